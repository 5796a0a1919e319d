"""The model server's settings: what one request may hold (``Limits``) and how a server process takes requests
in (``ServerConfig``), each read from the serving container's environment.

Settings: environment variables of the serving container (the model's ``containerSpec.env`` on Vertex,
``-e`` for ``docker run``); defaults in ``SERVING_DEFAULTS``. Each uvicorn worker process (the SDK runs
``VERTEX_CPR_WEB_CONCURRENCY`` of them, else one per core, at most ``VERTEX_CPR_MAX_WORKERS``: 4 in
containers/serve/Dockerfile) loads the model and applies these limits on its own.

| Variable | Default | Bounds | Over it |
|---|---|---|---|
| `TPUSTREAM_MAX_BODY_BYTES` | 16777216 (16 MiB) | the HTTP body (`Content-Length` checked before reading it) | 413 |
| `TPUSTREAM_MAX_INSTANCES` | 64 | images per request | 400 |
| `TPUSTREAM_MAX_IMAGE_BYTES` | 8388608 (8 MiB) | one image's encoded bytes | 400 |
| `TPUSTREAM_MAX_PIXELS` | 16777216 (16 Mi px) | one image's pixels, from its header | 400 |
| `TPUSTREAM_MAX_REQUEST_BYTES` | 12582912 (12 MiB) | encoded bytes of all images of a request | 400 |
| `TPUSTREAM_MAX_REQUEST_PIXELS` | 67108864 (64 Mi px: 64 images of 1024x1024) | pixels of all images of a request, from their headers, before any is decoded | 400 |
| `TPUSTREAM_TOP_K` | 5 | classes per answer when the request sets no `parameters.top_k` | |
| `TPUSTREAM_BATCH_SIZE` | 32 | images per forward pass | |
| `TPUSTREAM_SERVING_THREADS` | 1 | requests decoded and classified at once (per process) | |
| `TPUSTREAM_SERVING_QUEUE` | 64 | further requests in, waiting for a thread, at most (per process) | 503 |
| `TPUSTREAM_INFLIGHT_BYTES` | 0: 4 x `TPUSTREAM_MAX_BODY_BYTES` (64 MiB) | body bytes of the requests in (per process) | 503 |
| `TPUSTREAM_INFLIGHT_PIXELS` | 0: 4 x `TPUSTREAM_MAX_REQUEST_PIXELS` (256 Mi px) | image pixels of the requests in, from their headers (per process) | 503 |
| `TPUSTREAM_TORCH_THREADS` | CPUs / (processes x serving threads) | torch intra-op threads of each serving thread | |

Memory: a request holds its body, the parsed JSON and the decoded image bytes (together at most ~3 x
``TPUSTREAM_MAX_BODY_BYTES``) and one decoded image at a time (up to ~8 bytes per pixel while Pillow converts
it to RGB). Measured (``python -m tpustream.bench.serve``): 4 PNGs of 16 Mi px (the default request budget)
raised the server's peak RSS by ~175 MB, 64 of them (request budget raised) by ~190 MB, where holding every
decoded image took 3 GB: the peak extra RSS of a request is ~200 MB at the defaults. A process holds that
times ``TPUSTREAM_SERVING_THREADS``, plus what the waiting requests hold: at most ~3 x
``TPUSTREAM_INFLIGHT_BYTES`` (~200 MB at the defaults). The in-flight pixels default to 4 requests at the
request pixel budget: ~256 Mi px, a few seconds of decoding ahead of a new request on one core.
Torch's threads: each process would start one intra-op thread per core, so N processes x M serving threads
would oversubscribe the CPUs N x M times; ``TPUSTREAM_TORCH_THREADS`` defaults to an even share instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import ClassVar, TypeVar

from tpustream.errors import ConfigError
from tpustream.serve.admission import Admission

__all__ = ["INFLIGHT_REQUESTS", "Limits", "ServerConfig", "SERVING_DEFAULTS"]


def _env_int(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw[:40]!r} is not an integer: unset it or give a number") from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be at least {minimum}")
    return value


_Config = TypeVar("_Config", bound="_FromEnv")


class _FromEnv:
    """``from_env`` for a dataclass whose ``ENV`` maps its int fields to environment variables."""

    ENV: ClassVar[dict[str, str]] = {}
    MINIMUM: ClassVar[dict[str, int]] = {}

    @classmethod
    def from_env(cls: type[_Config]) -> _Config:
        values = {
            field: _env_int(var, getattr(cls, field), cls.MINIMUM.get(field, 1))
            for field, var in cls.ENV.items()
        }
        return cls(**values)

    def __post_init__(self) -> None:
        for field in fields(self):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            if isinstance(value, int) and value < self.MINIMUM.get(field.name, 1):
                raise ConfigError(
                    f"{field.name} must be at least {self.MINIMUM.get(field.name, 1)}, got {value}"
                )


@dataclass(frozen=True, kw_only=True)
class Limits(_FromEnv):
    """What one request may hold. Vertex's endpoints cap a request at 1.5 MB (10 MB on dedicated ones); the
    pixel budgets are what bound work and memory (a 34 KB PNG can claim 16 Mi px): they are checked from the
    images' headers before any decoding."""

    max_instances: int = 64
    max_image_bytes: int = 8 << 20
    max_pixels: int = 1 << 24  # 16.8 MP: any camera photo up to 16 MP (48 MiB decoded); see image.codec
    max_request_bytes: int = 12 << 20  # what a 16 MiB body of base64 can carry
    max_request_pixels: int = 1 << 26  # 64 images of 1024x1024; ~0.5 s of PNG decoding on one core
    top_k: int = 5
    batch_size: int = 32

    ENV: ClassVar[dict[str, str]] = {
        "max_instances": "TPUSTREAM_MAX_INSTANCES",
        "max_image_bytes": "TPUSTREAM_MAX_IMAGE_BYTES",
        "max_pixels": "TPUSTREAM_MAX_PIXELS",
        "max_request_bytes": "TPUSTREAM_MAX_REQUEST_BYTES",
        "max_request_pixels": "TPUSTREAM_MAX_REQUEST_PIXELS",
        "top_k": "TPUSTREAM_TOP_K",
        "batch_size": "TPUSTREAM_BATCH_SIZE",
    }


# Requests of the largest size allowed that the in-flight budgets hold by default (see the module docstring).
INFLIGHT_REQUESTS = 4


@dataclass(frozen=True, kw_only=True)
class ServerConfig(_FromEnv):
    """How the model server takes requests in: body size, threads, the in-flight budgets that admit or refuse
    a request and the most requests waiting (see the module docstring)."""

    max_body_bytes: int = 16 << 20
    threads: int = 1
    queue: int = 64
    inflight_bytes: int = 0  # 0: INFLIGHT_REQUESTS x max_body_bytes
    inflight_pixels: int = 0  # 0: INFLIGHT_REQUESTS x Limits.max_request_pixels
    torch_threads: int = 0  # 0: the CPUs shared evenly among the server's processes and serving threads

    ENV: ClassVar[dict[str, str]] = {
        "max_body_bytes": "TPUSTREAM_MAX_BODY_BYTES",
        "threads": "TPUSTREAM_SERVING_THREADS",
        "queue": "TPUSTREAM_SERVING_QUEUE",
        "inflight_bytes": "TPUSTREAM_INFLIGHT_BYTES",
        "inflight_pixels": "TPUSTREAM_INFLIGHT_PIXELS",
        "torch_threads": "TPUSTREAM_TORCH_THREADS",
    }
    MINIMUM: ClassVar[dict[str, int]] = {
        "queue": 0,
        "inflight_bytes": 0,
        "inflight_pixels": 0,
        "torch_threads": 0,
    }

    def admission(self, limits: Limits) -> Admission:
        """The in-flight budgets of one server process: the configured ones, else INFLIGHT_REQUESTS requests
        of the largest body and the largest request pixel budget."""
        return Admission(
            requests=self.threads + self.queue,
            body_bytes=self.inflight_bytes or INFLIGHT_REQUESTS * self.max_body_bytes,
            pixels=self.inflight_pixels or INFLIGHT_REQUESTS * limits.max_request_pixels,
        )

    def torch_threads_per_thread(self) -> int:
        """``torch_threads``, or the CPUs this process may use divided among the uvicorn worker processes
        (``WEB_CONCURRENCY``, which the SDK's model server sets before starting them) and serving threads."""
        if self.torch_threads:
            return self.torch_threads
        processes = max(1, int(os.environ.get("WEB_CONCURRENCY", "1") or 1))
        return max(1, len(os.sched_getaffinity(0)) // (processes * self.threads))


# Every setting's environment variable and default: the README's table is the module docstring's.
SERVING_DEFAULTS: dict[str, int] = {
    var: getattr(config, field) for config in (ServerConfig, Limits) for field, var in config.ENV.items()
}
