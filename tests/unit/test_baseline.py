"""The majority-class baseline (tpustream/metrics/baseline.py): exact, from class counts alone."""

import math

import numpy as np
import pytest

from tpustream.metrics.baseline import majority_baseline
from tpustream.metrics.classification import classification_metrics


def test_the_baseline_answers_the_largest_train_class_and_is_scored_on_the_split():
    # train: "circle" is the largest class; the test split is distributed otherwise
    classes = ["circle", "square", "star"]
    baseline = majority_baseline(classes, [50, 30, 20], split_counts=[4, 10, 6])
    assert baseline is not None and baseline.answer == "circle"
    assert baseline.top1 == 4 / 20  # the split's share of circles, not the train split's
    assert baseline.top5 == 1.0  # three classes: every top 5 holds the label
    # one class predicted: its F1 is 2p/(p+1) with precision 4/20 and recall 1; the other two score 0
    assert baseline.macro_f1 == pytest.approx((2 * 0.2 / 1.2) / 3)
    assert baseline.balanced_accuracy == pytest.approx(1 / 3)
    # the loss of answering the train frequencies (0.5, 0.3, 0.2)
    expected = -(4 * math.log(0.5) + 10 * math.log(0.3) + 6 * math.log(0.2)) / 20
    assert baseline.loss == pytest.approx(expected)


def test_the_baseline_agrees_with_the_candidates_metrics_for_the_same_answers():
    """A model that always answers the largest class scores exactly what the baseline says (the same
    conventions: a class without samples in the split is left out of the class averages)."""
    train, split = [7, 40, 3, 0, 12, 9, 1], [5, 8, 0, 2, 4, 3, 1]
    baseline = majority_baseline([f"c{i}" for i in range(7)], train, split)
    labels = np.repeat(np.arange(7), split)
    constant = np.full((len(labels), 1), 1)
    scored = classification_metrics(labels, constant, np.ones((len(labels), 1)), 7, thresholds=())
    assert baseline is not None and baseline.answer == "c1"
    assert baseline.top1 == pytest.approx(8 / 23)
    assert baseline.macro_f1 == pytest.approx(scored.macro_f1)
    assert baseline.balanced_accuracy == pytest.approx(scored.balanced_accuracy)
    # top 5 by train count: c1 (40), c4 (12), c5 (9), c0 (7), c2 (3)
    assert baseline.top5 == pytest.approx((8 + 4 + 3 + 5 + 0) / 23)
    assert baseline.loss is None  # class 3 has split samples and no train sample: an infinite loss


def test_a_tie_picks_the_first_class_and_an_empty_split_has_no_baseline():
    tied = majority_baseline(["a", "b"], [5, 5], [1, 3])
    assert tied is not None and tied.answer == "a" and tied.top1 == 0.25
    assert majority_baseline(["a", "b"], [5, 5], [0, 0]) is None
    assert majority_baseline(["a", "b"], [0, 0], [1, 1]) is None
    with pytest.raises(ValueError, match="one count per class"):
        majority_baseline(["a", "b"], [1], [1, 1])
