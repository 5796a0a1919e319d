"""The one storage seam: local paths and ``gs://`` URIs, read and written in-process.

Every other module passes URIs as ``str`` and calls these functions; nothing else knows about GCS.
No gsutil, no subprocess, no ``pipe:``. GCS calls go through google-cloud-storage with retries on
transient errors (429, 5xx, connection resets, cut bodies) and honour ``STORAGE_EMULATOR_HOST``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from tpustream.errors import TpustreamError

T = TypeVar("T")

__all__ = [
    "absolute",
    "sample_objects",
    "StorageError",
    "NotFound",
    "PreconditionFailed",
    "PathKindError",
    "ObjectInfo",
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

GCS_SCHEME = "gs://"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_READ_CHUNK = 8 * 1024 * 1024  # large buffered range reads: few round trips per shard


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


def is_gcs(uri: str) -> bool:
    return uri.startswith(GCS_SCHEME)


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
        bucket, _ = _split_gcs(uri)
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


def _file_in_the_way(path: str) -> PathKindError:
    """The error for a local path one of whose parents is a file (NotADirectoryError), naming that file."""
    parent = os.path.dirname(path)
    while parent and not os.path.isdir(parent):
        if os.path.lexists(parent):
            return PathKindError(
                f"{parent} is a file where a directory is expected (for {path}): "
                "give a directory or a gs:// prefix instead"
            )
        parent = os.path.dirname(parent)
    return PathKindError(f"{path}: part of this path is a file, not a directory: fix the path")


@contextlib.contextmanager
def _local_errors(path: str) -> Iterator[None]:
    """Turn the OS errors of a local read into ours: the path, what is wrong and what to do, in one line."""
    try:
        yield
    except FileNotFoundError as exc:
        raise NotFound(f"{path} does not exist") from exc
    except IsADirectoryError as exc:
        raise PathKindError(f"{path} is a directory, not a file: give the path of a file") from exc
    except NotADirectoryError as exc:
        raise _file_in_the_way(path) from exc


def join(base: str, *parts: str) -> str:
    """Join path parts onto a local path or gs:// URI with '/'."""
    out = base.rstrip("/") if base not in ("/", GCS_SCHEME) else base
    for part in parts:
        part = part.strip("/")
        if part:
            out = f"{out}/{part}" if not out.endswith("/") else out + part
    return out


# --------------------------------------------------------------------------- GCS plumbing

_clients: dict[tuple[int, str | None], Any] = {}
_clients_lock = threading.Lock()


def _tune_download_chunks() -> None:
    """Read response bodies in 1 MiB pieces instead of google-cloud-storage's 8 KiB.

    Its media layer iterates ``response.raw.stream(8192)``: ~12k Python iterations per 100 MB,
    which capped a loader worker at ~400 MB/s and made GCS input 25% slower than local disk in
    ``tpustream bench load``. The constant is private and has no public setting; if a release
    renames it, this does nothing and reads stay correct, only slower.
    """
    try:
        from google.cloud.storage._media.requests import _request_helpers
    except ImportError:
        return
    if getattr(_request_helpers, "_SINGLE_GET_CHUNK_SIZE", None) == 8192:
        _request_helpers._SINGLE_GET_CHUNK_SIZE = 1 << 20


def _client() -> Any:
    """A storage client per process (clients are not fork-safe) and per emulator endpoint."""
    from google.cloud import storage

    _tune_download_chunks()

    emulator = os.environ.get("STORAGE_EMULATOR_HOST") or None
    key = (os.getpid(), emulator)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            if emulator:
                from google.auth.credentials import AnonymousCredentials

                client = storage.Client(  # type: ignore[attr-defined]
                    project=os.environ.get("GOOGLE_CLOUD_PROJECT", "tpustream-local"),
                    credentials=AnonymousCredentials(),
                    client_options={"api_endpoint": emulator},
                )
            else:
                client = storage.Client()  # type: ignore[attr-defined]
            _clients[key] = client
        return client


def _retry() -> Any:
    """Exponential backoff on 429/5xx, connection resets and cut bodies, for ~2 minutes at most."""
    from google.api_core.retry import Retry
    from google.cloud.storage.retry import DEFAULT_RETRY

    return Retry(predicate=DEFAULT_RETRY._predicate, initial=0.05, maximum=8.0, multiplier=2.0, timeout=120.0)


def _idempotent(fn: Callable[[], T]) -> T:
    """Run a read-only GCS call under an outer retry as well.

    google-cloud-storage retries inside the download, but when an *error* response (a 404, say)
    is cut mid-body it raises ``ChunkedEncodingError`` while formatting the error, outside its
    own retry loop. Only reads go through here: retrying a write whose response was lost could
    turn our own success into a precondition failure.
    """
    return _retry()(fn)()


def _split_gcs(uri: str) -> tuple[str, str]:
    rest = uri[len(GCS_SCHEME) :]
    bucket, _, name = rest.partition("/")
    return bucket, name


def _blob(uri: str) -> Any:
    bucket, name = _split_gcs(uri)
    if not name:
        raise StorageError(f"{uri!r} names a bucket, not an object")
    return _client().bucket(bucket).blob(name)


@contextlib.contextmanager
def _gcs_errors(uri: str) -> Iterator[None]:
    """Translate google exceptions into ours, with the URI and what to do in the message."""
    from google.api_core import exceptions as gexc

    try:
        yield
    except gexc.NotFound as exc:
        bucket, name = _split_gcs(uri)
        if "bucket" in str(exc).lower() and not _bucket_exists(bucket):
            raise NotFound(
                f"bucket gs://{bucket} does not exist (for {uri}): create it or fix the URI"
            ) from exc
        raise NotFound(f"{uri} does not exist") from exc
    except gexc.PreconditionFailed as exc:
        raise PreconditionFailed(f"{uri} changed concurrently (precondition failed)") from exc
    except gexc.Forbidden as exc:
        raise StorageError(f"permission denied on {uri}: check the service account's roles") from exc


def _bucket_exists(bucket: str) -> bool:
    from google.api_core import exceptions as gexc

    try:
        _idempotent(lambda: _client().get_bucket(bucket, retry=_retry()))
        return True
    except gexc.NotFound:
        return False


# --------------------------------------------------------------------------- reading


class _RawBlobStream(io.RawIOBase):
    """Raw-stream face of google-cloud-storage's BlobReader, so ``io.BufferedReader`` can sit on it.

    BlobReader.read costs ~4 µs of Python per call; a tar parser makes several small reads per
    sample. Through a C BufferedReader those are served from memory and BlobReader sees 1 MiB reads.
    """

    def __init__(self, reader: Any) -> None:
        self._reader = reader

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._reader.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._reader.close()
        super().close()


def open_read(uri: str) -> IO[bytes]:
    """Open an object or file for streaming binary reads (GCS: large buffered range reads, retried)."""
    uri = check_uri(uri)
    if is_gcs(uri):
        blob = _blob(uri)
        with _gcs_errors(uri):
            _idempotent(lambda: blob.reload(retry=_retry()))
            reader = blob.open("rb", chunk_size=_READ_CHUNK, retry=_retry())
            return io.BufferedReader(_RawBlobStream(reader), buffer_size=1 << 20)
    with _local_errors(uri):
        return open(uri, "rb", buffering=_READ_CHUNK)


def read_bytes(uri: str) -> bytes:
    uri = check_uri(uri)
    if is_gcs(uri):
        with _gcs_errors(uri):
            blob = _blob(uri)
            return _idempotent(lambda: blob.download_as_bytes(retry=_retry()))
    with _local_errors(uri), open(uri, "rb") as f:
        return f.read()


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
    if is_gcs(uri):
        with _gcs_errors(uri):
            blob = _blob(uri)
            return _idempotent(
                lambda: blob.download_as_bytes(start=start, end=start + length - 1, retry=_retry())
            )
    with _local_errors(uri), open(uri, "rb") as f:
        f.seek(start)
        return f.read(length)


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
    if is_gcs(uri):
        blob = _blob(uri)
        kwargs: dict[str, Any] = {"retry": _retry()}
        if create_only:
            kwargs["if_generation_match"] = 0
        try:
            with _gcs_errors(uri):
                blob.upload_from_string(
                    data, content_type=content_type or "application/octet-stream", **kwargs
                )
        except PreconditionFailed as exc:
            if _holds(uri, data):  # our own earlier attempt landed and only its answer was lost
                return
            raise PreconditionFailed(f"{uri} already exists (create-only write)") from exc
        return
    _local_atomic_write(uri, data, create_only=create_only)


def _holds(uri: str, data: bytes) -> bool:
    """Whether the object at ``uri`` holds exactly ``data``.

    A conditional write is retried (503, reset, cut answer) with its condition: when the first attempt
    was applied and only its answer lost, the retry fails its own precondition. Reading back tells
    "ours, already there" (success) from "someone else's" (a real conflict).
    """
    current, _ = read_with_generation(uri)
    return current == data


def upload_file(local_path: str, uri: str, *, content_type: str | None = None) -> None:
    """Copy a finished local file to ``uri`` atomically (GCS objects appear only once complete)."""
    uri = check_uri(uri)
    if is_gcs(uri):
        blob = _blob(uri)
        with _gcs_errors(uri):
            blob.upload_from_filename(
                local_path, content_type=content_type or "application/octet-stream", retry=_retry()
            )
        return
    _ensure_local_parent(uri)
    tmp = _local_tmp_name(uri)
    try:
        shutil.copyfile(local_path, tmp)
        os.replace(tmp, uri)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def open_write(uri: str, *, content_type: str | None = None, buffering: int = 1 << 20) -> Iterator[IO[bytes]]:
    """A binary file to stream ``uri``'s contents into; ``uri`` appears only once the block ends without
    error, never half-written. Local: a hidden ``.partial`` temp file beside it (the umask's mode), then
    a rename. GCS: a local temp file, then one upload (the object exists only once it is complete)."""
    uri = check_uri(uri)
    if is_gcs(uri):
        fd, tmp = tempfile.mkstemp(prefix="tpustream-", suffix=".partial")
        os.close(fd)
    else:
        _ensure_local_parent(uri)
        tmp = _local_tmp_name(uri)
    try:
        with open(tmp, "wb", buffering=buffering) as f:
            yield f
        if is_gcs(uri):
            upload_file(tmp, uri, content_type=content_type)
        else:
            os.replace(tmp, uri)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _ensure_local_parent(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise _file_in_the_way(path) from exc


def _file_mode() -> int:
    """The mode a plain ``open()`` would give a new file now (0o666 less the umask): temp files from
    ``mkstemp`` are 0o600, which would leave shared datasets and registries unreadable to others."""
    try:
        with open("/proc/self/status") as status:  # Linux: read the umask without changing it
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere the umask is read by setting it and putting it back
    os.umask(mask)
    return 0o666 & ~mask


def _local_tmp_name(path: str) -> str:
    directory, base = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".partial", dir=directory)
    try:
        os.fchmod(fd, _file_mode())
    finally:
        os.close(fd)
    return tmp


def _local_atomic_write(path: str, data: bytes, *, create_only: bool) -> None:
    _ensure_local_parent(path)
    tmp = _local_tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if create_only:
            try:
                os.link(tmp, path)  # atomic create-if-absent
            except FileExistsError as exc:
                raise PreconditionFailed(f"{path} already exists") from exc
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


# --------------------------------------------------------------------------- compare-and-swap


def read_with_generation(uri: str) -> tuple[bytes | None, int]:
    """Read a small pointer object and its generation; ``(None, 0)`` when it does not exist."""
    uri = check_uri(uri)
    if is_gcs(uri):
        from google.api_core import exceptions as gexc

        blob = _blob(uri)
        try:
            with _gcs_errors(uri):
                _idempotent(lambda: blob.reload(retry=_retry()))
                data = _idempotent(
                    lambda: blob.download_as_bytes(if_generation_match=blob.generation, retry=_retry())
                )
            return data, int(blob.generation)
        except (NotFound, gexc.NotFound):
            return None, 0
        except PreconditionFailed:  # replaced between reload and download: read again
            return read_with_generation(uri)
    try:
        with _local_errors(uri), open(uri, "rb") as f:
            st = os.fstat(f.fileno())
            return f.read(), _local_generation(st)
    except NotFound:
        return None, 0


def _local_generation(st: os.stat_result) -> int:
    # A fresh inode for every replace (we always write a temp file and rename), so this changes.
    return (st.st_ino << 20) ^ st.st_mtime_ns or 1


def replace_if_generation(uri: str, data: bytes, generation: int) -> int:
    """Replace a small pointer object only if it still has ``generation`` (0 = must not exist).

    Returns the new generation. Raises ``PreconditionFailed`` when another writer got there first:
    re-read, decide again, retry. Keep pointer objects small: the GCS test server enforces the
    precondition on single-request uploads only.
    """
    uri = check_uri(uri)
    if is_gcs(uri):
        blob = _blob(uri)
        try:
            with _gcs_errors(uri):
                blob.upload_from_string(
                    data, content_type="application/json", if_generation_match=generation, retry=_retry()
                )
        except PreconditionFailed:
            now, now_generation = read_with_generation(uri)
            if now == data and now_generation != generation:
                return now_generation  # our write landed; the retry of a lost answer collided with it
            raise
        return int(blob.generation)
    _ensure_local_parent(uri)
    with _local_lock(uri):
        try:
            current = _local_generation(os.stat(uri))
        except FileNotFoundError:
            current = 0
        if current != generation:
            raise PreconditionFailed(f"{uri} changed concurrently (expected generation {generation})")
        _local_atomic_write(uri, data, create_only=False)
        return _local_generation(os.stat(uri))


@contextlib.contextmanager
def _local_lock(path: str) -> Iterator[None]:
    lock_path = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


# --------------------------------------------------------------------------- metadata


def exists(uri: str) -> bool:
    uri = check_uri(uri)
    if is_gcs(uri):
        with _gcs_errors(uri):
            blob = _blob(uri)
            return _idempotent(lambda: bool(blob.exists(retry=_retry())))
    return os.path.exists(uri)


def size(uri: str) -> int:
    return stat(uri).size


def stat(uri: str) -> ObjectInfo:
    """One object's (or file's) size and version; NotFound when it does not exist."""
    uri = check_uri(uri)
    if is_gcs(uri):
        blob = _blob(uri)
        with _gcs_errors(uri):
            _idempotent(lambda: blob.reload(retry=_retry()))
        return ObjectInfo(uri, int(blob.size or 0), str(blob.generation or ""))
    with _local_errors(uri):
        st = os.stat(uri)
    return ObjectInfo(uri, st.st_size, str(st.st_mtime_ns))


def stat_or_list(uri: str) -> list[ObjectInfo]:
    """``[stat(uri)]`` when ``uri`` names one object or file, else the objects under it (a directory)."""
    uri = check_uri(uri).rstrip("/")
    if is_gcs(uri):
        try:
            return [stat(uri)]
        except StorageError:  # no such object (a prefix), or a bucket root
            return list_objects(uri)
    return [stat(uri)] if os.path.isfile(uri) else list_objects(uri)


def list_objects(prefix: str, *, recursive: bool = True) -> list[ObjectInfo]:
    """List files/objects under a directory URI, sorted by URI (hidden local temp files excluded)."""
    prefix = check_uri(prefix)
    if is_gcs(prefix):
        bucket, name = _split_gcs(prefix)
        if name and not name.endswith("/"):
            name += "/"
        with _gcs_errors(prefix):
            out = _idempotent(
                lambda: [
                    ObjectInfo(f"gs://{bucket}/{b.name}", int(b.size or 0), str(b.generation or ""))
                    for b in _client().list_blobs(
                        bucket, prefix=name, delimiter=None if recursive else "/", retry=_retry()
                    )
                ]
            )
        return sorted(out, key=lambda o: o.uri)
    if not os.path.isdir(prefix):
        return []
    out = []
    for root, dirs, files in os.walk(prefix):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for fname in files:
            if fname.startswith("."):
                continue
            path = os.path.join(root, fname)
            st = os.stat(path)
            out.append(ObjectInfo(path, st.st_size, str(st.st_mtime_ns)))
        if not recursive:
            break
    return sorted(out, key=lambda o: o.uri)


def sample_objects(prefix: str, limit: int = 100) -> list[ObjectInfo]:
    """Up to ``limit`` objects under a directory URI, in listing order: a cheap look at what it holds
    (an error message's hint), where ``list_objects`` would page through all of a large bucket."""
    prefix = check_uri(prefix)
    if is_gcs(prefix):
        bucket, name = _split_gcs(prefix)
        if name and not name.endswith("/"):
            name += "/"
        with _gcs_errors(prefix):
            blobs = _client().list_blobs(bucket, prefix=name, max_results=limit, retry=_retry())
            return [
                ObjectInfo(f"gs://{bucket}/{b.name}", int(b.size or 0), str(b.generation or ""))
                for b in blobs
            ]
    out: list[ObjectInfo] = []
    for root, dirs, files in os.walk(prefix):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for fname in sorted(f for f in files if not f.startswith(".")):
            path = os.path.join(root, fname)
            out.append(ObjectInfo(path, os.path.getsize(path), ""))
            if len(out) == limit:
                return out
    return out


def path_kind(uri: str) -> str:
    """``"file"``, ``"dir"`` or ``"missing"`` for a local path. A gs:// URI is always ``"dir"``: GCS has no
    directories, a prefix exists only through its objects, and listing it says whether it holds any."""
    uri = check_uri(uri)
    if is_gcs(uri) or os.path.isdir(uri):
        return "dir"
    return "file" if os.path.exists(uri) else "missing"


def list_dirs(uri: str) -> list[str]:
    """Names of the sub-directories directly under a local directory, sorted, hidden ones skipped: an
    empty one does not show up in ``list_objects``. On GCS none: a prefix with no objects does not exist."""
    uri = check_uri(uri)
    if is_gcs(uri):
        return []
    with _local_errors(uri):
        entries = list(os.scandir(uri))
    return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith("."))


def prefix_exists(uri: str) -> bool:
    """Whether ``uri`` can be there as a directory: a local path that exists, or any prefix of a bucket
    that exists (a GCS prefix needs no object). Asks GCS for a listing, which needs no bucket-level role."""
    uri = check_uri(uri).rstrip("/")
    if is_gcs(uri):
        try:  # a one-level listing: cheap, and it fails only when the bucket does not exist
            list_objects(uri, recursive=False)
        except NotFound:
            return False
        return True
    return os.path.exists(uri)


def list_partials(uri: str) -> list[str]:
    """The ``*.partial`` temp files that killed writers (``open_write``) left directly in a directory:
    hidden locally (``.name.XXXX.partial``), so ``list_objects`` skips them. Only for cleanup, once no
    writer is running; none when the directory does not exist."""
    uri = check_uri(uri)
    if is_gcs(uri):
        return [obj.uri for obj in list_objects(uri) if obj.uri.endswith(".partial")]
    if not os.path.isdir(uri):
        return []
    return [entry.path for entry in os.scandir(uri) if entry.name.endswith(".partial")]


def delete(uri: str, *, missing_ok: bool = True) -> None:
    uri = check_uri(uri)
    if is_gcs(uri):
        from google.api_core import exceptions as gexc

        try:
            with _gcs_errors(uri):
                _blob(uri).delete(retry=_retry())
        except (NotFound, gexc.NotFound):
            if not missing_ok:
                raise
        return
    try:
        os.unlink(uri)
    except FileNotFoundError:
        if not missing_ok:
            raise NotFound(f"{uri} does not exist") from None


def remove_empty_dir(uri: str) -> None:
    """Remove a local directory left empty (GCS has no directories: nothing to do)."""
    uri = check_uri(uri)
    if not is_gcs(uri):
        with contextlib.suppress(OSError):
            os.rmdir(uri)


def copy(src: str, dst: str) -> None:
    """Copy one object/file (server-side within GCS; streamed otherwise), atomically at ``dst``."""
    src, dst = check_uri(src), check_uri(dst)
    if is_gcs(src) and is_gcs(dst):
        s_bucket, s_name = _split_gcs(src)
        d_bucket, d_name = _split_gcs(dst)
        client = _client()
        with _gcs_errors(src):
            client.bucket(s_bucket).copy_blob(
                client.bucket(s_bucket).blob(s_name), client.bucket(d_bucket), d_name, retry=_retry()
            )
        return
    if not is_gcs(src):
        if not os.path.isfile(src):
            with _local_errors(src):
                os.stat(src)  # missing, or a file in the way: raises the matching error
            if os.path.isdir(src):
                raise PathKindError(f"{src} is a directory, not a file: give the path of a file")
        upload_file(src, dst)
        return
    with tempfile.NamedTemporaryFile(prefix="tpustream-copy-") as tmp:
        with open_read(src) as reader:
            shutil.copyfileobj(reader, tmp, _READ_CHUNK)
        tmp.flush()
        upload_file(tmp.name, dst)


def move(src: str, dst: str) -> None:
    """Move one object/file to ``dst`` (replacing it): a rename on local disk, a server-side copy and a delete
    on GCS. ``dst`` holds either its old content or all of ``src``, never a part."""
    src, dst = check_uri(src), check_uri(dst)
    if not is_gcs(src) and not is_gcs(dst):
        _ensure_local_parent(dst)
        with _local_errors(src):
            os.replace(src, dst)
        return
    copy(src, dst)
    delete(src)


def ensure_prefix_writable(uri: str) -> None:
    """Fail early, with the fix in the message, if ``uri`` cannot hold a dataset/model directory."""
    uri = check_uri(uri)
    if is_gcs(uri):
        bucket, name = _split_gcs(uri)
        if not _bucket_exists(bucket):
            raise NotFound(f"bucket gs://{bucket} does not exist (for {uri}): create it or fix the URI")
        if name and exists(uri.rstrip("/")):
            raise StorageError(f"{uri} is an object, not a directory prefix: choose another output URI")
        return
    if os.path.isfile(uri):
        raise PathKindError(f"{uri} is a file, not a directory: choose another output path")
    try:
        os.makedirs(uri, exist_ok=True)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.EEXIST):
            raise _file_in_the_way(uri) from exc
        raise StorageError(f"cannot create {uri}: {exc.strerror}") from exc
    if not os.access(uri, os.W_OK):
        raise StorageError(f"{uri} is not writable")


@dataclass(frozen=True)
class BucketInfo:
    """Where a bucket keeps its data: ``location`` as GCS names it (``US-CENTRAL1``, ``US``, ``NAM4``), its
    ``location_type`` (region, dual-region, multi-region) and a configurable dual-region's regions."""

    name: str
    location: str
    location_type: str
    data_locations: tuple[str, ...] = ()


def bucket_info(uri: str, *, timeout: float = 30.0) -> BucketInfo:
    """The placement of the bucket of gs:// ``uri``: raises NotFound (no such bucket) or StorageError (no
    ``storage.buckets.get`` on it). Retries transient errors for ``timeout`` seconds at most: a preflight
    check, not a data path."""
    from google.api_core import exceptions as gexc

    if not is_gcs(check_uri(uri)):
        raise StorageError(f"{uri} is not a gs:// URI: a bucket's placement exists on GCS only")
    bucket, _ = _split_gcs(uri)
    try:
        found = _client().get_bucket(bucket, timeout=timeout, retry=_retry().with_timeout(timeout))
    except gexc.NotFound as exc:
        raise NotFound(f"bucket gs://{bucket} does not exist") from exc
    except gexc.Forbidden as exc:
        raise StorageError(f"permission denied reading bucket gs://{bucket} (storage.buckets.get)") from exc
    return BucketInfo(
        name=bucket,
        location=str(found.location or ""),
        location_type=str(found.location_type or ""),
        data_locations=tuple(found.data_locations or ()),
    )
