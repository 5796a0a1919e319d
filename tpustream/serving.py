"""Serving a tpustream model: the classifier (model.pt + model.json -> top-k per image) and its Vertex AI
Custom Prediction Routine (CPR) predictor.

The model server is google-cloud-aiplatform's own (``google.cloud.aiplatform.prediction.model_server``:
FastAPI + uvicorn; its ``CprModelServer`` reads ``AIP_HTTP_PORT``, ``AIP_HEALTH_ROUTE``,
``AIP_PREDICT_ROUTE`` and hands ``AIP_STORAGE_URI`` to the predictor's ``load``); this module supplies the
``Predictor`` subclass it runs through the SDK's ``PredictionHandler`` (``HANDLER_*`` / ``PREDICTOR_*``
variables, as ``LocalModel.build_cpr_model`` sets them: google/cloud/aiplatform/prediction/local_model.py).
Docs: https://cloud.google.com/vertex-ai/docs/predictions/custom-prediction-routines and the container
contract https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements.

Images go through the validation transform the trainer and ``tpustream evaluate`` use (``prepare_image``
with ``Augment(train=False)``: centre crop + antialiased resize, then ``normalize`` with model.json's mean
and std). Small images are upscaled with the batched resample the evaluation loader applies to a batch of
same-shaped images (``render_upscales``), for a lone image too, so an image's answer does not depend on
which other images share its request.

Request (Vertex's binary-data convention, https://cloud.google.com/vertex-ai/docs/predictions/get-online-predictions):
``{"instances": [{"b64": "<base64 JPEG/PNG/PPM>"}, ...], "parameters": {"top_k": 3}}``.
Response: ``{"predictions": [{"classes": [...], "class_indices": [...], "probabilities": [...]}, ...]}``.
A bad instance (not base64, not an image, too many bytes or pixels, undecodable) is an HTTP 400 naming it.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpustream import storage
from tpustream.errors import TpustreamError

if TYPE_CHECKING:
    import torch

    from tpustream.transforms import Prepared

__all__ = [
    "BadImage",
    "Classifier",
    "ClassifierPredictor",
    "Limits",
    "SERVING_ENV",
    "SERVING_PORT",
    "HEALTH_ROUTE",
    "PREDICT_ROUTE",
    "image_format",
    "resolve_model_uri",
]

log = logging.getLogger(__name__)

# What the serving image runs (containers/serve/Dockerfile sets the same; promote uploads them as the
# container's env): the SDK's handler with this module's predictor, as LocalModel.build_cpr_model does.
SERVING_ENV = {
    "HANDLER_MODULE": "google.cloud.aiplatform.prediction.handler",
    "HANDLER_CLASS": "PredictionHandler",
    "PREDICTOR_MODULE": "tpustream.serving",
    "PREDICTOR_CLASS": "ClassifierPredictor",
}
# The CPR defaults (google.cloud.aiplatform.prediction.DEFAULT_HTTP_PORT / _HEALTH_ROUTE / _PREDICT_ROUTE):
# the upload names them in the container spec and Vertex passes them back as AIP_HTTP_PORT etc.
SERVING_PORT = 8080
HEALTH_ROUTE = "/health"
PREDICT_ROUTE = "/predict"

_MAGIC = ((b"\xff\xd8\xff", "jpg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"P6", "ppm"))


class BadImage(TpustreamError, ValueError):
    """One image cannot be classified (not an image, too large, undecodable); the message says which."""


def image_format(data: bytes) -> str | None:
    """``jpg``, ``png`` or ``ppm`` from the file's first bytes, else None."""
    for magic, ext in _MAGIC:
        if data.startswith(magic):
            return ext
    return None


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer: unset it or give a positive number") from None
    if value < 1:
        raise ValueError(f"{name}={raw!r} must be positive")
    return value


@dataclass(frozen=True)
class Limits:
    """What one request may hold. Vertex's public endpoints accept at most 1.5 MB per request anyway; the
    pixel budget is what bounds memory (a 20 KB PNG can claim 169 MP): it is checked from the image's
    header before any decoding (``prepare_image``)."""

    max_instances: int = 64
    max_image_bytes: int = 8 << 20
    max_pixels: int = 1 << 24  # 16.8 MP: any camera photo up to 16 MP (48 MiB decoded); see imagecodec
    top_k: int = 5
    batch_size: int = 32

    @classmethod
    def from_env(cls) -> Limits:
        """TPUSTREAM_MAX_INSTANCES, TPUSTREAM_MAX_IMAGE_BYTES, TPUSTREAM_MAX_PIXELS, TPUSTREAM_TOP_K,
        TPUSTREAM_BATCH_SIZE (set them in the model's container env to change a deployment)."""
        return cls(
            max_instances=_env_int("TPUSTREAM_MAX_INSTANCES", cls.max_instances),
            max_image_bytes=_env_int("TPUSTREAM_MAX_IMAGE_BYTES", cls.max_image_bytes),
            max_pixels=_env_int("TPUSTREAM_MAX_PIXELS", cls.max_pixels),
            top_k=_env_int("TPUSTREAM_TOP_K", cls.top_k),
            batch_size=_env_int("TPUSTREAM_BATCH_SIZE", cls.batch_size),
        )


def resolve_model_uri(uri: str) -> str:
    """A model directory (model.json) as is; a registry (champion.json) -> its champion's version."""
    from tpustream import promote

    uri = storage.check_uri(uri).rstrip("/")
    if storage.exists(storage.join(uri, "model.json")):
        return uri
    if storage.exists(storage.join(uri, promote.CHAMPION)):
        champion = promote.read_champion(uri)
        assert champion is not None
        version = promote.version_uri(uri, champion["version"])
        log.info("%s is a registry: using its champion, version %s (%s)", uri, champion["version"], version)
        return version
    raise BadModel(
        f"--model {uri}: neither a model directory (model.json) nor a registry with a champion "
        "(champion.json): give the output of `tpustream train` or a promoted registry"
    )


class BadModel(TpustreamError, ValueError):
    """The model artifact cannot be served; the message says what and what to do."""


class Classifier:
    """A model artifact ready to classify image bytes: top-k classes with probabilities per image."""

    def __init__(self, model_uri: str, *, limits: Limits | None = None, device: Any = None) -> None:
        import torch

        from tpustream.checkpoint import CheckpointError, load_torch_file
        from tpustream.evaluate import EvaluationError, load_model_card
        from tpustream.models import build_model
        from tpustream.transforms import IMAGENET_MEAN, IMAGENET_STD, Augment

        self.limits = limits or Limits()
        self.uri = resolve_model_uri(model_uri)
        try:
            card = load_model_card(self.uri)
        except EvaluationError as exc:
            raise BadModel(str(exc)) from exc
        self.classes: list[str] = [str(c) for c in card["classes"]]
        self.input_size = int(card["input_size"])
        norm = card.get("normalization") or {}
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
        model = build_model(
            card["arch"], num_classes=len(self.classes), input_size=self.input_size,
            in_channels=int(card.get("in_channels", 3)),
        )  # fmt: skip
        try:
            model.load_state_dict(weights)
        except RuntimeError as exc:
            raise BadModel(
                f"{self.uri}/model.pt does not match its model.json ({card['arch']}): {exc}"
            ) from exc
        self.device = device if device is not None else torch.device("cpu")
        self.model = model.to(self.device).eval()
        self.augment = Augment(
            output_size=self.input_size, train=False, max_pixels=self.limits.max_pixels, exif=True
        )

    # ------------------------------------------------------------------ images -> uint8 pixels

    def prepare(self, data: bytes, name: str = "image") -> Prepared:
        """Decode one image (its header's pixel count checked before decoding) and place its centre crop."""
        from tpustream.imagecodec import ImageTooLarge
        from tpustream.transforms import prepare_image

        if len(data) > self.limits.max_image_bytes:
            raise BadImage(
                f"{name}: {len(data)} bytes exceeds the {self.limits.max_image_bytes}-byte image limit "
                "(TPUSTREAM_MAX_IMAGE_BYTES): send a smaller image"
            )
        ext = image_format(data)
        if ext is None:
            raise BadImage(f"{name}: not a JPEG, PNG or PPM image (starts with {data[:8]!r})")
        try:
            return prepare_image(data, ext, self.augment, random.Random(0))  # val: no randomness used
        except ImageTooLarge as exc:
            raise BadImage(
                f"{name}: {exc}".replace("raise --max-pixels", "raise TPUSTREAM_MAX_PIXELS")
            ) from exc
        except Exception as exc:  # PIL/simplejpeg raise many types for a damaged file
            kind = {"jpg": "JPEG", "png": "PNG", "ppm": "PPM"}[ext]
            raise BadImage(f"{name}: undecodable {kind} ({type(exc).__name__}: {exc})") from exc

    def pixels(self, prepared: list[Prepared]) -> torch.Tensor:
        """N x 3 x S x S uint8: the evaluation loader's render (render_batch), with small same-shaped
        images always upscaled by the batched resample, also when one is alone in its request."""
        import torch

        from tpustream.transforms import render_batch

        size = self.input_size
        out = torch.empty((len(prepared), 3, size, size), dtype=torch.uint8)
        render_batch(prepared, size, out, batch_alone=True)
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
                    results.append({
                        "classes": [self.classes[i] for i in i_row],
                        "class_indices": i_row,
                        "probabilities": [round(p, 6) for p in p_row],
                    })  # fmt: skip
        return results


def _http_error(status: int, message: str) -> Exception:
    from fastapi import HTTPException

    return HTTPException(status_code=status, detail=message)


def _decode_instance(instance: Any, index: int, limits: Limits) -> bytes:
    encoded = instance.get("b64") if isinstance(instance, dict) else None
    if not isinstance(encoded, str):
        raise BadImage(
            f'instance {index}: expected {{"b64": "<base64 JPEG, PNG or PPM bytes>"}}, got {str(instance)[:80]}'
        )
    if len(encoded) > 4 * ((limits.max_image_bytes + 2) // 3) + 4:  # before decoding it
        raise BadImage(
            f"instance {index}: {len(encoded)} base64 characters exceed the {limits.max_image_bytes}-byte "
            "image limit (TPUSTREAM_MAX_IMAGE_BYTES): send a smaller image"
        )
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadImage(f"instance {index}: not valid base64 ({exc})") from exc


try:  # the prediction extra (fastapi, uvicorn, docker) is a dependency; guarded so `--help` stays light
    from google.cloud.aiplatform.prediction.predictor import Predictor as _Predictor
except ImportError:  # pragma: no cover - reported by the model server itself
    _Predictor = object  # type: ignore[misc,assignment]


class ClassifierPredictor(_Predictor):  # type: ignore[misc,valid-type]
    """The CPR ``Predictor``: ``load`` once per server process, then preprocess -> predict -> postprocess
    per request (``PredictionHandler.handle``; an ``HTTPException`` raised here reaches the client as is,
    anything else becomes a 500: google/cloud/aiplatform/prediction/handler.py)."""

    def load(self, artifacts_uri: str, **kwargs: Any) -> None:
        if not artifacts_uri:
            raise BadModel(
                "AIP_STORAGE_URI is not set: Vertex sets it from the model's artifact_uri; locally, point it "
                "at a model directory or a registry"
            )
        self.limits = Limits.from_env()
        self.classifier = Classifier(artifacts_uri, limits=self.limits)
        log.info(
            "serving %s (%d classes, %d px, sha256 %s)", self.classifier.uri, len(self.classifier.classes),
            self.classifier.input_size, self.classifier.model_sha256[:12],
        )  # fmt: skip

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
        if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
            raise _http_error(400, f"parameters.top_k must be a positive integer, got {top_k!r}")
        try:
            prepared = [
                self.classifier.prepare(_decode_instance(instance, i, self.limits), f"instance {i}")
                for i, instance in enumerate(instances)
            ]
        except BadImage as exc:
            raise _http_error(400, str(exc)) from exc
        return self.classifier.pixels(prepared), top_k

    def predict(self, instances: tuple[Any, int | None]) -> list[dict[str, Any]]:
        pixels, top_k = instances
        return self.classifier.classify(pixels, top_k)

    def postprocess(self, prediction_results: list[dict[str, Any]]) -> dict[str, Any]:
        return {"predictions": prediction_results}
