"""Evaluate's per-sample scores: for every evaluated sample, its key in the shards, its source file, its true
class and its top-k classes with their probabilities, one JSON line each, gzip-compressed
(``scores.jsonl.gz`` beside metrics.json; ``champion_scores.jsonl.gz`` for the champion on the same samples).

JSON lines, not Parquet: pyarrow is not a dependency, a line is readable with ``zcat | head`` and ``jq``, and a
val split of 50,000 ImageNet samples at k = 10 is ~4 MB compressed. The file is enough to recompute every
metric evaluate reports from it (``metrics_from_scores``): evaluate computes them from exactly these rows
(probabilities rounded to 6 decimals, as written). k is every class up to ``FULL_SCORES_MAX_CLASSES`` classes
(the one-vs-rest curves are then exact), else ``TOP_K``.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from tpustream.errors import TpustreamError
from tpustream.metrics.classification import ClassificationMetrics, classification_metrics
from tpustream.storage import io as storage

__all__ = [
    "CHAMPION_SCORES_NAME",
    "DECIMALS",
    "FULL_SCORES_MAX_CLASSES",
    "SCORES_NAME",
    "TOP_K",
    "SampleScore",
    "ScoresError",
    "metrics_from_scores",
    "read_scores",
    "scores_top_k",
    "write_scores",
]

SCORES_NAME = "scores.jsonl.gz"
CHAMPION_SCORES_NAME = "champion_scores.jsonl.gz"
FULL_SCORES_MAX_CLASSES = 20  # up to this many classes a sample's every probability is kept
TOP_K = 10  # else its top 10
DECIMALS = 6  # probabilities as written (and as evaluate's metrics read them)


class ScoresError(TpustreamError, ValueError):
    """A scores file cannot be read; the message says which line and what to do."""


@dataclass(frozen=True, kw_only=True)
class SampleScore:
    """One evaluated sample: which it is, what it is, what the model said."""

    key: str  # the sample's key in the shards
    source: str  # the file it came from (the sample index's ``source``); "" when the dataset has no index
    label: int  # the true class index
    true_class: str
    top_classes: list[int]  # by decreasing probability; [0] is the prediction
    probabilities: list[float]

    def to_json_line(self) -> str:
        return json.dumps(
            {
                "key": self.key,
                "source": self.source,
                "label": self.label,
                "true_class": self.true_class,
                "top_classes": self.top_classes,
                "probabilities": self.probabilities,
            },
            separators=(",", ":"),
        )


def scores_top_k(num_classes: int) -> int:
    """How many classes per sample the scores keep."""
    return num_classes if num_classes <= FULL_SCORES_MAX_CLASSES else min(TOP_K, num_classes)


def write_scores(uri: str, rows: Iterable[SampleScore]) -> int:
    """Write ``rows`` to ``uri`` (gzip JSON lines; reproducible bytes: no timestamp in the gzip header).
    Returns the number of rows."""
    count = 0
    with (
        storage.open_write(uri, content_type="application/gzip") as stream,
        gzip.GzipFile(fileobj=stream, mode="wb", mtime=0) as packed,
        io.TextIOWrapper(packed, encoding="utf-8", newline="\n") as text,
    ):
        for row in rows:
            text.write(row.to_json_line() + "\n")
            count += 1
    return count


def read_scores(uri: str) -> Iterator[SampleScore]:
    """The rows of a scores file, in order.

    Raises:
        ScoresError: a line is not a score row (or the file is not gzip).
    """
    number = 1  # the line being read
    try:
        with storage.open_read(uri) as stream, gzip.GzipFile(fileobj=stream, mode="rb") as packed:
            for line in io.TextIOWrapper(packed, encoding="utf-8"):
                row = json.loads(line)
                yield SampleScore(
                    key=str(row["key"]),
                    source=str(row["source"]),
                    label=int(row["label"]),
                    true_class=str(row["true_class"]),
                    top_classes=[int(value) for value in row["top_classes"]],
                    probabilities=[float(value) for value in row["probabilities"]],
                )
                number += 1
    except (ValueError, KeyError, TypeError, OSError, EOFError, storage.StorageError) as exc:
        if isinstance(exc, storage.NotFound):
            raise ScoresError(
                f"{uri} does not exist: run tpustream evaluate (it writes {SCORES_NAME})"
            ) from exc
        raise ScoresError(
            f"{uri}:{number} is not a tpustream scores line ({type(exc).__name__}: {exc}): "
            "re-run tpustream evaluate"
        ) from exc


def metrics_from_scores(rows: Iterable[SampleScore], num_classes: int) -> ClassificationMetrics:
    """The classification metrics of a set of scores (evaluate's own computation)."""
    labels, top_classes, probabilities = [], [], []
    for row in rows:
        labels.append(row.label)
        top_classes.append(row.top_classes)
        probabilities.append(row.probabilities)
    k = len(top_classes[0]) if top_classes else 1
    if any(len(top) != k for top in top_classes):
        raise ScoresError("the scores rows hold different numbers of classes: they are not one evaluation's")
    return classification_metrics(
        np.asarray(labels, dtype=np.int64),
        np.asarray(top_classes, dtype=np.int64).reshape(-1, k),
        np.asarray(probabilities, dtype=np.float64).reshape(-1, k),
        num_classes,
    )
