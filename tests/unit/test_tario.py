import io
import shutil
import subprocess
import tarfile

import pytest

from tpustream.dataset.tar_writer import TarShardWriter
from tpustream.dataset.tario import TarFormatError, iter_tar_samples


def _shard(samples):
    buf = io.BytesIO()
    with TarShardWriter(buf) as writer:
        for key, fields in samples:
            writer.write(key, fields)
    return buf.getvalue(), writer.finish()


SAMPLES = [(f"{i:08d}", {"ppm": bytes([i]) * (100 + i * 37), "cls": str(i % 10).encode()}) for i in range(25)]


def test_writer_matches_stdlib_ustar_and_round_trips():
    data, stats = _shard(SAMPLES)
    assert stats.num_samples == 25 and stats.num_bytes == len(data)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
        assert [m.name for m in members[:2]] == ["00000000.ppm", "00000000.cls"]
        assert all(m.mtime == 1704067200 and m.mode == 0o444 for m in members)
        assert tar.extractfile(members[2]).read() == SAMPLES[1][1]["ppm"]
    assert b"PaxHeader" not in data and b"././@PaxHeader" not in data
    assert list(iter_tar_samples(io.BytesIO(data))) == SAMPLES


def test_writer_is_deterministic():
    assert _shard(SAMPLES)[1].sha256 == _shard(SAMPLES)[1].sha256
    changed = SAMPLES[:-1] + [(SAMPLES[-1][0], {"ppm": b"x", "cls": b"1"})]
    assert _shard(changed)[1].sha256 != _shard(SAMPLES)[1].sha256


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar not installed")
def test_gnu_tar_reads_shards(tmp_path):
    data, _ = _shard(SAMPLES)
    path = tmp_path / "s.tar"
    path.write_bytes(data)
    listing = subprocess.run(["tar", "tf", str(path)], capture_output=True, text=True, check=True)
    assert listing.stdout.split() == [f"{k}.{e}" for k, f in SAMPLES for e in f]
    assert listing.stderr == ""


def test_stock_webdataset_reads_shards(tmp_path):
    import webdataset as wds

    from tpustream.image.codec import encode_ppm
    from tpustream.sources.builtin import synthetic_cifar_image

    path = tmp_path / "s.tar"
    with open(path, "wb") as f, TarShardWriter(f) as writer:
        for i in range(6):
            writer.write(f"{i:08d}", {"ppm": encode_ppm(synthetic_cifar_image(i, i)), "cls": str(i).encode()})
    ds = wds.WebDataset(str(path), shardshuffle=False).decode("pil").to_tuple("ppm;jpg;jpeg;png", "cls")
    out = list(ds)
    assert [c for _, c in out] == list(range(6))
    assert out[0][0].size == (32, 32)


@pytest.mark.parametrize("key", ["a.b", "a/b", ""])
def test_bad_keys_are_refused(key):
    with pytest.raises(ValueError, match="sample key"):
        TarShardWriter(io.BytesIO()).write(key, {"cls": b"1"})


@pytest.mark.parametrize("cut", [100, 512, 5000, -1024])
def test_truncated_tar_raises(cut):
    data, _ = _shard(SAMPLES)
    with pytest.raises(TarFormatError):
        list(iter_tar_samples(io.BytesIO(data[:cut])))


def test_corrupt_header_raises():
    data = bytearray(_shard(SAMPLES)[0])
    data[3] ^= 0x1
    with pytest.raises(TarFormatError, match="checksum"):
        list(iter_tar_samples(io.BytesIO(bytes(data))))


def test_reads_stock_pax_and_long_names(tmp_path):
    import webdataset as wds

    path = tmp_path / "stock.tar"
    long_key = "d/" + "k" * 120
    with wds.TarWriter(str(path)) as sink:  # float mtime: PAX headers
        sink.write({"__key__": "a", "ppm": b"123", "cls": b"4"})
        sink.write({"__key__": long_key, "jpg": b"x" * 600, "cls": b"5"})
    with open(path, "rb") as f:
        assert list(iter_tar_samples(f)) == [
            ("a", {"ppm": b"123", "cls": b"4"}),
            (long_key, {"jpg": b"x" * 600, "cls": b"5"}),
        ]
    with tarfile.open(tmp_path / "gnu.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo(long_key + ".cls")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"7"))
    with open(tmp_path / "gnu.tar", "rb") as f:
        assert list(iter_tar_samples(f)) == [(long_key, {"cls": b"7"})]


def _mixed_samples(count=600, seed=5):
    """Small members (parsed from read-ahead chunks), some large ones (read straight from the stream) and
    sizes that put member ends on and across every chunk boundary."""
    import random

    rng = random.Random(seed)
    sizes = [rng.choice([0, 1, 511, 512, 513, 3000, 16 << 10, (16 << 10) + 1, 70_000]) for _ in range(count)]
    return [
        (f"{i:06d}", {"ppm": bytes([i % 251]) * size, "cls": b"%d" % (i % 10)})
        for i, size in enumerate(sizes)
    ]


@pytest.mark.parametrize("large_from", [0, 400, None])
def test_chunked_reading_matches_stdlib_tarfile(large_from):
    samples = _mixed_samples()
    if large_from is not None:  # all small until then: chunk mode first, then straight reads
        samples = [(k, f if i >= large_from else {"ppm": f["ppm"][:3000], "cls": f["cls"]})
                   for i, (k, f) in enumerate(samples)]  # fmt: skip
    else:
        samples = [(k, {"ppm": f["ppm"][:3000], "cls": f["cls"]}) for k, f in samples]
    data, _ = _shard(samples)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        expected = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    assert [
        (f"{k}.{e}", v) for k, f in iter_tar_samples(io.BytesIO(data), len(data)) for e, v in f.items()
    ] == expected


@pytest.mark.parametrize("member", [1, 201, 777])
def test_a_bad_checksum_inside_a_chunk_yields_the_members_before_it_then_raises(member):
    samples = [(k, {"ppm": f["ppm"][:3000], "cls": f["cls"]}) for k, f in _mixed_samples()]
    data, _ = _shard(samples)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        offset = tar.getmembers()[member].offset
    forged = bytearray(data)
    forged[offset + 5] ^= 0x1  # a name byte: only the checksum can tell
    got = []
    with pytest.raises(TarFormatError, match="checksum"):
        for key, fields in iter_tar_samples(io.BytesIO(bytes(forged)), len(forged)):
            got.append((key, fields))
    assert got == samples[: member // 2]


def _rewrite_header(data, offset, start, value):
    """``data`` with one header's bytes ``start:start+len(value)`` replaced and its checksum redone the way
    GNU tar writes it (6 digits, NUL, space)."""
    out = bytearray(data)
    out[offset + start : offset + start + len(value)] = value
    out[offset + 148 : offset + 156] = b" " * 8
    out[offset + 148 : offset + 156] = b"%06o\0 " % sum(out[offset : offset + 512])
    return bytes(out)


# Valid header encodings that writers other than ours use: the batch scan (_scan) takes only the layout
# ours, tarfile's and GNU tar's share, and hands these to the one-header path, which must read them all.
OTHER_ENCODINGS = {
    "size with leading spaces": lambda size: (124, b"    %07o\0" % size),
    "size ending in a space": lambda size: (124, b"%011o " % size),
    "size of 10 digits, two NULs": lambda size: (124, b"%010o\0\0" % size),
    "old V7 type flag NUL": lambda size: (156, b"\0"),
    "contiguous-file type flag": lambda size: (156, b"7"),
}


@pytest.mark.parametrize("case", sorted(OTHER_ENCODINGS))
@pytest.mark.parametrize("member", [0, 101])
def test_other_writers_header_encodings_read_as_stdlib_reads_them(case, member):
    samples = [(k, {"ppm": f["ppm"][:3000], "cls": f["cls"]}) for k, f in _mixed_samples(300)]
    data, _ = _shard(samples)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        info = tar.getmembers()[member]
    data = _rewrite_header(data, info.offset, *OTHER_ENCODINGS[case](info.size))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        expected = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    assert [
        (f"{k}.{e}", v) for k, f in iter_tar_samples(io.BytesIO(data), len(data)) for e, v in f.items()
    ] == expected


def test_seven_digit_checksum_and_ustar_name_prefix_read_as_stdlib_reads_them():
    samples = [(k, {"ppm": f["ppm"][:3000], "cls": f["cls"]}) for k, f in _mixed_samples(300)]
    data, _ = _shard(samples)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
    seven = bytearray(data)  # "%07o\0": 7 digits then NUL, as some old writers store it
    at = members[57].offset
    seven[at + 148 : at + 156] = b" " * 8
    seven[at + 148 : at + 156] = b"%07o\0" % sum(seven[at : at + 512])
    prefixed = _rewrite_header(data, members[80].offset, 345, b"dir\0")  # ustar prefix: "dir/<name>"
    for forged in (bytes(seven), prefixed):
        with tarfile.open(fileobj=io.BytesIO(forged)) as tar:
            expected = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
        got = [
            (f"{k}.{e}", v)
            for k, f in iter_tar_samples(io.BytesIO(forged), len(forged))
            for e, v in f.items()
        ]
        assert got == expected
    assert "dir/" in expected[80][0]


def _tar_by_stdlib(names_and_sizes, tar_format=tarfile.USTAR_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tar_format) as tar:
        for name, size in names_and_sizes:
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(bytes([len(name) % 251]) * size))
    return buf.getvalue()


def _webdataset_tar(count):
    import webdataset as wds

    buf = io.BytesIO()
    with wds.TarWriter(buf) as sink:  # a float mtime: a PAX header before every member
        for i in range(count):
            sink.write({"__key__": f"{i:05d}", "ppm": bytes([i % 251]) * 3000, "cls": b"%d" % (i % 10)})
    return buf.getvalue()


def _long(i):  # a path over 100 bytes: USTAR stores its directories in the name prefix
    return "d" * 60 + "/" + "e" * 50 + "/" + f"{i:05d}"


def _seven_digit_checksums(data):
    out = bytearray(data)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        offsets = [m.offset for m in tar.getmembers()]
    for at in offsets:  # "%07o\0", as some old writers store it: valid, but not the batch scan's layout
        out[at + 148 : at + 156] = b" " * 8
        out[at + 148 : at + 156] = b"%07o\0" % sum(out[at : at + 512])
    return bytes(out)


TARS_LAID_OUT_OTHERWISE = {
    "a PAX header per member (stock webdataset)": lambda n: _webdataset_tar(n),
    "a name prefix on every member": lambda n: _tar_by_stdlib(
        [(f"{_long(i)}.{e}", s) for i in range(n) for e, s in (("ppm", 3000), ("cls", 1))]
    ),
    "a name prefix on every third sample": lambda n: _tar_by_stdlib(
        [
            (f"{_long(i) if i % 3 == 0 else f'{i:05d}'}.{e}", s)
            for i in range(n)
            for e, s in (("ppm", 3000), ("cls", 1))
        ]
    ),
    "7-digit checksums": lambda n: _seven_digit_checksums(
        _tar_by_stdlib([(f"{i:05d}.{e}", s) for i in range(n) for e, s in (("ppm", 3000), ("cls", 1))])
    ),
}


@pytest.mark.parametrize("case", sorted(TARS_LAID_OUT_OTHERWISE))
def test_a_tar_laid_out_otherwise_reads_right_and_the_batch_scan_backs_off(case, monkeypatch):
    from tpustream.dataset import tario

    data = TARS_LAID_OUT_OTHERWISE[case](1500)
    readers = []

    class Recorded(tario._Reader):
        def __init__(self, read):
            super().__init__(read)
            readers.append(self)

    monkeypatch.setattr(tario, "_Reader", Recorded)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        expected = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    got = [(f"{k}.{e}", v) for k, f in iter_tar_samples(io.BytesIO(data), len(data)) for e, v in f.items()]
    assert got == expected
    # Each scan walks headers and may hand back none; if every scan walked on to the end of the chunk, a
    # tar like this would cost ~members^2 / 2 walked headers (it did: 10-40x slower than one at a time).
    assert readers[0].walked <= 4 * len(expected)


def test_group_samples_hands_out_each_sample_as_it_completes_and_keeps_them_on_an_error():
    from tpustream.dataset.tario import group_samples

    def members():
        yield from [("a.x", b"1"), ("a.y", b"2"), ("b.x", b"3"), ("c.x", b"4")]
        raise TarFormatError("truncated")

    got = []
    with pytest.raises(TarFormatError):
        for sample in group_samples(members()):
            got.append(sample)
    assert got == [("a", {"x": b"1", "y": b"2"}), ("b", {"x": b"3"})]  # "c" was not known to be complete
