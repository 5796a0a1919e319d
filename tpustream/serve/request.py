"""The predict request: its body parsed strictly (``parse_request``), its instances checked from base64
lengths and image headers without decoding a pixel (``CheckedRequest``), and the HTTP errors that answer a bad
one (a short ``detail`` that never quotes the request).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import re
from dataclasses import dataclass
from typing import Any, TypedDict

from tpustream.serve.automl import (
    AUTOML_KEY,
    B64_KEY,
    MIME_TYPE_KEYS,
    AutoMLParameters,
    AutoMLPrediction,
    json_type,
)
from tpustream.serve.classifier import BadImage, TopK
from tpustream.serve.settings import Limits
from tpustream.storage.backend import NotFound
from tpustream.storage.gcs import GCS_SCHEME, split_gcs

__all__ = [
    "OWN_PARAMETERS",
    "Batch",
    "CheckedRequest",
    "InstanceError",
    "Prediction",
    "PredictResponse",
    "decode_instance",
    "http_error",
    "parse_request",
    "read_content_object",
]

log = logging.getLogger(__name__)


class InstanceError(TypedDict):
    """A bad instance's slot of the answer: why it was not classified (``instance 3: <why>``)."""

    error: str


# One instance's slot: its top-k, AutoML's result for an AutoML request, or why it failed.
Prediction = TopK | AutoMLPrediction | InstanceError


class PredictResponse(TypedDict):
    """The answer's body: one prediction per instance, in order."""

    predictions: list[Prediction]


# The parameters of tpustream's own format (``{"b64"}`` instances): any other field is refused, naming it.
OWN_PARAMETERS = ("top_k",)
_MAX_DETAIL = 300  # characters of an error message sent back
_MAX_INT_DIGITS = 30  # the request's only integer is top_k; longer ones cost quadratic time to convert
_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# Cloud Storage's bucket and object naming rules (https://cloud.google.com/storage/docs/buckets#naming,
# https://cloud.google.com/storage/docs/objects#naming): a name GCS would refuse is not sent to it
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")


def http_error(status: int, message: str, headers: dict[str, str] | None = None) -> Exception:
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


def parse_request(body: bytes) -> dict[str, object]:
    """The request body as a JSON object, strictly: UTF-8, standard JSON (no NaN/Infinity), integers of at
    most 30 digits, finite numbers, nesting within Python's recursion limit. Raises an HTTP 400 whose
    message quotes nothing of the body."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise http_error(
            400, f"the request body is not UTF-8 text (invalid byte at offset {exc.start}): send JSON"
        ) from None
    try:
        value = json.loads(
            text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_refuse_constant
        )
    except _BadNumber as exc:
        raise http_error(400, f"JSON deserialization failed: {exc}") from None
    except json.JSONDecodeError as exc:
        raise http_error(
            400, f"JSON deserialization failed: {exc.msg} (line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise http_error(400, "JSON deserialization failed: nested too deeply") from None
    if not isinstance(value, dict):
        raise http_error(
            400,
            f'the request body must be a JSON object {{"instances": [...]}}, not a {type(value).__name__}',
        )
    return value


def decode_instance(instance: Any, index: int, limits: Limits, key: str = B64_KEY) -> bytes:
    """The image bytes of one instance, ``{"b64": ...}`` or (an AutoML request's) ``{"content": ...}``: base64
    bytes, or for ``content`` a ``gs://`` URI read under the same image budget (``read_content_object``)."""
    encoded = instance.get(key) if isinstance(instance, dict) else None
    if not isinstance(encoded, str):
        raise BadImage(
            f'instance {index}: expected {{"{key}": "<base64 image bytes>"}}, got a JSON {json_type(instance)}'
            + (f' without a "{key}" string' if isinstance(instance, dict) else "")
        )
    if key == AUTOML_KEY:
        if any(not isinstance(instance.get(name, ""), str) for name in MIME_TYPE_KEYS):
            raise BadImage(f'instance {index}: "mimeType" must be a string (e.g. "image/jpeg")')
        # google-cloud-aiplatform 1.165.1, google/cloud/aiplatform/v1/schema/predict/instance_v1/types/
        # image_classification.py, ImageClassificationPredictionInstance.content: "The image bytes or Cloud
        # Storage URI to make the prediction on": an AutoML batch file names its images by gs:// URI.
        if encoded.startswith(GCS_SCHEME):
            return read_content_object(encoded, index, limits)
        if _URI_SCHEME.match(encoded):  # base64 has no ':': a URI of another scheme, never read
            raise BadImage(
                f'instance {index}: "content" is a URI of a scheme this server does not read: send the image '
                "bytes base64-encoded, or a gs://BUCKET/OBJECT URI"
            )
    if len(encoded) > 4 * ((limits.max_image_bytes + 2) // 3) + 4:  # before decoding it
        raise BadImage(
            f"instance {index}: {len(encoded)} base64 characters exceed the {limits.max_image_bytes}-byte "
            "image limit (TPUSTREAM_MAX_IMAGE_BYTES): send a smaller image"
        )
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        what = (
            " (content: base64 image bytes or a gs:// URI; a local path is never read)"
            if key == AUTOML_KEY
            else ""
        )
        raise BadImage(f"instance {index}: not valid base64 ({str(exc)[:80]}){what}") from exc


def read_content_object(uri: str, index: int, limits: Limits) -> bytes:
    """The image an AutoML instance's ``content`` names as a Cloud Storage URI, read with the serving
    container's credentials (its service account on Vertex) in one ranged GET of at most
    ``max_image_bytes`` + 1 bytes: an object over the image budget, missing or unreadable fails its instance
    only. The message names no part of the URI (an error never quotes the request)."""
    from tpustream.storage import io as storage

    bucket, name = split_gcs(uri)
    if not _BUCKET.match(bucket) or not name or name.endswith("/") or len(name.encode()) > 1024:
        raise BadImage(
            f'instance {index}: "content" is not the Cloud Storage URI of an object: give gs://BUCKET/OBJECT (a '
            "bucket name of 3-222 characters, an object name of at most 1024 bytes)"
        )
    try:
        data = storage.read_range(storage.check_uri(uri), 0, limits.max_image_bytes + 1)
    except NotFound:
        raise BadImage(
            f'instance {index}: the Cloud Storage object its "content" names does not exist: check the URI'
        ) from None
    except (
        Exception
    ) as exc:  # permission denied, a range on an empty object, a bad bucket name: its own error
        log.warning("instance %d: reading its gs:// content failed: %s", index, exc)
        raise BadImage(
            f'instance {index}: the Cloud Storage object its "content" names could not be read (permission '
            "denied, empty or unavailable; the server log says which): grant the serving service account "
            "roles/storage.objectViewer on it, or send the image bytes"
        ) from None
    if len(data) > limits.max_image_bytes:
        raise BadImage(
            f'instance {index}: the Cloud Storage object its "content" names exceeds the '
            f"{limits.max_image_bytes}-byte image limit (TPUSTREAM_MAX_IMAGE_BYTES): send a smaller image"
        )
    return data


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
    fetched_bytes: int = 0  # of image_bytes, those read from Cloud Storage (AutoML gs:// content)

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
        raise http_error(400, first + more if len(first) + len(more) <= _MAX_DETAIL else first)


@dataclass(frozen=True, kw_only=True)
class Batch:
    """A request's decoded images: ``pixels`` has a row per instance not in ``failed``, in order."""

    pixels: Any  # torch.Tensor, N x 3 x S x S uint8
    count: int
    failed: dict[int, str]
    top_k: int | None
    automl: AutoMLParameters | None = None
