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
"probabilities": [...]}, ...]}``. Errors are ``{"detail": "<one short line>"}``, never echoing the request
beyond a few dozen characters: 400 for a malformed body (not UTF-8, not JSON, nested too deeply, integers of
more than 30 digits, NaN/Infinity, not an object) or a bad instance (named; not base64, not an image, over a
budget, undecodable), 413 for a body over ``TPUSTREAM_MAX_BODY_BYTES``, 503 with ``Retry-After`` when
``TPUSTREAM_SERVING_THREADS`` + ``TPUSTREAM_SERVING_QUEUE`` requests are already in, and 500 "internal
error, see the server log" for anything else (the traceback is logged, never sent).

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
| `TPUSTREAM_SERVING_QUEUE` | 2 | further requests admitted to wait for a thread (per process) | 503 |
| `TPUSTREAM_TORCH_THREADS` | CPUs / (processes x serving threads) | torch intra-op threads of each serving thread | |

Memory: a request holds its body, the parsed JSON and the decoded image bytes (together at most ~3 x
``TPUSTREAM_MAX_BODY_BYTES``) and one decoded image at a time (up to ~8 bytes per pixel while Pillow converts
it to RGB). Measured (``python -m tpustream.bench.serve``): 4 PNGs of 16 Mi px (the default request budget)
raised the server's peak RSS by ~175 MB, 64 of them (request budget raised) by ~190 MB, where holding every
decoded image took 3 GB: the peak extra RSS of a request is ~200 MB at the defaults. A process holds that
times ``TPUSTREAM_SERVING_THREADS``, plus the bodies of up to ``TPUSTREAM_SERVING_QUEUE`` waiting requests.
Torch's threads: each process would start one intra-op thread per core, so N processes x M serving threads
would oversubscribe the CPUs N x M times; ``TPUSTREAM_TORCH_THREADS`` defaults to an even share instead.
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
import reprlib
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from tpustream import storage
from tpustream.errors import ConfigError, TpustreamError
from tpustream.imagecodec import PIL_FORMATS, sniff_format
from tpustream.registry import CHAMPION, read_champion, version_uri
from tpustream.serving_contract import HEALTH_ROUTE, PREDICT_ROUTE, SERVING_ENV, SERVING_PORT

if TYPE_CHECKING:
    import torch
    from fastapi import Request, Response

    from tpustream.transforms import Prepared

__all__ = [
    "BadImage",
    "BadModel",
    "Classifier",
    "ClassifierHandler",
    "ClassifierPredictor",
    "Limits",
    "ServerConfig",
    "SERVING_DEFAULTS",
    # the container contract: tpustream.serving_contract's, re-exported (tests and the Dockerfile name it here)
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


@dataclass(frozen=True, kw_only=True)
class ServerConfig(_FromEnv):
    """How the model server takes requests in: body size, threads, queue (see the module docstring)."""

    max_body_bytes: int = 16 << 20
    threads: int = 1
    queue: int = 2
    torch_threads: int = 0  # 0: the CPUs shared evenly among the server's processes and serving threads

    ENV: ClassVar[dict[str, str]] = {
        "max_body_bytes": "TPUSTREAM_MAX_BODY_BYTES",
        "threads": "TPUSTREAM_SERVING_THREADS",
        "queue": "TPUSTREAM_SERVING_QUEUE",
        "torch_threads": "TPUSTREAM_TORCH_THREADS",
    }
    MINIMUM: ClassVar[dict[str, int]] = {"queue": 0, "torch_threads": 0}

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

        from tpustream.checkpoint import CheckpointError, load_torch_file
        from tpustream.evaluate import EvaluationError, load_model_card
        from tpustream.models import build_model
        from tpustream.pretrained import build_network
        from tpustream.transforms import IMAGENET_MEAN, IMAGENET_STD, Augment

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
        if card.pretrained is not None:  # the stock stem at every input size (tpustream/pretrained.py)
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
        if ext is None:
            raise BadImage(f"{name}: not a {_FORMAT_NAMES} image (starts with {data[:8]!r})")
        return ext

    def measure(self, data: bytes, name: str = "image") -> int:
        """The pixel count an image's header claims, decoding nothing; refuses (BadImage) what ``prepare``
        would refuse before decoding: too many bytes, not a supported format, an unreadable header, more
        pixels than ``limits.max_pixels``."""
        from tpustream.imagecodec import CorruptImage, ImageTooLarge, check_pixels, image_dimensions

        ext = self._format(data, name)
        try:
            width, height = image_dimensions(data, ext, name)
            check_pixels(width, height, self.limits.max_pixels, name)
        except ImageTooLarge as exc:
            raise BadImage(_budget_hint(str(exc))) from exc
        except CorruptImage as exc:
            raise BadImage(str(exc)) from exc
        if width < 1 or height < 1:
            raise BadImage(f"{name}: undecodable {PIL_FORMATS[ext]} (an empty {width}x{height} image)")
        return width * height

    def prepare(self, data: bytes, name: str = "image") -> Prepared:
        """Decode one image (its header's pixel count checked before decoding) and place its centre crop."""
        from tpustream.imagecodec import CorruptImage, ImageTooLarge, decode_rgb
        from tpustream.transforms import Prepared, center_crop_box, prepare_image

        ext = self._format(data, name)
        kind = PIL_FORMATS[ext]
        try:
            if ext in _LOADER_FORMATS:
                return prepare_image(data, ext, self.augment, random.Random(0))  # val: no randomness used
            image = decode_rgb(data, ext, self.limits.max_pixels, name)
        except ImageTooLarge as exc:
            message = str(exc) if str(exc).startswith(name) else f"{name}: {exc}"
            raise BadImage(_budget_hint(message)) from exc
        except CorruptImage as exc:
            raise BadImage(str(exc)) from exc
        except Exception as exc:  # PIL/simplejpeg raise many types for a damaged file
            raise BadImage(f"{name}: undecodable {kind} ({type(exc).__name__}: {str(exc)[:120]})") from exc
        if image.size == 0:
            raise BadImage(f"{name}: undecodable {kind} (an empty {image.shape[1]}x{image.shape[0]} image)")
        box = center_crop_box(  # prepare_image's val crop
            image.shape[1], image.shape[0], self.input_size, self.augment.val_crop_fraction
        )
        return Prepared(image, (float(box[0]), float(box[1]), float(box[2]), float(box[3])), False)

    def pixels(self, prepared: list[Prepared]) -> torch.Tensor:
        """N x 3 x S x S uint8: the evaluation loader's render (render_batch), with small same-shaped
        images always upscaled by the batched resample, also when one is alone in its request."""
        import torch

        from tpustream.transforms import render_batch

        size = self.input_size
        out = torch.empty((len(prepared), 3, size, size), dtype=torch.uint8)
        render_batch(prepared, size, out, batch_alone=True)
        return out

    def render_images(self, images: Sequence[tuple[bytes, str]]) -> torch.Tensor:
        """``pixels([prepare(data, name) ...])`` with one decoded image alive at a time: each large image is
        rendered into the batch as soon as it is decoded and then released; the small ones ``render_batch``
        upscales together (at most 2 x S^2 px each) are kept and rendered at the end, as it would."""
        import torch

        from tpustream.transforms import render, render_batch

        size = self.input_size
        out = torch.empty((len(images), 3, size, size), dtype=torch.uint8)
        small: list[Prepared] = []
        small_at: list[int] = []
        for index, (data, name) in enumerate(images):
            prepared = self.prepare(data, name)
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
        return out

    # ------------------------------------------------------------------ pixels -> top-k

    def classify(self, pixels: torch.Tensor, top_k: int | None = None) -> list[dict[str, Any]]:
        """Top-k classes, their indices and softmax probabilities for each image of ``pixels``."""
        import torch

        from tpustream.transforms import normalize

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
_brief_repr = reprlib.Repr()
_brief_repr.maxstring = _brief_repr.maxother = 40
_brief_repr.maxlist = _brief_repr.maxdict = 3
_brief_repr.maxlevel = 2


def _brief(value: Any) -> str:
    """``value`` as a short repr (strings, lists, dicts cut): what an error message may quote of a request."""
    return _brief_repr.repr(value)


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


def _decode_instance(instance: Any, index: int, limits: Limits) -> bytes:
    encoded = instance.get("b64") if isinstance(instance, dict) else None
    if not isinstance(encoded, str):
        raise BadImage(
            f'instance {index}: expected {{"b64": "<base64 image bytes>"}}, got {_brief(instance)}'
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

    def preprocess(self, prediction_input: Any) -> tuple[Any, int | None]:
        if not isinstance(prediction_input, dict) or not isinstance(prediction_input.get("instances"), list):
            raise _http_error(400, 'the request body must be {"instances": [{"b64": "..."}, ...]}')
        instances = prediction_input["instances"]
        if not instances:
            raise _http_error(400, "no instances: send at least one image")
        if len(instances) > self.limits.max_instances:
            raise _http_error(
                400,
                f"{len(instances)} instances exceed the limit of {self.limits.max_instances} per request "
                "(TPUSTREAM_MAX_INSTANCES): split the request",
            )
        parameters = prediction_input.get("parameters") or {}
        top_k = parameters.get("top_k") if isinstance(parameters, dict) else None
        if isinstance(top_k, float) and top_k.is_integer() and 1 <= top_k <= 1_000_000:
            # a batch prediction job's model_parameters is a google.protobuf.Value: its numbers are doubles,
            # so {"top_k": 3} arrives as 3.0 (aiplatform_v1 BatchPredictionJob.model_parameters)
            top_k = int(top_k)
        if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
            raise _http_error(400, f"parameters.top_k must be a positive integer, got {_brief(top_k)}")
        try:
            return self.classifier.render_images(self._images(instances)), top_k
        except BadImage as exc:
            raise _http_error(400, str(exc)) from exc

    def _images(self, instances: list[Any]) -> list[tuple[bytes, str]]:
        """Every instance's image bytes and name, checked against the per-image and per-request budgets from
        base64 lengths and image headers: a request over a budget is refused before any pixel is decoded."""
        limits = self.limits
        images: list[tuple[bytes, str]] = []
        total_bytes = total_pixels = 0
        for index, instance in enumerate(instances):
            data = _decode_instance(instance, index, limits)
            total_bytes += len(data)
            if total_bytes > limits.max_request_bytes:
                raise BadImage(
                    f"instances 0-{index}: {total_bytes} image bytes exceed the request budget of "
                    f"{limits.max_request_bytes} (TPUSTREAM_MAX_REQUEST_BYTES): split the request"
                )
            total_pixels += self.classifier.measure(data, f"instance {index}")
            if total_pixels > limits.max_request_pixels:
                raise BadImage(
                    f"instances 0-{index}: {total_pixels / 1e6:.1f} MP exceed the request budget of "
                    f"{limits.max_request_pixels / 1e6:.1f} MP (TPUSTREAM_MAX_REQUEST_PIXELS), checked "
                    "from the image headers: split the request or send smaller images"
                )
            images.append((data, f"instance {index}"))
        return images

    def predict(self, instances: tuple[Any, int | None]) -> list[dict[str, Any]]:
        pixels, top_k = instances
        return self.classifier.classify(pixels, top_k)

    def postprocess(self, prediction_results: list[dict[str, Any]]) -> dict[str, Any]:
        return {"predictions": prediction_results}


def _accepts_json(accept: str) -> bool:
    media = {part.split(";", 1)[0].strip().lower() for part in accept.split(",")}
    return not accept.strip() or bool(media & {"application/json", "application/*", "*/*"})


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) from its Content-Length or as soon as more than ``limit`` bytes arrive."""
    too_large = (
        f"the request body exceeds {limit} bytes (TPUSTREAM_MAX_BODY_BYTES): send fewer or smaller images"
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and len(declared) < 20 and int(declared) > limit:
        raise _http_error(413, too_large)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _http_error(413, too_large)
        chunks.append(chunk)
    return b"".join(chunks)


class ClassifierHandler(_PredictionHandler):
    """The CPR ``Handler`` (HANDLER_MODULE/HANDLER_CLASS): checks the headers, admits at most ``threads`` +
    ``queue`` requests (503 beyond), reads the body within ``max_body_bytes`` (413), then parses it strictly
    (``parse_request``) and runs the predictor on a worker thread, off the event loop that answers health
    checks. Anything unexpected is a 500 without details; its traceback goes to the server log."""

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
        self._slots = threading.BoundedSemaphore(self.config.threads + self.config.queue)
        log.info("model server: %s, %d torch threads per serving thread", self.config, torch_threads)

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
        if not self._slots.acquire(blocking=False):
            raise _http_error(
                503,
                f"busy: {self.config.threads + self.config.queue} requests already in "
                "(TPUSTREAM_SERVING_THREADS + TPUSTREAM_SERVING_QUEUE): retry shortly",
                headers={"Retry-After": "1"},
            )
        submitted = False
        try:
            body = await _read_body(request, self.config.max_body_bytes)
            future = self._pool.submit(self._answer, body)
            submitted = True  # from here the worker releases the slot, also if this coroutine is cancelled
        finally:
            if not submitted:
                self._slots.release()
        return Response(content=await asyncio.wrap_future(future), media_type="application/json")

    def _answer(self, body: bytes) -> bytes:
        """On a worker thread: parse, preprocess, predict, postprocess, serialise."""
        try:
            prediction_input = parse_request(body)
            predictor = self._predictor
            results = predictor.postprocess(predictor.predict(predictor.preprocess(prediction_input)))
            return json.dumps(results).encode()
        finally:
            self._slots.release()


def _set_torch_threads(count: int) -> None:
    import torch

    torch.set_num_threads(count)
