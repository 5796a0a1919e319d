"""Every SOURCE form (``tpustream shards create SOURCE``) behind one dispatch (``dispatch.open_source``):
builtin datasets, image folders and CIFAR files, import files, Vertex managed datasets, others' WebDataset shards.

The names below are the package's public API, imported on first use so that importing the package loads nothing
heavy (``tpustream --help`` stays torch-free); the modules themselves are imported by their full path inside tpustream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from tpustream.sources.dispatch import SourceForm, open_source, source_help, source_kind
    from tpustream.sources.types import Item, Rejected, Source, SourceError

_HOMES = {
    "open_source": "dispatch",
    "source_kind": "dispatch",
    "source_help": "dispatch",
    "SourceForm": "dispatch",
    "Source": "types",
    "Item": "types",
    "Rejected": "types",
    "SourceError": "types",
}
__all__ = [
    "SourceForm",
    "open_source",
    "source_help",
    "source_kind",
    "Item",
    "Rejected",
    "Source",
    "SourceError",
]

__getattr__, __dir__ = lazy_front(__name__, _HOMES)
