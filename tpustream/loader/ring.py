"""The loader's shared-memory batch slots: a ring of preallocated image slots per DataLoader worker, sized
to what /dev/shm holds. Workers render into it; the main process copies out and frees (``ShardLoader``)."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from tpustream.loader.epoch_plan import LoaderError

__all__ = ["SHM_DIR", "shm_free_bytes", "ring_depth"]

log = logging.getLogger(__name__)


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
