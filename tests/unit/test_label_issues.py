"""Likely label errors (tpustream/metrics/label_issues.py): confident learning on out-of-sample probabilities,
from evaluate's per-sample scores, written and read as label_issues.json; and on planted flips in the digits."""

import json

import numpy as np
import pytest

from tpustream.bench.labelnoise import bench_labelnoise, planted_label_flips
from tpustream.metrics.label_issues import (
    LabelIssuesError,
    label_issues_from_scores,
    likely_label_errors,
    probabilities_from_scores,
    read_label_issues,
    write_label_issues,
)
from tpustream.metrics.scores import SampleScore

CLASSES = ["cat", "dog", "fox"]


def _confident_split():
    """30 samples a model classifies surely and right, and three whose given label it contradicts (each at or
    above its suggested class's threshold, the mean probability of that class among the samples labelled so)."""
    labels = [i % 3 for i in range(30)]
    probs = np.full((30, 3), 0.05)
    probs[np.arange(30), labels] = 0.9
    for row, (given, says, sure) in {4: (1, 0, 0.97), 11: (2, 1, 0.9), 20: (2, 0, 0.93)}.items():
        labels[row] = given
        probs[row] = (1 - sure) / 2
        probs[row, says] = sure
    return labels, probs


def test_the_contradicted_labels_are_found_most_contradicted_first_with_the_suggested_class():
    labels, probs = _confident_split()
    keys = [f"k{i:02d}" for i in range(30)]
    issues = likely_label_errors(labels, probs, keys=keys, classes=CLASSES, split="test")
    assert issues.keys == ["k04", "k20", "k11"]  # self-confidence 0.015, 0.035, 0.05: lowest first
    first = issues.issues[0]
    assert (first.given_class, first.suggested_class, first.self_confidence) == ("dog", "cat", 0.015)
    assert issues.num_samples == 30 and issues.split == "test"
    assert [i.suggested_class for i in issues.issues] == ["cat", "cat", "dog"]


def test_it_is_cleanlabs_find_label_issues_ranked_by_self_confidence():
    from cleanlab.filter import find_label_issues

    rng = np.random.default_rng(3)
    probs = rng.dirichlet(np.full(4, 0.3), size=200)
    labels = np.where(rng.random(200) < 0.8, probs.argmax(axis=1), rng.integers(0, 4, size=200))
    expected = find_label_issues(labels, probs, return_indices_ranked_by="self_confidence")
    issues = likely_label_errors(labels, probs, keys=[f"{i:03d}" for i in range(200)], classes=list("abcd"))
    assert len(expected) > 5
    assert issues.keys == [f"{i:03d}" for i in expected]  # no ties here: cleanlab's order exactly


def test_no_issue_in_a_split_the_model_agrees_with_and_none_in_a_tiny_one():
    probs = np.eye(3)[[0, 1, 2] * 5] * 0.9 + 0.1 / 3
    assert (
        likely_label_errors([0, 1, 2] * 5, probs, keys=[str(i) for i in range(15)], classes=CLASSES).issues
        == ()
    )
    assert likely_label_errors([1], probs[:1], keys=["a"], classes=CLASSES).issues == ()


def test_bad_input_says_what_it_should_be():
    labels, probs = _confident_split()
    with pytest.raises(LabelIssuesError, match="one row per sample, one column per class"):
        likely_label_errors(labels, probs[:, :2], keys=[str(i) for i in range(30)], classes=CLASSES)
    with pytest.raises(LabelIssuesError, match="class indices 0..2"):
        likely_label_errors([5] * 30, probs, keys=[str(i) for i in range(30)], classes=CLASSES)


def _score(key, label, top, probabilities):
    return SampleScore(
        key=key,
        source=f"src/{key}.png",
        label=label,
        true_class=CLASSES[label],
        top_classes=top,
        probabilities=probabilities,
    )


def test_top_k_scores_spread_the_rest_of_the_mass_over_the_classes_not_kept():
    rows = [_score("a", 0, [1], [0.8]), _score("b", 2, [2, 0, 1], [0.5, 0.3, 0.2])]
    probs = probabilities_from_scores(rows, 3)
    assert probs[0].tolist() == pytest.approx([0.1, 0.8, 0.1])
    assert probs[1].tolist() == pytest.approx([0.3, 0.2, 0.5])


def test_issues_from_scores_name_the_source_and_round_trip_through_label_issues_json(tmp_path):
    labels, probs = _confident_split()
    rows = [
        _score(f"k{i:02d}", label, [int(c) for c in np.argsort(-p)], [float(v) for v in np.sort(p)[::-1]])
        for i, (label, p) in enumerate(zip(labels, probs, strict=True))
    ]
    issues = label_issues_from_scores(rows, CLASSES, split="val")
    assert issues.keys == ["k04", "k20", "k11"] and issues.issues[0].source == "src/k04.png"
    uri = str(tmp_path / "label_issues.json")
    write_label_issues(uri, issues)
    assert read_label_issues(uri) == issues
    assert json.loads((tmp_path / "label_issues.json").read_text())["format"] == 1
    (tmp_path / "bad.json").write_text('{"format": 99}')
    with pytest.raises(LabelIssuesError, match="bad.json is not a tpustream label_issues.json"):
        read_label_issues(str(tmp_path / "bad.json"))
    with pytest.raises(LabelIssuesError, match="does not exist: run tpustream evaluate"):
        read_label_issues(str(tmp_path / "none.json"))


def test_planted_label_flips_in_the_digits_val_split_are_found():
    """Issue 45's bar: 5% flips found with precision >= 0.7 at recall >= 0.5 (measured over 5 seeds: precision
    0.81-0.96, recall 0.70-0.96); asserted on each draw with margins, and on the mean."""
    results = [planted_label_flips(seed=seed) for seed in range(5)]
    assert all(r.planted == 27 for r in results)  # 5% of a 540-image val split
    assert all(r.precision >= 0.75 and r.recall >= 0.6 for r in results), results
    assert np.mean([r.precision for r in results]) >= 0.85 and np.mean([r.recall for r in results]) >= 0.8


def test_bench_labelnoise_prints_one_json_line():
    lines = list(bench_labelnoise(seeds=1))
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert line["bench"] == "labelnoise" and line["planted"] == 27 and line["precision_min"] >= 0.7
