"""A tpustream evaluation as a Vertex AI model evaluation: ``classification_evaluation`` turns evaluate's
metrics.json into a ``ModelEvaluation`` in Vertex's classification schema, ``import_evaluation`` imports it
into a model version once (the same model on the same dataset is not imported twice)."""

from __future__ import annotations

import logging
import math
from typing import Any, TypeGuard

from tpustream.artifacts import EvalReport

__all__ = ["EVALUATION_SCHEMA", "CONFUSION_MAX_CLASSES", "classification_evaluation", "import_evaluation"]

log = logging.getLogger(__name__)

# Vertex's classification metrics schema (ModelEvaluation.metrics_schema_uri): the URI GCPC's evaluation
# importer uses for classification (google_cloud_pipeline_components/container/_implementation/
# model_evaluation/import_model_evaluation.py, PROBLEM_TYPE_TO_SCHEMA_URI)
EVALUATION_SCHEMA = "gs://google-cloud-aiplatform/schema/modelevaluation/classification_metrics_1.0.0.yaml"


def _finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# The confusion matrix is sent once, and for at most this many classes: a full matrix of 1,000 classes is a
# million cells (megabytes of JSON, past common request-size limits); the classes with the most errors are
# the rows a person reads first.
CONFUSION_MAX_CLASSES = 100


def classification_evaluation(report: EvalReport, metrics_uri: str = "") -> dict[str, Any]:
    """A ``ModelEvaluation`` request body (snake-case fields, as the v1 client takes it) of the candidate in a
    ``tpustream evaluate`` metrics.json, its ``metrics`` in Vertex's classification schema.

    The fields are the schema's (aiplatform v1 REST "SchemaModelevaluationMetricsClassificationEvaluationMetrics";
    the same names in GCPC's ``google.ClassificationMetrics`` artifact schema, types/artifact_types.py):
    ``confusionMatrix`` {``annotationSpecs`` [{id, displayName}], ``rows``: rows[i][j] = val samples of class i
    predicted as j, which is evaluate's matrix}, sent once, capped at ``CONFUSION_MAX_CLASSES`` classes (those
    with the most errors; the metadata says so); ``logLoss`` (evaluate's mean cross-entropy); ``auPrc`` and
    ``auRoc`` (micro, one-vs-rest over the per-sample scores); ``confidenceMetrics``: one point per confidence
    threshold of evaluate's table (``recall``/``precision``: every class at or above the threshold counts as
    predicted; ``*At1``: the top-1 prediction only, when it reaches the threshold), and with more than five
    classes a ``maxPredictions`` 5 point at threshold 0 (top-5). An evaluation written before the per-sample
    scores has only the threshold-0 point these counts determine exactly. Annotation spec ids are the model's
    class indices (a custom model has no dataset annotation specs)."""
    candidate = report.candidate
    classes = [str(name) for name in report.classes]
    count = len(classes)
    matrix = [[int(cell) for cell in row] for row in candidate.confusion_matrix]
    shown = _confusion_classes(matrix, CONFUSION_MAX_CLASSES)
    confusion = {
        "annotationSpecs": [{"id": str(index), "displayName": classes[index]} for index in shown],
        "rows": [[matrix[i][j] for j in shown] for i in shown],
    }
    top1, top5 = candidate.top1, candidate.top5
    thresholds = candidate.thresholds
    if thresholds:
        confidence = [_confidence_point(row) for row in thresholds]
    else:  # an evaluation before per-sample scores: the one point its counts determine
        confidence = [
            {
                "confidenceThreshold": 0.0,
                "recall": 1.0,
                "precision": 1.0 / count,
                "f1Score": 2.0 / (count + 1),
                "recallAt1": top1,
                "precisionAt1": top1,  # one label per sample, one prediction: precision@1 = recall@1 = top-1
                "f1ScoreAt1": top1,
            }
        ]
    if count > 5 and _finite(top5):
        confidence.append(
            {"confidenceThreshold": 0.0, "maxPredictions": 5, "recall": top5, "precision": top5 / 5}
        )
    metrics: dict[str, Any] = {"confusionMatrix": confusion, "confidenceMetrics": confidence}
    for field_name, key in (("logLoss", "loss"), ("auPrc", "auprc"), ("auRoc", "auroc")):
        if _finite(candidate.metric(key)):
            metrics[field_name] = candidate.metric(key)
    metadata = {
        # the keys GCPC's importer writes (evaluation_dataset_type/_path), plus where the numbers come from
        "evaluation_dataset_type": "tpustream-shards",
        "evaluation_dataset_path": [report.dataset.uri],
        "dataset_manifest_digest": report.dataset.manifest_digest,
        "model_sha256": candidate.model_sha256,
        "num_samples": candidate.num_samples,
        "top1": top1,
        "top5": top5,
        "tpustream_metrics": metrics_uri,
    }
    for key in ("macro_f1", "balanced_accuracy"):
        if _finite(candidate.metric(key)):
            metadata[key] = candidate.metric(key)
    if len(shown) < count:
        metadata["confusion_matrix_classes"] = (
            f"{len(shown)} of {count} classes: those with the most errors (false negatives + false positives); "
            f"the full matrix is in {metrics_uri or 'metrics.json'}"
        )
    return {
        "display_name": _evaluation_name(report),
        "metrics_schema_uri": EVALUATION_SCHEMA,
        "metrics": metrics,
        "metadata": metadata,
    }


def _confidence_point(row: dict[str, Any]) -> dict[str, Any]:
    """One row of evaluate's threshold table as a ``ConfidenceMetrics`` point."""
    precision, recall = row["micro_precision"], row["micro_recall"]
    return {
        "confidenceThreshold": row["threshold"],
        "recall": recall,
        "precision": precision,
        "f1Score": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "recallAt1": row["recall"],
        "precisionAt1": row["precision"],
        "f1ScoreAt1": row["f1"],
    }


def _confusion_classes(matrix: list[list[int]], limit: int) -> list[int]:
    """The class indices the sent matrix keeps: all up to ``limit``, else the ``limit`` with the most errors
    (its samples predicted as another class, plus other classes' samples predicted as it), in class order."""
    count = len(matrix)
    if count <= limit:
        return list(range(count))
    errors = [sum(matrix[i]) + sum(row[i] for row in matrix) - 2 * matrix[i][i] for i in range(count)]
    ranked = sorted(range(count), key=lambda i: (-errors[i], i))
    return sorted(ranked[:limit])


def _evaluation_name(report: EvalReport) -> str:
    """The display name that identifies an evaluation: the same model on the same dataset is imported once."""
    digest = report.dataset.manifest_digest[:12]
    return f"tpustream evaluate: {report.candidate.num_samples} val samples of dataset {digest}"


def import_evaluation(
    client: Any, versioned_name: str, report: EvalReport, metrics_uri: str = ""
) -> str | None:
    """Import the evaluation in ``report`` into the model version ``versioned_name`` (ID@VERSION) unless
    that version has it already (same display name: same dataset); returns its resource name, or None for a
    partial evaluation, which is not imported. ``client``: the v1 ModelServiceClient
    (``tpustream.vertex.model_registry.v1_client("model")``)."""
    if not report.candidate.complete:
        log.warning(
            "not importing the evaluation into %s: it did not cover the whole val split", versioned_name
        )
        return None
    wanted = _evaluation_name(report)
    for existing in client.list_model_evaluations(parent=versioned_name):
        if existing.display_name == wanted:
            log.info("Vertex AI: %s has this evaluation already (%s)", versioned_name, existing.name)
            return str(existing.name)
    imported = client.import_model_evaluation(
        parent=versioned_name, model_evaluation=classification_evaluation(report, metrics_uri)
    )
    log.info("Vertex AI: imported the evaluation of %s as %s", versioned_name, imported.name)
    return str(imported.name)
