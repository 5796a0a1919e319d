"""The loader's per-epoch plan: pure arithmetic on the manifest's shard sizes, the same on every host.

Train: every replica takes ``ceil(samples / (batch x replicas))`` steps (``train_epoch_size``): the
remainder under one global batch is read too, and the epoch's last global batch is padded to full size,
its padding spread over the replicas (at most ``batch - 1`` slots each, so every padded batch keeps a real
sample to copy); only a remainder smaller than the replica count (or ``pad_last_batch`` off) is left out,
and then ``samples // (batch x replicas)`` steps. Its shards (a seeded permutation per epoch, dealt
round-robin to replicas, then to loader workers) give each worker a step quota in proportion to its
samples. The plan then deals samples, not only shards: a worker reads exactly ``quota x batch`` samples
less its ``padding`` (the worker whose batch the replica delivers last pads it), the first of its own
shards' samples, then the sample ranges other workers (of any replica) hold beyond their quota. So every
train sample is read exactly once per epoch (but a counted ``left_out``); no repeat. A replica needs one
shard of its own; with fewer shards than its workers, the workers without one idle (quota 0) and
``idle_workers`` says how many. Val: every shard read by exactly one worker; the replica with the most
batches sets the step count and the others pad with all-masked batches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from tpustream.errors import TpustreamError

__all__ = [
    "LoaderError",
    "SampleRange",
    "TrainEpochSize",
    "WorkerPlan",
    "plan_epoch",
    "idle_workers",
    "train_epoch_size",
]


class LoaderError(TpustreamError, ValueError):
    """The loader cannot be built as asked; the message names the numbers and the fix."""


@dataclass(frozen=True)
class SampleRange:
    """Samples ``start`` (inclusive) to ``stop`` (exclusive) of shard ``shard``, in the tar's order."""

    shard: int  # an index into the split's shard list
    start: int
    stop: int

    @property
    def num_samples(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class WorkerPlan:
    """What one loader worker of one replica does in one epoch."""

    worker: int
    shards: tuple[int, ...]  # the shards dealt to it (indices into the split's shard list), in read order
    num_batches: int
    fallback: tuple[int, ...] = ()  # train: shards to read when its own yield nothing
    # train: what it reads, in order: its own shards cut at its quota, then others' samples beyond theirs;
    # None: its whole shards (val)
    ranges: tuple[SampleRange, ...] | None = None
    left_out: int = 0  # train: samples of its own shards that nobody reads this epoch (the remainder)
    # train: slots of its last batch that are padding (copies of that batch's samples, mask False)
    padding: int = 0

    def read_ranges(self, shard_sizes: Sequence[int]) -> tuple[SampleRange, ...]:
        """The sample ranges this worker reads: ``ranges``, or its whole shards."""
        if self.ranges is not None:
            return self.ranges
        return tuple(SampleRange(s, 0, shard_sizes[s]) for s in self.shards)


EpochSizeCode = Literal["exact", "padded", "under-replicas", "not-padded"]


@dataclass(frozen=True)
class TrainEpochSize:
    """How a train epoch covers the split: steps per replica, padding slots and samples left out (all
    replicas together), with the code of the rule that chose them and ``line()`` to log."""

    num_samples: int
    global_batch: int
    num_replicas: int
    steps: int
    padding: int  # slots of the epoch's last global batch that copy its samples, weighted 0
    left_out: int  # samples nobody reads this epoch
    # exact: the split fills whole global batches; padded: the last one padded; under-replicas: a remainder
    # smaller than the replica count is left out (each replica's padded batch needs a real sample of its own);
    # not-padded: the remainder left out (``pad_last_batch`` off)
    code: EpochSizeCode

    def line(self) -> str:
        head = (
            f"{self.num_samples} train samples in {self.steps} step(s) per epoch of global batch "
            f"{self.global_batch}"
        )
        if self.code == "padded":
            return (
                f"{head}: every sample every epoch, the last batch padded with {self.padding} copies of its own "
                "samples, weighted 0 in the loss"
            )
        if self.code == "under-replicas":
            return (
                f"{head}: {self.left_out} left out per epoch (a remainder under the {self.num_replicas} replicas: "
                "a padded batch keeps one real sample per replica), others each epoch"
            )
        if self.code == "not-padded":
            return f"{head}: the remainder of {self.left_out} left out per epoch (pad_last_batch off)"
        return f"{head}: every sample every epoch"


def train_epoch_size(
    num_samples: int, *, batch_size: int, num_replicas: int, pad_last_batch: bool = True
) -> TrainEpochSize:
    """Pure: the train epoch's steps, padding and left out for ``num_samples`` over replicas of ``batch_size``.

    Raises:
        LoaderError: not even one step can be filled.
    """
    global_batch = batch_size * num_replicas
    full, remainder = divmod(num_samples, global_batch)
    code: EpochSizeCode
    if remainder == 0:
        code = "exact"
    elif not pad_last_batch:
        code = "not-padded"
    elif remainder < num_replicas:  # at most batch - 1 padding slots per replica: never a batch of padding
        code = "under-replicas"
    else:
        padding = global_batch - remainder
        return TrainEpochSize(num_samples, global_batch, num_replicas, full + 1, padding, 0, "padded")
    if full == 0:
        raise LoaderError(
            f"{num_samples} train samples cannot fill one global batch of {batch_size} x {num_replicas} "
            "replicas: use a smaller batch size"
            + (" (a padded batch needs at least one sample per replica)" if pad_last_batch else "")
        )
    return TrainEpochSize(num_samples, global_batch, num_replicas, full, 0, remainder, code)


def _apportion(total: int, weights: Sequence[int]) -> list[int]:
    """Split ``total`` into integer parts proportional to ``weights`` (largest remainder)."""
    weight_sum = sum(weights)
    if weight_sum == 0:
        return [total // len(weights) + (1 if i < total % len(weights) else 0) for i in range(len(weights))]
    exact = [total * w / weight_sum for w in weights]
    parts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (parts[i] - exact[i], i))
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


def plan_epoch(
    shard_sizes: Sequence[int],
    *,
    split: str,
    epoch: int,
    seed: int,
    num_replicas: int,
    replica_index: int,
    workers: int,
    batch_size: int,
    pad_last_batch: bool = True,
) -> tuple[int, list[WorkerPlan]]:
    """Pure: (steps per epoch, this replica's worker plans) from the manifest's shard sizes alone."""
    num_shards = len(shard_sizes)
    readers = max(1, workers)
    if split == "train":
        if num_shards < num_replicas:  # a replica with no shard of its own would read another's: duplicates
            raise LoaderError(
                f"the train split has {num_shards} shards but {num_replicas} replicas (hosts) each need one "
                f"of their own: re-create the shards with --num-shards {num_replicas * readers} (one per "
                f"loader worker of every host), or at least {num_replicas}"
            )
        size = train_epoch_size(
            sum(shard_sizes), batch_size=batch_size, num_replicas=num_replicas, pad_last_batch=pad_last_batch
        )
        steps = size.steps
        order = np.random.default_rng([seed, epoch, 0x5A4D]).permutation(num_shards).tolist()
        ranges, left_out, batch_counts, padding = _deal_samples(
            shard_sizes, order, num_replicas, readers, steps, batch_size, size.padding
        )
        mine = order[replica_index::num_replicas]
        per_worker = [mine[w::readers] for w in range(readers)]
        plans = [
            WorkerPlan(
                w,
                tuple(per_worker[w]),
                batch_counts[replica_index][w],
                tuple(s for s in mine if s not in per_worker[w]) + tuple(s for s in order if s not in mine),
                tuple(ranges[replica_index][w]),
                left_out[replica_index][w],
                padding[replica_index][w],
            )
            for w in range(readers)
        ]
        return steps, plans

    def replica_workers(rank: int) -> list[list[int]]:
        mine = list(range(num_shards))[rank::num_replicas]
        return [mine[w::readers] for w in range(readers)]

    def batches(groups: list[list[int]]) -> list[int]:
        return [math.ceil(sum(shard_sizes[s] for s in g) / batch_size) for g in groups]

    steps = max(1, max(sum(batches(replica_workers(r))) for r in range(num_replicas)))
    groups = replica_workers(replica_index)
    counts = batches(groups)
    counts[-1] += steps - sum(counts)  # all-padding batches so every replica takes `steps` steps
    return steps, [WorkerPlan(w, tuple(groups[w]), counts[w]) for w in range(readers)]


def _deal_samples(
    shard_sizes: Sequence[int],
    order: Sequence[int],
    num_replicas: int,
    readers: int,
    steps: int,
    batch_size: int,
    padding: int = 0,
) -> tuple[list[list[list[SampleRange]]], list[list[int]], list[list[int]], list[list[int]]]:
    """Per replica and worker: the sample ranges it reads, how many of its own samples nobody reads, its
    batches and the padding slots of its last batch.

    Each replica has ``steps`` batches, split between its workers in proportion to their shards' samples.
    The epoch's ``padding`` is spread over the replicas (the first ``padding % replicas`` take one more);
    each replica's goes into the batch it delivers last (``_last_delivered``), so that worker's quota is
    its batches' slots less the padding, and every other worker's is its batches' slots. A worker keeps its own shards' first samples up
    to its quota; the samples beyond it (a shard's tail, or whole shards) go to the workers short of theirs,
    first within the replica, then across replicas (replica by replica, worker by worker); what is left
    (fewer than one global batch) is left out this epoch. The shard permutation changes every epoch, so the
    samples left out do too.
    """
    ranges: list[list[list[SampleRange]]] = []
    surplus: list[list[list[SampleRange]]] = []  # per replica, per worker: its samples beyond its quota
    short: list[list[int]] = []  # per replica, per worker: samples still missing from its quota
    batch_counts: list[list[int]] = []
    paddings: list[list[int]] = []
    for replica in range(num_replicas):
        mine = order[replica::num_replicas]
        per_worker = [mine[w::readers] for w in range(readers)]
        weights = [sum(shard_sizes[s] for s in shards) for shards in per_worker]
        counts = _apportion(steps, weights)
        pads = [0] * readers
        pads[_last_delivered(counts)] = padding // num_replicas + (
            1 if replica < padding % num_replicas else 0
        )
        quotas = [count * batch_size - pad for count, pad in zip(counts, pads, strict=True)]
        batch_counts.append(counts)
        paddings.append(pads)
        ranges.append([])
        surplus.append([])
        short.append([])
        for shards, quota in zip(per_worker, quotas, strict=True):
            kept: list[SampleRange] = []
            extra: list[SampleRange] = []
            room = quota
            for shard in shards:
                size = shard_sizes[shard]
                take = min(size, room)
                if take:
                    kept.append(SampleRange(shard, 0, take))
                if take < size:
                    extra.append(SampleRange(shard, take, size))
                room -= take
            ranges[replica].append(kept)
            surplus[replica].append(extra)
            short[replica].append(room)

    def give(donors: list[list[SampleRange]], takers: list[tuple[int, int]]) -> None:
        for replica, worker in takers:
            needed = short[replica][worker]
            for donor in donors:
                while needed and donor:
                    piece = donor[0]
                    take = min(needed, piece.num_samples)
                    ranges[replica][worker].append(SampleRange(piece.shard, piece.start, piece.start + take))
                    if take == piece.num_samples:
                        donor.pop(0)
                    else:
                        donor[0] = SampleRange(piece.shard, piece.start + take, piece.stop)
                    needed -= take
            short[replica][worker] = needed

    for replica in range(num_replicas):  # within a host first: its own shards, already on its reading list
        give(surplus[replica], [(replica, w) for w in range(readers)])
    takers = [(r, w) for r in range(num_replicas) for w in range(readers)]
    give([extra for per_replica_surplus in surplus for extra in per_replica_surplus], takers)
    if any(any(row) for row in short):  # steps x batch x replicas - padding <= the split's samples: never
        raise LoaderError(f"the epoch plan could not fill every quota: {short} samples short (a bug)")
    left_out = [[sum(r.num_samples for r in extra) for extra in row] for row in surplus]
    return ranges, left_out, batch_counts, paddings


def _last_delivered(batch_counts: Sequence[int]) -> int:
    """The worker whose batch a replica delivers last: the DataLoader takes batches from its workers in
    turn (one worker: in order), so the last of those with the most batches."""
    return max(range(len(batch_counts)), key=lambda w: (batch_counts[w], w))


def idle_workers(plans: Sequence[WorkerPlan]) -> int:
    """How many of a replica's train workers have no shard of their own this epoch (fewer shards than readers)."""
    return sum(1 for plan in plans if not plan.shards)
