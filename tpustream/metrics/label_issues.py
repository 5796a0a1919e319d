"""Likely label errors: the samples whose given label the model contradicts most confidently, by confident
learning (Northcutt, Jiang & Chuang, "Confident Learning: Estimating Uncertainty in Dataset Labels", 2021).

The method is cleanlab's own ``cleanlab.filter.find_label_issues`` (prune by noise rate, ranked by
self-confidence: the probability the model gives the given label, lowest first), not a re-implementation: the
evaluate container already carries scikit-learn, and cleanlab adds pandas and ~1.2 s of import time (measured:
``python -X importtime -c "import cleanlab.filter"``, 1.2-1.5 s on this machine) to a step that imports torch
and runs a model; cleanlab is imported only when the issues are computed. Its probabilities must be
out-of-sample: evaluate's per-sample scores on the deciding split are (training never reads that split).

The scores keep every class's probability up to ``FULL_SCORES_MAX_CLASSES`` classes; beyond, a sample's top
``TOP_K`` only: ``probabilities_from_scores`` spreads the rest of its mass evenly over the classes not kept (a
given label outside the top k then has at most that share, which ranks it as contradicted, as it is).
``label_issues.json`` (beside metrics.json) is the list as evaluate writes it, read back by ``read_label_issues``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from tpustream.errors import TpustreamError
from tpustream.metrics.scores import SampleScore
from tpustream.storage import io as storage

__all__ = [
    "LABEL_ISSUES_FORMAT",
    "LABEL_ISSUES_NAME",
    "LabelIssue",
    "LabelIssues",
    "LabelIssuesError",
    "label_issues_from_scores",
    "likely_label_errors",
    "probabilities_from_scores",
    "read_label_issues",
    "write_label_issues",
]

LABEL_ISSUES_NAME = "label_issues.json"
LABEL_ISSUES_FORMAT = 1
METHOD = "cleanlab.filter.find_label_issues(filter_by='prune_by_noise_rate', ranked by self_confidence)"


class LabelIssuesError(TpustreamError, ValueError):
    """Scores or a label_issues.json cannot be used as given; the message says which and what to do."""


@dataclass(frozen=True, kw_only=True)
class LabelIssue:
    """One sample whose given label the model contradicts: what it is labelled, what the model says it is."""

    key: str  # the sample's key in the shards
    source: str  # the file it came from (the sample index's ``source``), "" when unknown
    given_class: str
    suggested_class: str  # the model's top class
    self_confidence: float  # the probability the model gives the given class: lower is more contradicted


@dataclass(frozen=True, kw_only=True)
class LabelIssues:
    """The likely label errors of one split, most contradicted first (ties by key)."""

    split: str
    num_samples: int  # samples examined
    issues: tuple[LabelIssue, ...]
    method: str = METHOD

    @property
    def keys(self) -> list[str]:
        return [issue.key for issue in self.issues]

    def to_json(self) -> dict[str, object]:
        return {
            "format": LABEL_ISSUES_FORMAT,
            "split": self.split,
            "num_samples": self.num_samples,
            "method": self.method,
            "issues": [asdict(issue) for issue in self.issues],
        }


def likely_label_errors(
    labels: Sequence[int] | np.ndarray,
    probs: np.ndarray,
    *,
    keys: Sequence[str],
    classes: Sequence[str],
    sources: Sequence[str] | None = None,
    split: str = "val",
) -> LabelIssues:
    """The samples whose given label the model contradicts most confidently, by confident learning.

    Args:
        labels: the given class index of each sample.
        probs: out-of-sample predicted probabilities, one row per sample, one column per class (rows sum to 1).
        keys: each sample's key in the shards.
        classes: the class names, by index.
        sources: each sample's source file ("" when unknown); None: all unknown.
        split: which split the samples are (recorded).

    Returns:
        The issues ranked by self-confidence, lowest first.

    Raises:
        LabelIssuesError: the arrays disagree in shape, or a label is not a class index.
    """
    given = np.asarray(labels, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    count = len(given)
    if probs.shape != (count, len(classes)) or len(keys) != count or (sources and len(sources) != count):
        raise LabelIssuesError(
            f"{count} labels, {len(keys)} keys and probabilities of shape {probs.shape} for {len(classes)} "
            "classes: one row per sample, one column per class"
        )
    if count and (given.min() < 0 or given.max() >= len(classes)):
        raise LabelIssuesError(
            f"labels must be class indices 0..{len(classes) - 1}, got {given.min()}..{given.max()}"
        )
    if count < 2 or len(classes) < 2:
        return LabelIssues(split=split, num_samples=count, issues=())
    from cleanlab.filter import find_label_issues

    with (
        warnings.catch_warnings()
    ):  # "too few examples in class k": a small split, said by the count it finds
        warnings.simplefilter("ignore", UserWarning)
        # n_jobs=1: one process, no fork inside a container
        found = find_label_issues(given, probs, n_jobs=1)
    flagged = [int(row) for row in np.flatnonzero(found)]
    order = sorted(flagged, key=lambda row: (float(probs[row, given[row]]), keys[row]))
    issues = tuple(
        LabelIssue(
            key=str(keys[row]),
            source=str(sources[row]) if sources else "",
            given_class=str(classes[given[row]]),
            suggested_class=str(classes[int(probs[row].argmax())]),
            self_confidence=round(float(probs[row, given[row]]), 6),
        )
        for row in order
    )
    return LabelIssues(split=split, num_samples=count, issues=issues)


def probabilities_from_scores(rows: Sequence[SampleScore], num_classes: int) -> np.ndarray:
    """Each row's probability of every class: its kept top-k, the rest of its mass spread evenly over the
    classes not kept; each row then normalized to sum to 1 (the scores are rounded to 6 decimals)."""
    probs = np.zeros((len(rows), num_classes), dtype=np.float64)
    for i, row in enumerate(rows):
        kept = len(row.top_classes)
        if kept < num_classes:
            probs[i, :] = max(0.0, 1.0 - sum(row.probabilities)) / (num_classes - kept)
        probs[i, row.top_classes] = row.probabilities
    totals = probs.sum(axis=1, keepdims=True)
    return np.divide(probs, totals, out=np.full_like(probs, 1.0 / max(num_classes, 1)), where=totals > 0)


def label_issues_from_scores(
    rows: Sequence[SampleScore], classes: Sequence[str], *, split: str
) -> LabelIssues:
    """``likely_label_errors`` on evaluate's per-sample scores of ``split``."""
    return likely_label_errors(
        [row.label for row in rows],
        probabilities_from_scores(rows, len(classes)),
        keys=[row.key for row in rows],
        classes=classes,
        sources=[row.source for row in rows],
        split=split,
    )


def write_label_issues(uri: str, issues: LabelIssues) -> None:
    """Write ``issues`` as ``label_issues.json`` at ``uri``."""
    storage.write_bytes(
        uri, (json.dumps(issues.to_json(), indent=1) + "\n").encode(), content_type="application/json"
    )


def read_label_issues(uri: str) -> LabelIssues:
    """The label issues evaluate wrote at ``uri``.

    Raises:
        LabelIssuesError: the file is missing, or not a label_issues.json of this format.
    """
    try:
        data = json.loads(storage.read_text(uri))
        if data.get("format") != LABEL_ISSUES_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, this version reads {LABEL_ISSUES_FORMAT}")
        return LabelIssues(
            split=str(data["split"]),
            num_samples=int(data["num_samples"]),
            method=str(data["method"]),
            issues=tuple(
                LabelIssue(
                    key=str(row["key"]),
                    source=str(row["source"]),
                    given_class=str(row["given_class"]),
                    suggested_class=str(row["suggested_class"]),
                    self_confidence=float(row["self_confidence"]),
                )
                for row in data["issues"]
            ),
        )
    except storage.NotFound as exc:
        raise LabelIssuesError(f"{uri} does not exist: run tpustream evaluate (it writes it)") from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LabelIssuesError(
            f"{uri} is not a tpustream {LABEL_ISSUES_NAME} ({exc}): re-run evaluate"
        ) from exc
