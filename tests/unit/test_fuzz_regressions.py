"""Inputs that once hung or crashed the loader or the writer (issue 15, and cases tests/common/fuzz_loader.py found),
kept as explicit bytes. Each runs under an alarm, so a regression to a hang fails instead of blocking."""

import io
import json
import random
import signal
import time
import tracemalloc
from contextlib import contextmanager

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from tpustream.cli.main import app
from tpustream.dataset import write as shards
from tpustream.dataset.manifest import read_manifest
from tpustream.dataset.plan import ShardConfig
from tpustream.dataset.tar_writer import TarShardWriter
from tpustream.dataset.tario import TarFormatError, iter_tar_samples
from tpustream.image.codec import (
    DEFAULT_MAX_PIXELS,
    CorruptImage,
    ImageTooLarge,
    decode_ppm,
    encode_ppm,
    ppm_header,
    prepare_image_bytes,
)
from tpustream.image.transforms import Augment, prepare_image
from tpustream.loader.shard_loader import LoaderConfig, ShardLoader
from tpustream.sources.types import Item, Source


@contextmanager
def deadline(seconds=5):
    def hang(*_):
        raise TimeoutError(f"still running after {seconds}s: a hang")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------------------------------------- PPM headers

# Each once looped forever in decode_ppm's header scan (it never checked for the end of the data).
HUNG = [b"P6 8", b"P6", b"P6 ", b"P6\n8 8", b"P6 8 8 255", b"P6 " + b"9" * 5000, b"P6\n#" + b"#" * 5000]
MALFORMED = [b"P6\n# comment never ends", b"P6 8 8 255x", b"P6\n-1 4\n255\n", b"", b"P6\n0 0\n255\n",
             b"P6\n4 4\n255\n" + b"\0" * 47]  # fmt: skip
UNSUPPORTED = [
    b"P5\n1 1\n255\n\0",
    b"P6\n2 2\n65535\n" + b"\0" * 24,
]  # Pillow reads them; decode_ppm does not


@pytest.mark.parametrize("data", HUNG + MALFORMED + UNSUPPORTED)
def test_malformed_ppm_is_a_value_error_at_once(data):
    started = time.perf_counter()
    with deadline(), pytest.raises(ValueError):
        decode_ppm(data)
    if data in UNSUPPORTED:
        return
    with deadline(), pytest.raises((ValueError, OSError)):  # the loader counts any exception undecodable
        prepare_image(data, "ppm", Augment(output_size=8, train=True), random.Random(0))
    with deadline(), pytest.raises(CorruptImage):
        prepare_image_bytes(data, ".ppm", None, "x.ppm")
    assert time.perf_counter() - started < 1.0


def test_ppm_header_forms_still_decode():
    pixels = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    for header in (b"P6\n3 2\n255\n", b"P6 3 2 255 ", b"P6\n# made by hand\n3\t2\r\n# c\n255\n"):
        assert ppm_header(header + pixels.tobytes())[:2] == (3, 2)
        assert np.array_equal(decode_ppm(header + pixels.tobytes()), pixels)


# ------------------------------------------------------------------------------------------- tar headers


def _shard():
    out = io.BytesIO()
    with TarShardWriter(out) as writer:
        writer.write("a", {"ppm": encode_ppm(np.zeros((2, 2, 3), np.uint8)), "cls": b"0"})
        writer.write("b", {"ppm": encode_ppm(np.ones((2, 2, 3), np.uint8)), "cls": b"1"})
    return out.getvalue()


def _forge(tar, start, value, member=0, checksum=True):
    data = bytearray(tar)
    at = 0 if member == 0 else 1024  # member 1 follows member 0's header and its 1-block PPM
    data[at + start : at + start + len(value)] = value
    if checksum:
        data[at + 148 : at + 156] = b" " * 8
        data[at + 148 : at + 156] = b"%06o\0 " % sum(data[at : at + 512])
    return bytes(data)


FORGED = {
    "base-256 size 100 GB (was MemoryError)": (124, b"\x80" + (100 * 10**9).to_bytes(11, "big")),
    "base-256 size 2^80 (was OverflowError)": (124, b"\x80" + (1 << 80).to_bytes(11, "big")),
    "base-256 size all ones (was OverflowError)": (124, b"\xff" * 12),
    "base-256 size negative": (124, b"\xff" + ((-5) % (1 << 88)).to_bytes(11, "big")),
    "octal size -5 (was ValueError from read)": (124, b"-5\0" + b"\0" * 9),
    "octal size with underscore": (124, b"1_0\0" + b"\0" * 8),
    "size one block past the end": (124, b"%011o\0" % 3000),
    "name ../escape": (0, b"../escape.ppm\0"),
    "absolute name": (0, b"/etc/x.ppm\0"),
    "hard link": (156, b"1"),
    "symlink": (156, b"2"),
    "character device": (156, b"3"),
    "GNU long link name": (156, b"K"),
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_forged_tar_header_is_a_tar_format_error(case):
    start, value = FORGED[case]
    data = _forge(_shard(), start, value)
    tracemalloc.start()
    try:
        with deadline(), pytest.raises(TarFormatError):
            list(iter_tar_samples(io.BytesIO(data), len(data)))
        with deadline(), pytest.raises(TarFormatError):  # no known size: still bounded by what arrives
            list(iter_tar_samples(io.BytesIO(data)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 << 20, f"{case}: {peak} bytes allocated for a {len(data)}-byte shard"


def test_bad_checksum_and_dot_dot_inside_a_file_name():
    tar = _shard()
    with pytest.raises(TarFormatError, match="checksum"):
        list(iter_tar_samples(io.BytesIO(_forge(tar, 148, b"0000001\0", checksum=False))))
    ok = _forge(tar, 0, b"x/a..b/a.ppm\0")  # ".." inside a name is not a path component
    assert [key for key, _ in iter_tar_samples(io.BytesIO(ok), len(ok))] == ["x/a..b/a", "a", "b"]


def test_member_claiming_more_than_the_known_size_is_refused():
    tar = _shard()
    with pytest.raises(TarFormatError, match="remain"):
        list(iter_tar_samples(io.BytesIO(tar), 700))  # the manifest says the shard is 700 bytes
    with pytest.raises(TarFormatError, match="past its known size"):
        list(iter_tar_samples(io.BytesIO(tar), 1024))


# ------------------------------------------------------------------------------------------- the loader


def _dataset(tmp_path, bad, count=24):
    """A dataset whose every 6th sample is ``bad`` (bytes, ext); 2 train and 2 val shards."""

    def load(item, _max_side):
        i = int(item.ref)
        if i % 6 == 0:
            return bad
        return encode_ppm(np.full((6, 6, 3), i, np.uint8)), "ppm"

    source = Source("t", "t", ["a", "b"], [Item(i, i % 2) for i in range(count)], load)
    out = str(tmp_path / "ds")
    config = ShardConfig(source="t", output=out, num_shards=2, val_shards=2, val_fraction=0.5)
    manifest, _ = shards.create_shards(config, progress=False, source=source)
    return out, manifest


def _black(dataset, manifest, split):
    """How many of a split's samples are the black (every 6th) ones."""
    count = 0
    for shard in manifest.splits[split].shards:
        with open(f"{dataset}/{shard.path}", "rb") as f:
            count += sum(1 for _, v in iter_tar_samples(f) if decode_ppm(v["ppm"], None).max() == 0)
    return count


def _epochs(dataset, split):
    reports = []
    for rank in range(2):
        loader = ShardLoader(LoaderConfig(data=dataset, split=split, batch_size=2, input_size=4,
                                          num_replicas=2, replica_index=rank, workers=0))  # fmt: skip
        with deadline(30):
            assert len(list(loader.epoch(0))) == loader.steps_per_epoch
        reports.append(loader.last_report)
    return reports


def test_shards_create_skips_and_counts_a_p6_8_image(tmp_path):
    for cls in ("a", "b"):
        (tmp_path / "src" / cls).mkdir(parents=True)
        for i in range(3):
            (tmp_path / "src" / cls / f"{i}.ppm").write_bytes(encode_ppm(np.full((4, 4, 3), i, np.uint8)))
    (tmp_path / "src" / "a" / "cut.ppm").write_bytes(b"P6 8")
    out = str(tmp_path / "ds")
    config = ShardConfig(source=str(tmp_path / "src"), output=out, num_shards=1, val_shards=1)
    with deadline(60):
        manifest, summary = shards.create_shards(config, progress=False)
    assert summary.skipped == 1 and manifest.skipped.count == 1
    assert "cut.ppm: cannot decode image" in manifest.skipped.examples[0]


def test_loader_skips_and_counts_p6_8_in_a_shard_written_by_another_tool(tmp_path):
    dataset, manifest = _dataset(tmp_path, (encode_ppm(np.zeros((6, 6, 3), np.uint8)), "ppm"))
    black_val = _black(dataset, manifest, "val")
    assert black_val > 0
    document = manifest.to_json()  # the manifest rewritten with the shards' new sizes
    for split in ("train", "val"):  # rewrite every shard with the 6th samples' images cut to "P6 8"
        for shard in document["splits"][split]["shards"]:
            path = tmp_path / "ds" / shard["path"]
            samples = list(iter_tar_samples(io.BytesIO(path.read_bytes())))
            with open(path, "wb") as f, TarShardWriter(f) as writer:
                for key, fields in samples:
                    if decode_ppm(fields["ppm"]).max() == 0:  # the every-6th samples: black
                        fields = {"ppm": b"P6 8", "cls": fields["cls"]}
                    writer.write(key, fields)
            shard["num_bytes"] = path.stat().st_size
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(document))
    reports = _epochs(dataset, "val")
    assert sum(r.undecodable for r in reports) == black_val and sum(r.bad_shards for r in reports) == 0
    assert sum(r.samples for r in reports) == manifest.num_samples("val") - black_val
    assert sum(r.undecodable for r in _epochs(dataset, "train")) >= 4 - black_val
    result = CliRunner().invoke(app, ["shards", "verify", "--deep", dataset])
    assert result.exit_code == 1
    assert result.output.count(": undecodable ppm (malformed or truncated PPM header") == 4
    assert "BAD train/train-000000.tar: sample " in result.output


def test_a_forged_base256_size_is_a_bad_shard_and_every_replica_keeps_its_steps(tmp_path):
    dataset, manifest = _dataset(tmp_path, (encode_ppm(np.zeros((6, 6, 3), np.uint8)), "ppm"))
    for split in ("train", "val"):
        path = tmp_path / "ds" / manifest.splits[split].shards[1].path
        path.write_bytes(
            _forge(path.read_bytes(), 124, b"\x80" + (100 * 10**9).to_bytes(11, "big"), member=1)
        )
    train = _epochs(dataset, "train")
    assert sum(r.bad_shards for r in train) == 1 and sum(r.repeated for r in train) > 0
    val = _epochs(dataset, "val")
    listed = manifest.num_samples("val")
    assert sum(r.bad_shards for r in val) == 1 and sum(r.unread for r in val) == listed // 2
    assert sum(r.samples + r.undecodable + r.unread for r in val) == listed
    assert any("claims 100000000000 bytes" in p for r in val for p in r.problems)


# ------------------------------------------------------------------------------------------- pixel budget


def _bomb():
    out = io.BytesIO()
    Image.new("1", (13000, 13000)).save(out, format="PNG", optimize=True)
    return out.getvalue()


def test_a_20_kb_png_of_13000_squared_is_refused_by_its_header():
    bomb = _bomb()
    assert len(bomb) < 40_000
    started = time.perf_counter()
    with pytest.raises(ImageTooLarge, match="13000x13000 = 169.0 MP"):
        prepare_image(bomb, "png", Augment(output_size=32, train=True), random.Random(0))
    with pytest.raises(ImageTooLarge, match="raise --max-pixels"):
        prepare_image_bytes(bomb, ".png", None, "bomb.png")
    with pytest.raises(ImageTooLarge):
        prepare_image_bytes(bomb, ".png", 256, "bomb.png")  # --max-side does not let a bomb through
    assert time.perf_counter() - started < 0.5  # decoding it takes seconds and 169 MB


def test_a_jpeg_header_claiming_60000_squared_is_refused():
    out = io.BytesIO()
    Image.new("RGB", (16, 16)).save(out, format="JPEG")
    data = bytearray(out.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") * 2
    with pytest.raises(ImageTooLarge, match="60000x60000"):
        prepare_image(bytes(data), "jpg", Augment(output_size=32, train=False), random.Random(0))


def test_pixel_budget_at_write_time_and_max_side_still_downsizes(tmp_path):
    root = tmp_path / "photos"
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 255, (200, 300, 3), np.uint8)).save(root / cls / f"{i}.jpg")
    (root / "cat" / "bomb.png").write_bytes(_bomb())
    runner = CliRunner()
    out = tmp_path / "ds"
    args = [
        "shards",
        "create",
        "--source",
        str(root),
        "--num-shards",
        "1",
        "--val-shards",
        "1",
        "--workers",
        "1",
    ]
    result = runner.invoke(app, [*args, "--output", str(out), "--max-side", "64"])
    assert result.exit_code == 0, result.output
    assert "1 skipped" in result.output
    manifest = read_manifest(str(out))
    assert manifest["max_pixels"] == DEFAULT_MAX_PIXELS
    assert "bomb.png: 13000x13000" in manifest["skipped"]["examples"][0]
    sides = []
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            with open(out / shard["path"], "rb") as f:
                sides += [max(Image.open(io.BytesIO(v["jpg"])).size) for _, v in iter_tar_samples(f)]
    assert sides and set(sides) == {64}  # legitimate photos still downsized
    result = runner.invoke(app, [*args, "--output", str(tmp_path / "small"), "--max-pixels", "50000"])
    # 300x200 = 60,000 px > 50,000: every image skipped, and a dataset of 0 samples is refused
    assert (
        result.exit_code == 2 and "no train sample could be written (0 in total; 9 skipped" in result.output
    )
    result = runner.invoke(app, ["shards", "verify", "--deep", str(out)])
    assert result.exit_code == 0 and "ok: 2 shards" in result.output, result.output


def test_loader_skips_an_image_above_its_pixel_budget(tmp_path):
    dataset, manifest = _dataset(tmp_path, (encode_ppm(np.zeros((40, 40, 3), np.uint8)), "ppm"))
    black_val = _black(dataset, manifest, "val")
    loader = ShardLoader(LoaderConfig(data=dataset, split="val", batch_size=2, input_size=4, num_replicas=1,
                                      replica_index=0, workers=0, max_pixels=1000))  # fmt: skip
    with deadline(30):
        assert len(list(loader.epoch(0))) == loader.steps_per_epoch
    assert loader.last_report.undecodable == black_val > 0  # the val split's 40x40 = 1,600 px samples
    result = CliRunner().invoke(app, ["shards", "verify", "--deep", "--max-pixels", "1000", dataset])
    assert result.exit_code == 1 and result.output.count("exceeds the pixel budget") == 4


def test_cli_default_budget_is_the_codec_default():
    from tpustream.cli import data as cli  # the shards commands (cli/main.py registers them)

    assert cli.DEFAULT_MAX_PIXELS == DEFAULT_MAX_PIXELS == 8192 * 8192
