"""What the storage seam's two backends share: the ``Backend`` protocol each implements (local files in
``storage.local``, GCS in ``storage.gcs``), the errors they raise and what a listing returns.

``tpustream.storage.io`` checks a URI, picks the backend by its scheme and calls it; nothing else imports a
backend. URIs reach a backend already checked (``storage.check_uri``): a plain local path or ``gs://``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import IO, Protocol

from tpustream.errors import TpustreamError

__all__ = [
    "Backend",
    "ObjectInfo",
    "StorageError",
    "NotFound",
    "PreconditionFailed",
    "PathKindError",
    "READ_CHUNK",
]

READ_CHUNK = 8 * 1024 * 1024  # large buffered range reads: few round trips per shard


class StorageError(TpustreamError, RuntimeError):
    """A storage operation failed in a way the user must act on (message says what and how)."""


class NotFound(StorageError):
    """The object or file does not exist."""


class PreconditionFailed(StorageError):
    """A compare-and-swap or create-only write lost: the object changed (or exists)."""


class PathKindError(StorageError):
    """A local file where a directory is expected, or a directory where a file is expected."""


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: its full URI, size in bytes, and version (GCS generation, local mtime in ns):
    a re-uploaded object of the same size has a new version."""

    uri: str
    size: int
    version: str = ""


class Backend(Protocol):
    """One kind of storage: what ``tpustream.storage.io``'s public functions of the same names do there.

    Every method but ``copy``/``move`` (both URIs here) and ``local_file`` is one public function; their
    docstrings in ``tpustream.storage.io`` are the contract. Writes are atomic: a reader sees the old object
    or the new one, never a part.
    """

    # reading
    def open_read(self, uri: str) -> IO[bytes]: ...
    def read_bytes(self, uri: str) -> bytes: ...
    def read_range(self, uri: str, start: int, length: int) -> bytes: ...

    # writing
    def write_bytes(self, uri: str, data: bytes, *, create_only: bool, content_type: str | None) -> None: ...
    def upload_file(self, local_path: str, uri: str, *, content_type: str | None) -> None: ...
    def open_write(
        self, uri: str, *, content_type: str | None, buffering: int
    ) -> AbstractContextManager[IO[bytes]]: ...

    # compare-and-swap on small pointer objects
    def read_with_generation(self, uri: str) -> tuple[bytes | None, int]: ...
    def replace_if_generation(self, uri: str, data: bytes, generation: int) -> int: ...

    # metadata and listing
    def exists(self, uri: str) -> bool: ...
    def stat(self, uri: str) -> ObjectInfo: ...
    def stat_or_list(self, uri: str) -> list[ObjectInfo]: ...
    def list_objects(self, prefix: str, *, recursive: bool) -> list[ObjectInfo]: ...
    def sample_objects(self, prefix: str, limit: int) -> list[ObjectInfo]: ...

    # deleting, copying and moving within this backend
    def delete(self, uri: str, *, missing_ok: bool) -> None: ...
    def copy(self, src: str, dst: str) -> None: ...
    def move(self, src: str, dst: str) -> None: ...
    def local_file(self, uri: str) -> AbstractContextManager[str]:
        """A local file holding the object's bytes while the block runs: how a copy crosses backends."""
        ...

    # directories: a local notion; on GCS a prefix exists only through its objects
    def path_kind(self, uri: str) -> str: ...
    def list_dirs(self, uri: str) -> list[str]: ...
    def prefix_exists(self, uri: str) -> bool: ...
    def list_partials(self, uri: str) -> list[str]: ...
    def remove_empty_dir(self, uri: str) -> None: ...
    def ensure_prefix_writable(self, uri: str) -> None: ...
