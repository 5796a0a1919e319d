"""Test support: a real GCS-API server on loopback (fake-gcs-server) and a fault-injecting proxy."""

from __future__ import annotations

import contextlib
import http.client
import random
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from tpustream.emulator import GcsServer, make_bucket


class FaultProxy:
    """HTTP proxy in front of the GCS server that answers a chosen fraction of requests badly.

    Half of the faults are a 503 without forwarding (the request is not applied); the other half,
    on GETs, forward the request and then cut the response body midway (Content-Length promised,
    half sent, connection closed). Seeded, so a failing run can be replayed.
    """

    def __init__(self, upstream: str, fault_rate: float, seed: int = 0) -> None:
        self.upstream = urlsplit(upstream)
        self.fault_rate = fault_rate
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.requests = 0
        self.faults = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy.lock:
                    proxy.requests += 1
                    roll = proxy.rng.random()
                fault = roll < proxy.fault_rate
                if fault and (self.command != "GET" or roll < proxy.fault_rate / 2):
                    with proxy.lock:
                        proxy.faults += 1
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
                data = resp.read()
                conn.close()
                cut = fault and len(data) > 1
                if cut:
                    with proxy.lock:
                        proxy.faults += 1
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
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


__all__ = ["FaultProxy", "GcsServer", "make_bucket"]
