"""``tpustream bench datacheck``: how well and how fast near-duplicates are found.

The hash's cost per image (``bench_hash_cost``: against the decodes shard writing does anyway), then two
measurements:

- **planted copies** (``planted_copy_roc``): real images, the bundled digits (1,797, upscaled from 8x8 to 32x32
  PNGs as a user's folder would hold them) and scikit-image's photos (tiles of 224x224, stored as JPEG q90),
  each with planted copies made the way users make them: JPEG re-save at quality 60-90, resize to 80-120%,
  a 1-4 px shift, brightness +-10%, PNG<->JPEG. All hashed by the shard-writing path
  (``perceptual_hash_bytes``). Per distance d = 0..16: recall of the planted copies (copy within d of its
  original) and the false-pair rate (pairs of distinct originals within d).
- **scale** (``bench_scale``): 1,000,000 train x 100,000 test random hashes with planted near copies, the
  multi-index search against brute force on a subsample of the test hashes (the brute-force time for all is
  extrapolated from it, and said so in the line), wall time and peak traced memory of each.
"""

from __future__ import annotations

import io
import json
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypeVar

import numpy as np

__all__ = [
    "COPY_KINDS",
    "RocPoint",
    "PlantedRoc",
    "planted_copy_roc",
    "bench_scale",
    "bench_hash_cost",
    "bench_datacheck",
]

CopyKind = Literal["jpeg-resave", "resize", "shift", "brightness", "format-swap"]
COPY_KINDS: tuple[CopyKind, ...] = ("jpeg-resave", "resize", "shift", "brightness", "format-swap")
_PHOTOS = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "camera",
    "moon",
    "brick",
    "coins",
    "grass",
    "gravel",
    "page",
    "text",
    "clock",
    "colorwheel",
)
_TILE = 224
_DIGIT_SIDE = 32
_T = TypeVar("_T")


@dataclass(frozen=True)
class RocPoint:
    """Recall of planted copies and false-pair rate among distinct originals at one distance."""

    max_distance: int
    recall: float
    false_pair_rate: float
    copies_found: int
    false_pairs: int
    recall_by_kind: dict[str, float]


@dataclass(frozen=True)
class PlantedRoc:
    """The ROC of one image set: ``points[d]`` for d = 0..16 by pHash alone; ``shift_aware_points[d]`` by
    pHash within d or window hashes within ``window_distance`` (thumbnails: the data check's match);
    ``window_points[d]`` by the window hashes alone within d."""

    data: Literal["digits", "photos"]
    originals: int
    copies: int
    distinct_pairs: int
    points: tuple[RocPoint, ...]
    window_distance: int
    thumbnails: int  # originals with window hashes
    shift_aware_points: tuple[RocPoint, ...]
    window_points: tuple[RocPoint, ...]

    def best_distance(
        self, min_recall: float = 0.95, max_false_pair_rate: float = 0.001, shift_aware: bool = False
    ) -> int | None:
        """The smallest pHash distance meeting both targets (by pHash alone, or with the windows), or None."""
        for point in self.shift_aware_points if shift_aware else self.points:
            if point.recall >= min_recall and point.false_pair_rate <= max_false_pair_rate:
                return point.max_distance
        return None


def _encode(pixels: np.ndarray, fmt: Literal["png", "jpg"], quality: int = 90) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    if fmt == "png":
        Image.fromarray(pixels).save(out, format="PNG", compress_level=1)
    else:
        Image.fromarray(pixels).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def _decode(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB") if img.mode not in ("L", "RGB") else img)


def _shifted(pixels: np.ndarray, dx: int, dy: int) -> np.ndarray:
    """Content moved by (dx, dy) px, the edge row/column repeated into the gap (a re-cropped copy)."""
    height, width = pixels.shape[:2]
    rows = np.clip(np.arange(height) - dy, 0, height - 1)
    cols = np.clip(np.arange(width) - dx, 0, width - 1)
    return pixels[rows][:, cols]


def _copy(original: bytes, fmt: Literal["png", "jpg"], kind: CopyKind, rng: np.random.Generator) -> bytes:
    """A planted copy of ``original`` (stored as ``fmt``) made by one user-like edit."""
    from PIL import Image

    pixels = _decode(original)
    if kind == "jpeg-resave":
        return _encode(pixels, "jpg", int(rng.integers(60, 91)))
    if kind == "format-swap":
        return _encode(pixels, "jpg" if fmt == "png" else "png")
    if kind == "resize":
        height, width = pixels.shape[:2]
        scale = float(rng.uniform(0.8, 1.2))
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        resized = Image.fromarray(pixels).resize(size, Image.Resampling.BICUBIC)
        return _encode(np.asarray(resized), fmt)
    if kind == "shift":
        step = [int(v) * int(rng.choice((-1, 1))) for v in rng.integers(1, 5, 2)]
        return _encode(_shifted(pixels, step[0], step[1]), fmt)
    factor = float(rng.uniform(0.9, 1.1))  # brightness
    return _encode(np.clip(pixels.astype(np.float32) * factor, 0, 255).astype(np.uint8), fmt)


def _digit_originals() -> tuple[list[bytes], Literal["png", "jpg"]]:
    from PIL import Image
    from sklearn.datasets import load_digits

    grey = np.clip(load_digits().images * 16, 0, 255).astype(np.uint8)
    side = (_DIGIT_SIDE, _DIGIT_SIDE)
    upscaled = [np.asarray(Image.fromarray(g).resize(side, Image.Resampling.BILINEAR)) for g in grey]
    return [_encode(pixels, "png") for pixels in upscaled], "png"


def _photo_originals() -> tuple[list[bytes], Literal["png", "jpg"]]:
    """Every non-overlapping 224x224 tile of each photo, plus the whole photo resized to 224x224."""
    import skimage.data
    from PIL import Image

    originals: list[bytes] = []
    for name in _PHOTOS:
        photo = getattr(skimage.data, name)()
        if photo.ndim == 2:
            photo = np.repeat(photo[:, :, None], 3, axis=2)
        photo = np.ascontiguousarray(photo[:, :, :3].astype(np.uint8))
        height, width = photo.shape[:2]
        tiles = [
            photo[top : top + _TILE, left : left + _TILE]
            for top in range(0, height - _TILE + 1, _TILE)
            for left in range(0, width - _TILE + 1, _TILE)
        ]
        whole = np.asarray(Image.fromarray(photo).resize((_TILE, _TILE), Image.Resampling.LANCZOS))
        originals.extend(_encode(np.ascontiguousarray(p), "jpg") for p in [*tiles, whole])
    return originals, "jpg"


def _roc_point(
    d: int, copies_found: dict[CopyKind, np.ndarray], false_pairs: np.ndarray, distinct_pairs: int
) -> RocPoint:
    """A point from per-copy found flags (by kind) and per-distinct-pair false flags."""
    all_found = np.concatenate(list(copies_found.values()))
    found, false = int(all_found.sum()), int(false_pairs.sum())
    return RocPoint(
        max_distance=d,
        recall=round(found / len(all_found), 4),
        false_pair_rate=round(false / distinct_pairs, 6),
        copies_found=found,
        false_pairs=false,
        recall_by_kind={k: round(float(v.mean()), 4) for k, v in copies_found.items()},
    )


def _windows(data: bytes) -> np.ndarray | None:
    """The 18 window hashes of a thumbnail's bytes (base then query windows), None for larger images."""
    from PIL import Image

    from tpustream.image.phash_windows import is_thumbnail, window_hashes_bytes

    with Image.open(io.BytesIO(data)) as img:
        width, height = img.size
    return window_hashes_bytes(data) if is_thumbnail(width, height) else None


def planted_copy_roc(
    data: Literal["digits", "photos"],
    copied: int = 300,
    seed: int = 0,
    max_distance: int = 16,
    window_distance: int | None = None,
) -> PlantedRoc:
    """Plant one copy of each kind for ``copied`` originals (all of them when fewer) and measure, per distance
    0..``max_distance``, the recall of copies and the false-pair rate among all pairs of distinct originals:
    by pHash alone (``points``), and by pHash or, between thumbnails, window hashes within
    ``window_distance`` (``DEFAULT_WINDOW_DISTANCE`` unless given; ``shift_aware_points``, the data check's
    match); and the windows alone per window distance (``window_points``)."""
    from tpustream.dataset.near_duplicates import (
        DEFAULT_WINDOW_DISTANCE,
        near_pairs_brute_force,
        near_window_pairs_brute_force,
        popcount,
    )
    from tpustream.image.phash import perceptual_hash_bytes
    from tpustream.image.phash_windows import WINDOWS

    window_distance = DEFAULT_WINDOW_DISTANCE if window_distance is None else window_distance
    originals, fmt = _digit_originals() if data == "digits" else _photo_originals()
    rng = np.random.default_rng(seed)
    chosen = rng.permutation(len(originals))[: min(copied, len(originals))]
    hashes = np.array([perceptual_hash_bytes(o) for o in originals], dtype=np.uint64)
    windows = [_windows(o) for o in originals]
    copy_distance: dict[CopyKind, np.ndarray] = {}
    window_distances: dict[CopyKind, np.ndarray] = {}  # 65: no windows (not both thumbnails)
    for kind in COPY_KINDS:
        copies = [_copy(originals[i], fmt, kind, rng) for i in chosen]
        hashed = np.array([perceptual_hash_bytes(c) for c in copies], dtype=np.uint64)
        copy_distance[kind] = popcount(hashed ^ hashes[chosen])
        least = []
        for copy, i in zip(copies, chosen, strict=True):
            mine, theirs = _windows(copy), windows[i]
            pair = (
                None
                if mine is None or theirs is None
                else popcount(mine[WINDOWS:, None] ^ theirs[None, :WINDOWS])
            )
            least.append(65 if pair is None else int(pair.min()))
        window_distances[kind] = np.array(least)
    count = len(originals)
    pairs = near_pairs_brute_force(hashes, hashes, max_distance)
    upper = pairs.query < pairs.base
    distinct = pairs.distance[upper]
    distinct_pairs = count * (count - 1) // 2
    # the least window distance of each pair of distinct thumbnails, either one the query (65: none)
    window_pair = np.full((count, count), 65, dtype=np.int64)
    thumbs = np.array([i for i, w in enumerate(windows) if w is not None], dtype=np.int64)
    if len(thumbs):
        stacked = np.stack([w for w in windows if w is not None])
        found = near_window_pairs_brute_force(stacked[:, WINDOWS:], stacked[:, :WINDOWS], max_distance)
        window_pair[thumbs[found.query], thumbs[found.base]] = found.distance
        window_pair = np.minimum(window_pair, window_pair.T)
    rows, cols = np.triu_indices(count, 1)
    window_distinct = window_pair[rows, cols]
    phash_distinct = np.full(len(rows), 65, dtype=np.int64)
    # the pHash distance of each distinct pair in triu order (pairs beyond max_distance stay 65)
    flat = pairs.query[upper] * count + pairs.base[upper]
    triu_flat = rows * count + cols
    phash_distinct[np.searchsorted(triu_flat, flat)] = distinct
    within_window = window_distinct <= window_distance
    points, shift_aware, window_points = [], [], []
    for d in range(max_distance + 1):
        points.append(
            _roc_point(d, {k: v <= d for k, v in copy_distance.items()}, phash_distinct <= d, distinct_pairs)
        )
        either = {k: (v <= d) | (window_distances[k] <= window_distance) for k, v in copy_distance.items()}
        shift_aware.append(_roc_point(d, either, (phash_distinct <= d) | within_window, distinct_pairs))
        window_points.append(
            _roc_point(
                d, {k: v <= d for k, v in window_distances.items()}, window_distinct <= d, distinct_pairs
            )
        )
    return PlantedRoc(
        data=data,
        originals=count,
        copies=len(chosen) * len(COPY_KINDS),
        distinct_pairs=distinct_pairs,
        points=tuple(points),
        window_distance=window_distance,
        thumbnails=len(thumbs),
        shift_aware_points=tuple(shift_aware),
        window_points=tuple(window_points),
    )


def _measured(fn: Callable[[], _T]) -> tuple[_T, float, int]:
    """(result, wall seconds, peak bytes traced by tracemalloc: numpy's buffers included) of one call."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        result = fn()
        return result, time.perf_counter() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _flips(rng: np.random.Generator, count: int, max_distance: int) -> np.ndarray:
    """``count`` uint64 masks of 0..``max_distance`` random set bits each."""
    masks = np.zeros(count, dtype=np.uint64)
    for row, bits in enumerate(rng.integers(0, max_distance + 1, count)):
        for bit in rng.choice(64, int(bits), replace=False):
            masks[row] |= np.uint64(1) << np.uint64(bit)
    return masks


def bench_scale(
    *,
    train: int,
    test: int,
    planted: int,
    max_distance: int,
    brute_force_sample: int,
    train_clusters: bool = True,
    seed: int = 0,
) -> dict[str, object]:
    """The multi-index search of ``test`` hashes against ``train`` hashes, ``planted`` of the test hashes being
    train hashes with 0..``max_distance`` bits flipped, against brute force on ``brute_force_sample`` of the
    test hashes (extrapolated to all of them); then the clusters inside train (``planted`` planted pairs), the
    data check's other search, timed alone (no baseline: brute force over train x train is the same
    extrapolation times train / test)."""
    from tpustream.dataset.near_duplicates import (
        near_clusters,
        near_pairs,
        near_pairs_brute_force,
        plan_search,
    )

    rng = np.random.default_rng(seed)
    train_hashes = rng.integers(0, 2**64 - 1, train, dtype=np.uint64, endpoint=True)
    test_hashes = rng.integers(0, 2**64 - 1, test, dtype=np.uint64, endpoint=True)
    # near copies inside train (train hash i + 1 a copy of train hash i, i even): clusters to count
    inside = rng.choice(np.arange(0, train - 1, 2), size=min(planted, train // 2), replace=False)
    train_hashes[inside + 1] = train_hashes[inside] ^ _flips(rng, len(inside), max_distance)
    planted_at = rng.choice(test, size=min(planted, test), replace=False)
    sources = rng.integers(0, train, len(planted_at))
    test_hashes[planted_at] = train_hashes[sources] ^ _flips(rng, len(planted_at), max_distance)
    pairs, index_s, index_peak = _measured(lambda: near_pairs(test_hashes, train_hashes, max_distance))
    found = set(zip(pairs.query.tolist(), pairs.base.tolist(), strict=True))
    planted_found = sum((int(q), int(b)) in found for q, b in zip(planted_at, sources, strict=True))
    sample = min(brute_force_sample, test)
    brute, brute_s, brute_peak = _measured(
        lambda: near_pairs_brute_force(test_hashes[:sample], train_hashes, max_distance)
    )
    in_sample = pairs.query < sample
    same = np.array_equal(pairs.query[in_sample], brute.query) and np.array_equal(
        pairs.base[in_sample], brute.base
    )
    brute_all_s = brute_s * test / sample
    clusters, clusters_s, clusters_peak = (
        _measured(lambda: near_clusters(train_hashes, max_distance)) if train_clusters else (None, 0.0, 0)
    )
    plan = plan_search(train, test, max_distance)
    return {
        "bench": "datacheck",
        "case": "scale",
        "train_hashes": train,
        "test_hashes": test,
        "max_distance": max_distance,
        "plan": {"substring_bits": list(plan.widths), "radii": list(plan.radii)},
        "pairs_found": len(pairs),
        "planted": len(planted_at),
        "planted_found": planted_found,
        "index_s": round(index_s, 2),
        "index_peak_mib": round(index_peak / 2**20, 1),
        "brute_force_sample": sample,
        "brute_force_sample_s": round(brute_s, 2),
        "brute_force_peak_mib": round(brute_peak / 2**20, 1),
        "brute_force_s_extrapolated": round(brute_all_s, 1),
        "same_pairs_as_brute_force_on_sample": bool(same),
        "ratio_vs_brute_force_extrapolated": round(brute_all_s / max(index_s, 1e-9), 1),
        "train_clusters_planted": len(inside),
        "train_clusters": clusters.count if clusters else None,
        "train_clusters_s": round(clusters_s, 2) if clusters else None,
        "train_clusters_peak_mib": round(clusters_peak / 2**20, 1) if clusters else None,
    }


def _per_call_us(fn: Callable[[], object], seconds: float) -> float:
    """Median microseconds per call over 5 rounds of ``seconds`` / 5 each (the machine is shared)."""
    fn()
    rounds = []
    for _ in range(5):
        calls, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds / 5:
            fn()
            calls += 1
        rounds.append((time.perf_counter() - started) / calls * 1e6)
    return float(np.median(rounds))


def bench_hash_cost(seconds: float = 1.0) -> Iterator[dict[str, object]]:
    """Per-image microseconds of the hash against the decodes shard writing does anyway, at 500x375, 224 and
    32 px (a JPEG q90 of a photo) and a 32 px PPM: the full decode; shard writing's check
    (``prepare_image_bytes``: a 1/8-scale draft decode for a JPEG kept as is); the draft decode the hash uses
    (``HASH_DRAFT_SIZE``, to grey); the hash from bytes (``perceptual_hash_bytes``: that decode and the hash);
    the hash alone of that draft decode (``hash_lows_image``: the cost a writer that hashes its own draft decode
    adds); and the hash of the full decode, ours (imagehash's, ``perceptual_hash``) and ``imagehash.phash``
    (when installed)."""
    import importlib.util

    from PIL import Image

    from tpustream.image.codec import encode_ppm
    from tpustream.sources.builtin import synthetic_cifar_image, synthetic_imagenet_jpeg

    photo = Image.open(io.BytesIO(synthetic_imagenet_jpeg(0, 0))).convert("RGB")
    cases: list[tuple[str, bytes, str]] = []
    for width, height in ((500, 375), (224, 224), (32, 32)):
        cases.append(
            (f"jpeg-{width}x{height}", _encode(np.asarray(photo.resize((width, height))), "jpg"), "jpg")
        )
    cases.append(("ppm-32x32", encode_ppm(synthetic_cifar_image(0, 0)), "ppm"))
    imagehash = importlib.import_module("imagehash") if importlib.util.find_spec("imagehash") else None
    for name, data, ext in cases:
        yield _hash_cost(name, data, ext, seconds, imagehash)


def _hash_cost(name: str, data: bytes, ext: str, seconds: float, imagehash: Any) -> dict[str, object]:
    from PIL import Image

    from tpustream.image.codec import prepare_image_bytes
    from tpustream.image.phash import (
        HASH_DRAFT_SIZE,
        hash_bits,
        hash_lows_image,
        perceptual_hash,
        perceptual_hash_bytes,
    )

    def open_image(draft: bool) -> Image.Image:
        img = Image.open(io.BytesIO(data))
        if draft:
            img.draft("L", HASH_DRAFT_SIZE)  # a no-op for a PPM
        img.load()
        return img

    full, drafted = open_image(False), open_image(True)
    line: dict[str, object] = {
        "bench": "datacheck",
        "case": "hash-cost",
        "image": name,
        "bytes": len(data),
        "full_decode_us": round(_per_call_us(lambda: open_image(False).convert("RGB"), seconds)),
        "shard_check_us": round(_per_call_us(lambda: prepare_image_bytes(data, ext, None, name), seconds)),
        "hash_draft_decode_us": round(_per_call_us(lambda: open_image(True), seconds)),
        "hash_bytes_us": round(_per_call_us(lambda: perceptual_hash_bytes(data), seconds)),
        # what a writer that hashes its own draft decode adds per image
        "hash_of_draft_us": round(_per_call_us(lambda: hash_bits(hash_lows_image(drafted)[None]), seconds)),
        "hash_of_full_decode_us": round(_per_call_us(lambda: perceptual_hash(full), seconds)),
    }
    if imagehash is not None:
        line["imagehash_of_full_decode_us"] = round(_per_call_us(lambda: imagehash.phash(full), seconds))
    return line


def _shift_aware_line(roc: PlantedRoc, max_distance: int) -> dict[str, object]:
    chosen = roc.shift_aware_points[max_distance] if max_distance < len(roc.points) else None
    return {
        "window_distance": roc.window_distance,
        "thumbnails": roc.thumbnails,
        "recall": chosen.recall if chosen else None,
        "false_pair_rate": chosen.false_pair_rate if chosen else None,
        "false_pairs": chosen.false_pairs if chosen else None,
        "recall_by_kind": chosen.recall_by_kind if chosen else None,
        "smallest_d_with_recall_95_false_pair_rate_0.1pct": roc.best_distance(shift_aware=True),
        "roc": [
            {k: v for k, v in asdict(p).items() if k != "recall_by_kind"} for p in roc.shift_aware_points
        ],
        "windows_alone_roc": [
            {k: v for k, v in asdict(p).items() if k != "recall_by_kind"} for p in roc.window_points
        ],
    }


def bench_datacheck(
    *,
    train: int,
    test: int,
    planted: int,
    max_distance: int,
    brute_force_sample: int,
    copied: int,
    train_clusters: bool = True,
    hash_seconds: float = 1.0,
) -> Iterator[str]:
    """Yield JSON lines: the hash's cost per image, the planted-copy ROC of the digits and of the photos, then
    the scale line."""
    for cost in bench_hash_cost(hash_seconds):
        yield json.dumps(cost)
    sets: tuple[Literal["digits", "photos"], ...] = ("digits", "photos")
    for data in sets:
        roc = planted_copy_roc(data, copied=copied)
        chosen = roc.points[max_distance] if max_distance < len(roc.points) else None
        yield json.dumps(
            {
                "bench": "datacheck",
                "case": "planted-copies",
                "data": data,
                "originals": roc.originals,
                "copies": roc.copies,
                "distinct_pairs": roc.distinct_pairs,
                "max_distance": max_distance,
                "recall": chosen.recall if chosen else None,
                "false_pair_rate": chosen.false_pair_rate if chosen else None,
                "smallest_d_with_recall_95_false_pair_rate_0.1pct": roc.best_distance(),
                "roc": [{k: v for k, v in asdict(p).items() if k != "recall_by_kind"} for p in roc.points],
                "recall_by_kind": chosen.recall_by_kind if chosen else None,
                # the data check's match: pHash within max_distance, or (thumbnails) windows within
                # window_distance; the lines above are pHash alone, as before the windows
                "shift_aware": _shift_aware_line(roc, max_distance),
            }
        )
    yield json.dumps(
        bench_scale(
            train=train,
            test=test,
            planted=planted,
            max_distance=max_distance,
            brute_force_sample=brute_force_sample,
            train_clusters=train_clusters,
        )
    )
