"""WebDataset shards written by other tools as a SOURCE: re-sharded into tpustream's equal-count layout."""

from __future__ import annotations

from tpustream import storage
from tpustream.source_types import Source, SourceError

__all__ = ["is_shard_directory", "webdataset_source"]


def is_shard_directory(path: str) -> bool:
    """Whether the directory ``path`` holds .tar shards (and no images): read as WebDataset shards."""
    objects = storage.list_objects(path)
    names = [obj.uri[len(path.rstrip("/")) + 1 :] for obj in objects]
    tars = [name for name in names if name.lower().endswith(".tar")]
    return bool(tars) and not any("manifest.json" == name for name in names) and len(tars) * 2 > len(names)


def webdataset_source(spec: str) -> Source:
    raise SourceError(f"source {spec!r}: reading WebDataset shards is not implemented yet")
