"""A webhook receiver on loopback: it stands in for Slack, Google Chat or any service a run's
``notify_webhook`` posts to (none can be reached from here). Records each request (path, headers, JSON body)
and answers the statuses it was given in turn (then 200)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["WebhookReceiver"]


class WebhookReceiver:
    """``with WebhookReceiver(statuses=[503]) as hook:`` ... ``hook.url``, ``hook.bodies``."""

    def __init__(
        self, statuses: list[int] | None = None, path: str = "/hooks/T000/B000/s3cr3t-token"
    ) -> None:
        self.statuses = list(statuses or [])
        self.requests: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length)
                receiver.requests.append(
                    {"path": self.path, "content_type": self.headers.get("Content-Type", ""), "body": raw}
                )
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies received, in order."""
        return [json.loads(request["body"]) for request in self.requests]

    def __enter__(self) -> WebhookReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
