"""What runs in the loader's DataLoader workers: read a worker's shards through the storage seam, shuffle
the encoded samples, decode and augment them, and render full batches into the slot ring.

The workers get everything they need in ``_Split`` and ``EpochStream`` (pickled when workers are spawned,
so both live at module level here); the main-process side is ``tpustream.loader.shard_loader.ShardLoader``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

import numpy as np

from tpustream.artifacts import Shard
from tpustream.dataset.tario import TarFormatError, iter_tar_sample_runs
from tpustream.image.codec import image_member
from tpustream.image.policy import apply_policy
from tpustream.image.transforms import (
    Augment,
    Prepared,
    prepare_image,
    render_batch,
    skip_image,
)
from tpustream.loader.config import LoaderConfig
from tpustream.loader.epoch_plan import LoaderError, SampleRange, WorkerPlan, plan_epoch
from tpustream.loader.ring import _Abandoned, _SlotRing
from tpustream.storage import io as storage

if TYPE_CHECKING:
    import torch

__all__: list[str] = []  # the loader's internals: tpustream.loader.shard_loader is the public face


class StatsDelta(TypedDict):
    """A worker's counters since its previous batch, shipped with each batch (no shared state)."""

    samples: int
    padded: int
    repeated: int
    undecodable: int
    unread: int
    problems: list[str]
    skipped_on_resume: int


class WorkerBatch(TypedDict):
    """A batch as a worker hands it to the main process (pickled through the DataLoader's queue):
    ``ShardLoader.epoch`` turns it into a ``Batch``. The labels and mask are numpy (a few hundred bytes
    inline, where a tensor travels as its own shared-memory segment); the images are either in the worker's
    ring slot, of which only the index travels, or (no worker processes) a fresh tensor."""

    label: np.ndarray
    mask: np.ndarray
    _stats: StatsDelta
    _slot: NotRequired[tuple[int, int]]  # (worker, slot) in the shared ring
    image: NotRequired[torch.Tensor]  # no worker processes: the rendered images themselves
    key: NotRequired[list[str]]  # evaluation (``sample_keys``): the samples' keys, "" for padding


class WorkerStats:
    """Per-worker counters shipped with each batch as a delta."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.samples = self.padded = self.repeated = self.undecodable = self.unread = (
            self.skipped_on_resume
        ) = 0
        self.problems: list[str] = []

    def take(self) -> StatsDelta:
        out = StatsDelta(
            samples=self.samples,
            padded=self.padded,
            repeated=self.repeated,
            undecodable=self.undecodable,
            unread=self.unread,
            problems=self.problems,
            skipped_on_resume=self.skipped_on_resume,
        )
        self.reset()
        return out


@dataclass(frozen=True)
class _Split:
    """What a loader's workers need of it: the split's shards, this replica's place and the augmentation.
    Nothing in it refers back to the ShardLoader, so the worker pool the loader holds forms no reference
    cycle (the pool's workers shut down as soon as the loader is dropped, not at some later collection)."""

    config: LoaderConfig
    dataset: str
    shards: list[Shard]  # the split's, from the manifest
    num_classes: int
    replica_index: int
    num_replicas: int
    augment: Augment

    def plan(self, epoch: int) -> tuple[int, list[WorkerPlan]]:
        cfg = self.config
        return plan_epoch(
            [s.num_samples for s in self.shards],
            split=cfg.split,
            epoch=epoch,
            seed=cfg.seed,
            num_replicas=self.num_replicas,
            replica_index=self.replica_index,
            workers=cfg.workers,
            batch_size=cfg.batch_size,
            pad_last_batch=cfg.pad_last_batch,
        )

    def layout(self, epoch: int, start_batch: int) -> tuple[int, list[WorkerPlan], list[int]]:
        """The epoch's steps; per worker, the plan it runs in ``epoch`` resumed at ``start_batch`` and how
        many of that plan's batches it skips (drawn for, not decoded)."""
        steps, plans = self.plan(epoch)
        if not 0 <= start_batch <= steps:
            raise ValueError(f"start_batch {start_batch} outside this epoch's {steps} batches")
        order, skip = _resume_layout(start_batch, [plan.num_batches for plan in plans], self.config.workers)
        return steps, [plans[index] for index in order], skip


class EpochStream:
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
        self._reported: set[tuple[int, int]] = set()  # (shard, range start) with a problem
        self._worker: int | None = None  # this DataLoader worker's index (None: the main process)
        self._written = 0  # batches this worker rendered this epoch

    def __iter__(self) -> Iterator[WorkerBatch]:
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

    def _raw_samples(
        self, ranges: Sequence[SampleRange], stats: WorkerStats, *, keyed: bool = False
    ) -> Iterator[tuple[bytes, str, Any]]:
        """The usable samples of each range in turn: a range starting past a shard's first sample reads
        the members before it without picking them (another worker reads those), and stops at its end.
        ``keyed`` (evaluation): each sample's label comes as ``(label, key)``, its key in the shard."""
        split = self.split
        for part in ranges:
            shard = split.shards[part.shard]
            uri = storage.join(split.dataset, shard.path)
            whole = part.start == 0 and part.stop == shard.num_samples
            count = 0  # samples read from the tar, usable or not, from the shard's first on
            try:
                with storage.open_read(uri) as stream:
                    # No member may claim more bytes than the manifest's shard size: a forged size costs
                    # an error, never an allocation.
                    # In runs (a list per 1 MiB read): a generator step less per sample.
                    for run in iter_tar_sample_runs(stream, shard.num_bytes):
                        if count + len(run) <= part.start:  # wholly before the range: not even picked
                            count += len(run)
                            continue
                        for sample_key, fields in run:
                            count += 1
                            if count > part.start:
                                sample = _pick(fields, split.num_classes)
                                if sample is None:
                                    stats.undecodable += 1
                                elif keyed:
                                    yield sample[0], sample[1], (sample[2], sample_key)
                                else:
                                    yield sample
                            if count == part.stop and not whole:
                                break
                        if count == part.stop and not whole:
                            break
            except (TarFormatError, storage.StorageError, OSError) as exc:
                problem = f"{shard.path}: read {count} of {shard.num_samples} samples ({exc})"
            except Exception as exc:  # anything else a forged shard trips is still one bad shard, not a crash
                problem = (
                    f"{shard.path}: read {count} of {shard.num_samples} samples ({type(exc).__name__}: {exc})"
                )
            else:
                if count == (shard.num_samples if whole else part.stop):
                    continue
                problem = f"{shard.path}: read {count} samples, manifest says {shard.num_samples}"
            key = (part.shard, part.start)
            if key not in self._reported:  # once per epoch, though repeat passes read it again
                self._reported.add(key)
                stats.problems.append(problem)
                # the range's samples the shard did not yield (negative: a whole shard held more)
                stats.unread += part.num_samples - max(0, count - part.start)

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
        self,
        samples: Iterator[tuple[bytes, str, Any]],
        rng: random.Random,
        stats: WorkerStats,
        skip: list[int],
    ) -> Iterator[tuple[Prepared | None, Any]]:
        """Decoded samples with their labels (as ``_raw_samples`` gives them); the first ``skip[0]`` are only
        drawn for (``skip_image``) and come out as None."""
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

    def _run(self, plan: WorkerPlan, skip_batches: int) -> Iterator[WorkerBatch]:
        if self.split.config.split == "train":
            yield from self._train(plan, skip_batches)
        else:
            if skip_batches:
                raise ValueError("start_batch applies to the train split only")
            yield from self._val(plan)

    def _batch(
        self,
        pending: list[Prepared],
        labels: list[int],
        stats: WorkerStats,
        keys: list[str] | None = None,
        *,
        copies: bool = False,
        policy_seed: int | None = None,
    ) -> WorkerBatch:
        """A full batch: ``pending`` rendered into its first slots, the rest padding (mask False): zeros, or
        with ``copies`` (train) its own samples again, in turn, with their labels, so that the BatchNorm
        statistics of a padded batch are computed over its real images alone (with a real count that divides
        the batch: exactly theirs); with ``keys`` (evaluation), ``key``: the samples' keys, "" for padding.
        ``policy_seed`` (train): the seed of the augmentation policy's draws for this batch (``apply_policy``),
        applied to the real samples before any copy is made of them."""
        import torch

        size, batch = self.split.config.input_size, self.split.config.batch_size
        # Rendered straight into place (CHW), padding zeroed: a worker's slot in the shared ring, whose index
        # alone travels to the main process, or (no worker processes) a fresh tensor.
        slot: tuple[int, int] | None = None
        if self.ring is not None and self._worker is not None:
            slot = (self._worker, self.ring.claim(self._worker, self._written, self.generation))
            chw = self.ring.images[slot]
        else:
            chw = torch.empty((batch, 3, size, size), dtype=torch.uint8)
        self._written += 1
        if pending:
            render_batch(pending, size, chw[: len(pending)])
            if policy_seed is not None:
                apply_policy(chw[: len(pending)], self.split.augment, policy_seed)
        # numpy, not tensors: pickled inline (a few hundred bytes), where a tensor travels as its own
        # shared-memory segment and file descriptor; the main process wraps them without a copy.
        label_array = np.zeros(batch, np.int64)
        label_array[: len(labels)] = labels
        if len(pending) < batch and copies and pending:
            originals = np.arange(len(pending), batch) % len(pending)
            chw[len(pending) :] = chw[torch.from_numpy(originals)]
            label_array[len(pending) :] = label_array[originals]
        elif len(pending) < batch:
            chw[len(pending) :].zero_()
        mask = np.zeros(batch, np.bool_)
        mask[: len(pending)] = True
        out = WorkerBatch(label=label_array, mask=mask, _stats=stats.take())
        if slot is not None:
            out["_slot"] = slot
        else:
            out["image"] = chw
        if keys is not None:
            out["key"] = keys + [""] * (batch - len(keys))
        return out

    def _train(self, plan: WorkerPlan, skip_batches: int = 0) -> Iterator[WorkerBatch]:
        cfg = self.split.config
        stats = WorkerStats()
        needed = (
            plan.num_batches * cfg.batch_size - plan.padding
        )  # its last batch: real samples, then padding
        skip = [skip_batches * cfg.batch_size]  # samples of this plan's first batches, drawn for, not decoded
        batches_done = skip_batches  # batches of the plan: skipped (resume) or yielded
        pending: list[Prepared] = []
        labels: list[int] = []
        produced = 0
        sizes = [shard.num_samples for shard in self.split.shards]
        fallback = WorkerPlan(plan.worker, plan.fallback, 0).read_ranges(sizes)  # whole shards
        candidates = [plan.read_ranges(sizes), fallback]
        source_index, repeat_pass = 0, 0
        while produced < needed:
            rng = _rng(cfg.seed, self.epoch, self.split.replica_index, plan.worker, repeat_pass)
            ranges = list(candidates[source_index])
            if repeat_pass:
                rng.shuffle(ranges)
            delivered_this_pass = 0
            stream = self._decoded(self._shuffled(self._raw_samples(ranges, stats), rng), rng, stats, skip)
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
                    # Keyed by the batch's place in the plan, not by draws from ``rng``: a resumed epoch
                    # skips batches without rendering them, and the batches after them get the same pixels.
                    seed = _seed(
                        cfg.seed, self.epoch, self.split.replica_index, plan.worker, produced, _POLICY
                    )
                    yield self._batch(pending, labels, stats, policy_seed=seed)
                    batches_done += 1
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
        if batches_done < plan.num_batches:  # its last batch, padded (the plan leaves a real sample in it)
            stats.padded += cfg.batch_size - len(pending)
            seed = _seed(cfg.seed, self.epoch, self.split.replica_index, plan.worker, produced, _POLICY)
            yield self._batch(pending, labels, stats, copies=True, policy_seed=seed)

    def _val(self, plan: WorkerPlan) -> Iterator[WorkerBatch]:
        cfg = self.split.config
        stats = WorkerStats()
        rng = _rng(cfg.seed, self.epoch, self.split.replica_index, plan.worker)
        pending: list[Prepared] = []
        labels: list[int] = []
        keys: list[str] | None = [] if cfg.sample_keys else None  # evaluation's per-sample scores
        emitted = 0
        capacity = plan.num_batches * cfg.batch_size
        whole_shards = plan.read_ranges([shard.num_samples for shard in self.split.shards])
        raw = self._raw_samples(whole_shards, stats, keyed=keys is not None)
        for prepared, label in self._decoded(raw, rng, stats, [0]):
            assert prepared is not None  # nothing is skipped on the val split
            if emitted * cfg.batch_size + len(pending) >= capacity:
                stats.problems.append("more val samples than the manifest lists: extra samples ignored")
                break
            pending.append(prepared)
            if keys is not None:
                label, key = label
                keys.append(key)
            labels.append(label)
            stats.samples += 1
            if len(pending) == cfg.batch_size:
                yield self._batch(pending, labels, stats, keys)
                emitted += 1
                pending, labels = [], []
                keys = [] if keys is not None else None
        while emitted < plan.num_batches:
            stats.padded += cfg.batch_size - len(pending)
            yield self._batch(pending, labels, stats, keys)
            emitted += 1
            pending, labels = [], []
            keys = [] if keys is not None else None


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


def _rng(*key: int) -> random.Random:
    """A fast scalar RNG seeded from the (seed, epoch, replica, worker, ...) key via numpy's SeedSequence."""
    return random.Random(int(np.random.SeedSequence(list(key)).generate_state(2, np.uint64)[0]))


_POLICY = 1  # the augmentation policy's seeds: keys of six entries, apart from the crops' (five at most)


def _seed(*key: int) -> int:
    """A 63-bit torch seed from a (seed, epoch, replica, worker, ...) key via numpy's SeedSequence."""
    return int(np.random.SeedSequence(list(key)).generate_state(1, np.uint64)[0] >> np.uint64(1))


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
