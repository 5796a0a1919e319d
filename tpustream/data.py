"""Deprecated: the loader moved to ``tpustream.loader`` (``from tpustream.loader import ShardLoader``).

``tpustream.data.ShardLoader`` and the module's other public names keep working for one release (0.x), with a
DeprecationWarning naming the new path. Nothing inside tpustream imports this module.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    new = f"{_MOVED[name]}.{name}"
    warnings.warn(
        f"tpustream.data.{name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2
    )
    return getattr(importlib.import_module(_MOVED[name]), name)
