"""Serving: ``server`` is the model server's handler and predictor, ``contract`` its routes and environment,
``classifier`` the model they run, ``request`` the request body and its checks, ``admission`` and ``settings``
the budgets and limits, ``automl`` the AutoML-compatible format, ``validate`` serving validation, ``predict``
batch prediction.

The names below are the package's public API, imported on first use so that importing the package loads nothing
heavy (``tpustream --help`` stays torch-free); the modules themselves are imported by their full path inside tpustream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from tpustream.serve.classifier import Classifier
    from tpustream.serve.predict.config import PredictConfig, PredictError
    from tpustream.serve.server import ClassifierHandler, ClassifierPredictor
    from tpustream.serve.validate import ServingValidationError, validate_serving

_HOMES = {
    "ClassifierHandler": "server",
    "ClassifierPredictor": "server",
    "Classifier": "classifier",
    "validate_serving": "validate",
    "ServingValidationError": "validate",
    "PredictConfig": "predict.config",
    "PredictError": "predict.config",
}
__all__ = [
    "Classifier",
    "ClassifierHandler",
    "ClassifierPredictor",
    "ServingValidationError",
    "validate_serving",
    "PredictConfig",
    "PredictError",
]

__getattr__, __dir__ = lazy_front(__name__, _HOMES)
