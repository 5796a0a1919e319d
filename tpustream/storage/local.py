"""The storage seam's local-filesystem backend: atomic writes through a hidden ``.partial`` temp file and a
rename, generations from (inode, mtime) under an ``flock``, and OS errors turned into ours."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from typing import IO

from tpustream.storage.backend import (
    READ_CHUNK,
    NotFound,
    ObjectInfo,
    PathKindError,
    PreconditionFailed,
    StorageError,
)

__all__ = ["LocalBackend"]


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


def _open_regular(path: str, buffering: int = -1) -> IO[bytes]:
    """Open ``path`` for reading only if it is a regular file: a FIFO or a device named where a file is
    expected would block the open or the read forever (O_NONBLOCK opens it without waiting, to look)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise PathKindError(f"{path} is a directory, not a file: give the path of a file")
        kind = (
            "FIFO"
            if stat.S_ISFIFO(mode)
            else "device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "socket"
        )
        raise PathKindError(f"{path} is a {kind}, not a regular file: only regular files are read")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb", buffering=buffering)


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


def _local_generation(st: os.stat_result) -> int:
    # A fresh inode for every replace (we always write a temp file and rename), so this changes.
    return (st.st_ino << 20) ^ st.st_mtime_ns or 1


@contextlib.contextmanager
def _local_lock(path: str) -> Iterator[None]:
    lock_path = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


class LocalBackend:
    """Local paths (``file:`` URIs arrive as paths). Hidden names (``.x``) are the seam's own temp and lock
    files: listings skip them."""

    # ---------------------------------------------------------------- reading

    def open_read(self, uri: str) -> IO[bytes]:
        with _local_errors(uri):
            return _open_regular(uri, buffering=READ_CHUNK)

    def read_bytes(self, uri: str) -> bytes:
        with _local_errors(uri), _open_regular(uri) as f:
            return f.read()

    def read_range(self, uri: str, start: int, length: int) -> bytes:
        with _local_errors(uri), _open_regular(uri) as f:
            f.seek(start)
            return f.read(length)

    # ---------------------------------------------------------------- writing

    def write_bytes(self, uri: str, data: bytes, *, create_only: bool, content_type: str | None) -> None:
        _local_atomic_write(uri, data, create_only=create_only)

    def upload_file(self, local_path: str, uri: str, *, content_type: str | None) -> None:
        _ensure_local_parent(uri)
        tmp = _local_tmp_name(uri)
        try:
            shutil.copyfile(local_path, tmp)
            os.replace(tmp, uri)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    @contextlib.contextmanager
    def open_write(self, uri: str, *, content_type: str | None, buffering: int) -> Iterator[IO[bytes]]:
        _ensure_local_parent(uri)
        tmp = _local_tmp_name(uri)
        try:
            with open(tmp, "wb", buffering=buffering) as f:
                yield f
            os.replace(tmp, uri)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    # ---------------------------------------------------------------- compare-and-swap

    def read_with_generation(self, uri: str) -> tuple[bytes | None, int]:
        try:
            with _local_errors(uri), open(uri, "rb") as f:
                st = os.fstat(f.fileno())
                return f.read(), _local_generation(st)
        except NotFound:
            return None, 0

    def replace_if_generation(self, uri: str, data: bytes, generation: int) -> int:
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

    # ---------------------------------------------------------------- metadata and listing

    def exists(self, uri: str) -> bool:
        return os.path.exists(uri)

    def stat(self, uri: str) -> ObjectInfo:
        with _local_errors(uri):
            st = os.stat(uri)
        return ObjectInfo(uri, st.st_size, str(st.st_mtime_ns))

    def stat_or_list(self, uri: str) -> list[ObjectInfo]:
        return [self.stat(uri)] if os.path.isfile(uri) else self.list_objects(uri, recursive=True)

    def list_objects(self, prefix: str, *, recursive: bool) -> list[ObjectInfo]:
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

    def sample_objects(self, prefix: str, limit: int) -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        for root, dirs, files in os.walk(prefix):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for fname in sorted(f for f in files if not f.startswith(".")):
                path = os.path.join(root, fname)
                out.append(ObjectInfo(path, os.path.getsize(path), ""))
                if len(out) == limit:
                    return out
        return out

    # ---------------------------------------------------------------- deleting, copying, moving

    def delete(self, uri: str, *, missing_ok: bool) -> None:
        try:
            os.unlink(uri)
        except FileNotFoundError:
            if not missing_ok:
                raise NotFound(f"{uri} does not exist") from None

    def copy(self, src: str, dst: str) -> None:
        with self.local_file(src) as path:
            self.upload_file(path, dst, content_type=None)

    def move(self, src: str, dst: str) -> None:
        _ensure_local_parent(dst)
        with _local_errors(src):
            os.replace(src, dst)

    @contextlib.contextmanager
    def local_file(self, uri: str) -> Iterator[str]:
        """``uri`` itself, once it is known to be a file (not missing, not a directory)."""
        if not os.path.isfile(uri):
            with _local_errors(uri):
                os.stat(uri)  # missing, or a file in the way: raises the matching error
            if os.path.isdir(uri):
                raise PathKindError(f"{uri} is a directory, not a file: give the path of a file")
        yield uri

    # ---------------------------------------------------------------- directories

    def path_kind(self, uri: str) -> str:
        if os.path.isdir(uri):
            return "dir"
        return "file" if os.path.exists(uri) else "missing"

    def list_dirs(self, uri: str) -> list[str]:
        with _local_errors(uri):
            entries = list(os.scandir(uri))
        return sorted(
            e.name for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")
        )

    def prefix_exists(self, uri: str) -> bool:
        return os.path.exists(uri)

    def list_partials(self, uri: str) -> list[str]:
        if not os.path.isdir(uri):
            return []
        return [entry.path for entry in os.scandir(uri) if entry.name.endswith(".partial")]

    def remove_empty_dir(self, uri: str) -> None:
        with contextlib.suppress(OSError):
            os.rmdir(uri)

    def ensure_prefix_writable(self, uri: str) -> None:
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
