"""Vertex AI: ``model_registry`` (Model Registry uploads and evaluations), ``batch_prediction`` and ``experiments``.

The names below are the package's public API, imported on first use so that importing the package loads nothing
heavy (``tpustream --help`` stays torch-free); the modules themselves are imported by their full path inside tpustream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from tpustream.vertex.batch_prediction import predict_on_vertex
    from tpustream.vertex.evaluation import classification_evaluation
    from tpustream.vertex.experiments import ExperimentError, join_experiment
    from tpustream.vertex.model_registry import PublishedModel, VertexError, VertexTarget, publish

_HOMES = {
    "publish": "model_registry",
    "PublishedModel": "model_registry",
    "classification_evaluation": "evaluation",
    "VertexError": "model_registry",
    "VertexTarget": "model_registry",
    "predict_on_vertex": "batch_prediction",
    "join_experiment": "experiments",
    "ExperimentError": "experiments",
}
__all__ = [
    "VertexError",
    "VertexTarget",
    "publish",
    "PublishedModel",
    "classification_evaluation",
    "predict_on_vertex",
    "ExperimentError",
    "join_experiment",
]

__getattr__, __dir__ = lazy_front(__name__, _HOMES)
