"""The trivial baseline a candidate must beat: always answer the train split's most frequent class.

Computed from class counts alone (the manifest's), so it is exact and needs no model: every sample of the
decision split gets the same answer, ranked by train frequency. top-1, macro-F1 and balanced accuracy come
from ``classification_metrics`` on those answers (the candidate's conventions: a class without samples in
the split is left out of the class averages); top-5 is the share of samples whose class is among the five
most frequent train classes; the loss is the cross-entropy of answering the train split's class frequencies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tpustream.artifacts import Baseline
from tpustream.metrics.classification import classification_metrics

__all__ = ["majority_baseline"]


def majority_baseline(
    classes: Sequence[str], train_counts: Sequence[int], split_counts: Sequence[int]
) -> Baseline | None:
    """Always answering the class with the most train samples (ties: the first in class order), scored on a
    split with ``split_counts`` samples per class.

    Args:
        classes: the class names, in label order.
        train_counts: the train split's samples per class (upsampled copies scale every class alike).
        split_counts: the decision split's samples per class.

    Returns:
        The baseline, or None when the train split or the decision split has no sample (nothing to answer
        or nothing to score).
    """
    if not len(classes) == len(train_counts) == len(split_counts):
        raise ValueError(
            f"{len(classes)} classes, {len(train_counts)} train counts and {len(split_counts)} split counts: "
            "one count per class expected"
        )
    train_total, split_total = sum(train_counts), sum(split_counts)
    if train_total <= 0 or split_total <= 0:
        return None
    ranked = sorted(range(len(classes)), key=lambda index: (-train_counts[index], index))
    frequencies = [count / train_total for count in train_counts]
    top = ranked[: min(5, len(ranked))]
    labels = np.repeat(np.arange(len(classes)), split_counts)
    answers = np.tile(np.asarray(top, dtype=np.int64), (split_total, 1))
    probabilities = np.tile(np.asarray([frequencies[index] for index in top]), (split_total, 1))
    scored = classification_metrics(labels, answers, probabilities, len(classes), thresholds=())
    unseen = any(count and not frequencies[index] for index, count in enumerate(split_counts))
    loss = (
        None
        if unseen
        else -sum(count * math.log(frequencies[index]) for index, count in enumerate(split_counts) if count)
        / split_total
    )
    return Baseline(
        answer=classes[ranked[0]],
        top1=split_counts[ranked[0]] / split_total,
        top5=sum(split_counts[index] for index in top) / split_total,
        loss=loss,
        macro_f1=scored.macro_f1,
        balanced_accuracy=scored.balanced_accuracy,
    )
