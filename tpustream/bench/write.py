"""Benchmarks that print one JSON line per result, with the baseline run side by side in-process.

The machine is shared and noisy: each writer runs ``repeats`` times, interleaved with its baseline,
and the median is reported with the ratio to the baseline's median.

The perceptual hash's cost (``write-phash`` lines) is measured on shard creation itself (``write_shard``: load,
check, sha256, hash, tar, sample index) with the hash on and off, interleaved in the same process: at CIFAR
size (32 px PPMs made from arrays in memory, as the cifar10 source does) and at ImageNet sizes (a folder of
500x375 and of 224x224 JPEGs on local disk, through the ImageFolder source's check). The thumbnails' window
hashes (``write-phash-windows`` lines) likewise: hash off, pHash alone, pHash and windows, on 32x32 PPMs and
a folder of 32x32 PNGs.
"""

from __future__ import annotations

import functools
import io
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["bench_write", "bench_hash_cost", "bench_window_cost"]


def _timed(fn: Callable[[], None]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def _tar_bytes(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))


def _write_ours(samples: Sequence[tuple[str, str, bytes, bytes]], directory: str, per_shard: int) -> None:
    from tpustream.dataset.tar_writer import TarShardWriter

    for shard, start in enumerate(range(0, len(samples), per_shard)):
        with (
            open(os.path.join(directory, f"ours-{shard:06d}.tar"), "wb", buffering=1 << 20) as f,
            TarShardWriter(f) as writer,
        ):
            for key, ext, image, cls in samples[start : start + per_shard]:
                writer.write(key, {ext: image, "cls": cls})


def _write_stock(samples: Sequence[tuple[str, str, bytes, bytes]], directory: str, per_shard: int) -> None:
    import webdataset as wds

    pattern = os.path.join(directory, "stock-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0) as sink:
        for key, ext, image, cls in samples:
            sink.write({"__key__": key, ext: image, "cls": cls})


def _compare_writers(
    name: str, samples: Sequence[tuple[str, str, bytes, bytes]], repeats: int, per_shard: int
) -> Iterator[dict[str, Any]]:
    payload = sum(len(s[2]) + len(s[3]) for s in samples)
    runs: dict[str, list[tuple[float, float]]] = {"stock-webdataset": [], "tpustream": []}
    sizes: dict[str, int] = {}
    writers = {"stock-webdataset": _write_stock, "tpustream": _write_ours}
    for _ in range(repeats):
        for writer, fn in writers.items():
            directory = tempfile.mkdtemp(prefix=f"tpustream-bench-{writer}-")
            try:
                runs[writer].append(_timed(functools.partial(fn, samples, directory, per_shard)))
                sizes[writer] = _tar_bytes(directory)
            finally:
                shutil.rmtree(directory, ignore_errors=True)
    stock_rate = len(samples) / statistics.median(w for w, _ in runs["stock-webdataset"])
    for writer in writers:
        wall = statistics.median(w for w, _ in runs[writer])
        cpu = statistics.median(c for _, c in runs[writer])
        overhead = (sizes[writer] - payload) / len(samples)
        members = 2
        yield {
            "bench": "write",
            "data": name,
            "writer": writer,
            "samples": len(samples),
            "repeats": repeats,
            "samples_per_s": round(len(samples) / wall),
            "samples_per_s_per_core": round(len(samples) / max(cpu, 1e-9)),
            "mb_per_s": round(payload / wall / 1e6, 1),
            "mb_per_s_per_core": round(payload / max(cpu, 1e-9) / 1e6, 1),
            "payload_bytes_per_sample": round(payload / len(samples)),
            "tar_overhead_bytes_per_sample": round(overhead),
            # what a writer can choose: headers (PAX or not); 512-byte block padding is fixed by tar
            "header_bytes_per_sample": round(overhead - _padding(samples) / len(samples) - 1024 / per_shard),
            "member_count_per_sample": members,
            "ratio_vs_stock": round(len(samples) / wall / stock_rate, 2),
        }


def _padding(samples: Sequence[tuple[str, str, bytes, bytes]]) -> int:
    return sum(-len(s[2]) % 512 + -len(s[3]) % 512 for s in samples)


def _encoding_choice(images: Sequence[Any], repeats: int) -> Iterator[dict[str, Any]]:
    """PPM vs PNG for raw arrays: bytes per sample and how fast the loader can decode each."""
    import numpy as np
    from PIL import Image

    from tpustream.image.codec import decode_ppm, encode_ppm

    ppm = [encode_ppm(img) for img in images]
    png = []
    for img in images:
        out = io.BytesIO()
        Image.fromarray(img).save(out, format="PNG", compress_level=1)
        png.append(out.getvalue())

    def decode_all_ppm() -> None:
        for data in ppm:
            decode_ppm(data)

    def decode_all_png() -> None:
        for data in png:
            np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

    rates = {}
    for fmt, fn, encoded in (("ppm", decode_all_ppm, ppm), ("png", decode_all_png, png)):
        wall = statistics.median(_timed(fn)[0] for _ in range(repeats))
        rates[fmt] = (len(encoded) / wall, sum(map(len, encoded)) / len(encoded))
    for fmt, (rate, nbytes) in rates.items():
        yield {
            "bench": "encoding",
            "data": "cifar-size",
            "format": fmt,
            "decode_samples_per_s": round(rate),
            "bytes_per_sample": round(nbytes),
            "decode_ratio_vs_png": round(rate / rates["png"][0], 2),
        }


def _cifar_array_source(count: int) -> Any:
    """``count`` distinct 32x32 images held as arrays, loaded as PPM bytes (the cifar10 source's way)."""
    from tpustream.image.codec import encode_ppm, resize_array
    from tpustream.sources.builtin import synthetic_cifar_image
    from tpustream.sources.types import Item, Source

    arrays = [synthetic_cifar_image(i, i % 10) for i in range(count)]

    def load(item: Item, max_side: int | None) -> tuple[bytes, str]:
        return encode_ppm(resize_array(arrays[int(item.ref)], max_side)), "ppm"

    return Source(
        "bench:cifar", "", [f"class{k}" for k in range(10)], [Item(i, i % 10) for i in range(count)], load
    )


def _jpeg_folder(root: str, count: int, width: int, height: int) -> str:
    """An ImageFolder of ``count`` distinct ``width`` x ``height`` JPEGs (q90) under ``root``."""
    from tpustream.sources.builtin import synthetic_imagenet_jpeg

    for i in range(count):
        directory = os.path.join(root, f"class{i % 10}")
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"{i:06d}.jpg"), "wb") as f:
            f.write(synthetic_imagenet_jpeg(i, i % 10, width, height))
    return root


def _hash_cost(name: str, source: Any, repeats: int, per_shard: int) -> dict[str, Any]:
    """Shard creation of every item of ``source`` with and without the perceptual hash, interleaved."""
    from tpustream.dataset.plan import ShardSpec
    from tpustream.dataset.shard_writer import write_shard

    indices = list(range(len(source.items)))
    specs = [
        ShardSpec("train", shard, tuple(f"{i:08d}" for i in part), tuple(part), "bench")
        for shard, part in enumerate(
            indices[start : start + per_shard] for start in range(0, len(indices), per_shard)
        )
    ]

    def create(hashing: bool) -> None:
        output = tempfile.mkdtemp(prefix="tpustream-bench-phash-")
        try:
            for spec in specs:
                write_shard(source, spec, output, max_side=None, strict=True, perceptual_hashes=hashing)
        finally:
            shutil.rmtree(output, ignore_errors=True)

    runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    create(True)  # warm: imports, the source's first loads
    for _ in range(repeats):
        for hashing in (False, True):
            runs[hashing].append(_timed(functools.partial(create, hashing)))
    cpu = {hashing: statistics.median(c for _, c in runs[hashing]) for hashing in runs}
    wall = {hashing: statistics.median(w for w, _ in runs[hashing]) for hashing in runs}
    count = len(source.items)
    return {
        "bench": "write-phash",
        "data": name,
        "samples": count,
        "repeats": repeats,
        "samples_per_s_per_core_without_hash": round(count / max(cpu[False], 1e-9)),
        "samples_per_s_per_core_with_hash": round(count / max(cpu[True], 1e-9)),
        "us_per_sample_without_hash": round(cpu[False] / count * 1e6, 1),
        "us_per_sample_with_hash": round(cpu[True] / count * 1e6, 1),
        "hash_us_per_sample": round((cpu[True] - cpu[False]) / count * 1e6, 1),
        "ratio_cpu_with_vs_without": round(cpu[True] / max(cpu[False], 1e-9), 3),
        # CPU seconds of this process: the shared machine's other load moves wall time, not this
        "slowdown_cpu": round(cpu[True] / max(cpu[False], 1e-9) - 1, 3),
        "slowdown_wall": round(wall[True] / max(wall[False], 1e-9) - 1, 3),
        "goal": 0.10,
    }


def _window_cost(name: str, source: Any, repeats: int, per_shard: int) -> dict[str, Any]:
    """Shard creation of ``source``'s thumbnails hash off, pHash alone and pHash with the window hashes
    (image.phash_windows), interleaved: what the windows add. The train split's role (base windows); val and
    test (query windows) cost the same."""
    from tpustream.dataset.plan import ShardSpec
    from tpustream.dataset.shard_writer import write_shard

    indices = list(range(len(source.items)))
    specs = [
        ShardSpec("train", shard, tuple(f"{i:08d}" for i in part), tuple(part), "bench")
        for shard, part in enumerate(
            indices[start : start + per_shard] for start in range(0, len(indices), per_shard)
        )
    ]
    modes = {"without_hash": (False, False), "phash_only": (True, False), "phash_and_windows": (True, True)}

    def create(phash: bool, windows: bool) -> None:
        output = tempfile.mkdtemp(prefix="tpustream-bench-windows-")
        try:
            for spec in specs:
                write_shard(
                    source,
                    spec,
                    output,
                    max_side=None,
                    strict=True,
                    perceptual_hashes=phash,
                    window_hashes=windows,
                )
        finally:
            shutil.rmtree(output, ignore_errors=True)

    runs: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    create(True, True)  # warm: imports, the source's first loads
    for _ in range(repeats):
        for mode, flags in modes.items():
            runs[mode].append(_timed(functools.partial(create, *flags)))
    cpu = {mode: statistics.median(c for _, c in runs[mode]) for mode in modes}
    wall = {mode: statistics.median(w for w, _ in runs[mode]) for mode in modes}
    count = len(source.items)
    base = max(cpu["without_hash"], 1e-9)
    return {
        "bench": "write-phash-windows",
        "data": name,
        "samples": count,
        "repeats": repeats,
        **{f"us_per_sample_{mode}": round(cpu[mode] / count * 1e6, 1) for mode in modes},
        # CPU seconds of this process (the windows' thread included): against shard creation without hashes
        "slowdown_cpu_phash_only": round(cpu["phash_only"] / base - 1, 3),
        "slowdown_cpu_phash_and_windows": round(cpu["phash_and_windows"] / base - 1, 3),
        "slowdown_cpu_windows_alone": round((cpu["phash_and_windows"] - cpu["phash_only"]) / base, 3),
        "slowdown_wall_phash_and_windows": round(
            wall["phash_and_windows"] / max(wall["without_hash"], 1e-9) - 1, 3
        ),
        "goal": 0.10,
    }


def _png_thumbnail_folder(root: str, count: int) -> str:
    """An ImageFolder of ``count`` distinct 32x32 PNGs (synthetic CIFAR images): thumbnails in files."""
    from PIL import Image

    from tpustream.sources.builtin import synthetic_cifar_image

    for i in range(count):
        directory = os.path.join(root, f"class{i % 10}")
        os.makedirs(directory, exist_ok=True)
        Image.fromarray(synthetic_cifar_image(i, i % 10)).save(
            os.path.join(directory, f"{i:06d}.png"), format="PNG", compress_level=1
        )
    return root


def bench_window_cost(*, samples: int, repeats: int) -> Iterator[dict[str, Any]]:
    """What the thumbnails' window hashes add to shard creation: 32x32 PPMs made in memory (CIFAR-size, as
    the cifar10 source) and a folder of 32x32 PNGs (ImageFolder)."""
    from tpustream.sources.image_folder import image_folder_source

    yield _window_cost("cifar-size-ppm", _cifar_array_source(samples), repeats, 2000)
    root = tempfile.mkdtemp(prefix="tpustream-bench-pngs-")
    try:
        source = image_folder_source(_png_thumbnail_folder(root, min(samples, 2000)))
        yield _window_cost("thumbnail-png-32x32", source, repeats, 2000)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def bench_hash_cost(*, samples: int, imagenet_samples: int, repeats: int) -> Iterator[dict[str, Any]]:
    """The perceptual hash's cost in shard creation, hash off vs on: CIFAR size and two ImageNet sizes."""
    from tpustream.sources.image_folder import image_folder_source

    yield _hash_cost("cifar-size-ppm", _cifar_array_source(samples), repeats, 2000)
    if imagenet_samples > 0:
        for width, height in ((500, 375), (224, 224)):
            root = tempfile.mkdtemp(prefix="tpustream-bench-jpegs-")
            try:
                source = image_folder_source(_jpeg_folder(root, imagenet_samples, width, height))
                yield _hash_cost(f"imagenet-size-jpeg-{width}x{height}", source, repeats, 200)
            finally:
                shutil.rmtree(root, ignore_errors=True)


def bench_write(
    *, samples: int, imagenet_samples: int, repeats: int, samples_per_shard: int
) -> Iterator[str]:
    """Yield JSON lines: CIFAR-size and ImageNet-size writes (ours vs stock), then PPM vs PNG, then shard
    creation with the perceptual hash off and on."""
    from tpustream.image.codec import encode_ppm
    from tpustream.sources.builtin import synthetic_cifar_image, synthetic_imagenet_jpeg

    images = [synthetic_cifar_image(i, i % 10) for i in range(samples)]  # every sample distinct
    cifar = [(f"{i:08d}", "ppm", encode_ppm(img), str(i % 10).encode()) for i, img in enumerate(images)]
    for result in _compare_writers("cifar-size-ppm", cifar, repeats, samples_per_shard):
        yield json.dumps(result)
    if imagenet_samples > 0:
        distinct = min(imagenet_samples, 200)
        jpegs = [synthetic_imagenet_jpeg(i, i % 10) for i in range(distinct)]
        imagenet = [
            (f"{i:08d}", "jpg", jpegs[i % distinct], str(i % 10).encode()) for i in range(imagenet_samples)
        ]
        for result in _compare_writers(
            "imagenet-size-jpeg", imagenet, repeats, max(1, samples_per_shard // 10)
        ):
            yield json.dumps(result)
    for result in _encoding_choice(images[:1000], repeats):
        yield json.dumps(result)
    for result in bench_hash_cost(samples=samples, imagenet_samples=imagenet_samples, repeats=repeats):
        yield json.dumps(result)
    for result in bench_window_cost(samples=samples, repeats=repeats):
        yield json.dumps(result)
