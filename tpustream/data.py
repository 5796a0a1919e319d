"""Streaming input: a dataset manifest -> exactly ``steps_per_epoch`` fixed-shape uint8 batches per replica.

Per epoch: shard order from (seed, epoch) -> split by replica (host/process) -> split by DataLoader
worker -> stream tars in-process through the storage seam -> shuffle buffer (encoded bytes) -> decode
+ augment -> full batches. Step counts come from the manifest, never from what was read, so every
replica takes the same number of steps whatever happens to a shard:

- train: ``steps = train_samples // (batch_size * replicas)``; a worker whose shards run short (or
  are corrupt) repeats samples to fill its quota; no partial batch ever.
- val: every sample exactly once across replicas; batches padded to full size with ``mask`` False,
  and replicas with fewer samples get extra all-padding batches so all take the same steps.

Corrupt shards and undecodable samples are skipped, counted, reconciled against the manifest and
reported per epoch in ``EpochReport``. Stats travel in-band with each batch (no shared state).
"""

from __future__ import annotations

import logging
import os
import random
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tpustream import storage
from tpustream.epoch_plan import LoaderError, WorkerPlan, idle_workers, plan_epoch
from tpustream.errors import ConfigError
from tpustream.imagecodec import DEFAULT_MAX_PIXELS, image_member
from tpustream.manifest import read_manifest
from tpustream.tario import TarFormatError, iter_tar_sample_runs, iter_tar_samples
from tpustream.transforms import (
    Augment,
    Prepared,
    default_min_crop_scale,
    prepare_image,
    render_batch,
    skip_image,
)
from tpustream.xla_runtime import process_layout

__all__ = [
    "LoaderConfig",
    "ShardLoader",
    "EpochReport",
    "default_input_size",
    "ring_depth",
    "shm_free_bytes",
    "input_size_rule",
]

log = logging.getLogger(__name__)

MAX_PROBLEMS_KEPT = 50


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """One replica's view of a split. ``batch_size`` is this replica's batch (SPMD: per-device batch x
    local devices; replicas strategy: per-device batch)."""

    data: str
    batch_size: int
    split: str = "train"
    input_size: int = 224
    num_replicas: int | None = None  # default: torch_xla process_count (1 without XLA)
    replica_index: int | None = None  # default: torch_xla process_index (0 without XLA)
    workers: int = 2
    seed: int = 0
    shuffle_buffer: int = 1024
    min_crop_scale: float | None = None  # default: transforms.default_min_crop_scale(input_size)
    prefetch_factor: int = 4
    max_pixels: int = DEFAULT_MAX_PIXELS  # images whose header claims more are skipped as undecodable

    def __post_init__(self) -> None:
        if self.split not in ("train", "val"):
            raise ConfigError(f"split must be 'train' or 'val', got {self.split!r}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.workers < 0:
            raise ConfigError(f"workers must be >= 0, got {self.workers}")
        if self.input_size < 1:
            raise ConfigError(f"input_size must be positive, got {self.input_size}")
        if self.shuffle_buffer < 1:
            raise ConfigError(f"shuffle_buffer must be at least 1, got {self.shuffle_buffer}")
        if self.max_pixels < 1:
            raise ConfigError(f"max_pixels must be at least 1, got {self.max_pixels}")
        if (self.num_replicas is None) != (self.replica_index is None):
            raise ConfigError("give both num_replicas and replica_index, or neither")
        if self.num_replicas is not None and not 0 <= (self.replica_index or 0) < self.num_replicas:
            raise ConfigError(
                f"replica_index {self.replica_index} out of range for {self.num_replicas} replicas"
            )


@dataclass
class EpochReport:
    """What one epoch read, skipped and repeated on this replica, and how long the consumer waited."""

    epoch: int
    steps: int
    samples: int = 0  # real (unmasked) samples delivered
    padded: int = 0  # val padding slots
    repeated: int = 0  # train samples delivered a second time to fill the quota
    undecodable: int = 0  # samples read but not usable: no image or class, undecodable, over --max-pixels
    bad_shards: int = 0
    # manifest samples that bad shards did not yield (negative: a shard held more than its manifest says);
    # val: samples + undecodable + unread == the manifest's samples for this replica
    unread: int = 0
    # a resumed epoch's first batches: read and shuffled, drawn from the same random stream, not decoded
    skipped_on_resume: int = 0
    problems: list[str] = field(default_factory=list)
    wait_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def samples_per_s(self) -> float:
        return (self.samples + self.repeated) / self.seconds if self.seconds > 0 else 0.0

    @property
    def data_wait_fraction(self) -> float:
        return self.wait_seconds / self.seconds if self.seconds > 0 else 0.0

    def add(self, stats: dict[str, Any]) -> None:
        self.samples += stats["samples"]
        self.padded += stats["padded"]
        self.repeated += stats["repeated"]
        self.undecodable += stats["undecodable"]
        self.unread += stats["unread"]
        self.skipped_on_resume += stats["skipped_on_resume"]
        self.bad_shards += len(stats["problems"])
        room = MAX_PROBLEMS_KEPT - len(self.problems)
        self.problems.extend(stats["problems"][: max(0, room)])

    def line(self) -> str:
        return (
            f"epoch {self.epoch}: {self.steps} steps, {self.samples} samples, {self.repeated} repeated, "
            f"{self.padded} padding, {self.undecodable} undecodable, {self.bad_shards} bad shard(s), "
            + (
                f"{self.skipped_on_resume} skipped on resume (not decoded), "
                if self.skipped_on_resume
                else ""
            )
            + f"{self.samples_per_s:,.0f} samples/s, data wait {100 * self.data_wait_fraction:.1f}%"
        )


class _Stats:
    """Per-worker counters shipped with each batch as a delta."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.samples = self.padded = self.repeated = self.undecodable = self.unread = (
            self.skipped_on_resume
        ) = 0
        self.problems: list[str] = []

    def take(self) -> dict[str, Any]:
        out = {
            "samples": self.samples,
            "padded": self.padded,
            "repeated": self.repeated,
            "undecodable": self.undecodable,
            "unread": self.unread,
            "problems": self.problems,
            "skipped_on_resume": self.skipped_on_resume,
        }
        self.reset()
        return out


class _Abandoned(Exception):
    """The main process left the epoch while a worker waited for a free batch slot."""


SHM_DIR = "/dev/shm"  # where torch's share_memory_() puts the ring (shm_open); Docker's default is 64 MB


def shm_free_bytes() -> int | None:
    """Free bytes in /dev/shm, or None where it cannot be read (no such mount: torch then uses files)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def ring_depth(wanted: int, bytes_per_depth: int, free: int | None, what: str) -> int:
    """How many batch slots per worker the ring gets: ``wanted``, fewer when /dev/shm cannot hold them (a
    worker writing past the end of a full /dev/shm dies of SIGBUS, with no message), at least 1 or a
    LoaderError naming the size needed and how to get it."""
    if free is None or wanted * bytes_per_depth <= free:
        return wanted
    depth = free // bytes_per_depth
    mib = 1 << 20
    if depth < 1:
        raise LoaderError(
            f"{what}: the loader's shared-memory batch slots need {bytes_per_depth / mib:,.1f} MiB in "
            f"{SHM_DIR} at least ({wanted * bytes_per_depth / mib:,.1f} MiB to prefetch {wanted} batches per "
            f"worker), and {free / mib:,.1f} MiB are free: give the container a larger {SHM_DIR} (docker run "
            f"--shm-size={-(-wanted * bytes_per_depth // (1 << 30)) + 1}g), or lower --workers, "
            "--batch-size or the input size"
        )
    log.warning(
        "%s: %s has %.1f MiB free, not the %.1f MiB for %d prefetched batches per worker: using %d "
        "(a larger /dev/shm, e.g. docker run --shm-size, restores the full prefetch)",
        what,
        SHM_DIR,
        free / mib,
        wanted * bytes_per_depth / mib,
        wanted,
        depth,
    )
    return int(depth)


class _SlotRing:
    """Preallocated shared-memory image slots, ``depth`` per worker, reused for every batch and epoch.

    A worker renders batch ``j`` straight into its slot ``j % depth`` and ships only the slot's index; the
    main process copies the images out and counts the slot free. Measured against a new shared-memory
    segment per batch (torch's ``share_memory_()`` + pickling): that path passes one file descriptor per
    tensor through the worker's resource-sharer thread, which waits for the worker's GIL, and faults in
    fresh pages on both sides; it cost most of the main process's time at CIFAR size (bench/load.py).
    """

    def __init__(self, workers: int, depth: int, batch_size: int, input_size: int) -> None:
        import torch

        self.depth = depth
        self.images = torch.empty((workers, depth, batch_size, 3, input_size, input_size), dtype=torch.uint8)
        self.images.share_memory_()
        counters = torch.zeros(workers + 3, dtype=torch.int64)
        counters.share_memory_()
        self._counters = counters  # keeps the shared memory alive; the views below are numpy's
        self._views()
        self.in_use = False

    def _views(self) -> None:
        counters = self._counters.numpy()
        workers = counters.shape[0] - 3
        self.consumed = counters[:workers]  # per worker: batches the main process copied out
        self.generation = counters[workers : workers + 1]  # bumped when the main process leaves an epoch
        self.epoch_spec = counters[workers + 1 :]  # (epoch, start_batch): what persistent workers run next

    def __getstate__(self) -> dict[str, Any]:  # spawned workers: numpy views are rebuilt on the shared tensor
        return {"depth": self.depth, "images": self.images, "_counters": self._counters}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, in_use=True)
        self._views()

    def start_epoch(self, epoch: int = 0, start_batch: int = 0) -> int:
        self.consumed[:] = 0
        self.epoch_spec[:] = (epoch, start_batch)
        self.in_use = True
        return int(self.generation[0])

    def end_epoch(self) -> None:
        self.generation[0] += 1  # a worker waiting for a slot gives up
        self.in_use = False

    def claim(self, worker: int, written: int, generation: int) -> int:
        """The slot for this worker's batch ``written``, once the main process has copied its last use."""
        while True:
            # the epoch first: a persistent worker still on a left epoch must not write the next one's slots
            if int(self.generation[0]) != generation:
                raise _Abandoned
            if written - int(self.consumed[worker]) < self.depth:
                break
            time.sleep(0.0002)
        return written % self.depth

    def take(self, worker: int, slot: int) -> Any:
        """The images of a worker's slot, copied out (the caller may keep them); the slot is free again."""
        import torch

        # numpy's copy, one thread: torch's clone of a slot this size splits across its intra-op threads,
        # and a thread that must wait for a core a loader worker holds made each copy take ~5 ms, not
        # ~20 µs (cProfile of the main process, bench load, 2 cores).
        images = torch.from_numpy(self.images[worker, slot].numpy().copy())
        self.consumed[worker] += 1
        return images


@dataclass(frozen=True)
class _Split:
    """What a loader's workers need of it: the split's shards, this replica's place and the augmentation.
    Nothing in it refers back to the ShardLoader, so the worker pool the loader holds forms no reference
    cycle (the pool's workers shut down as soon as the loader is dropped, not at some later collection)."""

    config: LoaderConfig
    dataset: str
    shards: list[dict[str, Any]]
    num_classes: int
    replica_index: int
    num_replicas: int
    augment: Augment

    def plan(self, epoch: int) -> tuple[int, list[WorkerPlan]]:
        cfg = self.config
        return plan_epoch(
            [int(s["num_samples"]) for s in self.shards],
            split=cfg.split,
            epoch=epoch,
            seed=cfg.seed,
            num_replicas=self.num_replicas,
            replica_index=self.replica_index,
            workers=cfg.workers,
            batch_size=cfg.batch_size,
        )

    def layout(self, epoch: int, start_batch: int) -> tuple[int, list[WorkerPlan], list[int]]:
        """The epoch's steps; per worker, the plan it runs in ``epoch`` resumed at ``start_batch`` and how
        many of that plan's batches it skips (drawn for, not decoded)."""
        steps, plans = self.plan(epoch)
        if not 0 <= start_batch <= steps:
            raise ValueError(f"start_batch {start_batch} outside this epoch's {steps} batches")
        order, skip = _resume_layout(start_batch, [plan.num_batches for plan in plans], self.config.workers)
        return steps, [plans[index] for index in order], skip


class _EpochStream:
    """The torch IterableDataset body for one (replica, epoch): each DataLoader worker runs its plan.

    ``persistent``: the workers outlive the epoch (``persistent_workers``); each time the main process
    starts an epoch, they read which one (and its resume batch) from the slot ring's shared spec.
    """

    def __init__(
        self,
        split: _Split,
        epoch: int,
        plans: list[WorkerPlan],
        skip: list[int],
        ring: _SlotRing | None = None,
        generation: int = 0,
        *,
        persistent: bool = False,
    ) -> None:
        self.split = split
        self.epoch = epoch
        self.plans = plans
        self.skip = skip  # per worker: its first batches a resumed epoch does not need (not decoded)
        self.ring = ring  # worker processes render into it; None: fresh tensors (no worker processes)
        self.generation = generation
        self.persistent = persistent
        self._reported: set[int] = set()
        self._worker: int | None = None  # this DataLoader worker's index (None: the main process)
        self._written = 0  # batches this worker rendered this epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        self._worker = info.id if info is not None else None
        self._written = 0
        if self.persistent and self.ring is not None:  # the epoch the main process has just started
            self.generation = int(self.ring.generation[0])
            self.epoch, start_batch = (int(value) for value in self.ring.epoch_spec)
            _, self.plans, self.skip = self.split.layout(self.epoch, start_batch)
            self._reported = set()
        if info is None and len(self.plans) > 1:  # no worker processes: run every plan in turn
            for plan, skip in zip(self.plans, self.skip, strict=True):
                yield from self._run(plan, skip)
            return
        try:
            yield from self._run(self.plans[worker], self.skip[worker])
        except _Abandoned:
            return

    # ---------------------------------------------------------------- reading

    def _raw_samples(self, shard_ids: Sequence[int], stats: _Stats) -> Iterator[tuple[bytes, str, int]]:
        split = self.split
        for shard_id in shard_ids:
            shard = split.shards[shard_id]
            uri = storage.join(split.dataset, shard["path"])
            count = 0  # samples read from the tar, usable or not
            try:
                with storage.open_read(uri) as stream:
                    # No member may claim more bytes than the manifest's shard size: a forged size costs
                    # an error, never an allocation.
                    # In runs (a list per 1 MiB read): a generator step less per sample.
                    for run in iter_tar_sample_runs(stream, int(shard["num_bytes"])):
                        for _key, fields in run:
                            count += 1
                            sample = _pick(fields, split.num_classes)
                            if sample is None:
                                stats.undecodable += 1
                                continue
                            yield sample
            except (TarFormatError, storage.StorageError, OSError) as exc:
                problem = f"{shard['path']}: read {count} of {shard['num_samples']} samples ({exc})"
            except Exception as exc:  # anything else a forged shard trips is still one bad shard, not a crash
                problem = f"{shard['path']}: read {count} of {shard['num_samples']} samples ({type(exc).__name__}: {exc})"
            else:
                if count == shard["num_samples"]:
                    continue
                problem = f"{shard['path']}: read {count} samples, manifest says {shard['num_samples']}"
            if shard_id not in self._reported:  # once per epoch, though repeat passes read it again
                self._reported.add(shard_id)
                stats.problems.append(problem)
                stats.unread += int(shard["num_samples"]) - count

    def _shuffled(self, samples: Iterator[Any], rng: random.Random) -> Iterator[Any]:
        size = self.split.config.shuffle_buffer
        buffer: list[Any] = []
        for sample in samples:
            if len(buffer) < size:
                buffer.append(sample)
                continue
            j = rng.randrange(size)
            yield buffer[j]
            buffer[j] = sample
        rng.shuffle(buffer)
        yield from buffer

    def _decoded(
        self, samples: Iterator[tuple[bytes, str, int]], rng: random.Random, stats: _Stats, skip: list[int]
    ) -> Iterator[tuple[Prepared | None, int]]:
        """Decoded samples; the first ``skip[0]`` are only drawn for (``skip_image``) and come out as None."""
        augment = self.split.augment
        for data, ext, label in samples:
            try:
                if skip[0] > 0:
                    skip_image(data, ext, augment, rng)
                    skip[0] -= 1
                    yield None, label
                else:
                    yield prepare_image(data, ext, augment, rng), label
            except Exception:  # any decoder failure means "undecodable sample": skip and count
                stats.undecodable += 1

    # ---------------------------------------------------------------- batching

    def _run(self, plan: WorkerPlan, skip_batches: int) -> Iterator[dict[str, Any]]:
        if self.split.config.split == "train":
            yield from self._train(plan, skip_batches)
        else:
            if skip_batches:
                raise ValueError("start_batch applies to the train split only")
            yield from self._val(plan)

    def _batch(self, pending: list[Prepared], labels: list[int], stats: _Stats) -> dict[str, Any]:
        """A full batch: ``pending`` rendered into its first slots, the rest zero padding (mask False)."""
        import torch

        size, batch = self.split.config.input_size, self.split.config.batch_size
        # Rendered straight into place (CHW), padding zeroed: a worker's slot in the shared ring, whose index
        # alone travels to the main process, or (no worker processes) a fresh tensor.
        out: dict[str, Any] = {}
        if self.ring is not None and self._worker is not None:
            slot = self.ring.claim(self._worker, self._written, self.generation)
            chw = self.ring.images[self._worker, slot]
            out["_slot"] = (self._worker, slot)
        else:
            chw = torch.empty((batch, 3, size, size), dtype=torch.uint8)
            out["image"] = chw
        self._written += 1
        if pending:
            render_batch(pending, size, chw[: len(pending)])
        if len(pending) < batch:
            chw[len(pending) :].zero_()
        # numpy, not tensors: pickled inline (a few hundred bytes), where a tensor travels as its own
        # shared-memory segment and file descriptor; the main process wraps them without a copy.
        label_array = np.zeros(batch, np.int64)
        label_array[: len(labels)] = labels
        mask = np.zeros(batch, np.bool_)
        mask[: len(pending)] = True
        out.update(label=label_array, mask=mask, _stats=stats.take())
        return out

    def _train(self, plan: WorkerPlan, skip_batches: int = 0) -> Iterator[dict[str, Any]]:
        cfg = self.split.config
        stats = _Stats()
        needed = plan.num_batches * cfg.batch_size
        skip = [skip_batches * cfg.batch_size]  # samples of this plan's first batches, drawn for, not decoded
        pending: list[Prepared] = []
        labels: list[int] = []
        produced = 0
        candidates = [plan.shards, plan.fallback]
        source_index, repeat_pass = 0, 0
        while produced < needed:
            rng = _rng(cfg.seed, self.epoch, self.split.replica_index, plan.worker, repeat_pass)
            shard_ids = list(candidates[source_index])
            if repeat_pass:
                rng.shuffle(shard_ids)
            delivered_this_pass = 0
            stream = self._decoded(self._shuffled(self._raw_samples(shard_ids, stats), rng), rng, stats, skip)
            for prepared, label in stream:
                if prepared is None:  # part of a batch the resumed run already trained on
                    produced += 1
                    delivered_this_pass += 1
                    stats.skipped_on_resume += 1
                    if produced == needed:
                        break
                    continue
                pending.append(prepared)
                labels.append(label)
                produced += 1
                delivered_this_pass += 1
                if repeat_pass:
                    stats.repeated += 1
                else:
                    stats.samples += 1
                if len(pending) == cfg.batch_size:
                    yield self._batch(pending, labels, stats)
                    pending, labels = [], []
                if produced == needed:
                    break
            if delivered_this_pass == 0:
                source_index += 1  # nothing readable in these shards: borrow the replica's/others'
                if source_index >= len(candidates) or not candidates[source_index]:
                    raise RuntimeError(
                        f"replica {self.split.replica_index} worker {plan.worker}: no readable train "
                        f"sample in any shard of {self.split.dataset}; problems: {stats.problems[:3]}"
                    )
            repeat_pass += 1

    def _val(self, plan: WorkerPlan) -> Iterator[dict[str, Any]]:
        cfg = self.split.config
        stats = _Stats()
        rng = _rng(cfg.seed, self.epoch, self.split.replica_index, plan.worker)
        pending: list[Prepared] = []
        labels: list[int] = []
        emitted = 0
        capacity = plan.num_batches * cfg.batch_size
        for prepared, label in self._decoded(self._raw_samples(plan.shards, stats), rng, stats, [0]):
            assert prepared is not None  # nothing is skipped on the val split
            if emitted * cfg.batch_size + len(pending) >= capacity:
                stats.problems.append("more val samples than the manifest lists: extra samples ignored")
                break
            pending.append(prepared)
            labels.append(label)
            stats.samples += 1
            if len(pending) == cfg.batch_size:
                yield self._batch(pending, labels, stats)
                emitted += 1
                pending, labels = [], []
        while emitted < plan.num_batches:
            stats.padded += cfg.batch_size - len(pending)
            yield self._batch(pending, labels, stats)
            emitted += 1
            pending, labels = [], []


# The default training input side (docs/ARCHITECTURE.md, "Input size"): the median shorter side of the
# dataset's images, rounded down to a multiple of 8, within [16, 224]. 224 is ResNet's ImageNet side (more
# costs TPU time quadratically for little accuracy); 16 is the least the small-input stem trains on (8x8
# digits are upscaled); no image is upscaled otherwise. A median, not one image: the same photos gave 120,
# 80, 79 or 224 px from their first sample, by seed and split.
MIN_INPUT_SIZE = 16
MAX_DEFAULT_INPUT_SIZE = 224
SIDE_SAMPLES = 256  # images measured when the manifest has no size statistics (datasets before them)


def input_size_rule(side: int) -> int:
    """The default input side for images whose median shorter side is ``side`` px."""
    return min(MAX_DEFAULT_INPUT_SIZE, max(MIN_INPUT_SIZE, side // 8 * 8))


def median_short_side(dataset: str, manifest: dict[str, Any]) -> tuple[int, str]:
    """The median shorter side of the dataset's train images and where it was read: the manifest's statistics
    (every train image: ``splits.train.stats.short_side``), else, for a dataset written before them, the
    headers of up to 256 images of the first train shard (a shuffled sample)."""
    train = manifest["splits"]["train"]
    median = ((train.get("stats") or {}).get("short_side") or {}).get("median")
    if isinstance(median, int | float) and median > 0:
        return int(median), f"the {train.get('num_samples', 'all')} train images (manifest statistics)"
    import io
    import statistics

    from PIL import Image

    shard = manifest["splits"]["train"]["shards"][0]
    sides: list[int] = []
    with storage.open_read(storage.join(dataset, shard["path"])) as stream:
        for _, fields in iter_tar_samples(stream, int(shard["num_bytes"])):
            ext = image_member(fields)
            if ext is not None:
                with Image.open(io.BytesIO(fields[ext])) as img:  # the header only
                    sides.append(min(img.size))
            if len(sides) == SIDE_SAMPLES:
                break
    if not sides:
        raise LoaderError(f"no image in {storage.join(dataset, shard['path'])}")
    return int(statistics.median_low(sides)), f"{len(sides)} images of {shard['path']}"


def default_input_size(dataset: str, manifest: dict[str, Any]) -> tuple[int, str]:
    """The training input side when none is given, and a line saying how it was chosen (model.json)."""
    side, measured = median_short_side(dataset, manifest)
    size = input_size_rule(side)
    return size, f"median shorter side {side} px over {measured} -> {size} px (multiple of 8 in [16, 224])"


def _round_robin(counts: list[int]) -> list[int]:
    """The order in which torch's DataLoader takes batches from workers with these batch counts: in turn,
    skipping exhausted workers (in-order delivery). Returns the worker index of each batch."""
    return [w for r in range(max(counts, default=0)) for w, count in enumerate(counts) if r < count]


def _resume_layout(start: int, per_plan: list[int], workers: int) -> tuple[list[int], list[int]]:
    """For an epoch resumed at global batch ``start``: which plan each worker runs and how many of that
    plan's batches it skips, so that the DataLoader's order from ``start`` on is the uninterrupted one.

    Without worker processes the plans run one after the other. With them, the DataLoader cycles
    through the workers from worker 0, so the plans are handed to the workers in the order in which the
    uninterrupted epoch next visits them.
    """
    if workers == 0 or len(per_plan) == 1:
        skip = [min(count, max(0, start - sum(per_plan[:i]))) for i, count in enumerate(per_plan)]
        return list(range(len(per_plan))), skip
    order = _round_robin(per_plan)
    skip = [order[:start].count(plan) for plan in range(len(per_plan))]
    tail = order[start:]
    assignment = list(dict.fromkeys(tail))  # plans in order of their next turn
    assignment += [plan for plan in range(len(per_plan)) if plan not in assignment]  # finished ones
    remaining = [per_plan[plan] - skip[plan] for plan in assignment]
    if [assignment[w] for w in _round_robin(remaining)] != tail:
        raise LoaderError(f"cannot resume this epoch's worker order at batch {start}")  # never seen; be loud
    return assignment, [skip[plan] for plan in assignment]


def _as_is(batch: Any) -> Any:
    return batch


def _data_loader(stream: _EpochStream, config: LoaderConfig, *, persistent: bool = False) -> Any:
    import torch.utils.data

    class _Dataset(torch.utils.data.IterableDataset):
        def __init__(self, stream: _EpochStream) -> None:
            self.stream = stream

        def __iter__(self) -> Iterator[dict[str, Any]]:
            return iter(self.stream)

    return torch.utils.data.DataLoader(
        _Dataset(stream),
        batch_size=None,
        collate_fn=_as_is,  # torch's default would turn the numpy labels into shared-memory tensors
        num_workers=config.workers,
        prefetch_factor=config.prefetch_factor if config.workers > 0 else None,
        persistent_workers=persistent,
    )


def _shut_down(loader: Any) -> None:
    """Stop a persistent DataLoader's workers now: what its iterator's finaliser would do, without
    waiting for the iterator to be collected."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        iterator._shutdown_workers()
        loader._iterator = None


def _rng(*key: int) -> random.Random:
    """A fast scalar RNG seeded from the (seed, epoch, replica, worker, ...) key via numpy's SeedSequence."""
    return random.Random(int(np.random.SeedSequence(list(key)).generate_state(2, np.uint64)[0]))


def _pick(fields: dict[str, bytes], num_classes: int) -> tuple[bytes, str, int] | None:
    """(image bytes, ext, label) of a sample, or None when it lacks an image or a valid class."""
    try:
        label = int(fields["cls"])
    except (KeyError, ValueError):
        return None
    if not 0 <= label < num_classes:
        return None
    ext = image_member(fields)
    return None if ext is None else (fields[ext], ext, label)


class ShardLoader:
    """Batches of one split for one replica. ``epoch(n)`` yields exactly ``steps_per_epoch`` batches.

    Each batch is ``{"image": uint8 [B,3,S,S], "label": int64 [B], "mask": bool [B]}``; normalise on the
    device with ``tpustream.transforms.normalize``. ``last_report`` describes the latest epoch.
    """

    def __init__(self, config: LoaderConfig, manifest: dict[str, Any] | None = None) -> None:
        self.config = config
        dataset = storage.check_uri(config.data).rstrip("/")
        if dataset.endswith(".json"):
            dataset = dataset.rsplit("/", 1)[0]
        self.manifest = manifest if manifest is not None else read_manifest(dataset)
        split = self.manifest["splits"].get(config.split)
        if not split or not split.get("shards"):
            raise LoaderError(f"dataset {dataset} has no {config.split!r} split")
        if config.num_replicas is None:
            replica_index, num_replicas = process_layout()
        else:
            replica_index, num_replicas = int(config.replica_index or 0), config.num_replicas
        min_scale = config.min_crop_scale or default_min_crop_scale(config.input_size)
        augment = Augment(
            output_size=config.input_size,
            train=config.split == "train",
            min_crop_scale=min_scale,
            max_pixels=config.max_pixels,
        )
        self._split = _Split(
            config,
            dataset,
            split["shards"],
            len(self.manifest["classes"]),
            replica_index,
            num_replicas,
            augment,
        )
        # Validate the layout now (raises LoaderError with the fix) and fix the step count.
        self.steps_per_epoch, first_plans = self._split.plan(0)
        self.last_report: EpochReport | None = None
        self._ring: _SlotRing | None = None
        self._pool: Any = None  # the DataLoader whose persistent workers render into self._ring
        self._close_pool: weakref.finalize | None = None
        readers = self.num_replicas * max(1, config.workers)
        idle = idle_workers(first_plans) if config.split == "train" else 0
        if idle:
            log.warning(
                "%d train shards over %d replica(s) x %d loader worker(s): %d of this replica's workers have "
                "no shard and stay idle; re-create the shards with --num-shards %d to use them all",
                len(self.shards),
                self.num_replicas,
                max(1, config.workers),
                idle,
                readers,
            )
        elif config.split == "train" and len(self.shards) % readers:
            log.info(
                "%d train shards over %d replica(s) x %d worker(s) do not divide evenly: some workers "
                "repeat a few samples per epoch to keep every replica at %d steps",
                len(self.shards),
                self.num_replicas,
                max(1, config.workers),
                self.steps_per_epoch,
            )

    # What the workers get (``_Split``), read through the loader.
    @property
    def dataset(self) -> str:
        return self._split.dataset

    @property
    def shards(self) -> list[dict[str, Any]]:
        return self._split.shards

    @property
    def num_classes(self) -> int:
        return self._split.num_classes

    @property
    def replica_index(self) -> int:
        return self._split.replica_index

    @property
    def num_replicas(self) -> int:
        return self._split.num_replicas

    @property
    def augment(self) -> Augment:
        return self._split.augment

    @property
    def num_samples(self) -> int:
        return sum(int(s["num_samples"]) for s in self.shards)

    def __len__(self) -> int:
        return self.steps_per_epoch

    def close(self) -> None:
        """Shut the worker processes down now (dropping the loader does too; so does interpreter exit)."""
        if self._close_pool is not None:
            self._close_pool()
        self._pool = self._close_pool = None  # a later epoch starts workers (and their finaliser) anew

    def __enter__(self) -> ShardLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _slot_ring(self) -> _SlotRing:
        """This loader's batch slots (allocated once), or new ones while another epoch still uses them."""
        cfg = self.config
        if self._ring is None or self._ring.in_use:
            per_depth = cfg.workers * cfg.batch_size * 3 * cfg.input_size**2  # one slot per worker
            what = (
                f"{cfg.split} loader ({cfg.workers} workers x batch {cfg.batch_size} x {cfg.input_size} px)"
            )
            depth = ring_depth(cfg.prefetch_factor + 1, per_depth, shm_free_bytes(), what)
            ring = _SlotRing(cfg.workers, depth, cfg.batch_size, cfg.input_size)
            if self._ring is None:
                self._ring = ring
            return ring
        return self._ring

    def epoch(self, epoch: int, start_batch: int = 0) -> Iterator[dict[str, Any]]:
        """Yield this replica's batches of ``epoch``: exactly ``steps_per_epoch`` of them, or raise.

        ``start_batch`` (train): resume an epoch at that batch. The batches before it are not decoded:
        their samples are read and shuffled as before (the shuffle buffer needs them) and their random
        draws replayed from image headers, so batch ``k`` onwards equals an uninterrupted epoch's.
        """
        import torch

        steps, plans, skip = self._split.layout(epoch, start_batch)
        cfg = self.config
        ring = self._slot_ring() if cfg.workers > 0 else None
        generation = ring.start_epoch(epoch, start_batch) if ring is not None else 0
        if ring is not None and ring is self._ring:
            # The loader's own slots: its workers live from epoch to epoch (persistent_workers), which
            # saves a fork, a start-up and a first fill per epoch; each reads the new epoch off the ring.
            if self._pool is None:
                stream = _EpochStream(self._split, epoch, plans, skip, ring, generation, persistent=True)
                self._pool = _data_loader(stream, cfg, persistent=True)
                self._close_pool = weakref.finalize(self, _shut_down, self._pool)
            loader = self._pool
        else:  # no worker processes, or a second epoch open at once: workers and slots of its own
            loader = _data_loader(_EpochStream(self._split, epoch, plans, skip, ring, generation), cfg)
        report = EpochReport(epoch=epoch, steps=steps)
        self.last_report = report
        started = time.perf_counter()
        delivered = start_batch
        iterator = iter(loader)
        try:
            while delivered < steps:
                wait_from = time.perf_counter()
                try:
                    batch = next(iterator)
                except StopIteration:
                    raise RuntimeError(
                        f"loader delivered {delivered} of {steps} batches for epoch {epoch} (a bug: please report)"
                    ) from None
                if ring is not None:
                    batch["image"] = ring.take(*batch.pop("_slot"))
                batch["label"] = torch.from_numpy(batch["label"])
                batch["mask"] = torch.from_numpy(batch["mask"])
                report.wait_seconds += time.perf_counter() - wait_from
                report.add(batch.pop("_stats"))
                delivered += 1
                report.seconds = time.perf_counter() - started
                yield batch
        finally:
            report.seconds = time.perf_counter() - started
            if ring is not None:
                ring.end_epoch()  # before the workers shut down: one waiting for a slot returns
            del iterator
        if report.problems or report.undecodable:
            log.warning("%s; first problems: %s", report.line(), report.problems[:5])
        else:
            log.info(report.line())
