"""Shard creation: plan first (seeded shuffle, upsample, split), then write tar shards, manifest LAST.

This module owns the run (``create_shards``: the checks before anything is written, resume, the process pool's
work, the summary line); ``dataset.shard_writer`` writes one shard, ``dataset.pool`` forks the writers,
``dataset.finalize`` commits the manifest and swaps a replacement in, ``dataset.fanout`` is the pipeline's
range-by-range form of the same run.

Layout written under the output URI (docs/ARCHITECTURE.md):
    train/train-000000.tar ...  val/val-000000.tar ...   manifest.json (written last)
    index/<split>-NNNNNN.jsonl     the sample index: one line per sample of the shard of the same name (its
                                   key, content sha256, size, format, class and source file), written after
                                   the shard and before its record; listed per shard in the manifest.
    _records/<split>-NNNNNN.json   one per finished shard while the dataset is being made (resume);
                                   removed once the manifest is committed.
A shard appears under its final name only when complete (local: temp file + rename; GCS: an object
exists only once its upload finished). Re-running after a crash keeps every shard whose record
matches the plan (and whose index is there) and writes the rest; a complete dataset (manifest present)
is refused unless ``overwrite``. Under ``overwrite`` the new dataset is written beside the old one, in
``_replacement/`` (its own records, resumable the same way), and swapped in only once it is complete: the
old manifest is removed, the new shards and indexes are moved into place, the new manifest is written last.
Until then the old dataset stays valid (a ``--strict`` stop or a crash leaves it as it was); a swap cut off
midway is finished by the next ``shards create`` on that output.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from tpustream.artifacts import Manifest
from tpustream.dataset.finalize import REPLACEMENT_DIR, finalize_manifest, finish_replacement
from tpustream.dataset.label_edits import edit_source
from tpustream.dataset.manifest import MANIFEST_NAME, ShardError
from tpustream.dataset.plan import ShardConfig, ShardSpec, plan_dataset
from tpustream.dataset.pool import run_parallel
from tpustream.dataset.shard_writer import ShardRecord, existing_record, write_shard
from tpustream.image.codec import DEFAULT_MAX_PIXELS
from tpustream.sources.dispatch import open_source
from tpustream.sources.types import Source
from tpustream.storage import io as storage

__all__ = ["CreateSummary", "create_shards", "check_output", "check_source_listing"]

log = logging.getLogger(__name__)


@dataclass
class CreateSummary:
    """The one-line summary of a ``shards create`` run."""

    output: str
    num_samples: int = 0
    num_shards: int = 0
    num_bytes: int = 0
    skipped: int = (
        0  # source images that could not be loaded + rows/samples the source rejected while listing
    )
    skipped_slots: int = 0  # the samples the images would have been: x upsample for train images
    rejected_rows: int = 0  # of ``skipped``: rows or samples left out before any image was read
    reused_shards: int = 0
    seconds: float = 0.0
    split_samples: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        rate = self.num_samples / self.seconds if self.seconds > 0 else 0.0
        splits = ", ".join(f"{k} {v}" for k, v in self.split_samples.items())
        images = self.skipped - self.rejected_rows
        skipped = f"{images} skipped"
        if self.skipped_slots != images:
            skipped = f"{images} skipped images ({self.skipped_slots} samples with their upsampled copies)"
        if self.rejected_rows:
            skipped += f", {self.rejected_rows} rows rejected"
        return (
            f"wrote {self.num_samples} samples ({splits}) in {self.num_shards} shards, "
            f"{self.num_bytes / 1e6:.1f} MB, {rate:,.0f} samples/s, {skipped}, "
            f"{self.reused_shards} shards kept from an earlier run -> {storage.join(self.output, MANIFEST_NAME)}"
        )


# --------------------------------------------------------------------------- the whole run


@dataclass(frozen=True)
class _WriterState:
    """What every forked writer of a ``create_shards`` run writes with: set before the pool forks, so the
    writers inherit it (the source included) instead of receiving it pickled with each shard."""

    source: Source
    output: str
    max_side: int | None
    strict: bool
    max_pixels: int = DEFAULT_MAX_PIXELS


_WRITER: _WriterState | None = None


def _worker_write(spec: ShardSpec) -> ShardRecord:
    state = _WRITER
    if state is None:
        raise RuntimeError("a writer ran outside create_shards (it sets the state before the pool forks)")
    return write_shard(
        state.source,
        spec,
        state.output,
        max_side=state.max_side,
        strict=state.strict,
        max_pixels=state.max_pixels,
    )


def check_output(output: str, *, overwrite: bool) -> bool:
    """Make sure ``output`` can hold a dataset; refuse a complete one there unless ``overwrite``.

    Changes nothing that exists. Returns whether a complete dataset is there, to be replaced
    (written in REPLACEMENT_DIR, then ``finish_replacement``).
    """
    storage.ensure_prefix_writable(output)
    if not storage.exists(storage.join(output, MANIFEST_NAME)):
        return False
    if not overwrite:
        raise ShardError(
            f"{output} already holds a complete dataset ({MANIFEST_NAME} exists): "
            "pass --overwrite to replace it, or choose another --output"
        )
    return True


def check_source_listing(source: Source, *, strict: bool) -> None:
    """Warn about the files and rows the source left out while listing; under ``strict`` refuse them, before
    anything is written."""
    if source.ignored:
        log.warning(
            "ignoring %d non-image file(s) in %s, e.g. %s",
            len(source.ignored),
            source.spec,
            ", ".join(source.ignored[:3]),
        )
        if strict:
            raise ShardError(
                f"--strict: {len(source.ignored)} non-image file(s) in {source.spec}, e.g. {source.ignored[0]}"
            )
    if source.rejected:
        first = source.rejected[0]
        log.warning(
            "%d row(s) of %s rejected while listing, e.g. %s (%s): %s",
            len(source.rejected),
            source.spec,
            first.ref,
            first.reason,
            first.message,
        )
        if strict:
            raise ShardError(
                f"--strict: {len(source.rejected)} row(s) of {source.spec} rejected, the first {first.ref} "
                f"({first.reason}: {first.message}); fix the rows or drop --strict to skip and count them"
            )


def create_shards(
    config: ShardConfig, *, progress: bool = True, source: Source | None = None
) -> tuple[Manifest, CreateSummary]:
    """Plan, write every shard (in parallel), then commit the manifest. Returns (manifest, summary): the
    manifest as written to manifest.json (``Manifest.to_json()`` for its JSON document)."""
    started = time.perf_counter()
    output = storage.check_uri(config.output).rstrip("/")
    finish_replacement(output)  # a swap an earlier --overwrite run did not finish
    if source is None:
        source = open_source(config.source, staging=output, class_names=config.class_names)
    check_source_listing(source, strict=config.strict)
    source, edits = edit_source(source, config, dataset_uri=output)
    # Every check that can fail (source, plan, output) runs before anything is written.
    plan = plan_dataset(source, config, label_edits=edits)
    replacing = check_output(output, overwrite=config.overwrite)
    # Replacing a complete dataset: the new one is made beside it and swapped in when complete.
    target = storage.join(output, REPLACEMENT_DIR) if replacing else output
    if replacing:
        log.info(
            "--overwrite: writing the new dataset in %s; %s stays valid until it is complete", target, output
        )

    records: dict[tuple[str, int], ShardRecord] = {}
    todo: list[ShardSpec] = []
    for spec in plan.shards:
        # --overwrite of an unfinished dataset starts over; a replacement resumes its own earlier attempt
        record = None if config.overwrite and not replacing else existing_record(spec, target)
        if record is None:
            todo.append(spec)
        else:
            records[(spec.split, spec.index)] = record
    reused = len(records)
    if reused:
        log.info("resuming: %d of %d shards already complete and matching the plan", reused, len(plan.shards))

    from tqdm import tqdm

    total = sum(len(s.keys) for s in todo)
    bar = tqdm(total=total, unit="sample", desc="shards", disable=not progress or None, smoothing=0.1)

    def done(record: ShardRecord) -> None:
        records[(record.split, record.index)] = record
        bar.update(record.num_samples + len(record.skipped))

    global _WRITER
    _WRITER = _WriterState(source, target, config.max_side, config.strict, config.max_pixels)
    try:
        run_parallel(_worker_write, todo, config.workers, done)
    finally:
        bar.close()
        _WRITER = None

    manifest = finalize_manifest(target, plan, list(records.values()))
    if replacing:
        finish_replacement(output)
    summary = CreateSummary(
        output=output,
        num_samples=sum(s.num_samples for s in manifest.splits.values()),
        num_shards=len(records),
        num_bytes=sum(s.num_bytes for s in manifest.splits.values()),
        skipped=manifest.skipped.count,
        skipped_slots=manifest.skipped.sample_slots,
        rejected_rows=manifest.skipped.rejected_rows,
        reused_shards=reused,
        seconds=time.perf_counter() - started,
        split_samples={k: v.num_samples for k, v in manifest.splits.items()},
    )
    return manifest, summary
