"""The loader fuzzer: mutate real shards and images, and check each case end to end.

Run by ``tests/integration/test_fuzz.py`` in a subprocess (``python -m tests.common.fuzz_loader SEED CASES DIR``) so
that a hang is killed by a per-case watchdog (``faulthandler``, which fires even inside C code) and named:
the driver prints ``START <n> <case>`` before each case and one JSON line after it.

For every case it asserts: no exception escapes (shard reading, decoding, ``shards verify --deep``, the
write-time image check), every replica gets exactly ``steps_per_epoch`` batches of both splits, train
batches are full, and the val report reconciles with the manifest
(``samples + undecodable + unread == manifest samples``, over both replicas).
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import os
import random
import shutil
import sys
import tarfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

BLOCK = 512
REPLICAS = 2
BATCH = 4
INPUT = 8
CASE_TIMEOUT_S = 20.0


# ----------------------------------------------------------------------------- the real dataset mutated


def _image_bytes(rng: np.random.Generator, i: int) -> tuple[bytes, str]:
    from PIL import Image

    from tpustream.image.codec import encode_ppm

    h, w = int(rng.integers(6, 20)), int(rng.integers(6, 20))
    pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    ext = ("ppm", "png", "jpg")[i % 3]
    if ext == "ppm":
        return encode_ppm(pixels), ext
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG" if ext == "png" else "JPEG")
    return out.getvalue(), ext


def make_base(root: str, count: int = 48) -> str:
    """A real dataset of PPM, PNG and JPEG samples: 4 train shards, 2 val shards."""
    from tpustream.dataset import write as shards
    from tpustream.dataset.plan import ShardConfig
    from tpustream.sources.types import Item, Source

    rng = np.random.default_rng(0)
    images = [_image_bytes(rng, i) for i in range(count)]
    source = Source("fuzz", "fuzz base", ["a", "b", "c"], [Item(i, i % 3) for i in range(count)],
                    lambda item, _max_side: images[int(item.ref)])  # fmt: skip
    out = os.path.join(root, "base")
    config = ShardConfig(source="fuzz", output=out, num_shards=4, val_shards=2, val_fraction=0.25)
    shards.create_shards(config, progress=False, source=source)
    return out


def _headers(tar: bytes) -> list[int]:
    """Offsets of the member headers of a well-formed tar."""
    offsets, pos = [], 0
    while pos + BLOCK <= len(tar) and tar[pos : pos + BLOCK] != b"\0" * BLOCK:
        offsets.append(pos)
        size = int(tar[pos + 124 : pos + 135].strip(b"\0 ") or b"0", 8)
        pos += BLOCK + size + (-size % BLOCK)
    return offsets


def _checksum(header: bytearray) -> None:
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)


def set_field(tar: bytes, member: int, start: int, value: bytes, fix_checksum: bool = True) -> bytes:
    out = bytearray(tar)
    headers = _headers(tar)
    at = headers[member % len(headers)]  # the val shard may hold fewer members than the train shard
    header = bytearray(out[at : at + BLOCK])
    header[start : start + len(value)] = value
    if fix_checksum:
        _checksum(header)
    out[at : at + BLOCK] = header
    return bytes(out)


def base256(value: int, width: int = 12) -> bytes:
    if value < 0:
        return b"\xff" + (value % (1 << (8 * (width - 1)))).to_bytes(width - 1, "big")
    return bytes([0x80]) + value.to_bytes(width - 1, "big")


def member_header(name: bytes, size: int, typeflag: bytes = b"0") -> bytes:
    info = tarfile.TarInfo(name.decode("latin-1"))
    info.size = size
    info.type = typeflag
    if typeflag in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        info.linkname = "../../etc/passwd"
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def bomb_png() -> bytes:
    """A ~20 KB PNG whose header says 13000x13000 (169 MP)."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("1", (13000, 13000)).save(out, format="PNG", optimize=True)
    return out.getvalue()


def huge_jpeg_header(real: bytes) -> bytes:
    """A real JPEG whose SOF0 dimensions are rewritten to 60000x60000."""
    data = bytearray(real)
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") * 2
    return bytes(data)


# A case: (description, raw-tar mutation or None, image mutation or None, keep the manifest consistent?)
TarMutation = Callable[[bytes], bytes]
ImageMutation = Callable[[bytes, str], tuple[bytes, str]]


def tar_cases(rng: random.Random, tar: bytes) -> list[tuple[str, TarMutation]]:
    n = len(_headers(tar))
    cases: list[tuple[str, TarMutation]] = []
    offsets = sorted({0, 1, 100, 511, 512, 513, 1023, 1024, len(tar) - 1024, len(tar) - 1}
                     | {rng.randrange(len(tar)) for _ in range(10)})  # fmt: skip
    for cut in offsets:
        cases.append((f"truncate at {cut}", lambda t, c=cut: t[:c]))
    for _k in range(12):
        flips = [(rng.randrange(len(tar)), 1 << rng.randrange(8)) for _ in range(rng.randint(1, 6))]

        def flip(t: bytes, flips: list[tuple[int, int]] = flips) -> bytes:
            out = bytearray(t)
            for at, bit in flips:
                if at < len(out):
                    out[at] ^= bit
            return bytes(out)

        cases.append((f"flip bits {flips}", flip))
    sizes: list[tuple[str, bytes]] = [
        ("base-256 100 GB", base256(100 * 10**9)),
        ("base-256 2^80", base256(1 << 80)),
        ("base-256 2^88-1", b"\xff" * 12),
        ("base-256 negative", base256(-5)),
        ("base-256 small", base256(3)),
        ("octal 77777777777", b"77777777777\0"),
        ("octal -5", b"-5\0" + b"\0" * 9),
        ("octal 1_0", b"1_0\0" + b"\0" * 8),
        ("not octal 9", b"00000000009\0"),
        ("size +1", b""),
        ("size -1", b""),
        ("size 0", b"00000000000\0"),
    ]
    for label, value in sizes:
        m = rng.randrange(n)

        def resize(t: bytes, m: int = m, label: str = label, value: bytes = value) -> bytes:
            if label in ("size +1", "size -1"):
                headers = _headers(t)
                at = headers[m % len(headers)]
                size = int(t[at + 124 : at + 135], 8) + (1 if label == "size +1" else -1)
                value = b"%011o\0" % max(size, 0)
            return set_field(t, m, 124, value)

        cases.append((f"member {m} size field: {label}", resize))
    for label, start, value in [
        ("name ../escape", 0, b"../escape.ppm\0"),
        ("name /abs", 0, b"/abs/x.ppm\0"),
        ("name a/../../b", 0, b"a/../../b.ppm\0"),
        ("empty name", 0, b"\0" * 100),
        ("typeflag hard link", 156, b"1"),
        ("typeflag symlink", 156, b"2"),
        ("typeflag char device", 156, b"3"),
        ("typeflag fifo", 156, b"6"),
        ("typeflag directory", 156, b"5"),
        ("typeflag GNU long link", 156, b"K"),
        ("typeflag GNU long name", 156, b"L"),
        ("typeflag pax", 156, b"x"),
        ("typeflag sparse", 156, b"S"),
        ("typeflag vendor Z", 156, b"Z"),
        ("prefix field set", 345, b"dir\0"),
    ]:
        m = rng.randrange(n)
        cases.append((f"member {m} {label}", lambda t, m=m, s=start, v=value: set_field(t, m, s, v)))
    m = rng.randrange(n)
    cases.append((f"member {m} bad checksum", lambda t, m=m: set_field(t, m, 148, b"0000001\0", False)))
    cases.append((f"member {m} checksum not octal", lambda t, m=m: set_field(t, m, 148, b"zzzzzz\0 ", False)))

    def insert(t: bytes, at_member: int, blob: bytes) -> bytes:
        headers = _headers(t)
        at = headers[at_member % len(headers)]
        return t[:at] + blob + t[at:]

    for label, blob in [
        ("zero-byte image member", member_header(b"zz.ppm", 0)),
        ("zero-byte cls member", member_header(b"zz.cls", 0)),
        ("symlink member", member_header(b"link.ppm", 0, tarfile.SYMTYPE)),
        ("hard link member", member_header(b"link.ppm", 0, tarfile.LNKTYPE)),
        (
            "base-256 100 GB member",
            member_header(b"big.ppm", 0)[:124] + base256(100 * 10**9) + member_header(b"big.ppm", 0)[136:],
        ),
        ("end marker early", b"\0" * 1024),
        ("garbage block", bytes(rng.randrange(256) for _ in range(BLOCK))),
    ]:
        m = rng.randrange(n)
        if label.startswith("base-256"):
            header = bytearray(blob)
            _checksum(header)
            blob = bytes(header)
        cases.append((f"insert {label} before member {m}", lambda t, m=m, b=blob: insert(t, m, b)))
    cases.append(("empty file", lambda t: b""))
    cases.append(("zeros only", lambda t: b"\0" * 1024))
    cases.append(("appended junk after end marker", lambda t: t + b"junk" * 300))
    return cases


def image_cases(rng: random.Random) -> list[tuple[str, ImageMutation]]:
    bomb = bomb_png()
    cases: list[tuple[str, ImageMutation]] = [
        ("PPM 'P6 8'", lambda d, e: (b"P6 8", "ppm")),
        ("PPM 'P6'", lambda d, e: (b"P6", "ppm")),
        ("PPM comment without end", lambda d, e: (b"P6\n#" + b"#" * 5000, "ppm")),
        ("PPM huge digits", lambda d, e: (b"P6 " + b"9" * 5000, "ppm")),
        ("PPM 60000x60000 header", lambda d, e: (b"P6\n60000 60000\n255\n" + b"\0" * 64, "ppm")),
        ("PPM 0x0", lambda d, e: (b"P6\n0 0\n255\n", "ppm")),
        ("PPM maxval 65535", lambda d, e: (b"P6\n2 2\n65535\n" + b"\0" * 24, "ppm")),
        ("zero-byte image", lambda d, e: (b"", e)),
        ("bomb PNG 13000x13000", lambda d, e: (bomb, "png")),
        ("bomb PNG as .jpg", lambda d, e: (bomb, "jpg")),
        ("text as .png", lambda d, e: (b"hello, world", "png")),
    ]
    for _k in range(6):
        cut = rng.random()
        cases.append((f"image truncated to {cut:.2f}", lambda d, e, c=cut: (d[: int(len(d) * c)], e)))
    for _k in range(8):
        seed = rng.randrange(1 << 30)

        def flip(d: bytes, e: str, seed: int = seed) -> tuple[bytes, str]:
            r = random.Random(seed)
            out = bytearray(d)
            for _ in range(r.randint(1, 8)):
                if out:
                    out[r.randrange(len(out))] ^= 1 << r.randrange(8)
            return bytes(out), e

        cases.append((f"image bytes flipped (seed {seed})", flip))
    return cases


# ----------------------------------------------------------------------------- running one case


def _rewrite_shard(path: str, mutate: ImageMutation, every: int) -> None:
    """Rewrite a shard through the real writer with every ``every``-th sample's image mutated."""
    from tpustream.dataset.tar_writer import TarShardWriter
    from tpustream.dataset.tario import iter_tar_samples

    with open(path, "rb") as f:
        samples = list(iter_tar_samples(f))
    with open(path, "wb") as f, TarShardWriter(f) as writer:
        for i, (key, fields) in enumerate(samples):
            if i % every == 0:
                ext = next(e for e in ("ppm", "png", "jpg") if e in fields)
                data, new_ext = mutate(fields.pop(ext), ext)
                fields = {new_ext: data, "cls": fields["cls"]}
            writer.write(key, fields)


def _refresh_manifest(dataset: str) -> None:
    """Make the manifest describe the shards as they now are (a consistent, forged dataset)."""
    import hashlib

    from tpustream.dataset.tario import iter_tar_samples

    path = os.path.join(dataset, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            shard_path = os.path.join(dataset, shard["path"])
            with open(shard_path, "rb") as f:
                data = f.read()
            shard["num_bytes"] = len(data)
            shard["sha256"] = hashlib.sha256(data).hexdigest()
            with contextlib.suppress(ValueError):
                shard["num_samples"] = sum(1 for _ in iter_tar_samples(io.BytesIO(data)))
        split["num_samples"] = sum(s["num_samples"] for s in split["shards"])
    with open(path, "w") as f:
        json.dump(manifest, f)


def run_loader(dataset: str) -> dict[str, Any]:
    """Both splits on both replicas; raises AssertionError when an invariant breaks."""
    from tpustream.dataset.manifest import load_manifest
    from tpustream.loader.shard_loader import LoaderConfig, ShardLoader

    manifest = load_manifest(dataset)
    out: dict[str, Any] = {}
    for split in ("train", "val"):
        totals = {"samples": 0, "undecodable": 0, "unread": 0, "bad_shards": 0}
        extra = False
        for rank in range(REPLICAS):
            loader = ShardLoader(LoaderConfig(data=dataset, split=split, batch_size=BATCH, input_size=INPUT,
                                              num_replicas=REPLICAS, replica_index=rank, workers=0),
                                 manifest)  # fmt: skip
            batches = list(loader.epoch(0))
            report = loader.last_report
            assert report is not None
            assert len(batches) == loader.steps_per_epoch, (split, rank, len(batches), loader.steps_per_epoch)
            for batch in batches:
                assert tuple(batch["image"].shape) == (BATCH, 3, INPUT, INPUT)
            if split == "train":
                # issue 46: only the epoch's last batch may be padded (one per replica)
                assert sum(not bool(b["mask"].all()) for b in batches) <= 1, "padding in two train batches"
                assert report.samples + report.repeated + report.padded == loader.steps_per_epoch * BATCH
            masked = sum(int(b["mask"].sum()) for b in batches)
            assert masked == report.samples + report.repeated, (split, rank, masked, report.samples)
            for key in totals:
                totals[key] += getattr(report, key)
            extra = extra or any("more val samples" in p for p in report.problems)
        if split == "val" and not extra:
            listed = sum(shard.num_samples for shard in manifest.splits["val"].shards)
            got = totals["samples"] + totals["undecodable"] + totals["unread"]
            assert got == listed, f"val report does not reconcile: {totals} vs {listed} in the manifest"
        out[split] = totals
    return out


def run_case(base: str, work: str, description: str, tar_mut: TarMutation | None,
             image_mut: ImageMutation | None, consistent: bool) -> dict[str, Any]:  # fmt: skip
    from tpustream.dataset.manifest import read_manifest, verify_shards
    from tpustream.image.codec import CorruptImage, prepare_image_bytes

    dataset = os.path.join(work, "case")
    shutil.rmtree(dataset, ignore_errors=True)
    shutil.copytree(base, dataset)
    manifest = read_manifest(dataset)
    targets = [os.path.join(dataset, manifest["splits"][s]["shards"][1]["path"]) for s in ("train", "val")]
    for path in targets:
        if tar_mut is not None:
            with open(path, "rb") as f:
                data = f.read()
            with open(path, "wb") as f:
                f.write(tar_mut(data))
        if image_mut is not None:
            _rewrite_shard(path, image_mut, every=3)
    if consistent:
        _refresh_manifest(dataset)
    result = run_loader(dataset)
    _, problems = verify_shards(dataset, workers=1, progress=False, deep=True)  # must not raise
    result["verify_problems"] = len(problems)
    if image_mut is not None:
        for ext in ("ppm", "png", "jpg"):  # the write-time check: bytes kept, re-encoded, or CorruptImage
            sample = next(iter(_sample_images(base, ext)))
            with contextlib.suppress(CorruptImage):
                prepare_image_bytes(*image_mut(sample, ext), None, "fuzz")
    if consistent and image_mut is not None:  # the shards are intact: deep verify lists what the loader skips
        val_bad = sum(1 for p in problems if p.startswith("val/"))
        assert val_bad == result["val"]["undecodable"], (problems, result["val"])
    return result


def _sample_images(base: str, ext: str) -> list[bytes]:
    from tpustream.dataset.tario import iter_tar_samples

    out = []
    for name in sorted(os.listdir(os.path.join(base, "train"))):
        with open(os.path.join(base, "train", name), "rb") as f:
            out.extend(fields[ext] for _, fields in iter_tar_samples(f) if ext in fields)
    return out


def all_cases(seed: int, base: str) -> list[tuple[str, TarMutation | None, ImageMutation | None, bool]]:
    rng = random.Random(seed)
    with open(os.path.join(base, "train", sorted(os.listdir(os.path.join(base, "train")))[1]), "rb") as f:
        tar = f.read()
    cases: list[tuple[str, TarMutation | None, ImageMutation | None, bool]] = []
    for description, mutation in tar_cases(rng, tar):
        cases.append((f"tar: {description}", mutation, None, False))
        if rng.random() < 0.3:  # the same bytes with a manifest that agrees (a forged, consistent dataset)
            cases.append((f"tar (manifest agrees): {description}", mutation, None, True))
    for description, image_mutation in image_cases(rng):
        cases.append((f"image: {description}", None, image_mutation, True))
    return cases


def main(argv: list[str]) -> int:
    seed, limit, work = int(argv[0]), int(argv[1]), argv[2]
    import logging

    logging.disable(logging.WARNING)  # the loader warns about every bad shard: expected here
    base = make_base(work)
    cases = all_cases(seed, base)[:limit]
    print(f"CASES {len(cases)}", flush=True)
    for n, (description, tar_mut, image_mut, consistent) in enumerate(cases):
        print(f"START {n} {description}", flush=True)
        faulthandler.dump_traceback_later(CASE_TIMEOUT_S, exit=True)  # a hang (even in C) ends the run here
        started = time.perf_counter()
        try:
            result = run_case(base, work, description, tar_mut, image_mut, consistent)
            status = "ok"
        except Exception:
            result, status = {"traceback": traceback.format_exc()}, "fail"
        faulthandler.cancel_dump_traceback_later()
        result.update(n=n, case=description, status=status, seconds=round(time.perf_counter() - started, 3))
        print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
