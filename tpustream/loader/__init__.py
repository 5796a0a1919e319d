"""Streaming input: ``ShardLoader`` turns a dataset manifest into exactly ``steps_per_epoch`` fixed-shape batches
per replica; ``config`` holds its options, ``epoch_plan`` splits an epoch, ``worker`` and ``ring`` run the workers.

The names below are the package's public API, imported on first use so that importing the package loads nothing
heavy (``tpustream --help`` stays torch-free); the modules themselves are imported by their full path inside tpustream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from tpustream.loader.batch import Batch
    from tpustream.loader.config import LoaderConfig
    from tpustream.loader.epoch_plan import LoaderError
    from tpustream.loader.shard_loader import EpochReport, ShardLoader

_HOMES = {
    "ShardLoader": "shard_loader",
    "EpochReport": "shard_loader",
    "LoaderConfig": "config",
    "Batch": "batch",
    "LoaderError": "epoch_plan",
}
__all__ = ["EpochReport", "ShardLoader", "LoaderConfig", "Batch", "LoaderError"]

__getattr__, __dir__ = lazy_front(__name__, _HOMES)
