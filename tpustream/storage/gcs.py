"""The storage seam's GCS backend: google-cloud-storage in-process, one client per process, retries on
transient errors (429, 5xx, connection resets, cut bodies), generation preconditions for compare-and-swap,
and ``STORAGE_EMULATOR_HOST`` honoured (the loopback test server)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from tpustream.storage.backend import READ_CHUNK, NotFound, ObjectInfo, PreconditionFailed, StorageError

T = TypeVar("T")

__all__ = ["GCS_SCHEME", "GcsBackend", "BucketInfo", "split_gcs"]

GCS_SCHEME = "gs://"

# --------------------------------------------------------------------------- plumbing

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


def split_gcs(uri: str) -> tuple[str, str]:
    """``gs://bucket/name`` -> ``(bucket, name)``."""
    rest = uri[len(GCS_SCHEME) :]
    bucket, _, name = rest.partition("/")
    return bucket, name


def _blob(uri: str) -> Any:
    bucket, name = split_gcs(uri)
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
        bucket, name = split_gcs(uri)
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


def _listed(bucket: str, blob: Any) -> ObjectInfo:
    return ObjectInfo(f"gs://{bucket}/{blob.name}", int(blob.size or 0), str(blob.generation or ""))


# --------------------------------------------------------------------------- the backend


class GcsBackend:
    """``gs://`` URIs. Reads are retried as a whole as well (``_idempotent``); a conditional write that
    fails its precondition reads the object back, since a retried request may collide with its own
    earlier attempt whose answer was lost."""

    # ---------------------------------------------------------------- reading

    def open_read(self, uri: str) -> IO[bytes]:
        blob = _blob(uri)
        with _gcs_errors(uri):
            _idempotent(lambda: blob.reload(retry=_retry()))
            reader = blob.open("rb", chunk_size=READ_CHUNK, retry=_retry())
            return io.BufferedReader(_RawBlobStream(reader), buffer_size=1 << 20)

    def read_bytes(self, uri: str) -> bytes:
        with _gcs_errors(uri):
            blob = _blob(uri)
            return _idempotent(lambda: blob.download_as_bytes(retry=_retry()))

    def read_range(self, uri: str, start: int, length: int) -> bytes:
        with _gcs_errors(uri):
            blob = _blob(uri)
            return _idempotent(
                lambda: blob.download_as_bytes(start=start, end=start + length - 1, retry=_retry())
            )

    # ---------------------------------------------------------------- writing

    def write_bytes(self, uri: str, data: bytes, *, create_only: bool, content_type: str | None) -> None:
        blob = _blob(uri)
        try:
            with _gcs_errors(uri):
                blob.upload_from_string(
                    data,
                    content_type=content_type or "application/octet-stream",
                    retry=_retry(),
                    if_generation_match=0 if create_only else None,  # None: the default, any generation
                )
        except PreconditionFailed as exc:
            if self._holds(uri, data):  # our own earlier attempt landed and only its answer was lost
                return
            raise PreconditionFailed(f"{uri} already exists (create-only write)") from exc

    def _holds(self, uri: str, data: bytes) -> bool:
        """Whether the object at ``uri`` holds exactly ``data``.

        A conditional write is retried (503, reset, cut answer) with its condition: when the first attempt
        was applied and only its answer lost, the retry fails its own precondition. Reading back tells
        "ours, already there" (success) from "someone else's" (a real conflict).
        """
        current, _ = self.read_with_generation(uri)
        return current == data

    def upload_file(self, local_path: str, uri: str, *, content_type: str | None) -> None:
        blob = _blob(uri)
        with _gcs_errors(uri):
            blob.upload_from_filename(
                local_path, content_type=content_type or "application/octet-stream", retry=_retry()
            )

    @contextlib.contextmanager
    def open_write(self, uri: str, *, content_type: str | None, buffering: int) -> Iterator[IO[bytes]]:
        """A local temp file, then one upload: the object exists only once it is complete."""
        fd, tmp = tempfile.mkstemp(prefix="tpustream-", suffix=".partial")
        os.close(fd)
        try:
            with open(tmp, "wb", buffering=buffering) as f:
                yield f
            self.upload_file(tmp, uri, content_type=content_type)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    # ---------------------------------------------------------------- compare-and-swap

    def read_with_generation(self, uri: str) -> tuple[bytes | None, int]:
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
            return self.read_with_generation(uri)

    def replace_if_generation(self, uri: str, data: bytes, generation: int) -> int:
        blob = _blob(uri)
        try:
            with _gcs_errors(uri):
                blob.upload_from_string(
                    data, content_type="application/json", if_generation_match=generation, retry=_retry()
                )
        except PreconditionFailed:
            now, now_generation = self.read_with_generation(uri)
            if now == data and now_generation != generation:
                return now_generation  # our write landed; the retry of a lost answer collided with it
            raise
        return int(blob.generation)

    # ---------------------------------------------------------------- metadata and listing

    def exists(self, uri: str) -> bool:
        with _gcs_errors(uri):
            blob = _blob(uri)
            return _idempotent(lambda: bool(blob.exists(retry=_retry())))

    def stat(self, uri: str) -> ObjectInfo:
        blob = _blob(uri)
        with _gcs_errors(uri):
            _idempotent(lambda: blob.reload(retry=_retry()))
        return ObjectInfo(uri, int(blob.size or 0), str(blob.generation or ""))

    def stat_or_list(self, uri: str) -> list[ObjectInfo]:
        try:
            return [self.stat(uri)]
        except StorageError:  # no such object (a prefix), or a bucket root
            return self.list_objects(uri, recursive=True)

    def list_objects(self, prefix: str, *, recursive: bool) -> list[ObjectInfo]:
        bucket, name = split_gcs(prefix)
        if name and not name.endswith("/"):
            name += "/"
        with _gcs_errors(prefix):
            out = _idempotent(
                lambda: [
                    _listed(bucket, b)
                    for b in _client().list_blobs(
                        bucket, prefix=name, delimiter=None if recursive else "/", retry=_retry()
                    )
                ]
            )
        return sorted(out, key=lambda o: o.uri)

    def sample_objects(self, prefix: str, limit: int) -> list[ObjectInfo]:
        bucket, name = split_gcs(prefix)
        if name and not name.endswith("/"):
            name += "/"
        with _gcs_errors(prefix):
            blobs = _client().list_blobs(bucket, prefix=name, max_results=limit, retry=_retry())
            return [_listed(bucket, b) for b in blobs]

    # ---------------------------------------------------------------- deleting, copying, moving

    def delete(self, uri: str, *, missing_ok: bool) -> None:
        from google.api_core import exceptions as gexc

        try:
            with _gcs_errors(uri):
                _blob(uri).delete(retry=_retry())
        except (NotFound, gexc.NotFound):
            if not missing_ok:
                raise

    def copy(self, src: str, dst: str) -> None:
        """Server-side: the bytes never leave GCS."""
        s_bucket, s_name = split_gcs(src)
        d_bucket, d_name = split_gcs(dst)
        client = _client()
        with _gcs_errors(src):
            client.bucket(s_bucket).copy_blob(
                client.bucket(s_bucket).blob(s_name), client.bucket(d_bucket), d_name, retry=_retry()
            )

    def move(self, src: str, dst: str) -> None:
        """A copy and a delete: GCS has no rename."""
        self.copy(src, dst)
        self.delete(src, missing_ok=True)

    @contextlib.contextmanager
    def local_file(self, uri: str) -> Iterator[str]:
        with tempfile.NamedTemporaryFile(prefix="tpustream-copy-") as tmp:
            with self.open_read(uri) as reader:
                shutil.copyfileobj(reader, tmp, READ_CHUNK)
            tmp.flush()
            yield tmp.name

    # ---------------------------------------------------------------- directories (none on GCS)

    def path_kind(self, uri: str) -> str:
        return "dir"

    def list_dirs(self, uri: str) -> list[str]:
        return []

    def prefix_exists(self, uri: str) -> bool:
        try:  # a one-level listing: cheap, and it fails only when the bucket does not exist
            self.list_objects(uri, recursive=False)
        except NotFound:
            return False
        return True

    def list_partials(self, uri: str) -> list[str]:  # directly in ``uri``, as locally: not the whole prefix
        return [obj.uri for obj in self.list_objects(uri, recursive=False) if obj.uri.endswith(".partial")]

    def remove_empty_dir(self, uri: str) -> None:
        pass

    def ensure_prefix_writable(self, uri: str) -> None:
        bucket, name = split_gcs(uri)
        if not _bucket_exists(bucket):
            raise NotFound(f"bucket gs://{bucket} does not exist (for {uri}): create it or fix the URI")
        if name and self.exists(uri.rstrip("/")):
            raise StorageError(f"{uri} is an object, not a directory prefix: choose another output URI")

    # ---------------------------------------------------------------- buckets (GCS only: not a Backend's)

    def bucket_info(self, bucket: str, *, timeout: float) -> BucketInfo:
        """The placement of ``bucket``; retries transient errors for ``timeout`` seconds at most."""
        from google.api_core import exceptions as gexc

        try:
            found = _client().get_bucket(bucket, timeout=timeout, retry=_retry().with_timeout(timeout))
        except gexc.NotFound as exc:
            raise NotFound(f"bucket gs://{bucket} does not exist") from exc
        except gexc.Forbidden as exc:
            raise StorageError(
                f"permission denied reading bucket gs://{bucket} (storage.buckets.get)"
            ) from exc
        return BucketInfo(
            name=bucket,
            location=str(found.location or ""),
            location_type=str(found.location_type or ""),
            data_locations=tuple(found.data_locations or ()),
        )


@dataclass(frozen=True)
class BucketInfo:
    """Where a bucket keeps its data: ``location`` as GCS names it (``US-CENTRAL1``, ``US``, ``NAM4``), its
    ``location_type`` (region, dual-region, multi-region) and a configurable dual-region's regions."""

    name: str
    location: str
    location_type: str
    data_locations: tuple[str, ...] = ()
