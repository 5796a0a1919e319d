"""The plan of a dataset: every shard's contents decided from (source, seed, options) alone.

Seeded stratified train/val(/test) split (or the source's own), one permutation per upsample pass,
``num_shards`` per split with counts differing by at most one, and a fingerprint per shard that resume compares against.
Nothing here writes; ``tpustream.dataset.write`` writes what this plans.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from tpustream.artifacts import LabelEditsApplied
from tpustream.dataset.manifest import MANIFEST_FORMAT, ShardError
from tpustream.errors import ConfigError
from tpustream.image.codec import DEFAULT_MAX_PIXELS
from tpustream.sources.types import Source

__all__ = [
    "ShardConfig",
    "ShardSpec",
    "DatasetPlan",
    "plan_dataset",
    "shard_path",
    "RECORDS_DIR",
    "SPLITS",
    "MIN_TRAIN_SHARDS",
]

RECORDS_DIR = "_records"
SPLITS = ("train", "val", "test")  # test: held out from training and model selection; absent when empty
SAMPLES_PER_SHARD_TARGET = 2000  # the blog's 1.28M samples / 640 shards
DEFAULT_VAL_FRACTION = 0.1  # ShardConfig.val_fraction None: the val share drawn from items without a split
MIN_TRAIN_SHARDS = 8  # enough for a host's loader workers to each stream their own shards

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ShardConfig:
    """Options of ``tpustream shards create`` (the CLI contract in docs/ARCHITECTURE.md); each field's
    docstring is its ``--help``."""

    source: str = "digits"
    """The images to shard (SOURCE)."""
    output: str
    """Dataset URI (local directory or gs://bucket/prefix)."""
    num_shards: int | None = None
    """Train shards (default: ~2,000 samples each, at least 8)."""
    min_train_shards: int = MIN_TRAIN_SHARDS
    """The least train shards when num_shards is None: one per loader worker of every host that reads them (the
    pipeline sets its slice's hosts x the run's loader workers, dataset/fanout.py), capped at the number of
    train samples. Not a CLI option: there --num-shards sets the count itself."""
    val_shards: int | None = None
    """Val shards (default: about the size of train shards)."""
    val_fraction: float | None = None
    """Stratified val fraction (default: the source's own split, else 0.1)."""
    test_fraction: float = 0.0
    """Stratified test fraction carved for a source without a test split of its own (ml_use=test rows, a test/
    folder or test shards), seeded like the val split; 0: no test split. Training and model selection never
    read test; evaluate and promotion decide on it when it exists."""
    upsample: int = 1
    """Repeat the train split K times (e.g. 50k CIFAR -> 1.28M)."""
    seed: int = 0
    """Seed of the split and shuffle."""
    max_side: int | None = None
    """Downsize images whose longer side exceeds PX at write time."""
    max_pixels: int = DEFAULT_MAX_PIXELS
    """Pixel budget: images whose header claims more pixels (width x height) are skipped and counted, never
    decoded (default 64 Mi = 8192x8192: above real photos, below decompression bombs)."""
    workers: int = 1
    """Parallel shard writers (processes)."""
    overwrite: bool = False
    """Replace a complete dataset at --output: the new one is written beside it (in _replacement/) and swapped
    in only once complete, so the old one stays valid until then, even if this run fails (re-run to finish)."""
    strict: bool = False
    """Fail on the first unreadable image or non-image file."""
    class_names: str | None = None
    """Class names as FILE (one per line, local or gs://) or a comma list a,b,c: integer label i (a WebDataset
    .cls index, a folder named 3) becomes name i, so integer and named labels mix as one set of classes. The
    dataset's classes are these names in this order; an integer label out of range or a name not listed is an
    error. Without it, WebDataset shards mixing integer and named labels are refused."""
    exclude_keys: str | None = None
    """Leave out the samples listed in FILE (local or gs://), one per line: each a sample's source or its key in
    the dataset at --output (evaluate's label_issues.json gives both); an unknown name is an error."""
    relabel: str | None = None
    """Give samples another class: FILE (local or gs://) of CSV rows key,class, key as for --exclude-keys, class
    one of the source's."""

    def __post_init__(self) -> None:
        if self.min_train_shards < 1:
            raise ConfigError(f"min_train_shards must be at least 1, got {self.min_train_shards}")
        if self.num_shards is not None and self.num_shards < 1:
            raise ConfigError(f"--num-shards must be at least 1, got {self.num_shards}")
        if self.val_shards is not None and self.val_shards < 1:
            raise ConfigError(f"--val-shards must be at least 1, got {self.val_shards}")
        if self.val_fraction is not None and not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"--val-fraction must be in [0, 1), got {self.val_fraction}")
        if not 0.0 <= self.test_fraction < 1.0:
            raise ConfigError(f"--test-fraction must be in [0, 1), got {self.test_fraction}")
        val_share = DEFAULT_VAL_FRACTION if self.val_fraction is None else self.val_fraction
        if self.test_fraction and val_share + self.test_fraction >= 1.0:
            raise ConfigError(
                f"--test-fraction {self.test_fraction} and the val fraction {val_share} leave no training "
                "samples: their sum must be below 1"
            )
        if self.upsample < 1:
            raise ConfigError(f"--upsample must be at least 1, got {self.upsample}")
        if self.max_side is not None and self.max_side < 8:
            raise ConfigError(f"--max-side must be at least 8 pixels, got {self.max_side}")
        if self.max_pixels < 64:
            raise ConfigError(f"--max-pixels must be at least 64, got {self.max_pixels}")
        if self.workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {self.workers}")
        if self.class_names is not None:
            from tpustream.sources.class_names import parse_class_names

            parse_class_names(self.class_names)  # a comma list is checked now; a FILE when the source opens


@dataclass(frozen=True)
class ShardSpec:
    """One planned shard: which source items it holds, under which keys, and its plan fingerprint."""

    split: str
    index: int
    keys: tuple[str, ...]
    items: tuple[int, ...]  # indices into Source.items
    fingerprint: str

    @property
    def path(self) -> str:
        return shard_path(self.split, self.index)

    @property
    def record_path(self) -> str:
        return f"{RECORDS_DIR}/{self.split}-{self.index:06d}.json"


@dataclass
class DatasetPlan:
    """Everything decided before any byte is written."""

    source: Source
    config: ShardConfig
    shards: list[ShardSpec]
    split_counts: dict[str, int]
    label_edits: LabelEditsApplied | None = None  # what ``source`` has had applied (the manifest records it)

    def shards_of(self, split: str) -> list[ShardSpec]:
        return [s for s in self.shards if s.split == split]


def shard_path(split: str, index: int) -> str:
    return f"{split}/{split}-{index:06d}.tar"


def _split_items(source: Source, config: ShardConfig, rng: np.random.Generator) -> dict[str, list[int]]:
    """Train/val/test item indices: the source's own split, or a stratified ``val_fraction`` split.

    Items the source puts in test (ml_use=test, a test/ folder or shard) stay there whatever the options: a
    curated test set is never re-split into training. A source without one gets a stratified ``test_fraction``
    of every item first (no draw when it is 0, so earlier plans stay as they were). Of the rest, without
    ``val_fraction``, items that carry a split keep it and items without one (import-file rows with no
    ml_use) get a stratified split of their own at the default 0.1; ``val_fraction`` re-splits them all
    (as a share of every item). A source with train and test but no val gets val drawn from train.
    """
    pool = list(range(len(source.items)))
    remaining = 1.0
    test = [i for i in pool if source.items[i].split == "test"]
    if test:
        pool = [i for i in pool if source.items[i].split != "test"]
        if config.test_fraction:
            log.warning(
                "source %s has its own test split (%d items): --test-fraction %s is not applied",
                source.spec,
                len(test),
                config.test_fraction,
            )
    elif config.test_fraction:
        pool, test = _stratified(source, pool, config.test_fraction, rng)
        remaining = 1.0 - config.test_fraction  # val_fraction stays a share of every item
    splits: dict[str, list[int]] = {"train": [], "val": []}
    if source.has_own_split and config.val_fraction is None:
        unassigned: list[int] = []
        for i in pool:
            item = source.items[i]
            (splits[item.split] if item.split is not None else unassigned).append(i)
        if unassigned:  # no rng draw otherwise: fully split sources keep the plans they always had
            train, val = _stratified(source, unassigned, DEFAULT_VAL_FRACTION, rng)
            splits["train"].extend(train)
            splits["val"].extend(val)
        elif test and not splits["val"]:  # train and test only: model selection needs a val split of its own
            splits["train"], splits["val"] = _stratified(source, splits["train"], DEFAULT_VAL_FRACTION, rng)
    else:
        fraction = DEFAULT_VAL_FRACTION if config.val_fraction is None else config.val_fraction
        splits["train"], splits["val"] = _stratified(source, pool, fraction / remaining, rng)
    if test:
        splits["test"] = test
    return splits


def _stratified(
    source: Source, indices: Iterable[int], fraction: float, rng: np.random.Generator
) -> tuple[list[int], list[int]]:
    """(rest, drawn): ``fraction`` of each class's ``indices`` (at least one while the class has two) drawn,
    seeded."""
    by_class: dict[int, list[int]] = {}
    for i in indices:
        by_class.setdefault(source.items[i].label, []).append(i)
    train: list[int] = []
    val: list[int] = []
    for label in sorted(by_class):
        members = np.array(by_class[label])
        rng.shuffle(members)
        n_val = int(round(fraction * len(members)))
        if fraction > 0 and len(members) >= 2:
            n_val = min(max(n_val, 1), len(members) - 1)  # every class in both splits when possible
        val.extend(members[:n_val].tolist())
        train.extend(members[n_val:].tolist())
    return train, val


def _fingerprint(
    source: Source, config: ShardConfig, split: str, keys: Sequence[str], items: Sequence[int]
) -> str:
    h = hashlib.sha256()
    params: list[object] = [MANIFEST_FORMAT, source.spec, config.max_side, split]
    if config.max_pixels != DEFAULT_MAX_PIXELS:  # another budget skips other images: another shard
        params.append(config.max_pixels)  # (the default leaves earlier datasets' fingerprints as they were)
    if config.class_names is not None:  # the records count samples by class name: renamed classes, new shards
        params.append(source.classes)
    h.update(json.dumps(params).encode())
    for key, i in zip(keys, items, strict=True):
        item = source.items[i]
        h.update(f"{key}\t{item.ref}\t{item.label}\n".encode())
    return h.hexdigest()


def plan_dataset(
    source: Source, config: ShardConfig, *, label_edits: LabelEditsApplied | None = None
) -> DatasetPlan:
    """Decide every shard's contents from (source, seed, options) alone — deterministic. ``label_edits``:
    what ``tpustream.dataset.label_edits.edit_source`` applied to ``source``, kept for the manifest."""
    if not source.items:
        raise ShardError(f"source {source.spec!r} has no samples")
    rng = np.random.default_rng(config.seed)
    splits = _split_items(source, config, rng)
    if not splits["train"]:
        fix = (
            "its items all carry the val or test split (ml_use validation/test, val/test shards or folders): give "
            "--val-fraction F to re-split every item"
            if source.has_own_split and config.val_fraction is None
            else "lower --val-fraction or add images"
        )
        raise ShardError(f"source {source.spec!r} has no training samples after the train/val split: {fix}")
    # Each upsample pass is its own permutation, so copies of one image land in different shards
    # (a single shuffle of the tiled list would often put two copies in one shard and one buffer).
    base = np.array(splits["train"], dtype=np.int64)
    order = {
        "train": np.concatenate([rng.permutation(base) for _ in range(config.upsample)]),
        "val": rng.permutation(np.array(splits["val"], dtype=np.int64)),
    }
    if "test" in splits:  # drawn last: a dataset without test keeps the plan it always had
        order["test"] = rng.permutation(np.array(splits["test"], dtype=np.int64))
    num_train = len(order["train"])
    train_shards = config.num_shards or max(
        min(config.min_train_shards, num_train), math.ceil(num_train / SAMPLES_PER_SHARD_TARGET)
    )
    if train_shards > num_train:
        raise ShardError(
            f"{num_train} training samples cannot fill {train_shards} shards: "
            f"use --num-shards {num_train} or fewer (or --upsample)"
        )
    num_val = len(order["val"])
    per_shard = num_train / train_shards
    val_shards = config.val_shards or (max(1, min(num_val, round(num_val / per_shard))) if num_val else 0)
    if num_val and val_shards > num_val:
        raise ShardError(
            f"{num_val} validation samples cannot fill {val_shards} shards: use --val-shards {num_val} or fewer"
        )
    num_test = len(order.get("test", ()))
    test_shards = max(1, min(num_test, round(num_test / per_shard))) if num_test else 0
    shards: list[ShardSpec] = []
    for split, count in (("train", train_shards), ("val", val_shards), ("test", test_shards)):
        if not len(order.get(split, ())):
            continue
        position = 0  # order[split] is already globally shuffled: classes are mixed in every shard
        for index, chunk in enumerate(np.array_split(order[split], count)):
            keys = tuple(f"{position + j:08d}" for j in range(len(chunk)))
            items = tuple(int(i) for i in chunk)
            position += len(chunk)
            shards.append(
                ShardSpec(split, index, keys, items, _fingerprint(source, config, split, keys, items))
            )
    return DatasetPlan(source, config, shards, {k: len(v) for k, v in order.items()}, label_edits)
