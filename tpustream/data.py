"""Deprecated: the loader moved to ``tpustream.loader`` (``from tpustream.loader import ShardLoader``).

``tpustream.data.ShardLoader`` and the module's other public names keep working for one release (0.x), with a
DeprecationWarning naming the new path. Nothing inside tpustream imports this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from tpustream.loader.batch import Batch
    from tpustream.loader.config import LoaderConfig
    from tpustream.loader.epoch_plan import LoaderError
    from tpustream.loader.shard_loader import EpochReport, ShardLoader

_MOVED = {
    "ShardLoader": "tpustream.loader.shard_loader",
    "EpochReport": "tpustream.loader.shard_loader",
    "LoaderConfig": "tpustream.loader.config",
    "Batch": "tpustream.loader.batch",
    "LoaderError": "tpustream.loader.epoch_plan",
}
__all__ = ["Batch", "EpochReport", "LoaderConfig", "LoaderError", "ShardLoader"]

__getattr__, __dir__ = lazy_front(__name__, {}, moved=_MOVED)
