"""Shard creation: plan first (seeded shuffle, upsample, split), then write tar shards, manifest LAST.

Layout written under the output URI (docs/ARCHITECTURE.md):
    train/train-000000.tar ...  val/val-000000.tar ...   manifest.json (written last)
    _records/<split>-NNNNNN.json   one per finished shard while the dataset is being made (resume);
                                   removed once the manifest is committed.
A shard appears under its final name only when complete (local: temp file + rename; GCS: an object
exists only once its upload finished). Re-running after a crash keeps every shard whose record
matches the plan and writes the rest; a complete dataset (manifest present) is refused unless
``overwrite``, which retires it (manifest removed) only once every check has passed and writing starts.
"""

from __future__ import annotations

import ctypes
import json
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from tpustream import storage
from tpustream.imagecodec import DEFAULT_MAX_PIXELS, CorruptImage, pixel_budget
from tpustream.manifest import MANIFEST_FORMAT, MANIFEST_NAME, ShardError, read_manifest
from tpustream.shard_plan import RECORDS_DIR, SPLITS, DatasetPlan, ShardConfig, ShardSpec, plan_dataset
from tpustream.source_types import Item, Source
from tpustream.sources import open_source
from tpustream.tario import TarShardWriter

__all__ = [
    "CreateSummary",
    "ShardRecord",
    "write_shard",
    "create_shards",
    "check_output",
    "retire_dataset",
    "finalize_manifest",
    "config_from_pipeline",
    "shard_ranges",
    "write_shard_range",
    "finalize_dataset",
]

log = logging.getLogger(__name__)

MAX_SKIPS_LISTED = 100


@dataclass
class CreateSummary:
    """The one-line summary of a ``shards create`` run."""

    output: str
    num_samples: int = 0
    num_shards: int = 0
    num_bytes: int = 0
    skipped: int = 0  # source images that could not be decoded
    skipped_slots: int = 0  # the samples they would have been: skipped x upsample for train images
    reused_shards: int = 0
    seconds: float = 0.0
    split_samples: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        rate = self.num_samples / self.seconds if self.seconds > 0 else 0.0
        splits = ", ".join(f"{k} {v}" for k, v in self.split_samples.items())
        skipped = f"{self.skipped} skipped"
        if self.skipped_slots != self.skipped:
            skipped = (
                f"{self.skipped} skipped images ({self.skipped_slots} samples with their upsampled copies)"
            )
        return (
            f"wrote {self.num_samples} samples ({splits}) in {self.num_shards} shards, "
            f"{self.num_bytes / 1e6:.1f} MB, {rate:,.0f} samples/s, {skipped}, "
            f"{self.reused_shards} shards kept from an earlier run -> {storage.join(self.output, MANIFEST_NAME)}"
        )


# --------------------------------------------------------------------------- writing one shard


@dataclass
class ShardRecord:
    """What a finished shard holds, stored beside it until the manifest is written."""

    split: str
    index: int
    path: str
    num_samples: int
    num_bytes: int
    sha256: str
    fingerprint: str
    class_counts: dict[str, int]
    skipped: list[str]  # one message per sample not written
    skipped_items: list[str] = field(default_factory=list)  # the source item (ref) of each, in order

    @classmethod
    def from_json(cls, data: bytes) -> ShardRecord:
        return cls(**json.loads(data))


def _iter_encoded(
    source: Source, spec: ShardSpec, max_side: int | None, strict: bool, skipped: list[tuple[str, str]]
) -> Iterator[tuple[str, Item, bytes, str]]:
    for key, i in zip(spec.keys, spec.items, strict=True):
        item = source.items[i]
        try:
            data, ext = source.load(item, max_side)
        except CorruptImage as exc:
            if strict:
                raise ShardError(
                    f"{exc} (--strict: stopping; drop --strict to skip and count bad images)"
                ) from exc
            log.warning("skipping %s", exc)
            skipped.append((str(item.ref), str(exc)))
            continue
        yield key, item, data, ext


def write_shard(
    source: Source,
    spec: ShardSpec,
    output: str,
    *,
    max_side: int | None,
    strict: bool,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> ShardRecord:
    """Write one planned shard to ``output/spec.path`` atomically and record what it holds. Images whose
    header claims more than ``max_pixels`` are skipped (counted) without being decoded."""
    final = storage.join(output, spec.path)
    skipped: list[tuple[str, str]] = []  # (item ref, message)
    class_counts: dict[str, int] = {}
    with (
        pixel_budget(max_pixels),
        storage.open_write(final, content_type="application/x-tar") as f,
        TarShardWriter(f) as writer,
    ):
        for key, item, data, ext in _iter_encoded(source, spec, max_side, strict, skipped):
            writer.write(key, {ext: data, "cls": str(item.label).encode("ascii")})
            name = source.classes[item.label]
            class_counts[name] = class_counts.get(name, 0) + 1
        stats = writer.finish()
    record = ShardRecord(
        spec.split,
        spec.index,
        spec.path,
        stats.num_samples,
        stats.num_bytes,
        stats.sha256,
        spec.fingerprint,
        class_counts,
        [message for _, message in skipped],
        [ref for ref, _ in skipped],
    )
    storage.write_bytes(storage.join(output, spec.record_path), json.dumps(asdict(record)).encode())
    return record


def _existing_record(spec: ShardSpec, output: str) -> ShardRecord | None:
    """The record of a shard finished by an earlier run, if it matches the plan and the shard is there."""
    try:
        record = ShardRecord.from_json(storage.read_bytes(storage.join(output, spec.record_path)))
    except (storage.NotFound, ValueError, TypeError):
        return None
    if record.fingerprint != spec.fingerprint:
        return None
    try:
        if storage.size(storage.join(output, spec.path)) != record.num_bytes:
            return None
    except storage.NotFound:
        return None
    return record


# --------------------------------------------------------------------------- the whole run

_WORKER_STATE: dict[str, Any] = {}
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)


def _exit_with_parent(parent_pid: int) -> None:
    """Pool initializer: a writer dies with the process that started it instead of writing on, orphaned.

    Linux kills it the moment the parent dies (``PR_SET_PDEATHSIG``); elsewhere a thread polls.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            args = (ctypes.c_ulong(v) for v in (signal.SIGKILL, 0, 0, 0))  # prctl is variadic: pass longs
            if libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), *args) == 0:
                if os.getppid() != parent_pid:  # the parent died before the request took effect
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="watch-parent").start()


def _worker_write(spec: ShardSpec) -> ShardRecord:
    state = _WORKER_STATE
    return write_shard(
        state["source"],
        spec,
        state["output"],
        max_side=state["max_side"],
        strict=state["strict"],
        max_pixels=state["max_pixels"],
    )


def _run_parallel(
    fn: Callable[[ShardSpec], ShardRecord],
    specs: list[ShardSpec],
    workers: int,
    on_done: Callable[[ShardRecord], None],
) -> None:
    if workers <= 1 or len(specs) <= 1:
        for spec in specs:
            on_done(fn(spec))
        return
    # fork: workers inherit the listed source (CIFAR arrays, photos) without pickling it
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(
        max_workers=min(workers, len(specs)),
        mp_context=ctx,
        initializer=_exit_with_parent,
        initargs=(os.getpid(),),
    ) as pool:
        for record in pool.map(fn, specs):
            on_done(record)


def check_output(output: str, *, overwrite: bool) -> bool:
    """Make sure ``output`` can hold a dataset; refuse a complete one there unless ``overwrite``.

    Changes nothing that exists. Returns whether a complete dataset is there, to be retired
    (``retire_dataset``) once writing starts.
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


def retire_dataset(output: str) -> None:
    """Remove the manifest (and any resume records) of the dataset at ``output``: it stops being one.

    Its shards are then overwritten in place under the same names (docs/ARCHITECTURE.md), so the old manifest
    could not stay valid: it goes first, and a failure from here on leaves no dataset, not a mixed one.
    """
    log.warning(
        "--overwrite: %s is no longer a dataset from now on (its %s is removed before the new shards are "
        "written); if this run fails, run it again to finish the new dataset",
        output,
        MANIFEST_NAME,
    )
    storage.delete(storage.join(output, MANIFEST_NAME))
    for obj in storage.list_objects(storage.join(output, RECORDS_DIR)):
        storage.delete(obj.uri)


def create_shards(
    config: ShardConfig, *, progress: bool = True, source: Source | None = None
) -> tuple[dict[str, Any], CreateSummary]:
    """Plan, write every shard (in parallel), then commit the manifest. Returns (manifest, summary)."""
    started = time.perf_counter()
    output = storage.check_uri(config.output).rstrip("/")
    if source is None:
        source = open_source(config.source)
    if source.ignored:
        log.warning(
            "ignoring %d non-image file(s) in %s, e.g. %s",
            len(source.ignored),
            source.spec,
            ", ".join(source.ignored[:3]),
        )
        if config.strict:
            raise ShardError(
                f"--strict: {len(source.ignored)} non-image file(s) in {source.spec}, e.g. {source.ignored[0]}"
            )
    # Every check that can fail (source, plan, output) runs before the old dataset is touched.
    plan = plan_dataset(source, config)
    replacing = check_output(output, overwrite=config.overwrite)

    records: dict[tuple[str, int], ShardRecord] = {}
    todo: list[ShardSpec] = []
    for spec in plan.shards:
        record = None if config.overwrite else _existing_record(spec, output)
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

    if replacing:
        retire_dataset(output)
    _WORKER_STATE.update(
        source=source,
        output=output,
        max_side=config.max_side,
        strict=config.strict,
        max_pixels=config.max_pixels,
    )
    try:
        _run_parallel(_worker_write, todo, config.workers, done)
    finally:
        bar.close()
        _WORKER_STATE.clear()

    manifest = finalize_manifest(output, plan, list(records.values()))
    summary = CreateSummary(
        output=output,
        num_samples=sum(s["num_samples"] for s in manifest["splits"].values()),
        num_shards=len(records),
        num_bytes=sum(s["num_bytes"] for s in manifest["splits"].values()),
        skipped=manifest["skipped"]["count"],
        skipped_slots=manifest["skipped"]["sample_slots"],
        reused_shards=reused,
        seconds=time.perf_counter() - started,
        split_samples={k: v["num_samples"] for k, v in manifest["splits"].items()},
    )
    return manifest, summary


def finalize_manifest(output: str, plan: DatasetPlan, records: list[ShardRecord]) -> dict[str, Any]:
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
    splits: dict[str, Any] = {}
    skipped: dict[str, str] = {}  # item ref -> message: an upsampled image is skipped once per copy
    skipped_slots = 0
    for split in SPLITS:
        split_records = sorted(
            (by_key[(s.split, s.index)] for s in plan.shards_of(split)), key=lambda r: r.index
        )
        if not split_records:
            continue
        class_counts = [0] * len(source.classes)
        for r in split_records:
            for name, count in r.class_counts.items():
                class_counts[source.classes.index(name)] += count
            skipped.update(zip(r.skipped_items or r.skipped, r.skipped, strict=True))
            skipped_slots += len(r.skipped)
        splits[split] = {
            "num_samples": sum(r.num_samples for r in split_records),
            "num_bytes": sum(r.num_bytes for r in split_records),
            "class_counts": class_counts,
            "shards": [
                {"path": r.path, "num_samples": r.num_samples, "num_bytes": r.num_bytes, "sha256": r.sha256}
                for r in split_records
            ],
        }
    examples = list(skipped.values())
    manifest = {
        "format": MANIFEST_FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": source.spec,
        "source_description": source.description,
        "classes": list(source.classes),
        "num_classes": len(source.classes),
        "seed": config.seed,
        "upsample": config.upsample,
        "val_fraction": config.val_fraction,
        "max_side": config.max_side,
        "max_pixels": config.max_pixels,
        "splits": splits,
        # count: source images skipped; sample_slots: the samples they cost (x upsample in train)
        "skipped": {
            "count": len(skipped),
            "sample_slots": skipped_slots,
            "examples": examples[:MAX_SKIPS_LISTED],
        },
        "ignored_files": {"count": len(source.ignored), "examples": source.ignored[:MAX_SKIPS_LISTED]},
    }
    planned = {s.path for s in plan.shards}
    for split in SPLITS:
        for obj in storage.list_objects(storage.join(output, split)):
            relative = obj.uri[len(output) + 1 :]
            if relative not in planned and relative.endswith(".tar"):
                log.info("removing %s: not part of this dataset's plan", obj.uri)
                storage.delete(obj.uri)
    _remove_partials(output)
    storage.write_bytes(
        storage.join(output, MANIFEST_NAME),
        json.dumps(manifest, indent=1).encode(),
        content_type="application/json",
    )
    for r in records:
        storage.delete(storage.join(output, f"{RECORDS_DIR}/{r.split}-{r.index:06d}.json"))
    storage.remove_empty_dir(storage.join(output, RECORDS_DIR))
    return manifest


def _remove_partials(output: str) -> None:
    """Delete the temp files that killed writers left in the split and record folders (once every
    writer is done), so the directory holds exactly what the manifest lists."""
    for folder in (*SPLITS, RECORDS_DIR):
        for leftover in storage.list_partials(storage.join(output, folder)):
            log.info("removing %s: a temp file left by an interrupted writer", leftover)
            storage.delete(leftover)


# --------------------------------------------------------------------------- fan-out (one plan, many writers)


def config_from_pipeline(
    *,
    source: str,
    output: str,
    num_shards: int,
    val_fraction: float,
    upsample: int,
    seed: int,
    max_side: int = 0,
    strict: bool = False,
) -> ShardConfig:
    """ShardConfig from pipeline parameters, which cannot be None: 0 shards = auto, val_fraction < 0 =
    the source's own split, max_side 0 = keep every image's size."""
    return ShardConfig(
        source=source,
        output=output,
        num_shards=num_shards or None,
        val_fraction=val_fraction if val_fraction >= 0 else None,
        upsample=upsample,
        seed=seed,
        max_side=max_side or None,
        strict=strict,
    )


def shard_ranges(config: ShardConfig, shards_per_task: int) -> list[list[int]]:
    """``[[start, end), ...]`` over the plan's shards (train then val) for parallel writers (KFP ParallelFor)."""
    if shards_per_task < 1:
        raise ValueError(f"shards_per_task must be at least 1, got {shards_per_task}")
    plan = plan_dataset(open_source(config.source), config)
    total = len(plan.shards)
    return [[start, min(start + shards_per_task, total)] for start in range(0, total, shards_per_task)]


def write_shard_range(config: ShardConfig, start: int, end: int) -> int:
    """Write the plan's shards ``[start, end)`` (keeping ones an earlier attempt finished); returns how many
    were written now. The manifest is left to ``finalize_dataset``."""
    output = storage.check_uri(config.output).rstrip("/")
    if storage.exists(storage.join(output, MANIFEST_NAME)):
        return 0  # complete already (an earlier run wrote it): nothing to write
    source = open_source(config.source)
    plan = plan_dataset(source, config)
    storage.ensure_prefix_writable(output)
    todo = [spec for spec in plan.shards[start:end] if _existing_record(spec, output) is None]
    for spec in todo:
        write_shard(
            source, spec, output, max_side=config.max_side, strict=config.strict, max_pixels=config.max_pixels
        )
    return len(todo)


def finalize_dataset(config: ShardConfig) -> dict[str, Any]:
    """Write manifest.json from the shard records once every planned shard is there (last step).
    A dataset that is complete already is returned as it is (its manifest, and so its digest, unchanged)."""
    output = storage.check_uri(config.output).rstrip("/")
    if storage.exists(storage.join(output, MANIFEST_NAME)):
        return read_manifest(output)
    source = open_source(config.source)
    plan = plan_dataset(source, config)
    records = [r for r in (_existing_record(spec, output) for spec in plan.shards) if r is not None]
    return finalize_manifest(output, plan, records)
