"""The data check before training: is this dataset fit to spend a TPU run on? (TFX StatisticsGen +
ExampleValidator, for tpustream datasets.)

A scheduled retraining run trains on whatever landed in the bucket. This reads the dataset's manifest (class
counts, skipped images, image statistics) and its sample index (one content sha256 per sample) and reports:

- exact duplicates within a split: the same bytes under different source names (the upsampled copies of one
  source image are not duplicates);
- leakage: an image in both train and val, which val then measures on data the model trained on, or in test
  and train or val, which the held-out test score then measures on data training or model selection saw;
- near leakage: a val or test image that is not a byte copy of a train image but a re-saved, resized, shifted
  or re-lit one, found by the sample index's perceptual hashes (``near-leak``: each pair listed) by
  multi-index hashing (``dataset.near_duplicates``); near-duplicate clusters inside train are counted. A
  dataset (or split) written before the hashes is checked exact-only, and the report says so;
- a class with no train or no val samples, a split with none at all;
- the skipped rate: images that could not be read or decoded and rows the source rejected, per source item;
- against a baseline dataset (the current champion's training data): new classes (a typo'd folder), vanished
  classes, a class whose share of the images moved, and a skipped rate that jumped;
- a warning, not an anomaly: a class with a handful of train images (with or without a baseline).

Each finding past its threshold is an ``Anomaly`` (a code, a one-line reason, details); a warning has the same
form and is reported, logged and printed, but never fails the check. Datasets written
before the sample index existed are checked on what their manifest holds, and the report says the hash
checks were skipped. Torch-free: the pipeline's "check data" step runs it on a CPU machine.

This module owns the checks of the dataset itself and their limits; what moved since a baseline is
``dataset.check_baseline``, its limits ``dataset.check_thresholds`` (``DataCheckThresholds``, also exported
here), the report object and the shapes of its facts ``dataset.check_result``, its Markdown
``dataset.check_report``. The pipeline's step (the champion's data as the baseline, an anomaly stopping the run)
is the run's gate, ``run.data_gate``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tpustream.artifacts import Manifest
from tpustream.dataset.check_baseline import baseline_checks, skipped_rate
from tpustream.dataset.check_report import percents
from tpustream.dataset.check_result import (
    ANOMALY_CODES,
    SIZE_KEYS,
    Anomaly,
    DataCheckFacts,
    DataCheckReport,
    DuplicateGroup,
    EmptyClass,
    LeakExample,
    NearDuplicateFacts,
    NearLeakPair,
    SplitFacts,
    SplitName,
    TinyClass,
)
from tpustream.dataset.check_thresholds import DataCheckThresholds
from tpustream.dataset.manifest import iter_sample_index, load_manifest, manifest_digest
from tpustream.storage import io as storage

__all__ = [
    "DataCheckThresholds",
    "NEAR_PAIRS_LISTED",
    "check_dataset",
]

log = logging.getLogger(__name__)

# Train images of the largest class per image of the smallest. Past 3x, an unweighted loss is mostly the
# large classes' and the small ones' recall suffers: the report says so and names the trainer's remedy
# (--class-weights auto); a note, never a finding: many real datasets are imbalanced on purpose.
IMBALANCE_RATIO = 3.0
# Near-leak pairs the facts (and so both reports) list: every one a user should look at on a real dataset, and
# a bounded report when a whole split turns out to be near copies.
NEAR_PAIRS_LISTED = 50
# Images with a side under the perceptual hash's own 32x32 input are checked exact-only: upscaled, a thumbnail's
# few pixels hash alike across distinct images (the planted-copy ROC's 8x8 digits: 0.08% false pairs at 8 bits,
# ~400 false near-leaks between the bundled digits' train and val), so their near pairs would be noise.
NEAR_MIN_SIDE = 32


# --------------------------------------------------------------------------- the facts


@dataclass
class _SplitHashes:
    """A split's content hashes: the first source seen for each, and every source for those seen under two
    or more names (few, so the full set is kept only for them)."""

    first: dict[str, str] = field(default_factory=dict)
    more: dict[str, set[str]] = field(default_factory=dict)
    first_key: dict[str, str] = field(default_factory=dict)  # the sample key of the first source seen
    phash: dict[str, str] = field(default_factory=dict)  # the perceptual hash of each content (when kept)
    windows: dict[str, str] = field(default_factory=dict)  # a thumbnail's window hashes (image.phash_windows)
    unhashed: int = 0  # samples whose index line has no perceptual hash (written before them)
    small: int = 0  # contents with a side under NEAR_MIN_SIDE: no near check

    def add(
        self,
        sha256: str,
        source: str,
        key: str = "",
        phash: str | None = None,
        short_side: int = 0,
        windows: str | None = None,
    ) -> None:
        seen = self.first.setdefault(sha256, source)
        if seen != source:
            self.more.setdefault(sha256, {seen}).add(source)
        elif sha256 not in self.first_key:
            self.first_key[sha256] = key
            if phash is None:
                self.unhashed += 1
            elif short_side < NEAR_MIN_SIDE:
                self.small += 1
            else:
                self.phash[sha256] = phash
                if windows is not None:
                    self.windows[sha256] = windows

    def sources(self, sha256: str) -> list[str]:
        return sorted(self.more.get(sha256) or {self.first[sha256]})

    @property
    def extra_copies(self) -> int:
        return sum(len(sources) - 1 for sources in self.more.values())

    @property
    def distinct_images(self) -> int:
        """Source files (an upsampled copy is the same file): distinct (content, source) pairs."""
        return len(self.first) + self.extra_copies


def _split_facts(manifest: Manifest, split: str) -> SplitFacts:
    info = manifest.splits[split]
    stats = info.stats.to_json() if info.stats else {}  # datasets written before the statistics have none
    facts: SplitFacts = {
        "samples": info.num_samples,
        "class_counts": dict(zip(manifest.classes, info.class_counts, strict=True)),
        "formats": stats.get("formats", {}),
    }
    for key in SIZE_KEYS:
        if key in stats:
            facts[key] = stats[key]
    return facts


# --------------------------------------------------------------------------- the check


def check_dataset(
    dataset_uri: str,
    baseline_uri: str | None = None,
    thresholds: DataCheckThresholds | None = None,
    *,
    max_examples: int = 5,
    baseline_note: str = "",
    class_weights: str | None = None,
) -> DataCheckReport:
    """Check the dataset at ``dataset_uri`` (against ``baseline_uri``'s when given).

    Args:
        dataset_uri: the dataset (the directory holding manifest.json), local or gs://.
        baseline_uri: the dataset to compare with (the champion's training data); None: no comparison.
        thresholds: the limits (the defaults: ``DataCheckThresholds()``).
        max_examples: file names listed per duplicate or leak finding.
        baseline_note: how the baseline was chosen (or why there is none), for the report.
        class_weights: the training run's --class-weights (none/auto), named by the class-balance note;
            None: not known (``shards check``).

    Returns:
        The report; ``report.anomalies`` is empty when the dataset passed.
    """
    thresholds = thresholds or DataCheckThresholds()
    dataset_uri = storage.check_uri(dataset_uri).rstrip("/")
    manifest = load_manifest(dataset_uri)
    classes = list(manifest.classes)
    splits = [split for split in ("train", "val", "test") if manifest.num_samples(split)]
    anomalies: list[Anomaly] = []
    notes: list[str] = []
    facts: DataCheckFacts = {
        "manifest_digest": manifest_digest(dataset_uri),
        "source": manifest.source or None,
        "classes": len(classes),
        "splits": {split: _split_facts(manifest, split) for split in splits},
    }

    missing = [split for split in ("train", "val") if split not in splits]
    if missing:
        anomalies.append(
            Anomaly(
                "missing-split",
                f"the dataset has no {' and no '.join(missing)} samples: training needs both "
                "(re-create it with a validation fraction, or add images to the split)",
                {"splits": missing},
            )
        )
    empty: list[
        EmptyClass
    ] = [  # test is optional and its classes are reported unmeasured by evaluate, not refused here
        {"class": name, "split": split}
        for split in splits
        if split != "test"
        for name, count in facts["splits"][split]["class_counts"].items()
        if not count
    ]
    facts["empty_classes"] = empty
    if empty:
        named = ", ".join(f"{e['class']!r} (0 {e['split']})" for e in empty[:max_examples])
        anomalies.append(
            Anomaly(
                "empty-class",
                f"{len(empty)} class/split pair(s) without samples: {named}"
                + (f" and {len(empty) - max_examples} more" if len(empty) > max_examples else "")
                + ": the model cannot learn a class it never sees, nor is it measured on one val lacks",
                {"empty": empty},
            )
        )

    warnings = _tiny_classes(manifest, thresholds, facts, max_examples)
    balance = _class_balance(manifest, facts, class_weights)
    if balance:
        notes.append(balance)

    if manifest.has_sample_index():
        anomalies += _hash_checks(dataset_uri, manifest, splits, thresholds, facts, max_examples)
        facts["hash_checks"] = True
        near = facts["near_duplicates"]
        if near["status"] == "exact-only":
            notes.append(
                f"Near-duplicate checks skipped (exact-only): the sample index of "
                f"{', '.join(near['unhashed_splits']) or 'train'} has no perceptual hashes (written before "
                "tpustream kept them), so only byte-identical copies are checked. Re-create the dataset with "
                "`tpustream shards create --overwrite` to find re-saved, resized or edited copies too."
            )
    else:
        facts["hash_checks"] = False
        notes.append(
            "Hash checks (exact duplicates, train/val leakage) skipped: the dataset has no sample index "
            "(written before tpustream kept one). Re-create it with `tpustream shards create --overwrite` "
            "to check them."
        )

    skipped = manifest.skipped
    rate = skipped_rate(manifest)
    facts["skipped"] = {
        "count": skipped.count,
        "sample_slots": skipped.sample_slots,
        "by_reason": skipped.by_reason,
        "rejected_rows": skipped.rejected_rows,
        "examples": skipped.examples[:max_examples],
        "rate": rate,
    }
    if rate > thresholds.max_skipped_rate:
        reasons = ", ".join(f"{reason} {count}" for reason, count in skipped.by_reason.items())
        shown_rate, shown_limit = percents(rate, thresholds.max_skipped_rate)
        anomalies.append(
            Anomaly(
                "skipped-rate",
                f"{shown_rate} of the source's items were skipped ({skipped.count}"
                + (f": {reasons}" if reasons else "")
                + f"), above {shown_limit}"
                + (f"; e.g. {skipped.examples[0]}" if skipped.examples else ""),
                {"rate": rate, "count": skipped.count, "by_reason": skipped.by_reason},
            )
        )

    baseline = None
    if baseline_uri:
        baseline = storage.check_uri(baseline_uri).rstrip("/")
        anomalies += baseline_checks(manifest, load_manifest(baseline), rate, thresholds, facts, max_examples)
    facts["baseline_note"] = baseline_note
    anomalies.sort(key=lambda a: ANOMALY_CODES.index(a.code))  # the most serious first
    return DataCheckReport(
        dataset_uri, baseline, thresholds, anomalies, facts, notes, max_examples, warnings=warnings
    )


def _class_balance(manifest: Manifest, facts: DataCheckFacts, class_weights: str | None) -> str:
    """The class-shares line: the train split's largest class per its smallest (source images), and what
    training does about it when past IMBALANCE_RATIO ("" when balanced enough, or fewer than 2 classes)."""
    if "train" not in facts["splits"]:
        return ""
    upsample = max(1, manifest.upsample)
    counts = {name: count // upsample for name, count in facts["splits"]["train"]["class_counts"].items()}
    present = {name: count for name, count in counts.items() if count > 0}
    if len(present) < 2:
        return ""
    largest, smallest = max(present, key=present.__getitem__), min(present, key=present.__getitem__)
    ratio = present[largest] / present[smallest]
    facts["class_balance"] = {
        "max_min_ratio": ratio,
        "largest": largest,
        "smallest": smallest,
        "class_weights": class_weights,
    }
    if ratio < IMBALANCE_RATIO:
        return ""
    if class_weights == "auto":
        choice = "training uses --class-weights auto (loss weighted by inverse class frequency)"
    else:
        given = "training uses --class-weights none; " if class_weights == "none" else ""
        choice = f"{given}consider --class-weights auto (loss weighted by inverse class frequency)"
    return (
        f"class shares: max/min {ratio:.1f}x in train ({largest!r} {present[largest]} images, {smallest!r} "
        f"{present[smallest]}); {choice}"
    )


def _tiny_classes(
    manifest: Manifest, thresholds: DataCheckThresholds, facts: DataCheckFacts, max_examples: int
) -> list[Anomaly]:
    """The classes with some, but fewer than ``min_class_train_samples``, train images (upsampled copies not
    counted; a class with none is an ``empty-class`` anomaly): a warning, with or without a baseline."""
    limit = thresholds.min_class_train_samples
    if "train" not in facts["splits"]:
        facts["tiny_classes"] = []
        return []
    upsample = max(1, manifest.upsample)
    counts = {name: count // upsample for name, count in facts["splits"]["train"]["class_counts"].items()}
    tiny: list[TinyClass] = sorted(
        ({"class": name, "train_images": count} for name, count in counts.items() if 0 < count < limit),
        key=lambda t: (t["train_images"], t["class"]),
    )
    facts["tiny_classes"] = tiny
    if not tiny:
        return []
    named = ", ".join(f"{t['class']!r} ({t['train_images']})" for t in tiny[:max_examples])
    more = f" and {len(tiny) - max_examples} more" if len(tiny) > max_examples else ""
    return [
        Anomaly(
            "tiny-class",
            f"{len(tiny)} class(es) with fewer than {limit} train images: {named}{more}: the model sees each "
            "only a few times, and val measures it on fewer still (add images, or merge or drop the class)",
            {"classes": tiny, "limit": limit},
        )
    ]


def _hash_checks(
    uri: str,
    manifest: Manifest,
    splits: list[str],
    thresholds: DataCheckThresholds,
    facts: DataCheckFacts,
    max_examples: int,
) -> list[Anomaly]:
    """Duplicates within each split and leakage between them, from the sample index's content hashes."""
    anomalies: list[Anomaly] = []
    hashes: dict[str, _SplitHashes] = {}
    for split in splits:
        hashes[split] = found = _SplitHashes()
        for entry in iter_sample_index(uri, manifest, split):
            found.add(
                entry.sha256,
                entry.source,
                entry.key,
                entry.phash,
                min(entry.width, entry.height),
                entry.phash_windows,
            )
        fraction = found.extra_copies / found.distinct_images if found.distinct_images else 0.0
        groups = sorted(found.more, key=lambda h: (-len(found.more[h]), h))
        examples: list[DuplicateGroup] = [
            {"sha256": h, "sources": found.sources(h)[: max(2, max_examples)]} for h in groups[:max_examples]
        ]
        split_facts = facts["splits"][split]
        split_facts["images"] = found.distinct_images
        split_facts["duplicate_groups"] = len(found.more)
        split_facts["duplicate_copies"] = found.extra_copies
        split_facts["duplicate_fraction"] = fraction
        split_facts["duplicate_examples"] = examples
        if fraction > thresholds.max_duplicate_fraction:
            first = examples[0]["sources"]
            shown_fraction, shown_limit = percents(fraction, thresholds.max_duplicate_fraction)
            anomalies.append(
                Anomaly(
                    "duplicate-images",
                    f"{found.extra_copies} {split} image(s) are exact copies of another under a different name "
                    f"({shown_fraction} of {found.distinct_images} source images, above {shown_limit}), "
                    f"e.g. {' = '.join(first[:2])}",
                    {
                        "split": split,
                        "copies": found.extra_copies,
                        "fraction": fraction,
                        "examples": examples,
                    },
                )
            )
    leaked = _shared(hashes, "train", "val")
    leaks = _leak_examples(hashes, leaked, ("train", "val"), max_examples)
    facts["leaked_images"] = len(leaked)
    facts["leak_examples"] = leaks
    if len(leaked) > thresholds.max_leaked_images:
        leak = leaks[0]
        anomalies.append(
            Anomaly(
                "train-val-leak",
                f"{len(leaked)} image(s) are in both train and val (limit {thresholds.max_leaked_images}): val "
                f"scores them after training on them, e.g. {leak['train'][0]} (train) = {leak['val'][0]} (val)",
                {"count": len(leaked), "examples": leaks},
            )
        )
    if "test" in hashes:
        test_leaked = sorted(set(_shared(hashes, "test", "train")) | set(_shared(hashes, "test", "val")))
        test_leaks = _leak_examples(hashes, test_leaked, ("test", "train", "val"), max_examples)
        facts["test_leaked_images"] = len(test_leaked)
        facts["test_leak_examples"] = test_leaks
        if len(test_leaked) > thresholds.max_leaked_images:
            leak = test_leaks[0]
            other: SplitName = "train" if leak.get("train") else "val"
            anomalies.append(
                Anomaly(
                    "test-leak",
                    f"{len(test_leaked)} test image(s) are also in train or val (limit "
                    f"{thresholds.max_leaked_images}): the held-out test score measures them after training or "
                    f"model selection saw them, e.g. {leak['test'][0]} (test) = {leak[other][0]} ({other})",
                    {"count": len(test_leaked), "examples": test_leaks},
                )
            )
    anomalies += _near_leaks(hashes, thresholds, facts, max_examples)
    return anomalies


def _near_leaks(
    hashes: dict[str, _SplitHashes], thresholds: DataCheckThresholds, facts: DataCheckFacts, max_examples: int
) -> list[Anomaly]:
    """Val and test images within ``near_duplicate_distance`` bits of a train image's perceptual hash, or,
    both thumbnails, with a query window within ``DEFAULT_WINDOW_DISTANCE`` bits of one of its base windows (a
    shifted copy: image.phash_windows; those that are byte copies are leaks already, not listed again), each
    with its nearest train image; and the near-duplicate clusters inside train (a fact). Exact-only when a
    split has no hashes."""
    import numpy as np

    from tpustream.dataset.near_duplicates import (
        DEFAULT_WINDOW_DISTANCE,
        NearPairs,
        near_clusters,
        near_pairs,
        near_window_pairs,
    )
    from tpustream.image.phash_windows import WINDOWS, split_window_hex

    distance = thresholds.near_duplicate_distance
    held_out = [split for split in ("val", "test") if split in hashes]
    unhashed = [split for split in ("train", *held_out) if split in hashes and hashes[split].unhashed]
    near: NearDuplicateFacts = {
        "status": "checked",
        "max_distance": distance,
        "unhashed_splits": unhashed,
        "small_images": {split: found.small for split, found in hashes.items() if found.small},
    }
    facts["near_duplicates"] = near
    if distance < 0:
        near["status"] = "off"
        return []
    if unhashed or "train" not in hashes:
        near["status"] = "exact-only"
        return []
    train = hashes["train"]
    train_contents = list(train.phash)
    train_hashes = np.array([int(train.phash[h], 16) for h in train_contents], dtype=np.uint64)
    clusters = near_clusters(train_hashes, distance)
    near["train_clusters"] = clusters.count
    near["train_clustered_images"] = clusters.clustered
    near["train_largest_cluster"] = int(clusters.sizes.max()) if clusters.count else 0
    window_distance = min(distance, DEFAULT_WINDOW_DISTANCE)  # 0 (equal hashes only): equal windows only
    near["window_distance"] = window_distance
    train_thumbs = np.array([i for i, h in enumerate(train_contents) if h in train.windows], dtype=np.int64)
    train_windows = np.array(
        [split_window_hex(train.windows[train_contents[i]]) for i in train_thumbs], dtype=np.uint64
    ).reshape(len(train_thumbs), WINDOWS)
    leaked: dict[str, int] = {}
    pairs: list[NearLeakPair] = []
    for split in held_out:
        found = hashes[split]
        queries = [h for h in found.phash if h not in train.first]  # byte copies: train-val-leak, test-leak
        query_hashes = np.array([int(found.phash[h], 16) for h in queries], dtype=np.uint64)
        by_hash = near_pairs(query_hashes, train_hashes, distance)
        thumbs = np.array([i for i, h in enumerate(queries) if h in found.windows], dtype=np.int64)
        windows = np.array(
            [split_window_hex(found.windows[queries[i]]) for i in thumbs], dtype=np.uint64
        ).reshape(len(thumbs), WINDOWS)
        by_window = near_window_pairs(windows, train_windows, window_distance)
        matches = NearPairs(
            query=np.concatenate([by_hash.query, thumbs[by_window.query]]),
            base=np.concatenate([by_hash.base, train_thumbs[by_window.base]]),
            distance=np.concatenate([by_hash.distance, by_window.distance]),
        )
        shifted = np.concatenate([np.zeros(len(by_hash), bool), np.ones(len(by_window), bool)])
        # the nearest train image of each (ties: by pHash first, then the first in train's order)
        order = np.lexsort((matches.base, shifted, matches.distance, matches.query))
        nearest = order[np.unique(matches.query[order], return_index=True)[1]]
        leaked[split] = len(nearest)
        for index in nearest:
            query, base = queries[int(matches.query[index])], train_contents[int(matches.base[index])]
            pairs.append(
                {
                    "split": split,
                    "source": found.first[query],
                    "key": found.first_key[query],
                    "train_source": train.first[base],
                    "train_key": train.first_key[base],
                    "distance": int(matches.distance[index]),
                    "match": "windows" if shifted[index] else "phash",
                }
            )
    pairs.sort(key=lambda p: (p["distance"], p["split"] != "test", p["source"]))  # the surest first
    near["leaked"] = leaked
    near["pairs"] = pairs[:NEAR_PAIRS_LISTED]
    count = sum(leaked.values())
    if count <= thresholds.max_leaked_images:
        return []
    first = pairs[0]
    splits = " and ".join(f"{n} {split}" for split, n in leaked.items() if n)
    return [
        Anomaly(
            "near-leak",
            f"{count} val/test image(s) ({splits}) are near copies of train images (perceptual hash within "
            f"{distance} bits, or a thumbnail's shifted window within {window_distance}; not byte-identical: "
            f"re-saved, resized, shifted or edited; limit "
            f"{thresholds.max_leaked_images}): their scores measure images training saw, e.g. "
            f"{first['source']} ({first['split']}) ~ {first['train_source']} (train), {first['distance']} bits"
            + (" (shifted windows)" if first.get("match") == "windows" else ""),
            {
                "count": count,
                "max_distance": distance,
                "window_distance": window_distance,
                "examples": pairs[:max_examples],
            },
        )
    ]


def _shared(hashes: dict[str, _SplitHashes], first: str, second: str) -> list[str]:
    """The content hashes in both splits (none when either is absent), sorted."""
    if first not in hashes or second not in hashes:
        return []
    return sorted(set(hashes[first].first) & set(hashes[second].first))


def _leak_examples(
    hashes: dict[str, _SplitHashes], leaked: list[str], splits: tuple[SplitName, ...], max_examples: int
) -> list[LeakExample]:
    """Per leaked hash (at most ``max_examples``), its source files in each of ``splits`` that holds it."""
    examples: list[LeakExample] = []
    for h in leaked[:max_examples]:
        example: LeakExample = {"sha256": h}
        for split in splits:
            if split in hashes and h in hashes[split].first:
                example[split] = hashes[split].sources(h)[:max_examples]
        examples.append(example)
    return examples
