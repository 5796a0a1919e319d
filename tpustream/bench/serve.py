"""``python -m tpustream.bench.serve [--model DIR]``: the model server (aiplatform's CPR server with
``tpustream.serve.server``, started as Vertex starts it) under hostile requests; one JSON line per case.

Each case sends one request (or several at once) to the real server process and reports the status, the
latency, the response size, the server's resident memory before and at its peak during the case
(``/proc/PID/status`` VmRSS, and VmHWM after a reset through ``/proc/PID/clear_refs``), and the slowest of
the health checks sent every 50 ms meanwhile. Without ``--model`` it builds a randomly initialised model
(``--arch tiny``, 16 px, or a ResNet at 224 px) in a temporary directory: the answers do not matter here,
what it costs to give them does. The server runs with the production defaults (``tpustream.serve.settings.SERVING_DEFAULTS``)
and one uvicorn worker; the ``streamed-64x16MP`` case runs on a second server whose request pixel budget is
raised, to measure what decoding images one at a time bounds on its own. The ``load-...`` case starts 8 clients
together, each sending 25 requests of 8 small images: how many are answered, and their p50/p95 latency.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

__all__ = ["ModelServer", "Reply", "build_model", "image_bytes", "instances", "main", "run"]

DIGITS = [str(d) for d in range(10)]


def build_model(root: str, *, arch: str = "tiny", input_size: int | None = None) -> str:
    """A randomly initialised model artifact (model.pt + model.json) for the digits classes at ``root``."""
    import torch

    from tpustream.models import build_model as build

    size = input_size or (16 if arch == "tiny" else 224)
    torch.manual_seed(0)
    model = build(arch, num_classes=len(DIGITS), input_size=size).eval()
    os.makedirs(root, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(root, "model.pt"))
    card = {"format": "tpustream.model/v1", "arch": arch, "classes": DIGITS, "input_size": size}
    with open(os.path.join(root, "model.json"), "w") as f:
        json.dump(card, f)
    return root


def image_bytes(width: int, height: int, fmt: str = "PNG", *, mode: str = "L", **save: Any) -> bytes:
    """An image with a little structure (stripes: it compresses well, as a bomb does, and decodes at full
    cost) in ``fmt``."""
    import numpy as np
    from PIL import Image

    pixels = np.zeros((height, width), np.uint8)
    pixels[::7] = 200
    pixels[:, ::13] = 90
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, format=fmt, **save)
    return out.getvalue()


def instances(images: list[bytes], **parameters: Any) -> bytes:
    """A Vertex predict body for ``images``."""
    body: dict[str, Any] = {"instances": [{"b64": base64.b64encode(image).decode()} for image in images]}
    if parameters:
        body["parameters"] = parameters
    return json.dumps(body).encode()


@dataclass
class Reply:
    status: int
    body: bytes
    latency_ms: float
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body)


class ModelServer:
    """The serving image's model server on ``model`` (``serve.validate.start_model_server``: ``SERVING_ENV``
    and the AIP_* variables as Vertex sets them), one uvicorn worker (so the process measured is the one
    serving), and ``env`` on top (TPUSTREAM_* limits); spoken to over raw sockets."""

    def __init__(self, model: str, log_path: str, env: dict[str, str] | None = None) -> None:
        self.model = model
        self.env = {"VERTEX_CPR_WEB_CONCURRENCY": "1", **(env or {})}
        self.log_path = log_path
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._running = contextlib.ExitStack()

    def __enter__(self) -> ModelServer:
        from tpustream.serve.validate import start_model_server

        server = self._running.enter_context(
            start_model_server(self.model, env=self.env, timeout=120, log_path=self.log_path)
        )
        self.port, self.process = server.port, server.process
        return self

    def __exit__(self, *exc: object) -> None:
        self._running.close()

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-4000:]

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    # ------------------------------------------------------------------ HTTP, on a raw socket

    def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        timeout: float = 120,
    ) -> Reply:
        """One HTTP/1.1 request on its own connection. A raw socket, because a server may answer and close
        before a large body is all sent (413): the reply is still read after the send fails."""
        head = {"Host": f"127.0.0.1:{self.port}", "Connection": "close", **(headers or {})}
        if method == "POST":
            head["Content-Length"] = str(len(body))
        lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items()), "", ""]
        started = time.perf_counter()
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as conn:
            # a server may answer early and close (413): its answer is still in our receive buffer
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                conn.sendall("\r\n".join(lines).encode() + body)
            chunks = []
            with contextlib.suppress(ConnectionResetError):
                while chunk := conn.recv(1 << 16):
                    chunks.append(chunk)
        latency = (time.perf_counter() - started) * 1000
        raw = b"".join(chunks)
        head_raw, _, payload = raw.partition(b"\r\n\r\n")
        status_line, *header_lines = head_raw.decode("latin-1").split("\r\n")
        status = int(status_line.split()[1]) if status_line.startswith("HTTP/") else 0
        parsed = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
        if parsed.get("transfer-encoding") == "chunked":
            payload = _unchunk(payload)
        return Reply(status, payload, latency, parsed)

    def predict(
        self, body: bytes, content_type: str | None = "application/json", timeout: float = 120
    ) -> Reply:
        from tpustream.serve.contract import PREDICT_ROUTE

        headers = {"Content-Type": content_type} if content_type else {}
        return self.request("POST", PREDICT_ROUTE, body, headers, timeout)

    def health(self, timeout: float = 10) -> Reply:
        from tpustream.serve.contract import HEALTH_ROUTE

        return self.request("GET", HEALTH_ROUTE, timeout=timeout)

    # ------------------------------------------------------------------ memory

    def memory_mb(self) -> dict[str, float]:
        """VmRSS and VmHWM (peak RSS) of the server process, MB."""
        values = {}
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    values[key] = int(rest.split()[0]) / 1024
        return values

    def reset_peak(self) -> bool:
        """Reset VmHWM to the current RSS (Linux: ``5`` to /proc/PID/clear_refs); False if not allowed."""
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False


def _unchunk(payload: bytes) -> bytes:
    out, rest = [], payload
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out.append(rest[:size])
        rest = rest[size + 2 :]
    return b"".join(out)


@dataclass
class Watch:
    """During a block: the server's peak RSS (VmHWM after a reset, or polled VmRSS) and health latencies."""

    server: ModelServer
    probe_every_s: float = 0.05
    rss_mb_before: float = 0.0
    rss_mb_peak: float = 0.0
    health_ms: list[float] = field(default_factory=list)
    health_failures: int = 0

    @contextlib.contextmanager
    def watching(self) -> Iterator[Watch]:
        stop = threading.Event()
        hwm = self.server.reset_peak()
        self.rss_mb_before = self.rss_mb_peak = self.server.memory_mb()["VmRSS"]

        def probe() -> None:
            while not stop.is_set():
                try:
                    reply = self.server.health(timeout=30)
                    self.health_ms.append(reply.latency_ms)
                    self.health_failures += reply.status != 200
                except OSError:
                    self.health_failures += 1
                stop.wait(self.probe_every_s)

        def sample() -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    self.rss_mb_peak = max(self.rss_mb_peak, self.server.memory_mb()["VmRSS"])
                stop.wait(0.01)

        threads = [threading.Thread(target=probe), threading.Thread(target=sample)]
        for thread in threads:
            thread.start()
        try:
            yield self
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            if hwm:
                self.rss_mb_peak = max(self.rss_mb_peak, self.server.memory_mb()["VmHWM"])


def _line(case: str, reply: Reply, watch: Watch | None = None, **extra: Any) -> dict[str, Any]:
    line: dict[str, Any] = {
        "bench": "serve",
        "case": case,
        "status": reply.status,
        "latency_ms": round(reply.latency_ms, 1),
        "response_bytes": len(reply.body),
    }
    if watch is not None:
        line.update(
            rss_mb_before=round(watch.rss_mb_before, 1),
            rss_mb_peak=round(watch.rss_mb_peak, 1),
            health_ms_max=round(max(watch.health_ms), 1) if watch.health_ms else None,
            health_probes=len(watch.health_ms),
            health_failures=watch.health_failures,
        )
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        detail = reply.json().get("detail")
        if detail is not None:
            line["detail"] = str(detail)[:100]
    return {**line, **extra}


def _hostile_bodies() -> Iterator[tuple[str, bytes, str | None]]:
    """(case, body, content type) of the malformed requests."""
    tiny = base64.b64encode(image_bytes(8, 8)).decode()
    yield "deep-json", b"[" * 200_000 + b"]" * 200_000, "application/json"
    yield "invalid-utf8", b'{"instances": [{"b64": "\xff\xfe\xfd"}]}', "application/json"
    yield (
        "huge-integer",
        b'{"instances": [], "parameters": {"top_k": ' + b"9" * 100_000 + b"}}",
        "application/json",
    )
    yield (
        "nan",
        f'{{"instances": [{{"b64": "{tiny}"}}], "parameters": {{"top_k": NaN}}}}'.encode(),
        "application/json",
    )
    yield "float-overflow", f'{{"instances": [{{"b64": "{tiny}"}}], "x": 1e999}}'.encode(), "application/json"
    yield "top-level-array", b'[{"b64": "x"}]', "application/json"
    binary = os.urandom(1 << 20)
    yield "raw-binary-as-json", binary, "application/json"
    yield "raw-binary-octet-stream", binary, "application/octet-stream"
    yield "junk-2MB", b'{"instances": [{"b64": "' + b"QUJD" * (1 << 19), "application/json"
    yield "junk-2MB-not-b64", b'{"instances": [{"b64": "' + b"%%" * (1 << 20) + b'"}]}', "application/json"


def _cases(server: ModelServer, limits: dict[str, int]) -> Iterator[dict[str, Any]]:
    def timed(case: str, send: Callable[[], Reply], **extra: Any) -> dict[str, Any]:
        watch = Watch(server)
        with watch.watching():
            reply = send()
        return _line(case, reply, watch, **extra)

    small = [image_bytes(28 + i, 28, "PNG") for i in range(8)]
    yield timed("valid-8-small", lambda: server.predict(instances(small)))
    for case, body, content_type in _hostile_bodies():
        yield timed(case, partial(server.predict, body, content_type), body_bytes=len(body))
    over = b"{" + b" " * (limits["TPUSTREAM_MAX_BODY_BYTES"] + 1024) + b"}"
    yield timed("body-over-cap", lambda: server.predict(over), body_bytes=len(over))
    many = instances([small[0]] * (limits["TPUSTREAM_MAX_INSTANCES"] + 1))
    yield timed("too-many-instances", lambda: server.predict(many))
    side = int(limits["TPUSTREAM_MAX_PIXELS"] ** 0.5)  # the largest square each image may be
    full = image_bytes(side, side, "PNG")
    count = limits["TPUSTREAM_MAX_REQUEST_PIXELS"] // (side * side)
    over_budget = instances([full] * limits["TPUSTREAM_MAX_INSTANCES"])
    yield timed(
        "64x16MP-over-request-budget", lambda: server.predict(over_budget), body_bytes=len(over_budget)
    )
    heavy = instances([full] * count)
    yield timed(f"heavy-allowed-{count}x16MP", lambda: server.predict(heavy), body_bytes=len(heavy))
    for fmt, save in (("WEBP", {"lossless": True}), ("TIFF", {"compression": "tiff_deflate"}), ("BMP", {})):
        one = image_bytes(96, 64, fmt, mode="RGB", **save)
        yield timed(f"format-{fmt.lower()}", partial(server.predict, instances([one])))
    bomb_side = side + 64  # just over the per-image budget: refused from the header
    for fmt, save in (("TIFF", {"compression": "tiff_deflate"}), ("WEBP", {"lossless": True})):
        bomb = image_bytes(bomb_side, bomb_side, fmt, **save)
        yield timed(f"bomb-{fmt.lower()}", partial(server.predict, instances([bomb])), body_bytes=len(bomb))
    # concurrent clients while a heavy request is in: admitted while the in-flight budgets hold them
    # (serve/server.py's Admission); a fast 503 beyond
    clients = 8
    watch = Watch(server)
    with watch.watching(), ThreadPoolExecutor(clients + 1) as pool:
        first = pool.submit(server.predict, heavy)
        time.sleep(0.3)
        replies = list(pool.map(lambda _: server.predict(instances(small[:2])), range(clients)))
        heavy_reply = first.result()
    statuses = sorted(r.status for r in replies)
    yield _line(
        f"concurrent-{clients}-during-heavy",
        heavy_reply,
        watch,
        statuses=statuses,
        rejected_ms_max=round(max((r.latency_ms for r in replies if r.status == 503), default=0), 1),
    )
    yield _load_line(server, small, clients=8, rounds=25)


def _load_line(server: ModelServer, small: list[bytes], *, clients: int, rounds: int) -> dict[str, Any]:
    """``clients`` clients, started together (a barrier), each sending ``rounds`` requests of the
    ``small`` images one after the other: how many are answered, and the latencies of those answered."""
    body = instances(small)
    start = threading.Barrier(clients)

    def client(_: int) -> list[Reply]:
        start.wait()
        return [server.predict(body) for _ in range(rounds)]

    watch = Watch(server)
    with watch.watching(), ThreadPoolExecutor(clients) as pool:
        replies = [reply for replies in pool.map(client, range(clients)) for reply in replies]
    answered = sorted(r.latency_ms for r in replies if r.status == 200)
    statuses: dict[str, int] = {}
    for reply in replies:
        statuses[str(reply.status)] = statuses.get(str(reply.status), 0) + 1

    def percentile(share: float) -> float | None:
        return round(answered[min(len(answered) - 1, int(share * len(answered)))], 1) if answered else None

    return {
        "bench": "serve",
        "case": f"load-{clients}-clients-x{rounds}-{len(small)}-small",
        "requests": len(replies),
        "statuses": statuses,
        "latency_ms_p50": percentile(0.5),
        "latency_ms_p95": percentile(0.95),
        "rss_mb_before": round(watch.rss_mb_before, 1),
        "rss_mb_peak": round(watch.rss_mb_peak, 1),
        "health_ms_max": round(max(watch.health_ms), 1) if watch.health_ms else None,
    }


def run(
    model: str | None,
    *,
    arch: str = "tiny",
    streamed_case: bool = True,
    echo: Callable[[str], Any] | None = None,
) -> list[dict[str, Any]]:
    """Start the model server on ``model`` (None: a random ``arch`` model built in a temporary directory),
    run the cases, return one dict per case (``echo``: called with each JSON line as it is measured)."""
    from tpustream.serve.settings import SERVING_DEFAULTS

    lines: list[dict[str, Any]] = []

    def emit(line: dict[str, Any]) -> None:
        lines.append(line)
        if echo is not None:
            echo(json.dumps(line))

    with tempfile.TemporaryDirectory(prefix="tpustream-bench-serve-") as tmp:
        model = model or build_model(os.path.join(tmp, "model"), arch=arch)
        with ModelServer(model, os.path.join(tmp, "server.log")) as server:
            for line in _cases(server, SERVING_DEFAULTS):
                emit(line)
        if streamed_case:  # decoding one image at a time, alone: the request budget raised out of the way
            raised = {
                "TPUSTREAM_MAX_REQUEST_PIXELS": str(1 << 30),
                "TPUSTREAM_MAX_REQUEST_BYTES": str(16 << 20),
            }
            with ModelServer(model, os.path.join(tmp, "server-raised.log"), raised) as server:
                side = int(SERVING_DEFAULTS["TPUSTREAM_MAX_PIXELS"] ** 0.5)
                body = instances(
                    [image_bytes(side, side, "PNG")] * SERVING_DEFAULTS["TPUSTREAM_MAX_INSTANCES"]
                )
                watch = Watch(server)
                with watch.watching():
                    reply = server.predict(body)
                emit(_line("streamed-64x16MP-budget-raised", reply, watch, body_bytes=len(body)))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tpustream.bench.serve", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", help="a model directory or registry (default: a random model built here)")
    parser.add_argument(
        "--arch", default="tiny", help="the random model's architecture (tiny, resnet18, resnet50)"
    )
    parser.add_argument("--no-streamed-case", action="store_true", help="skip the second server's case")
    args = parser.parse_args(argv)
    run(args.model, arch=args.arch, streamed_case=not args.no_streamed_case, echo=print)
    return 0


if __name__ == "__main__":
    sys.exit(main())
