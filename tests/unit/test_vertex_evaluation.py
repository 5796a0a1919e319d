"""The Vertex model evaluation of an evaluate run with per-sample scores: its confidence points, AU-PRC and
AU-ROC, the confusion matrix sent once and capped, the body parsed as Vertex's ImportModelEvaluationRequest,
and its size for 10 and 1,000 classes."""

import json

import numpy as np
import pytest
from google.cloud.aiplatform_v1.types import ImportModelEvaluationRequest

from tests.fakes.vertex import classification_metrics_problem, validate_body
from tpustream.artifacts import EvalReport
from tpustream.metrics.classification import THRESHOLDS
from tpustream.metrics.scores import SampleScore, metrics_from_scores, scores_top_k
from tpustream.vertex.evaluation import CONFUSION_MAX_CLASSES, classification_evaluation


def evaluate_document(num_classes, num_samples, seed=0):
    """A metrics.json as evaluate writes it, from constructed per-sample scores of a half-right model."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, num_samples)
    logits = rng.normal(size=(num_samples, num_classes)) + 3.0 * np.eye(num_classes)[labels]
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    k = scores_top_k(num_classes)
    top = np.argsort(-probabilities, axis=1)[:, :k]
    rows = [
        SampleScore(
            key=str(i),
            source="",
            label=int(label),
            true_class=str(label),
            top_classes=t.tolist(),
            probabilities=np.round(probabilities[i, t], 6).tolist(),
        )
        for i, (label, t) in enumerate(zip(labels, top, strict=True))
    ]
    matrix = np.zeros((num_classes, num_classes), int)
    np.add.at(matrix, (labels, top[:, 0]), 1)
    top1 = float(np.trace(matrix) / num_samples)
    candidate = {
        "model_sha256": "cd" * 32,
        "num_samples": num_samples,
        "complete": True,
        "top1": top1,
        "top5": min(1.0, top1 + 0.1),
        "loss": 0.9,
        "confusion_matrix": matrix.tolist(),
        **metrics_from_scores(rows, num_classes).to_json(),
    }
    return {
        "classes": [f"class-{i:04d}" for i in range(num_classes)],
        "dataset": {"uri": "gs://b/data", "manifest_digest": "ab" * 32},
        "candidate": candidate,
    }


def request_body(evaluation):
    """The JSON body the v1 client sends (camelCase, as Vertex parses it)."""
    request = ImportModelEvaluationRequest(
        parent="projects/p/locations/l/models/1@1", model_evaluation=evaluation
    )
    return json.loads(ImportModelEvaluationRequest.to_json(request))


@pytest.mark.parametrize("num_classes", [10, 1000])
def test_the_evaluation_carries_the_threshold_curve_and_a_capped_matrix_once(num_classes):
    document = evaluate_document(num_classes, num_samples=4000)
    candidate = document["candidate"]
    evaluation = classification_evaluation(EvalReport.from_json(document), "gs://b/eval/metrics.json")
    metrics = evaluation["metrics"]
    assert classification_metrics_problem(metrics) is None
    body = request_body(evaluation)
    validate_body(ImportModelEvaluationRequest, body)  # no field Vertex does not have
    size = len(json.dumps(body, separators=(",", ":")).encode())
    print(f"ImportModelEvaluation request body, {num_classes} classes: {size} bytes")
    assert size < 1_000_000  # ~1.5 MB is the common request-size limit
    assert metrics["auPrc"] == candidate["auprc"] and metrics["auRoc"] == candidate["auroc"]
    points = [p for p in metrics["confidenceMetrics"] if "maxPredictions" not in p]
    assert [p["confidenceThreshold"] for p in points] == list(THRESHOLDS)
    assert all("confusionMatrix" not in p for p in metrics["confidenceMetrics"])  # sent once
    at_zero, at_half = points[0], points[50]
    assert at_zero["recall"] == 1.0 and at_zero["precision"] == pytest.approx(1 / num_classes)
    assert at_zero["recallAt1"] == at_zero["precisionAt1"] == pytest.approx(candidate["top1"])
    table = candidate["thresholds"][50]
    assert (at_half["precisionAt1"], at_half["recallAt1"]) == (table["precision"], table["recall"])
    # precision rises and recall falls as the threshold rises
    assert (
        points[-1]["precisionAt1"] >= at_zero["precisionAt1"]
        and points[-1]["recallAt1"] <= at_zero["recallAt1"]
    )
    specs = metrics["confusionMatrix"]["annotationSpecs"]
    matrix = np.array(candidate["confusion_matrix"])
    if num_classes <= CONFUSION_MAX_CLASSES:
        assert metrics["confusionMatrix"]["rows"] == candidate["confusion_matrix"]
        assert "confusion_matrix_classes" not in evaluation["metadata"]
    else:
        kept = [int(spec["id"]) for spec in specs]
        assert len(kept) == CONFUSION_MAX_CLASSES and kept == sorted(kept)
        errors = matrix.sum(axis=0) + matrix.sum(axis=1) - 2 * np.diag(matrix)
        assert min(errors[kept]) >= max(np.delete(errors, kept))  # the classes with the most errors
        assert metrics["confusionMatrix"]["rows"] == matrix[np.ix_(kept, kept)].tolist()
        assert evaluation["metadata"]["confusion_matrix_classes"].startswith(
            f"{CONFUSION_MAX_CLASSES} of {num_classes} classes: those with the most errors"
        )
    assert evaluation["metadata"]["macro_f1"] == candidate["macro_f1"]
