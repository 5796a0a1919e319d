"""Random access into gzip streams through the checkpoints one streaming read records."""

import gzip
import io
import random

import pytest

from tpustream.sources.gzip_index import IndexingGunzip, read_at


def _data(seed: int) -> bytes:
    """Runs of random bytes (incompressible) between runs of zeros (compressing ~1000x)."""
    rng = random.Random(seed)
    return b"".join(
        rng.randbytes(rng.randrange(1, 20_000)) + bytes(rng.randrange(0, 300_000)) for _ in range(40)
    )


@pytest.mark.parametrize(
    "pack",
    [
        lambda data: gzip.compress(data, mtime=0),
        lambda data: gzip.compress(data[:77_777], mtime=0) + gzip.compress(data[77_777:], mtime=0),
        lambda data: gzip.compress(data, mtime=0) + bytes(512),  # padding after the last member is ignored
    ],
    ids=["one-member", "two-members", "trailing-zeros"],
)
def test_every_range_reads_back_through_the_index(pack):
    data = _data(0)
    compressed = pack(data)
    reader = IndexingGunzip(io.BytesIO(compressed), spacing=1 << 16)
    assert io.BufferedReader(reader).read() == data
    assert len(reader.checkpoints) > 20  # one per 64 KiB of output
    ranges = []

    def read_range(start: int, length: int) -> bytes:
        ranges.append(length)
        return compressed[start : start + length]

    rng = random.Random(1)
    for _ in range(200):
        offset = rng.randrange(len(data))
        size = min(rng.randrange(0, 100_000), len(data) - offset)
        assert read_at(read_range, reader.checkpoints, offset, size) == data[offset : offset + size]
    assert read_at(read_range, reader.checkpoints, len(data) - 5, 5) == data[-5:]


def test_a_truncated_or_corrupt_stream_is_an_oserror():
    compressed = gzip.compress(_data(2), mtime=0)
    with pytest.raises(OSError, match="ends early"):
        io.BufferedReader(IndexingGunzip(io.BytesIO(compressed[: len(compressed) // 2]))).read()
    with pytest.raises(OSError, match="not a valid gzip stream"):
        io.BufferedReader(IndexingGunzip(io.BytesIO(b"PK\x03\x04 not gzip at all"))).read()
