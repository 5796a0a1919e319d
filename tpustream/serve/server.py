"""Serving a tpustream model: the classifier (model.pt + model.json -> top-k per image) and the Vertex AI
Custom Prediction Routine (CPR) handler and predictor that run it, hardened against hostile requests.

The model server is google-cloud-aiplatform's own (``google.cloud.aiplatform.prediction.model_server``:
FastAPI + uvicorn; its ``CprModelServer`` reads ``AIP_HTTP_PORT``, ``AIP_HEALTH_ROUTE``,
``AIP_PREDICT_ROUTE`` and hands ``AIP_STORAGE_URI`` to the handler, which hands it to the predictor's
``load``). It builds the handler and predictor named by ``HANDLER_*`` / ``PREDICTOR_*`` (``SERVING_ENV``,
where ``LocalModel.build_cpr_model`` puts them: google/cloud/aiplatform/prediction/local_model.py). The
handler is ours (``ClassifierHandler``), not the SDK's ``PredictionHandler``, whose ``DefaultSerializer``
(prediction/serializer.py) catches only ``JSONDecodeError`` and echoes the body back, and which runs the
predictor on the event loop (prediction/handler.py), while the server turns any other exception into a 500
carrying its arguments (prediction/model_server.py).
Docs: https://cloud.google.com/vertex-ai/docs/predictions/custom-prediction-routines; the container
contract (health checks, the predict route): https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements;
request size: 1.5 MB on shared public endpoints, 10 MB on dedicated ones:
https://cloud.google.com/vertex-ai/docs/predictions/using-dedicated-endpoints.

Images go through the validation transform the trainer and ``tpustream evaluate`` use (``prepare_image``
with ``Augment(train=False)``: centre crop + antialiased resize, then ``normalize`` with model.json's mean
and std). Small images are upscaled with the batched resample the evaluation loader applies to a batch of
same-shaped images (``render_upscales``), for a lone image too, so an image's answer does not depend on
which other images share its request. Every format shard creation accepts is served
(``file_sources.IMAGE_EXTENSIONS``, recognised by its first bytes: ``imagecodec.sniff_format``): JPEG, PNG
and PPM as the loader decodes them; PGM/PBM, BMP, GIF, WebP and TIFF as shard creation decodes them before
storing them losslessly (``imagecodec.decode_rgb``), each with the same pixel budget, checked from its header.

Request (Vertex's binary-data convention:
https://cloud.google.com/vertex-ai/docs/predictions/get-online-predictions):
``{"instances": [{"b64": "<base64 image>"}, ...], "parameters": {"top_k": 3}}``, ``Content-Type:
application/json``. Response: ``{"predictions": [{"classes": [...], "class_indices": [...],
"probabilities": [...]}, ...]}``, one per instance in order; a bad instance (not base64, not an image, over
its own byte or pixel budget, undecodable) fails alone: its slot is ``{"error": "instance 3: <why>"}`` and the
others are answered (status 200). Errors are ``{"detail": "<one short line>"}`` that never quote the request
(no byte of the body, no value of it: they say what kind of thing was wrong, and name our own limits): 400
for a malformed body (not UTF-8, not JSON, nested too deeply, integers of more than 30 digits,
NaN/Infinity, not an object), a bad request (no instances, too many, over a request budget, a ``top_k``
that is not an integer from 1 to the model's class count) or a request whose every instance is bad (the
first one's message), 413 for a body over ``TPUSTREAM_MAX_BODY_BYTES``, 503 with ``Retry-After: 1`` when
the request does not fit the process's in-flight budgets (below), and 500 "internal error, see the server
log" for anything else (the traceback is logged, never sent). ``parameters.top_k`` over the class count is
refused, where ``TPUSTREAM_TOP_K`` (the server's default) is capped at the class count.

AutoML's format too (``tpustream.serve.automl``, Vertex's AutoML image classification schemata): a request
whose instances are ``{"content": "<base64 image>"}`` (``mimeType`` optional) takes ``parameters``
``{"confidenceThreshold": 0.0, "maxPredictions": 10}`` (the schema's defaults; maxPredictions is capped at the
class count) and is answered ``{"predictions": [{"ids": ["3", ...], "displayNames": [...], "confidences":
[...]}, ...]}`` (ids: class indices, as strings). The instances' key chooses the format per request; mixing
``b64`` and ``content`` instances, or one format's parameters with the other's, is a 400. The same limits,
budgets and admission apply, and a bad instance fails alone in its slot (``{"error": ...}``) as above.

Admission (``Admission``): each process admits requests while what the requests in it (being read,
checked, waiting for a serving thread, worked on) cost fits its budgets: their count
(``TPUSTREAM_SERVING_THREADS`` + ``TPUSTREAM_SERVING_QUEUE``: a flood of tiny requests cannot queue without
end), their body bytes (charged from ``Content-Length`` before the body is read, the body cap when the body
is chunked, then its real size: the memory waiting requests hold) and their images' pixels (charged from the
image headers on an intake thread, before the request waits for a serving thread: the decoding work ahead of
a new request, which bounds its wait). A request that does not fit is a 503 with ``Retry-After``, before
its body is read when the bytes do not fit (a client sending ``Expect: 100-continue``, as curl does for large
bodies, does not even send it). A request within the per-request limits always fits an otherwise empty
server. Small requests cost next to nothing: 8 clients of 8 small images each are all answered.

Requests are decoded and classified on a thread pool, off uvicorn's event loop, so the health route answers
while a request is being worked on. Budgets are checked from base64 lengths and image headers before any
pixel is decoded, and images are decoded one at a time, each released once its crop is in the uint8 batch
(small images the batched resample takes together, at most 2 x S^2 px each, are kept until the end).

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

``Child process [PID] died`` at start (more than one worker): uvicorn's supervisor (uvicorn/supervisors/
multiprocess.py) pings every worker each 0.5 s and kills one that does not answer within 5 s
(``timeout_worker_healthcheck``, left at its default by the SDK's ``uvicorn.run``); a spawned worker answers only
after re-importing the SDK's model_server module, which took ~4.7 s here on a busy machine, so workers started
together on few cores can miss it and are replaced, before any code of ours runs. See README (Serving).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import math
import os
import random
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from tpustream.errors import ConfigError, TpustreamError
from tpustream.image.codec import PIL_FORMATS, sniff_format
from tpustream.registry.store import CHAMPION, read_champion, version_uri
from tpustream.serve.automl import (
    AUTOML_KEY,
    B64_KEY,
    MIME_TYPE_KEYS,
    AutoMLParameters,
    BadRequest,
    automl_prediction,
    json_type,
    parse_automl_parameters,
    refuse_automl_parameters,
    request_format,
)
from tpustream.serve.contract import HEALTH_ROUTE, PREDICT_ROUTE, SERVING_ENV, SERVING_PORT
from tpustream.storage import io as storage

if TYPE_CHECKING:
    import torch
    from fastapi import Request, Response

    from tpustream.image.transforms import Prepared

__all__ = [
    "BadImage",
    "BadModel",
    "Classifier",
    "ClassifierHandler",
    "ClassifierPredictor",
    "Limits",
    "ServerConfig",
    "SERVING_DEFAULTS",
    # the container contract: tpustream.serve.contract's, re-exported (tests and the Dockerfile name it here)
    "SERVING_ENV",
    "SERVING_PORT",
    "HEALTH_ROUTE",
    "PREDICT_ROUTE",
    "IMAGE_FORMATS",
    "image_format",
    "parse_request",
    "resolve_model_uri",
]

log = logging.getLogger(__name__)

# The formats image_format recognises: every one shard creation accepts (file_sources.IMAGE_EXTENSIONS).
IMAGE_FORMATS = tuple(PIL_FORMATS)
_FORMAT_NAMES = "JPEG, PNG, PPM/PGM/PBM, BMP, GIF, WebP or TIFF"
# Decoded as the loader decodes shard members; the other formats as shard creation decodes them.
_LOADER_FORMATS = ("jpg", "png", "ppm")
INTERNAL_ERROR = "internal error, see the server log"


class BadImage(TpustreamError, ValueError):
    """One image cannot be classified (not an image, too large, undecodable); the message says which."""


class BadModel(TpustreamError, ValueError):
    """The model artifact cannot be served; the message says what and what to do."""


def image_format(data: bytes) -> str | None:
    """``jpg``, ``png``, ``ppm`` (also PGM/PBM), ``bmp``, ``gif``, ``webp`` or ``tiff`` from the file's first
    bytes, else None: the formats shard creation accepts."""
    return sniff_format(data)


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
    max_pixels: int = 1 << 24  # 16.8 MP: any camera photo up to 16 MP (48 MiB decoded); see imagecodec
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


@dataclass
class Ticket:
    """What one admitted request holds of the in-flight budgets, until it is answered or refused."""

    body_bytes: int
    pixels: int = 0
    released: bool = False


class Admission:
    """The requests of one server process in flight (their bodies being read, checked, waiting for a
    serving thread or worked on) against three budgets: their count, their body bytes (the memory they
    hold while they wait: body, parsed JSON, image bytes) and their images' pixels from the headers (the
    decoding work queued ahead of a new request, which bounds its wait). A request is admitted when it fits,
    or when nothing else holds that budget (so a request within the per-request limits is always served
    alone); otherwise it is refused with a 503. Thread-safe: the event loop admits, worker threads release."""

    def __init__(self, *, requests: int, body_bytes: int, pixels: int) -> None:
        self.max_requests, self.max_body_bytes, self.max_pixels = requests, body_bytes, pixels
        self.requests = self.body_bytes = self.pixels = 0
        self._lock = threading.Lock()

    def admit(self, body_bytes: int) -> Ticket | str:
        """A ticket holding ``body_bytes`` (the declared body, or the body cap when none is declared), or
        why not: the message of the 503."""
        with self._lock:
            if self.requests >= self.max_requests:
                return (
                    f"busy: {self.requests} requests already in, the most this server process takes "
                    "(TPUSTREAM_SERVING_THREADS + TPUSTREAM_SERVING_QUEUE): retry shortly"
                )
            if self.body_bytes and self.body_bytes + body_bytes > self.max_body_bytes:
                return (
                    f"busy: request bodies of {self.body_bytes} bytes already in, and this one's {body_bytes} "
                    f"would exceed the in-flight budget of {self.max_body_bytes} (TPUSTREAM_INFLIGHT_BYTES): "
                    "retry shortly"
                )
            self.requests += 1
            self.body_bytes += body_bytes
            return Ticket(body_bytes=body_bytes)

    def resize(self, ticket: Ticket, body_bytes: int) -> None:
        """The body has arrived: hold its real size (at most what was declared) instead."""
        with self._lock:
            if not ticket.released:
                self.body_bytes += body_bytes - ticket.body_bytes
                ticket.body_bytes = body_bytes

    def add_pixels(self, ticket: Ticket, pixels: int) -> str | None:
        """Charge the request's pixels, read from its image headers; None, or why not (the 503's message)."""
        with self._lock:
            if self.pixels and self.pixels + pixels > self.max_pixels:
                return (
                    f"busy: images of {_pixel_count(self.pixels)} already in, and this request's "
                    f"{_pixel_count(pixels)} would exceed the in-flight budget of {_pixel_count(self.max_pixels)} "
                    "(TPUSTREAM_INFLIGHT_PIXELS): retry shortly"
                )
            self.pixels += pixels
            ticket.pixels = pixels
            return None

    def release(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket.released:
                return
            ticket.released = True
            self.requests -= 1
            self.body_bytes -= ticket.body_bytes
            self.pixels -= ticket.pixels


def _pixel_count(pixels: int) -> str:
    return f"{pixels / 1e6:.1f} MP" if pixels >= 100_000 else f"{pixels} px"


# Every setting's environment variable and default: the README's table is the module docstring's.
SERVING_DEFAULTS: dict[str, int] = {
    var: getattr(config, field) for config in (ServerConfig, Limits) for field, var in config.ENV.items()
}


def resolve_model_uri(uri: str) -> str:
    """A model directory (model.json) as is; a registry (champion.json) -> its champion's version."""
    uri = storage.check_uri(uri).rstrip("/")
    if storage.exists(storage.join(uri, "model.json")):
        return uri
    if storage.exists(storage.join(uri, CHAMPION)):
        champion = read_champion(uri)
        assert champion is not None
        version = version_uri(uri, champion["version"])
        log.info("%s is a registry: using its champion, version %s (%s)", uri, champion["version"], version)
        return version
    raise BadModel(
        f"--model {uri}: neither a model directory (model.json) nor a registry with a champion "
        "(champion.json): give the output of `tpustream train` or a promoted registry"
    )


def _budget_hint(message: str) -> str:
    return message.replace("raise --max-pixels", "raise TPUSTREAM_MAX_PIXELS")


class Classifier:
    """A model artifact ready to classify image bytes: top-k classes with probabilities per image."""

    def __init__(self, model_uri: str, *, limits: Limits | None = None, device: Any = None) -> None:
        import torch

        from tpustream.image.transforms import IMAGENET_MEAN, IMAGENET_STD, Augment
        from tpustream.models import build_model, build_network
        from tpustream.train.checkpoint import CheckpointError, load_torch_file
        from tpustream.train.evaluate import EvaluationError, load_model_card

        self.limits = limits or Limits()
        self.uri = resolve_model_uri(model_uri)
        try:
            card = load_model_card(self.uri)
        except EvaluationError as exc:
            raise BadModel(str(exc)) from exc
        self.classes: list[str] = list(card.classes)
        self.input_size = card.input_size
        norm = card.normalization
        self.mean = tuple(float(v) for v in norm.get("mean", IMAGENET_MEAN))
        self.std = tuple(float(v) for v in norm.get("std", IMAGENET_STD))
        if float(norm.get("scale", 255)) != 255:
            raise BadModel(
                f"{self.uri}/model.json: normalization scale {norm['scale']} is not 255 (uint8 pixels)"
            )
        try:
            weights, self.model_sha256 = load_torch_file(
                storage.join(self.uri, "model.pt"), what="model weights"
            )
        except CheckpointError as exc:
            raise BadModel(f"{exc}: the model artifact is incomplete or corrupt; re-export it") from exc
        if card.pretrained is not None:  # the stock stem at every input size (tpustream/train/pretrained.py)
            model = build_network(
                card.arch, num_classes=len(self.classes), input_size=self.input_size, pretrained=True
            )
        else:
            model = build_model(
                card.arch,
                num_classes=len(self.classes),
                input_size=self.input_size,
                in_channels=card.in_channels,
            )
        try:
            model.load_state_dict(weights)
        except RuntimeError as exc:
            raise BadModel(f"{self.uri}/model.pt does not match its model.json ({card.arch}): {exc}") from exc
        self.device = device if device is not None else torch.device("cpu")
        self.model = model.to(self.device).eval()
        self.augment = Augment(
            output_size=self.input_size,
            train=False,
            max_pixels=self.limits.max_pixels,
            exif=True,
            val_crop_fraction=card.val_crop_fraction,  # model.json's preprocessing, as evaluate's loader
        )

    # ------------------------------------------------------------------ images -> uint8 pixels

    def _format(self, data: bytes, name: str) -> str:
        if len(data) > self.limits.max_image_bytes:
            raise BadImage(
                f"{name}: {len(data)} bytes exceeds the {self.limits.max_image_bytes}-byte image limit "
                "(TPUSTREAM_MAX_IMAGE_BYTES): send a smaller image"
            )
        ext = image_format(data)
        if ext is None:  # its first bytes are not quoted: an answer never repeats request content
            raise BadImage(f"{name}: not a {_FORMAT_NAMES} image (no such file signature in its first bytes)")
        return ext

    def measure(self, data: bytes, name: str = "image") -> int:
        """The pixel count an image's header claims, decoding nothing; refuses (BadImage) what ``prepare``
        would refuse before decoding: too many bytes, not a supported format, an unreadable header, more
        pixels than ``limits.max_pixels``."""
        from tpustream.image.codec import CorruptImage, ImageTooLarge, check_pixels, image_dimensions

        ext = self._format(data, name)
        try:
            width, height = image_dimensions(data, ext, name)
            check_pixels(width, height, self.limits.max_pixels, name)
        except ImageTooLarge as exc:
            raise self._too_large(exc, name) from exc
        except CorruptImage as exc:
            raise self._undecodable(exc, name, PIL_FORMATS[ext]) from exc
        if width < 1 or height < 1:
            raise BadImage(f"{name}: undecodable {PIL_FORMATS[ext]} (an empty {width}x{height} image)")
        return width * height

    def prepare(self, data: bytes, name: str = "image") -> Prepared:
        """Decode one image (its header's pixel count checked before decoding) and place its centre crop."""
        from tpustream.image.codec import ImageTooLarge, decode_rgb
        from tpustream.image.transforms import Prepared, center_crop_box, prepare_image

        ext = self._format(data, name)
        kind = PIL_FORMATS[ext]
        try:
            if ext in _LOADER_FORMATS:
                return prepare_image(data, ext, self.augment, random.Random(0))  # val: no randomness used
            image = decode_rgb(data, ext, self.limits.max_pixels, name)
        except ImageTooLarge as exc:
            raise self._too_large(exc, name) from exc
        except Exception as exc:  # CorruptImage, or PIL/simplejpeg's many types for a damaged file
            raise self._undecodable(exc, name, kind) from exc
        if image.size == 0:
            raise BadImage(f"{name}: undecodable {kind} (an empty {image.shape[1]}x{image.shape[0]} image)")
        box = center_crop_box(  # prepare_image's val crop
            image.shape[1], image.shape[0], self.input_size, self.augment.val_crop_fraction
        )
        return Prepared(image, (float(box[0]), float(box[1]), float(box[2]), float(box[3])), False)

    def _too_large(self, exc: Exception, name: str) -> BadImage:
        """Our pixel budget, named as the server's setting, also where Pillow's own bomb limit (2 x 89 MP,
        above any budget) refused the header first: its message is Pillow's, not ours."""
        from PIL import Image

        if isinstance(exc.__cause__, Image.DecompressionBombError):
            return BadImage(
                f"{name}: its header claims more than {2 * (Image.MAX_IMAGE_PIXELS or 0) / 1e6:.0f} MP, over "
                f"the pixel budget of {self.limits.max_pixels / 1e6:.1f} MP per image (TPUSTREAM_MAX_PIXELS): "
                "send a smaller image"
            )
        message = str(exc) if str(exc).startswith(name) else f"{name}: {exc}"
        return BadImage(_budget_hint(message))

    @staticmethod
    def _undecodable(exc: Exception, name: str, kind: str) -> BadImage:
        """A damaged image, said without the decoder's message (Pillow's can quote the file's bytes, e.g. a
        PNG chunk name): that goes to the server log."""
        cause = exc.__cause__ if isinstance(exc, TpustreamError) and exc.__cause__ is not None else exc
        log.info("%s: undecodable %s: %s", name, kind, exc)
        return BadImage(f"{name}: undecodable {kind} (truncated or damaged: {type(cause).__name__})")

    def pixels(self, prepared: list[Prepared]) -> torch.Tensor:
        """N x 3 x S x S uint8: the evaluation loader's render (render_batch), with small same-shaped
        images always upscaled by the batched resample, also when one is alone in its request."""
        import torch

        from tpustream.image.transforms import render_batch

        size = self.input_size
        out = torch.empty((len(prepared), 3, size, size), dtype=torch.uint8)
        render_batch(prepared, size, out, batch_alone=True)
        return out

    def render_images(
        self, images: Sequence[tuple[bytes, str]], *, failed: dict[int, str] | None = None
    ) -> torch.Tensor:
        """``pixels([prepare(data, name) ...])`` with one decoded image alive at a time: each large image is
        rendered into the batch as soon as it is decoded and then released; the small ones ``render_batch``
        upscales together (at most 2 x S^2 px each) are kept and rendered at the end, as it would.

        With ``failed``, an image that cannot be decoded does not fail the others: its message is recorded
        there under its index in ``images`` and it has no row in the batch (the rows are the other images',
        in order); without it, the first such image raises BadImage."""
        import torch

        from tpustream.image.transforms import render, render_batch

        size = self.input_size
        out = torch.empty((len(images), 3, size, size), dtype=torch.uint8)
        small: list[Prepared] = []
        small_at: list[int] = []
        for index, (data, name) in enumerate(images):
            try:
                prepared = self.prepare(data, name)
            except BadImage as exc:
                if failed is None:
                    raise
                failed[index] = str(exc)
                continue
            if prepared.batchable(size):
                small.append(prepared)
                small_at.append(index)
            else:  # rendered alone by render_batch too: nothing else in the batch changes its pixels
                render(prepared, size, out[index])
            del prepared  # before the next image is decoded
        if small:
            block = torch.empty((len(small), 3, size, size), dtype=torch.uint8)
            render_batch(small, size, block, batch_alone=True)
            out[small_at] = block
        if failed:
            return out[[index for index in range(len(images)) if index not in failed]]
        return out

    # ------------------------------------------------------------------ pixels -> top-k

    def classify(self, pixels: torch.Tensor, top_k: int | None = None) -> list[dict[str, Any]]:
        """Top-k classes, their indices and softmax probabilities for each image of ``pixels``."""
        import torch

        from tpustream.image.transforms import normalize

        k = max(1, min(top_k or self.limits.top_k, len(self.classes)))
        batch = self.limits.batch_size
        results: list[dict[str, Any]] = []
        xla = self.device.type not in ("cpu", "cuda")
        with torch.no_grad():
            for start in range(0, len(pixels), batch):
                chunk = pixels[start : start + batch]
                count = len(chunk)
                if xla and count < batch:  # one compiled shape on XLA: pad the last batch
                    chunk = torch.cat([chunk, chunk.new_zeros((batch - count, *chunk.shape[1:]))])
                logits = self.model(normalize(chunk.to(self.device), self.mean, self.std)).float()
                probabilities, indices = logits.softmax(dim=1).topk(k, dim=1)
                probabilities, indices = probabilities[:count].cpu(), indices[:count].cpu()
                for p_row, i_row in zip(probabilities.tolist(), indices.tolist(), strict=True):
                    results.append(
                        {
                            "classes": [self.classes[i] for i in i_row],
                            "class_indices": i_row,
                            "probabilities": [round(p, 6) for p in p_row],
                        }
                    )
        return results


# ---------------------------------------------------------------------------------- the request body

_MAX_DETAIL = 300  # characters of an error message sent back
_MAX_INT_DIGITS = 30  # the request's only integer is top_k; longer ones cost quadratic time to convert


def _http_error(status: int, message: str, headers: dict[str, str] | None = None) -> Exception:
    from fastapi import HTTPException

    detail = message if len(message) <= _MAX_DETAIL else message[: _MAX_DETAIL - 3] + "..."
    return HTTPException(status_code=status, detail=detail, headers=headers)


class _BadNumber(ValueError):
    pass


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > _MAX_INT_DIGITS:
        raise _BadNumber(f"an integer of {digits} digits (at most {_MAX_INT_DIGITS})")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadNumber("a number beyond the range of a double")
    return value


def _refuse_constant(text: str) -> Any:
    raise _BadNumber(f"{text} (not JSON)")  # NaN, Infinity, -Infinity: Python's extensions to JSON


def parse_request(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, strictly: UTF-8, standard JSON (no NaN/Infinity), integers of at
    most 30 digits, finite numbers, nesting within Python's recursion limit. Raises an HTTP 400 whose
    message quotes nothing of the body."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _http_error(
            400, f"the request body is not UTF-8 text (invalid byte at offset {exc.start}): send JSON"
        ) from None
    try:
        value = json.loads(
            text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_refuse_constant
        )
    except _BadNumber as exc:
        raise _http_error(400, f"JSON deserialization failed: {exc}") from None
    except json.JSONDecodeError as exc:
        raise _http_error(
            400, f"JSON deserialization failed: {exc.msg} (line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise _http_error(400, "JSON deserialization failed: nested too deeply") from None
    if not isinstance(value, dict):
        raise _http_error(
            400,
            f'the request body must be a JSON object {{"instances": [...]}}, not a {type(value).__name__}',
        )
    return value


def _decode_instance(instance: Any, index: int, limits: Limits, key: str = B64_KEY) -> bytes:
    """The image bytes of one instance, ``{"b64": ...}`` or (an AutoML request's) ``{"content": ...}``."""
    encoded = instance.get(key) if isinstance(instance, dict) else None
    if not isinstance(encoded, str):
        raise BadImage(
            f'instance {index}: expected {{"{key}": "<base64 image bytes>"}}, got a JSON {json_type(instance)}'
            + (f' without a "{key}" string' if isinstance(instance, dict) else "")
        )
    if key == AUTOML_KEY:
        if any(not isinstance(instance.get(name, ""), str) for name in MIME_TYPE_KEYS):
            raise BadImage(f'instance {index}: "mimeType" must be a string (e.g. "image/jpeg")')
        if encoded.startswith("gs://"):  # ImageClassificationPredictionInstance allows a URI; we read none
            raise BadImage(
                f'instance {index}: "content" is a Cloud Storage URI; this server reads no URI a request names: '
                "send the image bytes, base64-encoded"
            )
    if len(encoded) > 4 * ((limits.max_image_bytes + 2) // 3) + 4:  # before decoding it
        raise BadImage(
            f"instance {index}: {len(encoded)} base64 characters exceed the {limits.max_image_bytes}-byte "
            "image limit (TPUSTREAM_MAX_IMAGE_BYTES): send a smaller image"
        )
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadImage(f"instance {index}: not valid base64 ({str(exc)[:80]})") from exc


# ---------------------------------------------------------------------------------- the CPR classes

try:  # the prediction extra (fastapi, uvicorn, docker) is a dependency; guarded so `--help` stays light
    from google.cloud.aiplatform.prediction.handler import PredictionHandler as _PredictionHandler
    from google.cloud.aiplatform.prediction.predictor import Predictor as _Predictor
except ImportError:  # pragma: no cover - reported by the model server itself
    _Predictor = object  # type: ignore[misc,assignment]
    _PredictionHandler = object  # type: ignore[misc,assignment]


class ClassifierPredictor(_Predictor):
    """The CPR ``Predictor``: ``load`` once per server process, then preprocess -> predict -> postprocess
    per request (on ``ClassifierHandler``'s worker thread; an ``HTTPException`` raised here reaches the
    client as is, anything else becomes a 500 without details)."""

    def load(self, artifacts_uri: str, **kwargs: Any) -> None:
        if not artifacts_uri:
            raise BadModel(
                "AIP_STORAGE_URI is not set: Vertex sets it from the model's artifact_uri; locally, point it "
                "at a model directory or a registry"
            )
        self.limits = Limits.from_env()
        self.classifier = Classifier(artifacts_uri, limits=self.limits)
        log.info(
            "serving %s (%d classes, %d px, sha256 %s; %s)",
            self.classifier.uri,
            len(self.classifier.classes),
            self.classifier.input_size,
            self.classifier.model_sha256[:12],
            self.limits,
        )

    def check(self, prediction_input: Any) -> CheckedRequest:
        """The request's shape, ``parameters.top_k`` and every instance's image bytes and pixel count, read
        from base64 lengths and image headers, no pixel decoded: what the request costs. A bad instance is
        recorded for its slot of the answer; a bad request (or one whose every instance is bad) is a 400."""
        if not isinstance(prediction_input, dict) or not isinstance(prediction_input.get("instances"), list):
            raise _http_error(
                400,
                'the request body must be {"instances": [{"b64": "..."}, ...]} (or AutoML\'s [{"content": ...}])',
            )
        instances = prediction_input["instances"]
        if not instances:
            raise _http_error(400, "no instances: send at least one image")
        if len(instances) > self.limits.max_instances:
            raise _http_error(
                400,
                f"{len(instances)} instances exceed the limit of {self.limits.max_instances} per request "
                "(TPUSTREAM_MAX_INSTANCES): split the request",
            )
        parameters = prediction_input.get("parameters")
        try:
            automl = request_format(instances) == "automl"
            if automl:
                top_k, automl_parameters = None, parse_automl_parameters(parameters)
            else:
                refuse_automl_parameters(parameters)
                top_k, automl_parameters = self._top_k(parameters), None
            images, failed, image_bytes, pixels = self._images(instances, AUTOML_KEY if automl else B64_KEY)
        except (BadImage, BadRequest) as exc:
            raise _http_error(400, str(exc)) from exc
        checked = CheckedRequest(
            count=len(instances),
            images=images,
            failed=failed,
            top_k=top_k,
            automl=automl_parameters,
            image_bytes=image_bytes,
            pixels=pixels,
        )
        checked.raise_if_all_failed()
        return checked

    def _top_k(self, parameters: Any) -> int | None:
        parameters = parameters or {}
        top_k = parameters.get("top_k") if isinstance(parameters, dict) else None
        if isinstance(top_k, float) and top_k.is_integer() and 1 <= top_k <= 1_000_000:
            # a batch prediction job's model_parameters is a google.protobuf.Value: its numbers are doubles,
            # so {"top_k": 3} arrives as 3.0 (aiplatform_v1 BatchPredictionJob.model_parameters)
            top_k = int(top_k)
        classes = len(self.classifier.classes)
        if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
            kind = json_type(top_k)
            raise _http_error(
                400,
                f"parameters.top_k must be a positive integer (at most the model's {classes} classes), got "
                + ("a number that is not one" if kind == "number" else f"a JSON {kind}"),
            )
        if top_k is not None and top_k > classes:  # refused, not capped: the client asked for what isn't
            raise _http_error(
                400, f"parameters.top_k exceeds the model's {classes} classes: ask for at most {classes}"
            )
        return top_k

    def _images(
        self, instances: list[Any], key: str = B64_KEY
    ) -> tuple[list[tuple[int, bytes]], dict[int, str], int, int]:
        """The (index, image bytes) of every instance that passes its own checks (base64, size, format,
        header, per-image pixels), the messages of those that do not, and the good ones' total bytes and
        pixels, checked against the request budgets: a request over one is refused before any decoding."""
        limits = self.limits
        images: list[tuple[int, bytes]] = []
        failed: dict[int, str] = {}
        total_bytes = total_pixels = 0
        for index, instance in enumerate(instances):
            try:
                data = _decode_instance(instance, index, limits, key)
                pixels = self.classifier.measure(data, f"instance {index}")
            except BadImage as exc:
                failed[index] = str(exc)
                continue
            total_bytes += len(data)
            if total_bytes > limits.max_request_bytes:
                raise BadImage(
                    f"instances 0-{index}: {total_bytes} image bytes exceed the request budget of "
                    f"{limits.max_request_bytes} (TPUSTREAM_MAX_REQUEST_BYTES): split the request"
                )
            total_pixels += pixels
            if total_pixels > limits.max_request_pixels:
                raise BadImage(
                    f"instances 0-{index}: {total_pixels / 1e6:.1f} MP exceed the request budget of "
                    f"{limits.max_request_pixels / 1e6:.1f} MP (TPUSTREAM_MAX_REQUEST_PIXELS), checked "
                    "from the image headers: split the request or send smaller images"
                )
            images.append((index, data))
        return images, failed, total_bytes, total_pixels

    def preprocess(self, prediction_input: Any) -> Batch:
        """The checked request's (``check``) images decoded into one uint8 batch; an image that fails to
        decode fails its own instance only."""
        checked = (
            prediction_input if isinstance(prediction_input, CheckedRequest) else self.check(prediction_input)
        )
        failed = dict(checked.failed)
        undecodable: dict[int, str] = {}
        pixels = self.classifier.render_images(
            [(data, f"instance {index}") for index, data in checked.images], failed=undecodable
        )
        for position, message in undecodable.items():
            failed[checked.images[position][0]] = message
        batch = Batch(
            pixels=pixels, count=checked.count, failed=failed, top_k=checked.top_k, automl=checked.automl
        )
        CheckedRequest.raise_if_none_left(checked.count, failed)
        return batch

    def predict(self, instances: Batch) -> list[dict[str, Any]]:
        """One answer per instance, in order: its top-k (AutoML's ClassificationPredictionResult for an AutoML
        request), or ``{"error": "<why>"}`` for a bad instance."""
        automl = instances.automl
        if automl is None:
            results = self.classifier.classify(instances.pixels, instances.top_k)
        else:  # classify caps maxPredictions at the class count, as the schema allows
            results = [
                automl_prediction(result, automl)
                for result in self.classifier.classify(instances.pixels, automl.max_predictions)
            ]
        answers = iter(results)
        return [
            {"error": instances.failed[index]} if index in instances.failed else next(answers)
            for index in range(instances.count)
        ]

    def postprocess(self, prediction_results: list[dict[str, Any]]) -> dict[str, Any]:
        return {"predictions": prediction_results}


@dataclass(frozen=True, kw_only=True)
class CheckedRequest:
    """A predict request checked from base64 lengths and image headers, nothing decoded: its instances'
    image bytes (``images``: index and bytes of the good ones), its bad instances' messages (``failed``), and
    what it costs (the good images' bytes and header pixels), which admission charges before it waits."""

    count: int
    images: list[tuple[int, bytes]]
    failed: dict[int, str]
    top_k: int | None
    image_bytes: int
    pixels: int
    automl: AutoMLParameters | None = None  # an AutoML-shaped request's parameters: answered in its shape

    def raise_if_all_failed(self) -> None:
        self.raise_if_none_left(self.count, self.failed)

    @staticmethod
    def raise_if_none_left(count: int, failed: dict[int, str]) -> None:
        """A 400 when no instance is left to answer: a request of bad images fails as a whole, with the
        first one's message (a single-image request's answer is unchanged)."""
        if len(failed) < count:
            return
        first = failed[min(failed)]
        more = f" (and {count - 1} more bad instances)" if count > 1 else ""
        raise _http_error(400, first + more if len(first) + len(more) <= _MAX_DETAIL else first)


@dataclass(frozen=True, kw_only=True)
class Batch:
    """A request's decoded images: ``pixels`` has a row per instance not in ``failed``, in order."""

    pixels: Any  # torch.Tensor, N x 3 x S x S uint8
    count: int
    failed: dict[int, str]
    top_k: int | None
    automl: AutoMLParameters | None = None


def _accepts_json(accept: str) -> bool:
    media = {part.split(";", 1)[0].strip().lower() for part in accept.split(",")}
    return not accept.strip() or bool(media & {"application/json", "application/*", "*/*"})


def _declared_length(request: Request) -> int | None:
    declared = request.headers.get("content-length", "")
    return int(declared) if declared.isdigit() and len(declared) < 20 else None


def _too_large(limit: int) -> Exception:
    return _http_error(
        413,
        f"the request body exceeds {limit} bytes (TPUSTREAM_MAX_BODY_BYTES): send fewer or smaller images",
    )


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as more than ``limit`` bytes arrive."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


class ClassifierHandler(_PredictionHandler):
    """The CPR ``Handler`` (HANDLER_MODULE/HANDLER_CLASS): checks the headers; admits the request against
    the process's in-flight budgets (``Admission``: count, body bytes from Content-Length, then pixels from
    the image headers; 503 with Retry-After beyond); reads the body within ``max_body_bytes`` (413); parses
    and checks it strictly on an intake thread (``parse_request``, ``ClassifierPredictor.check``); then
    decodes and classifies on a serving thread, off the event loop that answers health checks. Anything
    unexpected is a 500 without details; its traceback goes to the server log."""

    def __init__(self, artifacts_uri: str, predictor: Any = None) -> None:
        super().__init__(artifacts_uri, predictor=predictor)  # constructs and loads the predictor
        self.config = ServerConfig.from_env()
        torch_threads = self.config.torch_threads_per_thread()
        _set_torch_threads(torch_threads)
        self._pool = ThreadPoolExecutor(
            max_workers=self.config.threads,
            thread_name_prefix="tpustream-predict",
            initializer=_set_torch_threads,
            initargs=(torch_threads,),
        )
        # parsing and header checks (a few ms per MB) while the serving threads decode: a request's pixels
        # are known, and charged, before it waits for a serving thread
        self._intake = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpustream-intake")
        self.admission = self.config.admission(self._classifier.limits)
        log.info(
            "model server: %s, %d torch threads per serving thread; in flight at most %d requests, %d body "
            "bytes, %d pixels",
            self.config,
            torch_threads,
            self.admission.max_requests,
            self.admission.max_body_bytes,
            self.admission.max_pixels,
        )

    async def handle(self, request: Request) -> Response:  # type: ignore[override]  # the SDK's is async too
        from fastapi import HTTPException
        from starlette.requests import ClientDisconnect

        try:
            return await self._handle(request)
        except HTTPException:
            raise
        except ClientDisconnect:
            raise _http_error(400, "the client disconnected before sending the whole body") from None
        except Exception:
            log.exception("prediction request failed")
            raise _http_error(500, INTERNAL_ERROR) from None

    async def _handle(self, request: Request) -> Response:
        from fastapi import Response

        media_type = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            raise _http_error(
                400,
                'unsupported Content-Type: send the body as "application/json" (Vertex\'s predict format)',
            )
        if not _accepts_json(request.headers.get("accept", "")):
            raise _http_error(400, 'unsupported Accept: the server answers "application/json"')
        limit = self.config.max_body_bytes
        declared = _declared_length(request)
        if declared is not None and declared > limit:
            raise _too_large(limit)
        # charged before the body is read (a client sending Expect: 100-continue sends it only if admitted)
        ticket = self.admission.admit(limit if declared is None else declared)
        if isinstance(ticket, str):
            raise _busy(ticket)
        admitted = ticket
        handed_over = False  # from then on, the thread holding the request releases its ticket
        try:
            body = await _read_body(request, limit)
            self.admission.resize(admitted, len(body))
            intake = self._intake.submit(self._check, body)
            try:
                checked = await asyncio.wrap_future(intake)
            except asyncio.CancelledError:
                intake.add_done_callback(lambda _: self.admission.release(admitted))
                handed_over = True
                raise
            refusal = self.admission.add_pixels(admitted, checked.pixels)
            if refusal is not None:
                raise _busy(refusal)
            future = self._pool.submit(self._answer, checked)
            future.add_done_callback(lambda _: self.admission.release(admitted))
            handed_over = True
        finally:
            if not handed_over:
                self.admission.release(admitted)
        return Response(content=await asyncio.wrap_future(future), media_type="application/json")

    @property
    def _classifier(self) -> ClassifierPredictor:
        return cast(ClassifierPredictor, self._predictor)

    def _check(self, body: bytes) -> CheckedRequest:
        """On the intake thread: parse the body and check the request from its image headers."""
        return self._classifier.check(parse_request(body))

    def _answer(self, checked: CheckedRequest) -> bytes:
        """On a serving thread: decode, predict, postprocess, serialise."""
        predictor = self._predictor
        return json.dumps(predictor.postprocess(predictor.predict(predictor.preprocess(checked)))).encode()


def _busy(message: str) -> Exception:
    return _http_error(503, message, headers={"Retry-After": "1"})


def _set_torch_threads(count: int) -> None:
    import torch

    torch.set_num_threads(count)
