"""Shard creation: plan first (seeded shuffle, upsample, split), then write tar shards, manifest LAST.

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

import contextvars
import ctypes
import hashlib
import json
import logging
import multiprocessing
import os
import signal
import struct
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from tpustream.artifacts import IgnoredFiles, Manifest, Shard, SizeSummary, SkippedSummary, Split, SplitStats
from tpustream.dataset.manifest import (
    INDEX_DIR,
    MANIFEST_NAME,
    SampleIndexEntry,
    ShardError,
    index_path,
    load_manifest,
)
from tpustream.dataset.plan import (
    MIN_TRAIN_SHARDS,
    RECORDS_DIR,
    SPLITS,
    DatasetPlan,
    ShardConfig,
    ShardSpec,
    plan_dataset,
)
from tpustream.dataset.tario import TarShardWriter
from tpustream.errors import ConfigError
from tpustream.image.codec import (
    DEFAULT_MAX_PIXELS,
    CorruptImage,
    ImageTooLarge,
    UnreadableImage,
    pixel_budget,
    ppm_header,
)
from tpustream.sources.dispatch import open_source
from tpustream.sources.types import SKIP_REASONS, Item, Source
from tpustream.storage import io as storage

__all__ = [
    "CreateSummary",
    "ShardRecord",
    "LOAD_WINDOW",
    "skip_reason",
    "write_shard",
    "create_shards",
    "check_output",
    "check_source_listing",
    "REPLACEMENT_DIR",
    "finish_replacement",
    "finalize_manifest",
    "config_from_pipeline",
    "shard_ranges",
    "write_shard_range",
    "finalize_dataset",
]

log = logging.getLogger(__name__)

MAX_SKIPS_LISTED = 100
REPLACEMENT_DIR = "_replacement"  # where --overwrite writes the new dataset until it is complete
# Images a writer loads ahead of the one it writes, on threads, when they are objects on GCS: an import file
# lists images in other buckets, one GET (~tens of ms) each, so a writer that fetched one at a time would wait
# on the network nearly all of its time (400 JPEGs with 30 ms per request: 12 samples/s one at a time, 59
# with 8 ahead). Eight leaves two of the 10 connections google-cloud-storage's session keeps per host
# (requests' default pool) to the shard's own upload: with 10 or 16 ahead, urllib3 warned "Connection pool is
# full" and threw connections away (a new TLS handshake each, on real GCS). Items made in memory or read from
# local disk load in the writer's own thread: that is CPU-bound Python, which threads only slow down (3x on
# synthetic-cifar, the GIL handed around). More writers (--workers) is what adds parallelism there.
LOAD_WINDOW = 8


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
    skipped_reasons: list[str] = field(default_factory=list)  # SKIP_REASONS, one per skipped sample
    sample_index: str = ""  # its path, relative to the dataset ("" in records written before it)
    sample_index_sha256: str = ""
    formats: dict[str, int] = field(default_factory=dict)  # image member extension -> samples
    sizes: dict[str, int] = field(default_factory=dict)  # "WxH" -> samples (0x0: header unreadable)

    @classmethod
    def from_json(cls, data: bytes) -> ShardRecord:
        return cls(**json.loads(data))


def skip_reason(exc: CorruptImage) -> str:
    """The manifest's reason (source_types.SKIP_REASONS) for an image a source could not load."""
    if isinstance(exc, ImageTooLarge):
        return "too-large"
    if isinstance(exc, UnreadableImage):
        return "missing-object"
    return "undecodable"


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (baseline, progressive, lossless...): 0xC0-0xCF but DHT, JPG and DAC
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _image_size(data: bytes, ext: str) -> tuple[int, int]:
    """(width, height) from the image's header alone; (0, 0) when it cannot be read.

    Read by hand rather than with ``PIL.Image.open``, which parses every JPEG marker segment (EXIF included)
    and cost ~15% of an ImageFolder write; the source's loader has already checked that the image decodes.
    """
    try:
        if ext == "ppm":
            width, height, _ = ppm_header(data)
            return width, height
        if ext == "png" and data[:8] == _PNG_SIGNATURE and data[12:16] == b"IHDR":
            width, height = struct.unpack_from(">II", data, 16)
            return width, height
        if ext == "jpg" and data[:2] == b"\xff\xd8":
            return _jpeg_size(data)
    except (ValueError, struct.error):
        pass
    return 0, 0


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """The frame size in a JPEG's SOF segment, found by walking the segment lengths from the start."""
    position = 2  # after SOI
    while position + 9 <= len(data):
        if data[position] != 0xFF:
            break
        marker = data[position + 1]
        if marker == 0xFF:  # a fill byte before the marker
            position += 1
        elif marker in _JPEG_SOF:  # FF Cn, length, precision, height, width
            height, width = struct.unpack_from(">HH", data, position + 5)
            return width, height
        elif marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length (TEM, RSTn, SOI)
            position += 2
        else:
            position += 2 + struct.unpack_from(">H", data, position + 2)[0]
    return 0, 0


class _Loaded(NamedTuple):
    """One source item as it goes into a shard, with what the sample index records about it."""

    data: bytes
    ext: str
    sha256: str
    width: int
    height: int


def _load(source: Source, item: Item, max_side: int | None) -> _Loaded | CorruptImage:
    """The item's image and what the sample index records about it, or the CorruptImage saying why it
    cannot be written (returned, not raised: whether it is skipped or fatal is the writer's choice)."""
    try:
        data, ext = source.load(item, max_side)
    except CorruptImage as exc:
        return exc
    width, height = _image_size(data, ext)
    return _Loaded(data, ext, hashlib.sha256(data).hexdigest(), width, height)


def _loaded_in_order(
    source: Source, spec: ShardSpec, max_side: int | None, pool: ThreadPoolExecutor | None
) -> Iterator[tuple[str, Item, _Loaded | CorruptImage]]:
    """The shard's items in plan order, loaded on ``pool`` at most LOAD_WINDOW ahead (None: in this thread)."""
    items = ((key, source.items[i]) for key, i in zip(spec.keys, spec.items, strict=True))
    if pool is None:
        for key, item in items:
            yield key, item, _load(source, item, max_side)
        return
    pending: deque[tuple[str, Item, Future[_Loaded | CorruptImage]]] = deque()
    for key, item in items:
        # in a copy of this thread's context: the pixel budget (pixel_budget) is a ContextVar
        pending.append(
            (key, item, pool.submit(contextvars.copy_context().run, _load, source, item, max_side))
        )
        if len(pending) >= LOAD_WINDOW:
            done_key, done_item, future = pending.popleft()
            yield done_key, done_item, future.result()
    for key, item, future in pending:
        yield key, item, future.result()


def _iter_encoded(
    source: Source,
    spec: ShardSpec,
    max_side: int | None,
    strict: bool,
    skipped: list[tuple[str, str, str]],
) -> Iterator[tuple[str, Item, _Loaded]]:
    """The shard's loaded items in plan order; an image that cannot be loaded is skipped and recorded in
    ``skipped`` as (item ref, message, reason), or stops the shard under ``strict``."""
    remote = bool(spec.items) and storage.is_gcs(source.locate(source.items[spec.items[0]]))
    pool = ThreadPoolExecutor(LOAD_WINDOW, thread_name_prefix="tpustream-load") if remote else None
    try:
        for key, item, loaded in _loaded_in_order(source, spec, max_side, pool):
            if isinstance(loaded, CorruptImage):
                if strict:
                    raise ShardError(
                        f"{loaded} (--strict: stopping; drop --strict to skip and count bad images)"
                    ) from loaded
                log.warning("skipping %s", loaded)
                skipped.append((str(item.ref), str(loaded), skip_reason(loaded)))
                continue
            yield key, item, loaded
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)  # a stopped shard leaves no load running


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
    skipped: list[tuple[str, str, str]] = []  # (item ref, message, reason)
    class_counts: Counter[str] = Counter()
    formats: Counter[str] = Counter()
    sizes: Counter[tuple[int, int]] = Counter()
    index_lines: list[str] = []
    with (
        pixel_budget(max_pixels),
        storage.open_write(final, content_type="application/x-tar") as f,
        TarShardWriter(f) as writer,
    ):
        for key, item, loaded in _iter_encoded(source, spec, max_side, strict, skipped):
            writer.write(key, {loaded.ext: loaded.data, "cls": str(item.label).encode("ascii")})
            name = source.classes[item.label]
            class_counts[name] += 1
            formats[loaded.ext] += 1
            sizes[loaded.width, loaded.height] += 1
            entry = SampleIndexEntry(
                key=key,
                sha256=loaded.sha256,
                width=loaded.width,
                height=loaded.height,
                format=loaded.ext,
                source=source.locate(item),
                label=name,
            )
            index_lines.append(entry.to_json_line() + "\n")
        stats = writer.finish()
    # The index before the record: a recorded shard always has its index (resume trusts the record).
    index = "".join(index_lines).encode()
    storage.write_bytes(
        storage.join(output, index_path(spec.path)), index, content_type="application/x-ndjson"
    )
    record = ShardRecord(
        spec.split,
        spec.index,
        spec.path,
        stats.num_samples,
        stats.num_bytes,
        stats.sha256,
        spec.fingerprint,
        dict(class_counts),
        [message for _, message, _ in skipped],
        [ref for ref, _, _ in skipped],
        [reason for _, _, reason in skipped],
        sample_index=index_path(spec.path),
        sample_index_sha256=hashlib.sha256(index).hexdigest(),
        formats=dict(formats),
        sizes={f"{width}x{height}": count for (width, height), count in sizes.items()},
    )
    storage.write_bytes(storage.join(output, spec.record_path), json.dumps(asdict(record)).encode())
    return record


def _existing_record(spec: ShardSpec, output: str) -> ShardRecord | None:
    """The record of a shard finished by an earlier run, if it matches the plan and the shard is there."""
    try:
        record = ShardRecord.from_json(storage.read_bytes(storage.join(output, spec.record_path)))
    except (storage.NotFound, ValueError, TypeError):
        return None
    if record.fingerprint != spec.fingerprint or not record.sample_index:  # no index: an older writer's
        return None
    try:
        if storage.size(storage.join(output, spec.path)) != record.num_bytes:
            return None
    except storage.NotFound:
        return None
    if not storage.exists(storage.join(output, record.sample_index)):
        return None
    return record


# --------------------------------------------------------------------------- the whole run

_WORKER_STATE: dict[str, Any] = {}
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)


def exit_with_parent(parent_pid: int) -> None:
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
        initializer=exit_with_parent,
        initargs=(os.getpid(),),
    ) as pool:
        for record in pool.map(fn, specs):
            on_done(record)


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
    # Every check that can fail (source, plan, output) runs before anything is written.
    plan = plan_dataset(source, config)
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
        record = None if config.overwrite and not replacing else _existing_record(spec, target)
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

    _WORKER_STATE.update(
        source=source,
        output=target,
        max_side=config.max_side,
        strict=config.strict,
        max_pixels=config.max_pixels,
    )
    try:
        _run_parallel(_worker_write, todo, config.workers, done)
    finally:
        bar.close()
        _WORKER_STATE.clear()

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


# --------------------------------------------------------------------------- fan-out (one plan, many writers)


def config_from_pipeline(
    *,
    source: str,
    output: str,
    num_shards: int,
    val_fraction: float,
    upsample: int,
    seed: int,
    test_fraction: float = 0.0,
    max_side: int = 0,
    strict: bool = False,
    min_train_shards: int = MIN_TRAIN_SHARDS,
) -> ShardConfig:
    """ShardConfig from pipeline parameters, which cannot be None: 0 shards = auto, val_fraction < 0 =
    the source's own split, max_side 0 = keep every image's size."""
    return ShardConfig(
        source=source,
        output=output,
        num_shards=num_shards or None,
        val_fraction=val_fraction if val_fraction >= 0 else None,
        test_fraction=test_fraction,
        upsample=upsample,
        seed=seed,
        max_side=max_side or None,
        strict=strict,
        min_train_shards=min_train_shards,
    )


def shard_ranges(config: ShardConfig, shards_per_task: int) -> list[list[int]]:
    """``[[start, end), ...]`` over the plan's shards (train, val, then test) for parallel writers (KFP ParallelFor)."""
    if shards_per_task < 1:
        raise ConfigError(f"shards_per_task must be at least 1, got {shards_per_task}")
    source = open_source(
        config.source,
        staging=storage.check_uri(config.output).rstrip("/"),
        class_names=config.class_names,
    )
    check_source_listing(source, strict=config.strict)  # the pipeline's --strict stops here, before writing
    plan = plan_dataset(source, config)
    total = len(plan.shards)
    return [[start, min(start + shards_per_task, total)] for start in range(0, total, shards_per_task)]


def write_shard_range(config: ShardConfig, start: int, end: int) -> int:
    """Write the plan's shards ``[start, end)`` (keeping ones an earlier attempt finished); returns how many
    were written now. The manifest is left to ``finalize_dataset``."""
    output = storage.check_uri(config.output).rstrip("/")
    if storage.exists(storage.join(output, MANIFEST_NAME)):
        return 0  # complete already (an earlier run wrote it): nothing to write
    source = open_source(config.source, staging=output, class_names=config.class_names)
    plan = plan_dataset(source, config)
    storage.ensure_prefix_writable(output)
    todo = [spec for spec in plan.shards[start:end] if _existing_record(spec, output) is None]
    for spec in todo:
        write_shard(
            source, spec, output, max_side=config.max_side, strict=config.strict, max_pixels=config.max_pixels
        )
    return len(todo)


def finalize_dataset(config: ShardConfig) -> Manifest:
    """Write manifest.json from the shard records once every planned shard is there (last step).
    A dataset that is complete already is returned as it is (its manifest, and so its digest, unchanged)."""
    output = storage.check_uri(config.output).rstrip("/")
    if storage.exists(storage.join(output, MANIFEST_NAME)):
        return load_manifest(output)
    source = open_source(config.source, staging=output, class_names=config.class_names)
    plan = plan_dataset(source, config)
    records = [r for r in (_existing_record(spec, output) for spec in plan.shards) if r is not None]
    return finalize_manifest(output, plan, records)
