"""Vertex AI on loopback: ``VertexRecorder`` (recorder.py) answers the REST calls the real aiplatform client
makes, one family of calls per module (runs, endpoints, batch, datasets, tuning), each request body checked by
``rules`` as Vertex parses it; ``emulation`` runs a compiled pipeline's tasks as Vertex would, with GCPC's
real launcher (``gcpc_launcher_shim``)."""

from tests.fakes.vertex.datasets import IMAGE_METADATA_SCHEMA, ML_USE_LABEL, TEXT_METADATA_SCHEMA, DatasetRow
from tests.fakes.vertex.recorder import VertexRecorder
from tests.fakes.vertex.rules import (
    CLASSIFICATION_SCHEMA,
    Refused,
    classification_metrics_problem,
    schedule_tick,
    tensorboard_problem,
    tpu_job_hosts,
    validate_body,
)

__all__ = [
    "CLASSIFICATION_SCHEMA",
    "IMAGE_METADATA_SCHEMA",
    "ML_USE_LABEL",
    "TEXT_METADATA_SCHEMA",
    "DatasetRow",
    "Refused",
    "VertexRecorder",
    "classification_metrics_problem",
    "schedule_tick",
    "tensorboard_problem",
    "tpu_job_hosts",
    "validate_body",
]
