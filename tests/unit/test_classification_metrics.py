"""classification_metrics against scikit-learn's definitions on constructed cases, and the scores file's
round trip (the metrics it gives back are the ones computed before writing it)."""

import numpy as np
import pytest
from sklearn.metrics import (
    average_precision_score,
    balanced_accuracy_score,
    precision_recall_fscore_support,
    roc_auc_score,
)

from tpustream.metrics.classification import THRESHOLDS, average_precision, classification_metrics
from tpustream.metrics.scores import (
    SampleScore,
    ScoresError,
    metrics_from_scores,
    read_scores,
    write_scores,
)


def constructed(num_samples=400, num_classes=8, seed=0, decimals=3):
    """Labels and softmax probabilities of a half-right model; rounded, so scores tie as real ones do."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, num_samples)
    labels[labels == num_classes - 1] = 0  # the last class has no sample: not measured
    logits = rng.normal(size=(num_samples, num_classes)) + 1.5 * np.eye(num_classes)[labels]
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    probabilities = np.round(probabilities, decimals)
    order = np.argsort(-probabilities, axis=1, kind="stable")
    return labels, order, np.take_along_axis(probabilities, order, axis=1), probabilities


def test_per_class_macro_and_balanced_accuracy_equal_scikit_learns():
    labels, top, top_p, _ = constructed()
    num_classes = top.shape[1]
    measured = classification_metrics(labels, top, top_p, num_classes)
    present = sorted(set(labels.tolist()))
    precision, recall, f1, support = precision_recall_fscore_support(
        labels, top[:, 0], labels=list(range(num_classes)), zero_division=0
    )
    assert measured.precision == pytest.approx(precision.tolist())
    assert measured.recall[:-1] == pytest.approx(recall[:-1].tolist()) and measured.recall[-1] is None
    assert measured.f1[:-1] == pytest.approx(f1[:-1].tolist()) and measured.f1[-1] is None
    assert measured.support == support.tolist()
    _, _, macro, _ = precision_recall_fscore_support(
        labels, top[:, 0], labels=present, average="macro", zero_division=0
    )
    assert measured.macro_f1 == pytest.approx(macro)
    assert measured.balanced_accuracy == pytest.approx(balanced_accuracy_score(labels, top[:, 0]))


@pytest.mark.parametrize("k", [None, 3])
def test_auprc_and_auroc_equal_scikit_learns_on_the_stored_scores(k):
    """Every class stored: the one-vs-rest curves are exact; top-3 stored: they equal scikit-learn's on
    probability vectors holding those three and zeros elsewhere."""
    labels, top, top_p, probabilities = constructed()
    num_classes = top.shape[1]
    if k is not None:
        top, top_p = top[:, :k], top_p[:, :k]
        probabilities = np.zeros_like(probabilities)
        np.put_along_axis(probabilities, top, top_p, axis=1)
    measured = classification_metrics(labels, top, top_p, num_classes)
    one_hot = np.eye(num_classes)[labels]
    assert measured.auprc == pytest.approx(average_precision_score(one_hot, probabilities, average="micro"))
    assert measured.auroc == pytest.approx(roc_auc_score(one_hot, probabilities, average="micro"))
    per_class = average_precision_score(one_hot[:, :-1], probabilities[:, :-1], average=None)
    assert measured.auprc_per_class[:-1] == pytest.approx(per_class.tolist())
    assert measured.auprc_per_class[-1] is None  # no sample of the class
    assert measured.scores_top_k == (k or num_classes)
    # the threshold table's micro columns: every class at or above the threshold counts as predicted
    for row in measured.thresholds[::9]:
        predicted = probabilities >= row["threshold"]
        hits = (predicted & (one_hot > 0)).sum()
        assert row["micro_recall"] == pytest.approx(hits / len(labels))
        assert row["micro_precision"] == pytest.approx(hits / predicted.sum() if predicted.sum() else 1.0)


def test_threshold_table_counts_by_hand():
    labels = np.array([0, 1, 1, 2])
    top = np.array([[0, 1], [0, 1], [1, 0], [2, 0]])
    top_p = np.array([[0.9, 0.1], [0.6, 0.4], [0.5, 0.5], [0.3, 0.2]])
    rows = {row["threshold"]: row for row in classification_metrics(labels, top, top_p, 3).thresholds}
    assert [row["threshold"] for row in rows.values()] == list(THRESHOLDS) and len(rows) == 100
    assert rows[0.0] == pytest.approx(
        {
            "threshold": 0.0,
            "precision": 0.75,
            "recall": 0.75,
            "coverage": 1.0,
            "f1": 0.75,
            "micro_precision": 4 / 12,  # every class of every sample is predicted at 0
            "micro_recall": 1.0,
        }
    )
    # micro at 0.5: the pairs (0, 0.9) right, (1, 0.6) wrong, (2, 0.5) right and (2, 0.5) wrong
    assert (rows[0.5]["micro_precision"], rows[0.5]["micro_recall"]) == (0.5, 0.5)
    # at 0.5: samples 0, 1, 2 acted on, 0 and 2 right
    assert (rows[0.5]["precision"], rows[0.5]["recall"], rows[0.5]["coverage"]) == pytest.approx(
        (2 / 3, 0.5, 0.75)
    )
    # nothing reaches 0.95: no prediction, none wrong
    assert (rows[0.95]["precision"], rows[0.95]["recall"], rows[0.95]["coverage"]) == (1.0, 0.0, 0.0)


def test_average_precision_takes_tied_blocks_as_one_step():
    # weights: a block of 3 positives and 1 negative at one score is the same as its four entries
    assert average_precision([0.9, 0.5], [1, 3], [0, 1]) == pytest.approx(
        average_precision_score([1, 1, 1, 1, 0], [0.9, 0.5, 0.5, 0.5, 0.5])
    )
    assert average_precision([0.5], [0], [2]) is None  # no positive: undefined, not 0


def test_metrics_from_the_scores_file_equal_those_computed_before_writing(tmp_path):
    labels, top, top_p, _ = constructed(num_samples=50)
    rows = [
        SampleScore(
            key=f"k{i:03d}",
            source=f"src/{i}.png",
            label=int(label),
            true_class=str(label),
            top_classes=[int(c) for c in t],
            probabilities=[float(p) for p in ps],
        )
        for i, (label, t, ps) in enumerate(zip(labels, top, top_p, strict=True))
    ]
    uri = str(tmp_path / "scores.jsonl.gz")
    assert write_scores(uri, rows) == 50
    back = list(read_scores(uri))
    assert back == rows
    assert metrics_from_scores(back, 8) == classification_metrics(labels, top, top_p, 8)
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(ScoresError, match="bad.jsonl.gz:1 is not a tpustream scores line"):
        list(read_scores(str(tmp_path / "bad.jsonl.gz")))
    with pytest.raises(ScoresError, match="does not exist"):
        list(read_scores(str(tmp_path / "missing.jsonl.gz")))
