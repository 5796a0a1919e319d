"""AutoML image classification's request and answer format, which the model server also speaks, so that a
client written for an AutoML endpoint can call a tpustream model unchanged.

The format is Vertex AI's schema for AutoML image classification models, as google-cloud-aiplatform ships
it (google/cloud/aiplatform/v1/schema/predict/...; tests parse our bodies into these messages with
``json_format.ParseDict(..., ignore_unknown_fields=False)``):

- an instance: ``instance_v1.types.ImageClassificationPredictionInstance`` (``aiplatform.gapic.schema.predict.
  instance.ImageClassificationPredictionInstance``): ``{"content": "<base64 image>", "mimeType": "image/png"}``.
  ``content`` may also be a Cloud Storage URI there (``gs://BUCKET/OBJECT``, as an AutoML batch file names its
  images): the server reads that object with its own credentials, under the same image and request budgets as
  inline bytes, and a missing, unreadable or oversized object fails its instance only; no other scheme and
  no local path is ever read. ``mimeType`` is accepted and not trusted: the format is recognised from the
  bytes, as for ``{"b64"}`` instances.
- the parameters: ``params_v1.types.ImageClassificationPredictionParams``: ``confidenceThreshold`` ("only
  predictions with at least this confidence score. Default value is 0.0") and ``maxPredictions`` ("up to
  that many top, by confidence score, predictions per instance. If this number is very high, the Model may
  return fewer predictions. Default value is 10"): a number over the class count is capped, not refused, and
  0 is the default (proto3 cannot tell 0 from unset: ``MessageToDict``, which the SDK's ``to_value`` uses,
  leaves it out).
- a prediction: ``prediction_v1.types.ClassificationPredictionResult``: ``ids`` (int64: strings in proto3's
  JSON, as AutoML answers them; here the class index), ``displayNames`` (the class names), ``confidences``
  (softmax probabilities), in decreasing confidence.

The schemata's published URIs (``PREDICT_SCHEMATA``) are what an AutoML image classification model's
``predictSchemata`` holds; ``tpustream.vertex.model_registry`` declares them on upload (``Model.predict_schemata``:
https://cloud.google.com/vertex-ai/docs/reference/rest/v1/PredictSchemata).

Which format a request is in is read from its instances' key, per request: ``{"content"}`` instances are
AutoML's (AutoML's parameters, AutoML's answer), ``{"b64"}`` instances tpustream's (``top_k``; ``classes``,
``class_indices``, ``probabilities``). A request mixing them, or one format's parameters with the other's
instances, is refused. Torch-free, like ``serve.contract``: ``tpustream.vertex.model_registry`` reads the URIs from here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from tpustream.errors import TpustreamError

if TYPE_CHECKING:
    from tpustream.serve.classifier import TopK

__all__ = [
    "AUTOML_KEY",
    "B64_KEY",
    "AutoMLParameters",
    "AutoMLPrediction",
    "BadRequest",
    "MIME_TYPE_KEYS",
    "PREDICT_SCHEMATA",
    "automl_prediction",
    "field_names",
    "json_type",
    "parse_automl_parameters",
    "refuse_automl_parameters",
    "request_format",
]

_SCHEMA = "gs://google-cloud-aiplatform/schema/predict"
# Model.predict_schemata of an AutoML image classification model (aiplatform v1 PredictSchemata's fields).
PREDICT_SCHEMATA = {
    "instance_schema_uri": f"{_SCHEMA}/instance/image_classification_1.0.0.yaml",
    "parameters_schema_uri": f"{_SCHEMA}/params/image_classification_1.0.0.yaml",
    "prediction_schema_uri": f"{_SCHEMA}/prediction/classification_1.0.0.yaml",
}

B64_KEY = "b64"  # Vertex's binary-data convention: tpustream's own format
AUTOML_KEY = "content"  # ImageClassificationPredictionInstance.content
MIME_TYPE_KEYS = ("mimeType", "mime_type")  # its JSON name and its field name: ParseDict takes both
# ImageClassificationPredictionParams' fields, by JSON name and field name (ParseDict accepts either)
_THRESHOLD_KEYS = ("confidenceThreshold", "confidence_threshold")
_MAX_PREDICTIONS_KEYS = ("maxPredictions", "max_predictions")
_AUTOML_PARAMETERS = (*_THRESHOLD_KEYS, *_MAX_PREDICTIONS_KEYS)
_INT32_MAX = 2**31 - 1
# A request's field name that an error may quote: a short identifier (a longer or odd one is only counted).
_NAMEABLE_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,39}$")


class BadRequest(TpustreamError, ValueError):
    """The request's format or parameters are wrong; the message (an HTTP 400's) quotes nothing of it."""


class AutoMLPrediction(TypedDict):
    """One image's answer to an AutoML request (ClassificationPredictionResult, by its JSON names)."""

    ids: list[str]  # class indices, as strings
    displayNames: list[str]  # the schema's JSON name (camelCase)
    confidences: list[float]


@dataclass(frozen=True, kw_only=True)
class AutoMLParameters:
    """An AutoML request's parameters, with the schema's defaults (0.0 and 10)."""

    confidence_threshold: float = 0.0
    max_predictions: int = 10


def request_format(instances: list[Any]) -> Literal["automl", "tpustream"]:
    """``"automl"`` when the instances are ``{"content"}``, else ``"tpustream"``; a request with both kinds
    (or an instance with both keys) is a BadRequest. Instances with neither fail alone, later."""
    keys = {
        key for item in instances if isinstance(item, dict) for key in (B64_KEY, AUTOML_KEY) if key in item
    }
    if len(keys) == 2:
        raise BadRequest(
            'the instances mix {"b64": ...} and {"content": ...}: send one format per request ({"b64"} with '
            'parameters.top_k, or AutoML\'s {"content"} with confidenceThreshold / maxPredictions)'
        )
    return "automl" if keys == {AUTOML_KEY} else "tpustream"


def refuse_automl_parameters(parameters: Any) -> None:
    """A ``{"b64"}`` request carrying AutoML's parameters is refused rather than answered without them."""
    if isinstance(parameters, dict) and any(key in parameters for key in _AUTOML_PARAMETERS):
        raise BadRequest(
            'parameters.confidenceThreshold / maxPredictions are AutoML\'s, for {"content": ...} instances: '
            'with {"b64": ...} instances use parameters.top_k, or send {"content"} instances'
        )


def parse_automl_parameters(parameters: Any) -> AutoMLParameters:
    """An AutoML request's ``parameters`` (absent or null: the defaults), strictly: only the schema's two
    fields, a threshold from 0 to 1, a non-negative 32-bit integer of predictions (0: the default)."""
    if parameters is None:
        return AutoMLParameters()
    if not isinstance(parameters, dict):
        raise BadRequest(
            "parameters must be a JSON object {confidenceThreshold, maxPredictions} (AutoML's "
            f"ImageClassificationPredictionParams), got a JSON {json_type(parameters)}"
        )
    if "top_k" in parameters:
        raise BadRequest(
            'parameters.top_k is for {"b64": ...} instances: with AutoML\'s {"content": ...} instances use '
            "parameters.maxPredictions"
        )
    unknown = [key for key in parameters if key not in _AUTOML_PARAMETERS]
    if unknown:
        raise BadRequest(
            f"parameters {field_names(unknown)}: not a field of AutoML's ImageClassificationPredictionParams; "
            "send only confidenceThreshold and maxPredictions"
        )
    defaults = AutoMLParameters()
    threshold = _one_of(parameters, _THRESHOLD_KEYS)
    if threshold is None:
        threshold = defaults.confidence_threshold
    elif isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        kind = json_type(threshold)
        raise BadRequest(
            "parameters.confidenceThreshold must be a number from 0 to 1, got "
            + ("a number outside that range" if kind == "number" else f"a JSON {kind}")
        )
    count = _one_of(parameters, _MAX_PREDICTIONS_KEYS)
    if isinstance(count, float) and count.is_integer() and 0 <= count <= _INT32_MAX:
        count = int(count)  # a batch job's model_parameters is a protobuf Value: its numbers are doubles
    if count is None or count == 0:
        count = defaults.max_predictions
    elif isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= _INT32_MAX:
        kind = json_type(count)
        raise BadRequest(
            f"parameters.maxPredictions must be a positive integer (at most {_INT32_MAX}), got "
            + ("a number that is not one" if kind == "number" else f"a JSON {kind}")
        )
    return AutoMLParameters(confidence_threshold=float(threshold), max_predictions=count)


def _one_of(parameters: dict[str, object], names: tuple[str, str]) -> Any:
    if all(name in parameters for name in names):
        raise BadRequest(f"parameters has both {names[0]} and {names[1]}: send one ({names[0]})")
    return next((parameters[name] for name in names if name in parameters), None)


def automl_prediction(result: TopK, parameters: AutoMLParameters) -> AutoMLPrediction:
    """One image's top-k (``Classifier.classify``'s ``classes``, ``class_indices``, ``probabilities``, at
    least ``max_predictions`` long when the model has that many classes) as AutoML's
    ClassificationPredictionResult: at most ``max_predictions`` classes of at least ``confidence_threshold``."""
    kept = [
        position
        for position, probability in enumerate(result["probabilities"][: parameters.max_predictions])
        if probability >= parameters.confidence_threshold
    ]
    return AutoMLPrediction(
        ids=[str(result["class_indices"][position]) for position in kept],
        displayNames=[result["classes"][position] for position in kept],
        confidences=[result["probabilities"][position] for position in kept],
    )


def field_names(keys: Iterable[str]) -> str:
    """``'topk', 'k'``: a request's field names as an error may say them: a short identifier is quoted, any
    other is only counted (an error never echoes arbitrary request text)."""
    keys = list(keys)
    named = [repr(key) for key in keys if _NAMEABLE_FIELD.match(key)]
    unnamed = len(keys) - len(named)
    if unnamed:
        named.append(f"{unnamed} field{'s' if unnamed > 1 else ''} whose name is not a short identifier")
    return ", ".join(named)


def json_type(value: Any) -> str:
    """What a JSON value is, in JSON's words: what an error may say of a request value instead of quoting it."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object", type(None): "null"}.get(type(value), "value")
