"""The dataset's commit: the manifest from the shard records, written last and atomically, and the swap of a
complete ``--overwrite`` replacement (``_replacement/``) into place.

Both leave the output holding exactly what its manifest lists: shards and indexes of an earlier, different plan
and temp files of killed writers are removed; the records are dropped once the manifest is written. A swap cut
off midway is finished by calling ``finish_replacement`` again.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter

from tpustream.artifacts import IgnoredFiles, Manifest, Shard, SizeSummary, SkippedSummary, Split, SplitStats
from tpustream.dataset.manifest import INDEX_DIR, MANIFEST_NAME, ShardError, index_path
from tpustream.dataset.plan import RECORDS_DIR, SPLITS, DatasetPlan
from tpustream.dataset.shard_writer import ShardRecord
from tpustream.sources.types import SKIP_REASONS
from tpustream.storage import io as storage

__all__ = ["MAX_SKIPS_LISTED", "REPLACEMENT_DIR", "finalize_manifest", "finish_replacement"]

log = logging.getLogger(__name__)

MAX_SKIPS_LISTED = 100
REPLACEMENT_DIR = "_replacement"  # where --overwrite writes the new dataset until it is complete


def finalize_manifest(output: str, plan: DatasetPlan, records: list[ShardRecord]) -> Manifest:
    """Write manifest.json from the shard records — last, atomically — then drop the records.

    Also removes shard files left from an earlier, different plan (more shards than now) and temp
    files of writers killed midway, so the directory holds exactly what the manifest lists.
    """
    by_key = {(r.split, r.index): r for r in records}
    missing = [s.path for s in plan.shards if (s.split, s.index) not in by_key]
    if missing:
        raise ShardError(
            f"cannot write the manifest: {len(missing)} shard(s) not written yet, e.g. {missing[0]}"
        )
    config, source = plan.config, plan.source
    splits: dict[str, Split] = {}
    # item ref -> (message, reason): an upsampled image is skipped once per copy, counted once
    skipped: dict[str, tuple[str, str]] = {}
    skipped_slots = 0
    for split in SPLITS:
        split_records = sorted(
            (by_key[(s.split, s.index)] for s in plan.shards_of(split)), key=lambda r: r.index
        )
        if not split_records:
            continue
        class_counts = [0] * len(source.classes)
        formats: Counter[str] = Counter()
        sizes: Counter[str] = Counter()
        for r in split_records:
            for name, count in r.class_counts.items():
                class_counts[source.classes.index(name)] += count
            reasons = r.skipped_reasons or ["undecodable"] * len(r.skipped)
            refs = r.skipped_items or r.skipped
            for ref, message, reason in zip(refs, r.skipped, reasons, strict=True):
                skipped[ref] = (message, reason)
            skipped_slots += len(r.skipped)
            formats.update(r.formats)
            sizes.update(r.sizes)
        splits[split] = Split(
            num_samples=sum(r.num_samples for r in split_records),
            num_bytes=sum(r.num_bytes for r in split_records),
            class_counts=class_counts,
            stats=SplitStats(
                formats=dict(sorted(formats.items())),
                **{key: SizeSummary(**summary) for key, summary in _size_stats(sizes).items()},
            ),
            shards=[
                Shard(
                    path=r.path,
                    num_samples=r.num_samples,
                    num_bytes=r.num_bytes,
                    sha256=r.sha256,
                    sample_index=r.sample_index,
                    sample_index_sha256=r.sample_index_sha256,
                )
                for r in split_records
            ],
        )
    rejected = source.rejected
    by_reason = Counter(reason for _, reason in skipped.values()) + Counter(r.reason for r in rejected)
    examples = [message for message, _ in skipped.values()]
    examples += [r.message if r.message.startswith(r.ref) else f"{r.ref}: {r.message}" for r in rejected]
    if "train" not in splits or not splits["train"].num_samples:  # 0 train samples is never a dataset
        written = sum(split.num_samples for split in splits.values())
        raise ShardError(
            f"source {source.spec!r}: no train sample could be written ({written} in total; "
            f"{len(skipped) + len(rejected)} skipped{', e.g. ' + examples[0] if examples else ''}): "
            "fix the source's images or rows and re-run"
        )
    manifest = Manifest(
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        source=source.spec,
        source_description=source.description,
        classes=list(source.classes),
        num_classes=len(source.classes),
        seed=config.seed,
        upsample=config.upsample,
        val_fraction=config.val_fraction,
        test_fraction=config.test_fraction,
        max_side=config.max_side,
        max_pixels=config.max_pixels,
        splits=splits,
        skipped=SkippedSummary(
            count=len(skipped) + len(rejected),
            sample_slots=skipped_slots,
            by_reason={reason: by_reason[reason] for reason in SKIP_REASONS if by_reason[reason]},
            rejected_rows=len(rejected),
            examples=examples[:MAX_SKIPS_LISTED],
        ),
        ignored_files=IgnoredFiles(count=len(source.ignored), examples=source.ignored[:MAX_SKIPS_LISTED]),
        label_edits=plan.label_edits,
    )
    _remove_unplanned(output, {s.path for s in plan.shards} | {index_path(s.path) for s in plan.shards})
    _remove_partials(output)
    manifest.write(storage.join(output, MANIFEST_NAME))
    for r in records:
        storage.delete(storage.join(output, f"{RECORDS_DIR}/{r.split}-{r.index:06d}.json"))
    storage.remove_empty_dir(storage.join(output, RECORDS_DIR))
    _warn_missing_classes(manifest)
    return manifest


def _size_stats(sizes: Counter[str]) -> dict[str, dict[str, int]]:
    """min / median / max of the width, height and shorter side over samples (``sizes``: "WxH" -> samples)."""
    pairs = [(*map(int, size.split("x")), count) for size, count in sizes.items()]
    pairs = [(w, h, count) for w, h, count in pairs if w > 0 and h > 0]
    if not pairs:
        return {}

    def summary(values: list[tuple[int, int]]) -> dict[str, int]:
        ordered = sorted(values)
        middle, seen = (sum(count for _, count in ordered) - 1) // 2, 0  # the lower median: a real size
        for value, count in ordered:
            seen += count
            if seen > middle:
                return {"min": ordered[0][0], "median": value, "max": ordered[-1][0]}
        raise AssertionError("unreachable: the counts are positive")

    return {
        "width": summary([(w, count) for w, _, count in pairs]),
        "height": summary([(h, count) for _, h, count in pairs]),
        "short_side": summary([(min(w, h), count) for w, h, count in pairs]),
    }


def _warn_missing_classes(manifest: Manifest) -> None:
    """A split with no sample (train and evaluate need both), or a class with no sample in a split: training
    never sees it, or evaluation never measures it."""
    for split in ("train", "val"):  # test is optional: 0 test samples is the default
        if split not in manifest.splits:
            log.warning(
                "the dataset has no %s split (every item the source gave was assigned to the other): `train` and "
                "`evaluate` need both; re-create it with --val-fraction F, which re-splits every item",
                split,
            )
    for split, info in manifest.splits.items():
        empty = [name for name, count in zip(manifest.classes, info.class_counts, strict=True) if not count]
        if empty:
            log.warning(
                "class(es) %s have 0 %s samples: %s; add images of them or leave them out of the source",
                ", ".join(empty),
                split,
                "the model cannot learn them" if split == "train" else "their accuracy is never measured",
            )


def _remove_unplanned(output: str, planned: set[str]) -> None:
    """Delete the shards and indexes under ``output`` that ``planned`` (relative paths) does not name."""
    for folder, suffix in (*((split, ".tar") for split in SPLITS), (INDEX_DIR, ".jsonl")):
        for obj in storage.list_objects(storage.join(output, folder)):
            relative = obj.uri[len(output) + 1 :]
            if relative not in planned and relative.endswith(suffix):
                log.info("removing %s: not part of this dataset's plan", obj.uri)
                storage.delete(obj.uri)


def finish_replacement(output: str) -> bool:
    """Swap a complete replacement dataset (``output/_replacement``, written by ``--overwrite``) into place.

    The old manifest goes first, so no reader sees old and new shards under one manifest; every step after it
    can be redone, so a swap cut off midway is finished by calling this again. Returns whether there was one.
    """
    staging = storage.join(output, REPLACEMENT_DIR)
    try:
        data = storage.read_bytes(storage.join(staging, MANIFEST_NAME))
    except storage.NotFound:
        return False
    manifest = Manifest.from_json(json.loads(data), storage.join(staging, MANIFEST_NAME))
    log.warning("--overwrite: replacing the dataset at %s with the new one completed in %s", output, staging)
    storage.delete(storage.join(output, MANIFEST_NAME))
    waiting = {obj.uri for obj in storage.list_objects(staging)}  # one listing, not a request per file
    planned: set[str] = set()
    for shard in manifest.all_shards():
        for relative in (shard.path, shard.sample_index):
            if not relative:
                continue
            planned.add(relative)
            if storage.join(staging, relative) in waiting:  # not moved by a cut-off earlier swap
                storage.move(storage.join(staging, relative), storage.join(output, relative))
    _remove_unplanned(output, planned)
    for obj in storage.list_objects(storage.join(output, RECORDS_DIR)):  # an earlier unfinished run's
        storage.delete(obj.uri)
    storage.remove_empty_dir(storage.join(output, RECORDS_DIR))
    storage.write_bytes(storage.join(output, MANIFEST_NAME), data, content_type="application/json")
    storage.delete(storage.join(staging, MANIFEST_NAME))
    for obj in storage.list_objects(staging):  # nothing is left there but empty folders and temp files
        storage.delete(obj.uri)
    for folder in (*SPLITS, INDEX_DIR, RECORDS_DIR, ""):
        storage.remove_empty_dir(storage.join(staging, folder) if folder else staging)
    return True


def _remove_partials(output: str) -> None:
    """Delete the temp files that killed writers left in the split and record folders (once every
    writer is done), so the directory holds exactly what the manifest lists."""
    for folder in (*SPLITS, INDEX_DIR, RECORDS_DIR):
        for leftover in storage.list_partials(storage.join(output, folder)):
            log.info("removing %s: a temp file left by an interrupted writer", leftover)
            storage.delete(leftover)
