"""The one storage seam: local paths and ``gs://`` URIs, read and written in-process.

Every other module passes URIs as ``str`` and calls these functions; nothing else knows about GCS.
No gsutil, no subprocess, no ``pipe:``. GCS calls go through google-cloud-storage with retries on
transient errors (429, 5xx, connection resets, cut bodies) and honour ``STORAGE_EMULATOR_HOST``.

Each function checks its URI and hands it to the backend its scheme names (``storage.backend.Backend``):
``storage.local.LocalBackend`` for paths and ``file:`` URIs, ``storage.gcs.GcsBackend`` for ``gs://``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterator
from typing import IO

from tpustream.storage.backend import (
    Backend,
    NotFound,
    ObjectInfo,
    PathKindError,
    PreconditionFailed,
    StorageError,
)
from tpustream.storage.gcs import GCS_SCHEME, BucketInfo, GcsBackend, split_gcs
from tpustream.storage.local import LocalBackend

__all__ = [
    "absolute",
    "sample_objects",
    "StorageError",
    "NotFound",
    "PreconditionFailed",
    "PathKindError",
    "ObjectInfo",
    "GCS_SCHEME",
    "is_gcs",
    "join",
    "check_uri",
    "open_read",
    "read_bytes",
    "sha256",
    "read_range",
    "read_text",
    "write_bytes",
    "upload_file",
    "open_write",
    "read_with_generation",
    "replace_if_generation",
    "exists",
    "size",
    "stat",
    "stat_or_list",
    "list_objects",
    "path_kind",
    "list_dirs",
    "list_partials",
    "prefix_exists",
    "delete",
    "copy",
    "move",
    "remove_empty_dir",
    "ensure_prefix_writable",
    "BucketInfo",
    "bucket_info",
]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

_LOCAL = LocalBackend()
_GCS = GcsBackend()


def is_gcs(uri: str) -> bool:
    return uri.startswith(GCS_SCHEME)


def _backend(uri: str) -> Backend:
    """The backend of a checked URI."""
    return _GCS if is_gcs(uri) else _LOCAL


def check_uri(uri: str) -> str:
    """Return ``uri`` normalised, or raise ``StorageError`` for schemes we refuse.

    ``pipe:`` URLs run shell commands (webdataset) and are refused outright; any other ``scheme://``
    but ``gs://`` and ``file://`` is unsupported.
    """
    if not isinstance(uri, str) or not uri:
        raise StorageError(f"empty storage URI {uri!r}: give a local path or a gs://bucket/prefix URI")
    if uri.startswith("pipe:"):
        raise StorageError(
            f"refusing {uri!r}: pipe: URLs run shell commands; give a local path or a gs:// URI instead"
        )
    if uri.startswith("file:"):
        return _file_uri_path(uri)
    if is_gcs(uri):
        bucket, _ = split_gcs(uri)
        if not bucket:
            raise StorageError(f"{uri!r} names no bucket: use gs://BUCKET/PREFIX")
        return uri
    scheme = _SCHEME.match(uri)
    if scheme:
        raise StorageError(
            f"unsupported URI scheme {scheme.group(0)!r} in {uri!r}: tpustream reads and writes local paths and gs:// only"
        )
    return uri


def absolute(uri: str) -> str:
    """``uri`` checked, with a local path made absolute: what a record that outlives the current directory
    (model.json, metrics.json) stores, so it still names the same place when read from elsewhere."""
    uri = check_uri(uri).rstrip("/") or "/"
    return uri if is_gcs(uri) else os.path.abspath(uri)


def _file_uri_path(uri: str) -> str:
    """The local path of a ``file:`` URI: ``file:///p``, ``file://localhost/p`` and ``file:/p`` are ``/p``;
    ``file://p`` stays the relative path ``p``. A bare ``file:p`` is refused: as a path it would create a
    directory literally named ``file:``."""
    if uri.startswith("file://localhost/"):
        return uri[len("file://localhost") :]
    if uri.startswith("file://"):
        path = uri[len("file://") :]
    elif uri.startswith("file:/"):
        path = uri[len("file:") :]
    else:
        path = ""
    if not path:
        raise StorageError(
            f"{uri!r} is not a file URI with a path: give file:///ABSOLUTE/PATH or a plain path"
        )
    return path


def join(base: str, *parts: str) -> str:
    """Join path parts onto a local path or gs:// URI with '/'."""
    out = base.rstrip("/") if base not in ("/", GCS_SCHEME) else base
    for part in parts:
        part = part.strip("/")
        if part:
            out = f"{out}/{part}" if not out.endswith("/") else out + part
    return out


# --------------------------------------------------------------------------- reading


def open_read(uri: str) -> IO[bytes]:
    """Open an object or file for streaming binary reads (GCS: large buffered range reads, retried)."""
    uri = check_uri(uri)
    return _backend(uri).open_read(uri)


def read_bytes(uri: str) -> bytes:
    uri = check_uri(uri)
    return _backend(uri).read_bytes(uri)


def sha256(uri: str) -> str:
    """The sha256 hex digest of an object's bytes, read in 1 MiB chunks (a model's weights need not fit twice)."""
    digest = hashlib.sha256()
    with open_read(uri) as reader:
        while chunk := reader.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def read_range(uri: str, start: int, length: int) -> bytes:
    """``length`` bytes of the object or file at ``start`` (one ranged GET on GCS); fewer only at its end."""
    uri = check_uri(uri)
    if length <= 0:
        return b""
    return _backend(uri).read_range(uri, start, length)


def read_text(uri: str) -> str:
    return read_bytes(uri).decode("utf-8")


# --------------------------------------------------------------------------- writing


def write_bytes(uri: str, data: bytes, *, create_only: bool = False, content_type: str | None = None) -> None:
    """Write a whole object atomically: readers see the old object or the new one, never a part.

    Args:
        uri: destination.
        data: the full contents.
        create_only: fail with ``PreconditionFailed`` if the destination already exists.
        content_type: optional MIME type (GCS only).
    """
    uri = check_uri(uri)
    _backend(uri).write_bytes(uri, data, create_only=create_only, content_type=content_type)


def upload_file(local_path: str, uri: str, *, content_type: str | None = None) -> None:
    """Copy a finished local file to ``uri`` atomically (GCS objects appear only once complete)."""
    uri = check_uri(uri)
    _backend(uri).upload_file(local_path, uri, content_type=content_type)


@contextlib.contextmanager
def open_write(uri: str, *, content_type: str | None = None, buffering: int = 1 << 20) -> Iterator[IO[bytes]]:
    """A binary file to stream ``uri``'s contents into; ``uri`` appears only once the block ends without
    error, never half-written. Local: a hidden ``.partial`` temp file beside it (the umask's mode), then
    a rename. GCS: a local temp file, then one upload (the object exists only once it is complete)."""
    uri = check_uri(uri)
    with _backend(uri).open_write(uri, content_type=content_type, buffering=buffering) as f:
        yield f


# --------------------------------------------------------------------------- compare-and-swap


def read_with_generation(uri: str) -> tuple[bytes | None, int]:
    """Read a small pointer object and its generation; ``(None, 0)`` when it does not exist."""
    uri = check_uri(uri)
    return _backend(uri).read_with_generation(uri)


def replace_if_generation(uri: str, data: bytes, generation: int) -> int:
    """Replace a small pointer object only if it still has ``generation`` (0 = must not exist).

    Returns the new generation. Raises ``PreconditionFailed`` when another writer got there first:
    re-read, decide again, retry. Keep pointer objects small: the GCS test server enforces the
    precondition on single-request uploads only.
    """
    uri = check_uri(uri)
    return _backend(uri).replace_if_generation(uri, data, generation)


# --------------------------------------------------------------------------- metadata


def exists(uri: str) -> bool:
    uri = check_uri(uri)
    return _backend(uri).exists(uri)


def size(uri: str) -> int:
    return stat(uri).size


def stat(uri: str) -> ObjectInfo:
    """One object's (or file's) size and version; NotFound when it does not exist."""
    uri = check_uri(uri)
    return _backend(uri).stat(uri)


def stat_or_list(uri: str) -> list[ObjectInfo]:
    """``[stat(uri)]`` when ``uri`` names one object or file, else the objects under it (a directory)."""
    uri = check_uri(uri).rstrip("/")
    return _backend(uri).stat_or_list(uri)


def list_objects(prefix: str, *, recursive: bool = True) -> list[ObjectInfo]:
    """List files/objects under a directory URI, sorted by URI (hidden local temp files excluded)."""
    prefix = check_uri(prefix)
    return _backend(prefix).list_objects(prefix, recursive=recursive)


def sample_objects(prefix: str, limit: int = 100) -> list[ObjectInfo]:
    """Up to ``limit`` objects under a directory URI, in listing order: a cheap look at what it holds
    (an error message's hint), where ``list_objects`` would page through all of a large bucket."""
    prefix = check_uri(prefix)
    return _backend(prefix).sample_objects(prefix, limit)


def path_kind(uri: str) -> str:
    """``"file"``, ``"dir"`` or ``"missing"`` for a local path. A gs:// URI is always ``"dir"``: GCS has no
    directories, a prefix exists only through its objects, and listing it says whether it holds any."""
    uri = check_uri(uri)
    return _backend(uri).path_kind(uri)


def list_dirs(uri: str) -> list[str]:
    """Names of the sub-directories directly under a local directory, sorted, hidden ones skipped: an
    empty one does not show up in ``list_objects``. On GCS none: a prefix with no objects does not exist."""
    uri = check_uri(uri)
    return _backend(uri).list_dirs(uri)


def prefix_exists(uri: str) -> bool:
    """Whether ``uri`` can be there as a directory: a local path that exists, or any prefix of a bucket
    that exists (a GCS prefix needs no object). Asks GCS for a listing, which needs no bucket-level role."""
    uri = check_uri(uri).rstrip("/")
    return _backend(uri).prefix_exists(uri)


def list_partials(uri: str) -> list[str]:
    """The ``*.partial`` temp files that killed writers (``open_write``) left directly in a directory:
    hidden locally (``.name.XXXX.partial``), so ``list_objects`` skips them. Only for cleanup, once no
    writer is running; none when the directory does not exist."""
    uri = check_uri(uri)
    return _backend(uri).list_partials(uri)


def delete(uri: str, *, missing_ok: bool = True) -> None:
    uri = check_uri(uri)
    _backend(uri).delete(uri, missing_ok=missing_ok)


def remove_empty_dir(uri: str) -> None:
    """Remove a local directory left empty (GCS has no directories: nothing to do)."""
    uri = check_uri(uri)
    _backend(uri).remove_empty_dir(uri)


def copy(src: str, dst: str) -> None:
    """Copy one object/file (server-side within GCS; streamed otherwise), atomically at ``dst``."""
    src, dst = check_uri(src), check_uri(dst)
    source, target = _backend(src), _backend(dst)
    if source is target:
        source.copy(src, dst)
        return
    with source.local_file(src) as path:  # across backends the bytes pass through a local file
        target.upload_file(path, dst, content_type=None)


def move(src: str, dst: str) -> None:
    """Move one object/file to ``dst`` (replacing it): a rename on local disk, a server-side copy and a delete
    on GCS. ``dst`` holds either its old content or all of ``src``, never a part."""
    src, dst = check_uri(src), check_uri(dst)
    source, target = _backend(src), _backend(dst)
    if source is target:
        source.move(src, dst)
        return
    copy(src, dst)
    delete(src)


def ensure_prefix_writable(uri: str) -> None:
    """Fail early, with the fix in the message, if ``uri`` cannot hold a dataset/model directory."""
    uri = check_uri(uri)
    _backend(uri).ensure_prefix_writable(uri)


def bucket_info(uri: str, *, timeout: float = 30.0) -> BucketInfo:
    """The placement of the bucket of gs:// ``uri``: raises NotFound (no such bucket) or StorageError (no
    ``storage.buckets.get`` on it). Retries transient errors for ``timeout`` seconds at most: a preflight
    check, not a data path."""
    if not is_gcs(check_uri(uri)):
        raise StorageError(f"{uri} is not a gs:// URI: a bucket's placement exists on GCS only")
    bucket, _ = split_gcs(uri)
    return _GCS.bucket_info(bucket, timeout=timeout)
