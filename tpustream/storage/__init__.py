"""Local paths and ``gs://`` URIs behind one seam: ``io`` is what callers use, ``backend`` the contract,
``local`` and ``gcs`` its two implementations.

The names below are the package's public API, imported on first use so that importing the package loads nothing
heavy (``tpustream --help`` stays torch-free); the modules themselves are imported by their full path inside tpustream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from tpustream.storage.backend import NotFound, PreconditionFailed, StorageError
    from tpustream.storage.io import (
        copy,
        delete,
        exists,
        is_gcs,
        join,
        list_objects,
        move,
        open_read,
        open_write,
        read_bytes,
        read_text,
        write_bytes,
    )

_HOMES = {
    "is_gcs": "io",
    "join": "io",
    "read_bytes": "io",
    "read_text": "io",
    "write_bytes": "io",
    "open_read": "io",
    "open_write": "io",
    "exists": "io",
    "list_objects": "io",
    "copy": "io",
    "move": "io",
    "delete": "io",
    "StorageError": "backend",
    "NotFound": "backend",
    "PreconditionFailed": "backend",
}
__all__ = [
    "copy",
    "delete",
    "exists",
    "is_gcs",
    "join",
    "list_objects",
    "move",
    "open_read",
    "open_write",
    "read_bytes",
    "read_text",
    "write_bytes",
    "NotFound",
    "PreconditionFailed",
    "StorageError",
]

__getattr__, __dir__ = lazy_front(__name__, _HOMES)
