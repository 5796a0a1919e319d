"""Streaming input: a dataset manifest -> exactly ``steps_per_epoch`` fixed-shape uint8 batches per replica.

Per epoch: shard order from (seed, epoch) -> split by replica (host/process) -> split by DataLoader
worker -> stream tars in-process through the storage seam -> shuffle buffer (encoded bytes) -> decode
+ augment -> full batches. Step counts come from the manifest, never from what was read, so every
replica takes the same number of steps whatever happens to a shard:

- train: ``steps = ceil(train_samples / (batch_size * replicas))``; the plan deals every sample to exactly
  one (replica, worker), and the epoch's last global batch is padded to full size with copies of its own
  samples, ``mask`` False (weighted 0 in the loss); only a remainder under the replica count is left out,
  and counted (``TrainEpochSize``); a worker whose shards turn out short (corrupt) repeats samples to fill
  its quota.
- val: every sample exactly once across replicas; batches padded to full size with ``mask`` False,
  and replicas with fewer samples get extra all-padding batches so all take the same steps.

Corrupt shards and undecodable samples are skipped, counted, reconciled against the manifest and
reported per epoch in ``EpochReport``. Stats travel in-band with each batch (no shared state).

The loader in five modules: ``config`` (``LoaderConfig``, the default input size), ``epoch_plan`` (who reads
what), ``ring`` (the shared-memory batch slots), ``worker`` (what runs in the DataLoader workers) and this one,
the main-process side (``ShardLoader``, ``EpochReport``), which re-exports the public names. What it yields is
a ``Batch`` (tpustream/loader/batch.py).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tpustream.artifacts import Shard
from tpustream.dataset.manifest import Manifest, load_manifest
from tpustream.image.transforms import Augment, default_min_crop_scale
from tpustream.loader.batch import Batch
from tpustream.loader.config import LoaderConfig
from tpustream.loader.epoch_plan import LoaderError, TrainEpochSize, idle_workers, train_epoch_size
from tpustream.loader.ring import _SlotRing, ring_depth, shm_free_bytes
from tpustream.loader.worker import EpochStream, StatsDelta, WorkerBatch, _Split
from tpustream.storage import io as storage
from tpustream.xla_runtime import process_layout

__all__ = [
    "LoaderConfig",
    "ShardLoader",
    "EpochReport",
    "ring_depth",
    "shm_free_bytes",
]

log = logging.getLogger(__name__)

MAX_PROBLEMS_KEPT = 50


@dataclass
class EpochReport:
    """What one epoch read, skipped and repeated on this replica, and how long the consumer waited."""

    epoch: int
    steps: int
    samples: int = 0  # real (unmasked) samples delivered: seen once this epoch
    padded: int = 0  # padding slots (mask False): val zeros, train copies of the padded batch's samples
    repeated: int = 0  # train samples delivered a second time to fill the quota (a shard ran short)
    # train: samples of this replica's shards that no replica reads this epoch, the remainder under one global
    # batch (train_samples - steps x batch x replicas over all replicas); the epoch plan's, not what was read
    left_out: int = 0
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

    def add(self, stats: StatsDelta) -> None:
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
            f"epoch {self.epoch}: {self.steps} steps, {self.samples} samples seen, {self.repeated} repeated, "
            + (f"{self.left_out} left out (under one global batch), " if self.left_out else "")
            + f"{self.padded} padding, {self.undecodable} undecodable, {self.bad_shards} bad shard(s), "
            + (
                f"{self.skipped_on_resume} skipped on resume (not decoded), "
                if self.skipped_on_resume
                else ""
            )
            + f"{self.samples_per_s:,.0f} samples/s, data wait {100 * self.data_wait_fraction:.1f}%"
        )


def _as_is(batch: Any) -> Any:
    return batch


def _data_loader(stream: EpochStream, config: LoaderConfig, *, persistent: bool = False) -> Any:
    import torch.utils.data

    class _Dataset(torch.utils.data.IterableDataset):
        def __init__(self, stream: EpochStream) -> None:
            self.stream = stream

        def __iter__(self) -> Iterator[WorkerBatch]:
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


class ShardLoader:
    """Batches of one split for one replica. ``epoch(n)`` yields exactly ``steps_per_epoch`` batches.

    Each batch is ``{"image": uint8 [B,3,S,S], "label": int64 [B], "mask": bool [B]}``; normalise on the
    device with ``tpustream.image.transforms.normalize``. ``last_report`` describes the latest epoch. With
    ``LoaderConfig.sample_keys`` (evaluation) a batch also has ``"key"``: its samples' keys, "" for padding.
    """

    def __init__(self, config: LoaderConfig, manifest: Manifest | None = None) -> None:
        self.config = config
        dataset = storage.check_uri(config.data).rstrip("/")
        if dataset.endswith(".json"):
            dataset = dataset.rsplit("/", 1)[0]
        self.manifest = manifest if manifest is not None else load_manifest(dataset)
        split = self.manifest.split(config.split)
        if split is None or not split.shards:
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
            val_crop_fraction=config.val_crop_fraction,
            policy=config.augment_policy,
            random_erasing=config.random_erasing,
        )
        self._split = _Split(
            config,
            dataset,
            list(split.shards),  # pickled to each worker
            len(self.manifest.classes),
            replica_index,
            num_replicas,
            augment,
        )
        # Validate the layout now (raises LoaderError with the fix) and fix the step count.
        self.steps_per_epoch, first_plans = self._split.plan(0)
        self.epoch_size: TrainEpochSize | None = None  # train: how an epoch covers the split
        if config.split == "train":
            self.epoch_size = train_epoch_size(
                self.num_samples,
                batch_size=config.batch_size,
                num_replicas=num_replicas,
                pad_last_batch=config.pad_last_batch,
            )
            log.info(self.epoch_size.line())
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

    # What the workers get (``_Split``), read through the loader.
    @property
    def dataset(self) -> str:
        return self._split.dataset

    @property
    def shards(self) -> list[Shard]:
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
        return sum(s.num_samples for s in self.shards)

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

    def epoch(self, epoch: int, start_batch: int = 0) -> Iterator[Batch]:
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
                stream = EpochStream(self._split, epoch, plans, skip, ring, generation, persistent=True)
                self._pool = _data_loader(stream, cfg, persistent=True)
                self._close_pool = weakref.finalize(self, _shut_down, self._pool)
            loader = self._pool
        else:  # no worker processes, or a second epoch open at once: workers and slots of its own
            loader = _data_loader(EpochStream(self._split, epoch, plans, skip, ring, generation), cfg)
        report = EpochReport(epoch=epoch, steps=steps, left_out=sum(plan.left_out for plan in plans))
        self.last_report = report
        started = time.perf_counter()
        delivered = start_batch
        iterator = iter(loader)
        try:
            while delivered < steps:
                wait_from = time.perf_counter()
                try:
                    handed: WorkerBatch = next(iterator)
                except StopIteration:
                    raise RuntimeError(
                        f"loader delivered {delivered} of {steps} batches for epoch {epoch} (a bug: please report)"
                    ) from None
                batch = Batch(
                    image=ring.take(*handed["_slot"]) if ring is not None else handed["image"],
                    label=torch.from_numpy(handed["label"]),
                    mask=torch.from_numpy(handed["mask"]),
                )
                if "key" in handed:
                    batch["key"] = handed["key"]
                report.wait_seconds += time.perf_counter() - wait_from
                report.add(handed["_stats"])
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
