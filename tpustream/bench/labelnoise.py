"""``tpustream bench labelnoise``: are planted label flips found as likely label errors?

On scikit-learn's bundled digits (the ``digits`` source's images), a stratified val split gets ``flip_fraction``
of its labels flipped to another class drawn at random; a model trained on the (clean) train split scores val
out-of-sample, as evaluate scores the deciding split, and ``likely_label_errors`` (confident learning) lists
the samples it contradicts. The line gives precision (flagged samples that were flipped) and recall (flips
flagged). The model is scikit-learn's logistic regression on the 64 pixels, not ``tpustream train``: the
method reads probabilities, not how they were made, and a trainer run per seed would take minutes on CPU
where this takes a second. Several seeds: the spread shows what one draw of flips can do.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["PlantedResult", "bench_labelnoise", "planted_label_flips"]


@dataclass(frozen=True, kw_only=True)
class PlantedResult:
    """One draw of planted flips and what confident learning found of them."""

    seed: int
    val_samples: int
    planted: int
    flagged: int
    found: int  # flagged and planted

    @property
    def precision(self) -> float:
        return self.found / self.flagged if self.flagged else 1.0

    @property
    def recall(self) -> float:
        return self.found / self.planted if self.planted else 1.0


def planted_label_flips(
    *, seed: int, flip_fraction: float = 0.05, val_fraction: float = 0.3
) -> PlantedResult:
    """Flip ``flip_fraction`` of a digits val split's labels, score val with a model trained on train, and
    count the flips ``likely_label_errors`` finds."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split

    from tpustream.metrics.label_issues import likely_label_errors

    digits = load_digits()
    pixels, labels = digits.data / 16.0, digits.target.astype(np.int64)
    train_x, val_x, train_y, val_y = train_test_split(
        pixels, labels, test_size=val_fraction, stratify=labels, random_state=seed
    )
    rng = np.random.default_rng(seed)
    flipped = rng.choice(len(val_y), size=round(flip_fraction * len(val_y)), replace=False)
    given = val_y.copy()
    given[flipped] = (val_y[flipped] + rng.integers(1, 10, size=len(flipped))) % 10  # another class
    model = LogisticRegression(max_iter=2000).fit(train_x, train_y)
    issues = likely_label_errors(
        given,
        model.predict_proba(val_x),
        keys=[f"{i:05d}" for i in range(len(given))],
        classes=[str(d) for d in range(10)],
    )
    flagged = {int(key) for key in issues.keys}
    return PlantedResult(
        seed=seed,
        val_samples=len(given),
        planted=len(flipped),
        flagged=len(flagged),
        found=len(flagged & {int(i) for i in flipped}),
    )


def bench_labelnoise(*, seeds: int = 5, flip_fraction: float = 0.05) -> Iterator[str]:
    """One JSON line: precision and recall of planted label flips over ``seeds`` draws (min and mean)."""
    started = time.perf_counter()
    results = [planted_label_flips(seed=seed, flip_fraction=flip_fraction) for seed in range(seeds)]
    precision = [r.precision for r in results]
    recall = [r.recall for r in results]
    yield json.dumps(
        {
            "bench": "labelnoise",
            "data": "digits",
            "model": "sklearn LogisticRegression on train, val scored out-of-sample",
            "method": "cleanlab.filter.find_label_issues (prune_by_noise_rate, self_confidence)",
            "flip_fraction": flip_fraction,
            "seeds": seeds,
            "val_samples": results[0].val_samples,
            "planted": results[0].planted,
            "flagged": [r.flagged for r in results],
            "precision_min": round(min(precision), 3),
            "precision_mean": round(float(np.mean(precision)), 3),
            "recall_min": round(min(recall), 3),
            "recall_mean": round(float(np.mean(recall)), 3),
            "seconds": round(time.perf_counter() - started, 2),
        }
    )
