"""Test support: a real GCS-API server on loopback (fake-gcs-server) and a fault-injecting proxy."""

from __future__ import annotations

import contextlib
import http.client
import random
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from tpustream.bench.emulator import GcsServer, make_bucket


class FaultProxy:
    """HTTP proxy in front of the GCS server that answers a chosen fraction of requests badly.

    Half of the faults are a 503 without forwarding (the request is not applied); the other half
    forward the request and then cut the response body midway (Content-Length promised, half sent,
    connection closed): for a write, the write was applied but its answer is lost. Seeded, so a failing
    run can be replayed.

    The server's own URL is rewritten to the proxy's in every response body: google-cloud-storage
    downloads object bodies through the ``mediaLink`` the server returns, which would otherwise bypass
    the proxy, so shard bodies were never faulted. ``media_faults`` counts faults on body downloads.
    """

    def __init__(self, upstream: str, fault_rate: float, seed: int = 0) -> None:
        self.upstream = urlsplit(upstream)
        self.fault_rate = fault_rate
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.requests = 0
        self.faults = 0
        self.media_requests = 0
        self.media_faults = 0
        self.write_answers_lost = 0
        # lose_answer(method, path) -> True: forward the request (it is applied), then cut its answer
        self.lose_answer: Callable[[str, str], bool] | None = None
        # rewrite(method, path, body) -> the body to answer instead (e.g. a bucket's location, which
        # fake-gcs-server always reports as US-CENTRAL1)
        self.rewrite: Callable[[str, str, bytes], bytes] | None = None
        upstream_url = upstream.rstrip("/").encode()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                media = "alt=media" in self.path or self.path.startswith("/download/")
                with proxy.lock:
                    proxy.requests += 1
                    proxy.media_requests += media
                    roll = proxy.rng.random()
                fault = roll < proxy.fault_rate
                if fault and roll < proxy.fault_rate / 2:
                    with proxy.lock:
                        proxy.faults += 1
                        proxy.media_faults += media
                    payload = b'{"error": {"code": 503, "message": "injected fault"}}'
                    self.send_response(503)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read().replace(upstream_url, proxy.url.encode())  # mediaLink -> through us
                conn.close()
                if proxy.rewrite is not None:
                    data = proxy.rewrite(self.command, self.path, data)
                forced = proxy.lose_answer is not None and proxy.lose_answer(self.command, self.path)
                cut = (fault or forced) and len(data) > 1
                if cut:
                    with proxy.lock:
                        proxy.faults += 1
                        proxy.media_faults += media
                        proxy.write_answers_lost += self.command in ("POST", "PUT", "PATCH")
                self.send_response(resp.status)
                for key, value in resp.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                if cut:
                    self.send_header("Connection", "close")
                self.end_headers()
                if cut:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

        class QuietServer(ThreadingHTTPServer):
            def handle_error(self, request: object, client_address: object) -> None:
                pass  # clients hang up on cut bodies: expected here

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"  # set before the first request
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


__all__ = ["FaultProxy", "GcsServer", "make_bucket"]
