"""The loader's per-epoch plan: pure arithmetic on the manifest's shard sizes, the same on every host.

Train: every replica takes ``samples // (batch x replicas)`` steps; its shards (a seeded permutation per
epoch, dealt round-robin to replicas, then to loader workers) give each worker a step quota in proportion
to its samples. A replica needs one shard of its own; with fewer shards than its workers, the workers
without one idle (quota 0) and ``idle_workers`` says how many. Val: every shard read by exactly one worker; the replica with the most batches sets the
step count and the others pad with all-masked batches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tpustream.errors import TpustreamError

__all__ = ["LoaderError", "WorkerPlan", "plan_epoch", "idle_workers"]


class LoaderError(TpustreamError, ValueError):
    """The loader cannot be built as asked; the message names the numbers and the fix."""


@dataclass(frozen=True)
class WorkerPlan:
    """What one loader worker of one replica does in one epoch."""

    worker: int
    shards: tuple[int, ...]  # indices into the split's shard list, in read order
    num_batches: int
    fallback: tuple[int, ...] = ()  # train: shards to read when its own yield nothing


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
        steps = sum(shard_sizes) // (batch_size * num_replicas)
        if steps == 0:
            raise LoaderError(
                f"{sum(shard_sizes)} train samples cannot fill one global batch of "
                f"{batch_size} x {num_replicas} replicas: use a smaller batch size"
            )
        order = np.random.default_rng([seed, epoch, 0x5A4D]).permutation(num_shards).tolist()
        mine = order[replica_index::num_replicas]
        per_worker = [mine[w::readers] for w in range(readers)]
        quotas = _apportion(steps, [sum(shard_sizes[s] for s in shards) for shards in per_worker])
        plans = [
            WorkerPlan(
                w,
                tuple(per_worker[w]),
                quotas[w],
                tuple(s for s in mine if s not in per_worker[w]) + tuple(s for s in order if s not in mine),
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


def idle_workers(plans: Sequence[WorkerPlan]) -> int:
    """How many of a replica's train workers have no shard of their own this epoch (fewer shards than readers)."""
    return sum(1 for plan in plans if not plan.shards)
