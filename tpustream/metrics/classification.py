"""Classification metrics from per-sample scores: per-class precision/recall/F1, macro-F1, balanced accuracy,
a confidence-threshold table, AU-PRC and AU-ROC. Pure numpy: evaluate computes them from the scores it
writes (scores.jsonl.gz, tpustream/metrics/scores.py), and anyone can recompute them from that file.

A sample's scores are its top-k classes and their probabilities (k = every class when there are at most
``scores.FULL_SCORES_MAX_CLASSES``). One-vs-rest curves (AU-PRC, AU-ROC) rank every (sample, class) pair by
its probability; a class outside a sample's top-k counts with probability 0 (the tail of the curve where no
prediction is made), so with all classes stored the curves are exact, and with top-k they are what those
top-k scores support. Conventions (scikit-learn's where it has one):

- a class with no sample (support 0) is not measured: its recall and F1 are None, and it is left out of
  macro-F1 and balanced accuracy (as ``per_class_accuracy`` leaves it out of the per-class check);
- precision of a class never predicted is 0.0 (scikit-learn's ``zero_division=0``); at a confidence
  threshold no prediction reaches, precision is 1.0 (no prediction is wrong: the precision-recall curve's
  convention) and coverage and recall are 0;
- average precision is scikit-learn's step sum ``sum_n (R_n - R_{n-1}) P_n`` over distinct scores (no
  interpolation); ROC AUC is the trapezoid under the ROC curve with ties as one step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "THRESHOLDS",
    "ClassificationMetrics",
    "average_precision",
    "classification_metrics",
    "roc_auc",
]

# Confidence thresholds of the threshold table and of the Vertex evaluation's confidence points: every
# hundredth from 0.00 to 0.99 (the top-1 probability of a sure model crowds above 0.9).
THRESHOLDS: tuple[float, ...] = tuple(round(step / 100, 2) for step in range(100))


@dataclass(frozen=True, kw_only=True)
class ClassificationMetrics:
    """What the per-sample scores say about a model; ``to_json`` is the part of metrics.json they make."""

    num_samples: int
    precision: list[float]  # per class; 0.0 for a class never predicted
    recall: list[float | None]  # per class; None: no sample of the class (not measured)
    f1: list[float | None]
    support: list[int]
    predicted: list[int]  # per class: samples whose top-1 is the class
    macro_f1: float | None  # over the measured classes; None: no sample at all
    balanced_accuracy: float | None  # mean recall over the measured classes
    # per THRESHOLDS entry: {threshold, precision, recall, coverage, f1} of the top-1 prediction, and
    # micro_precision / micro_recall of every (sample, class) pair at or above it (Vertex's "precision", "recall")
    thresholds: list[dict[str, float]]
    auprc: float | None  # micro: every (sample, class) pair one-vs-rest
    auprc_per_class: list[float | None]  # None: no sample of the class
    auroc: float | None  # micro
    scores_top_k: int  # the classes per sample the curves were computed on (= classes: exact)

    def to_json(self) -> dict[str, Any]:
        return {
            "macro_f1": self.macro_f1,
            "balanced_accuracy": self.balanced_accuracy,
            "auprc": self.auprc,
            "auroc": self.auroc,
            "per_class": {
                "precision": self.precision,
                "recall": self.recall,
                "f1": self.f1,
                "support": self.support,
                "predicted": self.predicted,
                "auprc": self.auprc_per_class,
            },
            "thresholds": self.thresholds,
            "scores_top_k": self.scores_top_k,
        }


def classification_metrics(
    labels: Any,
    top_classes: Any,
    top_probabilities: Any,
    num_classes: int,
    *,
    thresholds: tuple[float, ...] = THRESHOLDS,
) -> ClassificationMetrics:
    """The metrics of ``labels`` (int [N]) against each sample's top-k predictions.

    Args:
        labels: the true class index of each sample.
        top_classes: int [N, k], each row the predicted classes by decreasing probability (column 0: top-1).
        top_probabilities: float [N, k], their probabilities.
        num_classes: the model's class count (classes may have no sample).
        thresholds: the confidence thresholds of the table, on the top-1 probability.
    """
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    count = labels.shape[0]
    top_classes = np.asarray(top_classes, dtype=np.int64).reshape(count, -1)
    top_probabilities = np.asarray(top_probabilities, dtype=np.float64).reshape(count, -1)
    k = top_classes.shape[1]
    if count and not (labels.min() >= 0 and labels.max() < num_classes):
        raise ValueError(f"labels must be class indices in [0, {num_classes})")
    if count and not (top_classes.min() >= 0 and top_classes.max() < num_classes):
        raise ValueError(f"top_classes must be class indices in [0, {num_classes})")
    predicted = top_classes[:, 0] if k else np.full(count, -1)
    correct = predicted == labels
    support = np.bincount(labels, minlength=num_classes)
    predicted_count = np.bincount(predicted[predicted >= 0], minlength=num_classes)
    hits = np.bincount(labels[correct], minlength=num_classes)
    precision = [float(h / p) if p else 0.0 for h, p in zip(hits, predicted_count, strict=True)]
    recall = [float(h / s) if s else None for h, s in zip(hits, support, strict=True)]
    f1 = [_f1(p, r) for p, r in zip(precision, recall, strict=True)]
    measured_f1 = [value for value in f1 if value is not None]
    measured_recall = [value for value in recall if value is not None]
    return ClassificationMetrics(
        num_samples=count,
        precision=precision,
        recall=recall,
        f1=f1,
        support=[int(s) for s in support],
        predicted=[int(p) for p in predicted_count],
        macro_f1=float(np.mean(measured_f1)) if measured_f1 else None,
        balanced_accuracy=float(np.mean(measured_recall)) if measured_recall else None,
        thresholds=_threshold_table(labels, top_classes, top_probabilities, num_classes, correct, thresholds),
        auprc=_micro_curve(labels, top_classes, top_probabilities, num_classes, average_precision),
        auprc_per_class=_per_class_auprc(labels, top_classes, top_probabilities, num_classes),
        auroc=_micro_curve(labels, top_classes, top_probabilities, num_classes, roc_auc),
        scores_top_k=k,
    )


def _f1(precision: float, recall: float | None) -> float | None:
    if recall is None:
        return None
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def _threshold_table(
    labels: np.ndarray,
    top_classes: np.ndarray,
    top_probabilities: np.ndarray,
    num_classes: int,
    correct: np.ndarray,
    thresholds: tuple[float, ...],
) -> list[dict[str, float]]:
    """Acting only on predictions whose top-1 probability reaches each threshold: the share of those acted on
    that are right (precision), of all samples that are acted on and right (recall), and acted on (coverage).
    ``micro_*``: every class whose probability reaches the threshold counts as predicted (a class outside the
    stored top-k counts at probability 0, as in the curves)."""
    count = max(1, labels.shape[0])
    confidence = top_probabilities[:, 0] if top_probabilities.shape[1] else np.zeros(labels.shape[0])
    scores, positive, outside = _pairs(labels, top_classes, top_probabilities)
    unstored = labels.shape[0] * (num_classes - top_classes.shape[1])
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    positives_above = np.r_[np.cumsum(positive[order][::-1])[::-1], 0]  # positives at index i and after
    rows = []
    for threshold in thresholds:
        first = int(np.searchsorted(sorted_scores, threshold, side="left"))
        pair_hits = int(positives_above[first]) + (outside if threshold <= 0 else 0)
        pair_predicted = sorted_scores.shape[0] - first + (unstored if threshold <= 0 else 0)
        micro_precision = pair_hits / pair_predicted if pair_predicted else 1.0
        acted = confidence >= threshold
        covered = int(acted.sum())
        right = int((acted & correct).sum())
        precision = right / covered if covered else 1.0
        recall = right / count
        rows.append(
            {
                "threshold": float(threshold),
                "precision": precision,
                "recall": recall,
                "coverage": covered / count,
                "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
                "micro_precision": micro_precision,
                "micro_recall": pair_hits / count,
            }
        )
    return rows


def _pairs(
    labels: np.ndarray, top_classes: np.ndarray, top_probabilities: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int]:
    """Stored (sample, class) scores and whether the class is the sample's, and how many samples' true class
    is outside their stored top-k (positives at the implicit score 0)."""
    positive = top_classes == labels[:, None]
    outside = int(labels.shape[0] - positive.any(axis=1).sum())
    return top_probabilities.reshape(-1), positive.reshape(-1), outside


def _micro_curve(
    labels: np.ndarray, top_classes: np.ndarray, top_probabilities: np.ndarray, num_classes: int, area: Any
) -> float | None:
    """``area`` over every (sample, class) pair: the stored scores, plus one block at score 0 holding the
    pairs outside the top-k (``outside`` of them positive)."""
    count, k = top_classes.shape
    if not count:
        return None
    scores, positive, outside = _pairs(labels, top_classes, top_probabilities)
    unstored = count * (num_classes - k)
    weights_pos = positive.astype(np.float64)
    weights_neg = (~positive).astype(np.float64)
    if unstored:
        scores = np.append(scores, 0.0)
        weights_pos = np.append(weights_pos, float(outside))
        weights_neg = np.append(weights_neg, float(unstored - outside))
    return area(scores, weights_pos, weights_neg)


def _per_class_auprc(
    labels: np.ndarray, top_classes: np.ndarray, top_probabilities: np.ndarray, num_classes: int
) -> list[float | None]:
    """One-vs-rest average precision of each class (None for a class with no sample): its stored scores, plus
    one block at score 0 for the samples that do not have it in their top-k."""
    count = labels.shape[0]
    scores, positive, _ = _pairs(labels, top_classes, top_probabilities)
    classes = top_classes.reshape(-1)
    order = np.argsort(classes, kind="mergesort")
    bounds = np.searchsorted(classes[order], np.arange(num_classes + 1))
    support = np.bincount(labels, minlength=num_classes)
    out: list[float | None] = []
    for cls in range(num_classes):
        if not support[cls]:
            out.append(None)
            continue
        picked = order[bounds[cls] : bounds[cls + 1]]
        stored_positive = positive[picked].astype(np.float64)
        unstored = count - picked.shape[0]
        missed = float(support[cls] - stored_positive.sum())  # its samples without it in their top-k
        out.append(
            average_precision(
                np.append(scores[picked], 0.0),
                np.append(stored_positive, missed),
                np.append(1.0 - stored_positive, unstored - missed),
            )
        )
    return out


def _ranked(
    scores: Any, positive_weights: Any, negative_weights: Any
) -> tuple[np.ndarray, np.ndarray] | None:
    """Cumulative (positives, negatives) at each distinct score, highest first; None without positives."""
    scores = np.asarray(scores, dtype=np.float64)
    positive_weights = np.asarray(positive_weights, dtype=np.float64)
    negative_weights = np.asarray(negative_weights, dtype=np.float64)
    if positive_weights.sum() <= 0:
        return None
    order = np.argsort(-scores, kind="mergesort")
    scores = scores[order]
    true_positives = np.cumsum(positive_weights[order])
    false_positives = np.cumsum(negative_weights[order])
    last_of_tie = np.r_[np.nonzero(np.diff(scores))[0], scores.shape[0] - 1]
    return true_positives[last_of_tie], false_positives[last_of_tie]


def average_precision(scores: Any, positive_weights: Any, negative_weights: Any) -> float | None:
    """Area under the precision-recall curve of a ranking (scikit-learn's ``average_precision_score``): each
    entry has a score and counts ``positive_weights`` positives and ``negative_weights`` negatives (a tie
    block of many pairs can be one entry). None without any positive."""
    ranked = _ranked(scores, positive_weights, negative_weights)
    if ranked is None:
        return None
    true_positives, false_positives = ranked
    predicted = true_positives + false_positives
    precision = np.divide(true_positives, predicted, out=np.ones_like(predicted), where=predicted > 0)
    recall = true_positives / true_positives[-1]
    steps = np.diff(np.r_[0.0, recall])
    return float(np.sum(steps * precision))


def roc_auc(scores: Any, positive_weights: Any, negative_weights: Any) -> float | None:
    """Area under the ROC curve (scikit-learn's ``roc_auc_score``), entries weighted as in
    ``average_precision``. None without both a positive and a negative."""
    ranked = _ranked(scores, positive_weights, negative_weights)
    if ranked is None or ranked[1][-1] <= 0:
        return None
    true_positives, false_positives = ranked
    tpr = np.r_[0.0, true_positives / true_positives[-1]]
    fpr = np.r_[0.0, false_positives / false_positives[-1]]
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))
