"""Random access into a gzip stream without a decompressed copy: the zran idea, in Python's zlib.

Reading a ``.tar.gz`` once, streaming (``IndexingGunzip``), records a checkpoint every CHECKPOINT_SPACING bytes
of output: the compressed and uncompressed offsets there and a copy of the inflater's state (its 32 KiB
window: ~40 KB each, so ~4% of the uncompressed size in memory). ``read_at`` then returns any byte range by
restarting the inflater at the checkpoint before it and reading the compressed bytes from there with ranged
reads: at most CHECKPOINT_SPACING bytes inflated and discarded per read. Streams of several gzip members
(pigz, bgzip, ``cat a.gz b.gz``) are one stream, as gzip reads them; bytes after the last member are ignored.
"""

from __future__ import annotations

import bisect
import io
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

__all__ = ["CHECKPOINT_SPACING", "Checkpoint", "IndexingGunzip", "read_at"]

CHECKPOINT_SPACING = 1 << 20  # uncompressed bytes between checkpoints: the most a read_at inflates in vain
READ_CHUNK = 256 << 10  # compressed bytes read at a time
OUT_CHUNK = 256 << 10  # output of one inflate call: highly compressible input never balloons in memory
GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer around deflate data


@dataclass(frozen=True)
class Checkpoint:
    """Where inflating can restart: ``state`` has consumed ``compressed`` bytes and produced ``position``."""

    position: int
    compressed: int
    state: zlib._Decompress
    at_member_start: bool


class _Inflater:
    """Inflates a gzip stream of one or more members, OUT_CHUNK bytes of output per step."""

    def __init__(self, checkpoint: Checkpoint | None = None) -> None:
        if checkpoint is None:
            self.state, self.compressed, self.position, self.at_member_start = (
                zlib.decompressobj(GZIP_WBITS),
                0,
                0,
                True,
            )
        else:
            self.state = checkpoint.state.copy()
            self.compressed, self.position = checkpoint.compressed, checkpoint.position
            self.at_member_start = checkpoint.at_member_start
        self.trailing = False  # bytes after the last member: ignored, as gzip does

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(self.position, self.compressed, self.state.copy(), self.at_member_start)

    @property
    def complete(self) -> bool:
        """Whether the input so far ends exactly after a member (a whole gzip stream)."""
        return self.trailing or (self.at_member_start and self.position > 0)

    def step(self, data: bytes) -> tuple[bytes, bytes]:
        """One inflate call over ``data``: (output, the part of ``data`` not consumed yet)."""
        if self.trailing:
            self.compressed += len(data)
            return b"", b""
        try:
            out = self.state.decompress(data, OUT_CHUNK)
        except zlib.error as exc:
            if self.at_member_start and self.position:
                self.trailing = True
                self.compressed += len(data)
                return b"", b""
            raise OSError(f"not a valid gzip stream at byte {self.compressed} ({exc})") from None
        if self.state.eof:
            rest = self.state.unused_data
            self.state, self.at_member_start = zlib.decompressobj(GZIP_WBITS), True
        else:
            rest = self.state.unconsumed_tail
            self.at_member_start = self.at_member_start and len(rest) == len(data)
        self.compressed += len(data) - len(rest)
        self.position += len(out)
        return out, rest


class IndexingGunzip(io.RawIOBase):
    """The decompressed bytes of the gzip stream ``raw``, read once, recording ``checkpoints`` as it goes."""

    def __init__(self, raw: IO[bytes], spacing: int | None = None) -> None:
        super().__init__()
        self._raw = raw
        self._inflater = _Inflater()
        self._spacing = CHECKPOINT_SPACING if spacing is None else spacing
        self._pending = b""  # compressed bytes read but not consumed
        self._buffer = memoryview(b"")
        self._raw_done = False
        self.checkpoints: list[Checkpoint] = []

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._buffer:
            piece = self._next_piece()
            if piece is None:
                return 0
            self._buffer = memoryview(piece)
        count = min(len(buffer), len(self._buffer))
        buffer[:count] = self._buffer[:count]
        self._buffer = self._buffer[count:]
        return count

    def _next_piece(self) -> bytes | None:
        inflater = self._inflater
        while True:
            if not self.checkpoints or inflater.position >= self.checkpoints[-1].position + self._spacing:
                self.checkpoints.append(inflater.checkpoint())
            if not self._pending and not self._raw_done:
                self._pending = self._raw.read(READ_CHUNK)
                self._raw_done = not self._pending
            out, self._pending = inflater.step(self._pending)
            if out:
                return out
            if self._raw_done and not self._pending:
                if inflater.complete:
                    return None
                raise OSError(f"the gzip stream ends early, after {inflater.compressed} bytes (truncated?)")


def read_at(
    read_range: Callable[[int, int], bytes], checkpoints: list[Checkpoint], offset: int, size: int
) -> bytes:
    """``size`` decompressed bytes at ``offset``, inflated from the checkpoint before it; ``read_range(start,
    length)`` reads the compressed stream. Raises OSError when the stream ends first."""
    point = checkpoints[bisect.bisect_right([c.position for c in checkpoints], offset) - 1]
    inflater = _Inflater(point)
    skip = offset - point.position
    out = bytearray()
    start = point.compressed
    want = skip + size + 4096  # enough compressed bytes in one read when the data does not compress
    data = b""
    ended = False
    while len(out) < size:
        if not data and not ended:
            data = read_range(start, want)
            start += len(data)
            ended = not data
            want = READ_CHUNK
        piece, data = inflater.step(data)
        if not piece and ended and not data:
            raise OSError(f"the gzip stream ends before byte {offset + size} (changed since it was listed?)")
        if skip:
            cut = min(skip, len(piece))
            piece, skip = piece[cut:], skip - cut
        out += piece
    return bytes(out[:size])
