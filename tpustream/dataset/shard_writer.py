"""One shard: load its planned items (ahead, on threads, when they are on GCS), write them into a tar atomically,
then its sample index, then its record; what was skipped and why; the record an earlier run left (resume).

``write_shard`` is what every writer runs, whether ``create_shards`` drives it over a process pool or a pipeline
task over a range of the plan (``dataset.fanout``). A skipped image is recorded with its source item and its
reason (``sources.types.SKIP_REASONS``); ``dataset.finalize`` counts them into the manifest.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import struct
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from tpustream.dataset.manifest import SampleIndexEntry, ShardError, index_path
from tpustream.dataset.plan import ShardSpec
from tpustream.dataset.tar_writer import TarShardWriter
from tpustream.image.codec import (
    DEFAULT_MAX_PIXELS,
    CorruptImage,
    ImageTooLarge,
    UnreadableImage,
    kept_hash_lows,
    kept_thumbnail_grey,
    pixel_budget,
    ppm_header,
)
from tpustream.image.phash import (
    PPM32_HEADER,
    PPM32_SIZE,
    Ppm32Hasher,
    hash_bits,
    hash_hex_batch,
    hash_lows_bytes,
    hash_lows_images,
)
from tpustream.image.phash_windows import (
    WindowHasher,
    is_thumbnail,
    ppm32_window_map,
    window_hex,
    window_role,
)
from tpustream.sources.types import Item, Source
from tpustream.storage import io as storage

if TYPE_CHECKING:
    from PIL import Image as PILImage

__all__ = ["LOAD_WINDOW", "ShardRecord", "skip_reason", "write_shard", "existing_record"]

log = logging.getLogger(__name__)

# Images a writer loads ahead of the one it writes, on threads, when they are objects on GCS: an import file
# lists images in other buckets, one GET (~tens of ms) each, so a writer that fetched one at a time would wait
# on the network nearly all of its time (400 JPEGs with 30 ms per request: 12 samples/s one at a time, 59
# with 8 ahead). Eight leaves two of the 10 connections google-cloud-storage's session keeps per host
# (requests' default pool) to the shard's own upload: with 10 or 16 ahead, urllib3 warned "Connection pool is
# full" and threw connections away (a new TLS handshake each, on real GCS). Items made in memory or read from
# local disk load in the writer's own thread: that is CPU-bound Python, which threads only slow down (3x on
# synthetic-cifar, the GIL handed around). More writers (--workers) is what adds parallelism there.
LOAD_WINDOW = 8


@dataclass
class ShardRecord:
    """What a finished shard holds, stored beside it until the manifest is written."""

    split: str
    index: int
    path: str
    num_samples: int
    num_bytes: int
    sha256: str
    fingerprint: str
    class_counts: dict[str, int]
    skipped: list[str]  # one message per sample not written
    skipped_items: list[str] = field(default_factory=list)  # the source item (ref) of each, in order
    skipped_reasons: list[str] = field(default_factory=list)  # SKIP_REASONS, one per skipped sample
    sample_index: str = ""  # its path, relative to the dataset ("" in records written before it)
    sample_index_sha256: str = ""
    formats: dict[str, int] = field(default_factory=dict)  # image member extension -> samples
    sizes: dict[str, int] = field(default_factory=dict)  # "WxH" -> samples (0x0: header unreadable)

    @classmethod
    def from_json(cls, data: bytes) -> ShardRecord:
        return cls(**json.loads(data))


def skip_reason(exc: CorruptImage) -> str:
    """The manifest's reason (sources.types.SKIP_REASONS) for an image a source could not load."""
    if isinstance(exc, ImageTooLarge):
        return "too-large"
    if isinstance(exc, UnreadableImage):
        return "missing-object"
    return "undecodable"


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (baseline, progressive, lossless...): 0xC0-0xCF but DHT, JPG and DAC
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _image_size(data: bytes, ext: str) -> tuple[int, int]:
    """(width, height) from the image's header alone; (0, 0) when it cannot be read.

    Read by hand rather than with ``PIL.Image.open``, which parses every JPEG marker segment (EXIF included)
    and cost ~15% of an ImageFolder write; the source's loader has already checked that the image decodes.
    """
    try:
        if ext == "ppm":
            width, height, _ = ppm_header(data)
            return width, height
        if ext == "png" and data[:8] == _PNG_SIGNATURE and data[12:16] == b"IHDR":
            width, height = struct.unpack_from(">II", data, 16)
            return width, height
        if ext == "jpg" and data[:2] == b"\xff\xd8":
            return _jpeg_size(data)
    except (ValueError, struct.error):
        pass
    return 0, 0


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """The frame size in a JPEG's SOF segment, found by walking the segment lengths from the start."""
    position = 2  # after SOI
    while position + 9 <= len(data):
        if data[position] != 0xFF:
            break
        marker = data[position + 1]
        if marker == 0xFF:  # a fill byte before the marker
            position += 1
        elif marker in _JPEG_SOF:  # FF Cn, length, precision, height, width
            height, width = struct.unpack_from(">HH", data, position + 5)
            return width, height
        elif marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length (TEM, RSTn, SOI)
            position += 2
        else:
            position += 2 + struct.unpack_from(">H", data, position + 2)[0]
    return 0, 0


class _Loaded(NamedTuple):
    """One source item as it goes into a shard, with what the sample index records about it."""

    data: bytes
    ext: str
    sha256: str
    width: int
    height: int
    # the perceptual hash's 64 low DCT coefficients (phash.hash_lows), or a 32x32 PPM's bytes or a small grey
    # image (a JPEG's draft, a thumbnail), hashed with the shard's others (phash.Ppm32Hasher,
    # phash.hash_lows_images); None: not hashed
    hash_input: np.ndarray | bytes | PILImage.Image | None
    # a thumbnail's grey pixels from the source's check-decode (codec.kept_thumbnail_grey), for its window
    # hashes; None: none kept (its stored bytes are hashed)
    thumbnail_grey: np.ndarray | None = None


def _load(
    source: Source,
    item: Item,
    max_side: int | None,
    hashing: bool,
    kept: list[np.ndarray | PILImage.Image] | None = None,
    greys: list[np.ndarray] | None = None,
) -> _Loaded | CorruptImage:
    """The item's image and what the sample index records about it, or the CorruptImage saying why it
    cannot be written (returned, not raised: whether it is skipped or fatal is the writer's choice).
    ``kept``: the list of the ``kept_hash_lows`` block this thread is in (the writer's own loop), else None
    (a load on the pool's threads enters its own); ``greys``: its ``kept_thumbnail_grey`` list, likewise."""
    grey: list[np.ndarray] = []
    try:
        hash_input: np.ndarray | bytes | PILImage.Image | None = None
        if not hashing:
            data, ext = source.load(item, max_side)
        elif kept is not None:  # one block for the whole shard: ~0.4 us an image less than one per load
            kept.clear()
            if greys is not None:
                greys.clear()
                grey = greys
            data, ext = source.load(item, max_side)
            hash_input = _hash_input(data, ext, kept)
        else:
            with kept_hash_lows() as kept, kept_thumbnail_grey() as grey:
                data, ext = source.load(item, max_side)
            hash_input = _hash_input(data, ext, kept)
    except CorruptImage as exc:
        return exc
    except ValueError as exc:  # bytes the source did not check (a PPM it made) that do not decode
        return CorruptImage(f"{item.ref}: {exc}")
    width, height = _image_size(data, ext)
    thumbnail_grey = grey[-1] if grey and grey[-1].shape == (height, width) else None
    return _Loaded(data, ext, hashlib.sha256(data).hexdigest(), width, height, hash_input, thumbnail_grey)


def _hash_input(
    data: bytes, ext: str, kept: list[np.ndarray | PILImage.Image]
) -> np.ndarray | bytes | PILImage.Image:
    """What the perceptual hash of stored bytes is taken from: a 32x32 PPM as it is (hashed with the shard's
    others, ``phash.Ppm32Hasher``, whoever made it: its hash is ``phash.perceptual_hash_bytes``'), else what
    the source's own check-decode ``kept`` when it kept the bytes, else ``phash.hash_lows_bytes`` of them."""
    if ext == "ppm" and len(data) == PPM32_SIZE and data.startswith(PPM32_HEADER):
        return data
    if kept:
        return kept[-1]
    return hash_lows_bytes(data)


def _loaded_in_order(
    source: Source, spec: ShardSpec, max_side: int | None, hashing: bool, pool: ThreadPoolExecutor | None
) -> Iterator[tuple[str, Item, _Loaded | CorruptImage]]:
    """The shard's items in plan order, loaded on ``pool`` at most LOAD_WINDOW ahead (None: in this thread)."""
    items = ((key, source.items[i]) for key, i in zip(spec.keys, spec.items, strict=True))
    if pool is None:
        if not hashing:
            for key, item in items:
                yield key, item, _load(source, item, max_side, False)
            return
        with kept_hash_lows() as kept, kept_thumbnail_grey() as greys:
            for key, item in items:
                yield key, item, _load(source, item, max_side, True, kept, greys)
        return
    pending: deque[tuple[str, Item, Future[_Loaded | CorruptImage]]] = deque()
    for key, item in items:
        # in a copy of this thread's context: the pixel budget (pixel_budget) is a ContextVar
        pending.append(
            (key, item, pool.submit(contextvars.copy_context().run, _load, source, item, max_side, hashing))
        )
        if len(pending) >= LOAD_WINDOW:
            done_key, done_item, future = pending.popleft()
            yield done_key, done_item, future.result()
    for key, item, future in pending:
        yield key, item, future.result()


def _iter_encoded(
    source: Source,
    spec: ShardSpec,
    max_side: int | None,
    strict: bool,
    hashing: bool,
    skipped: list[tuple[str, str, str]],
) -> Iterator[tuple[str, Item, _Loaded]]:
    """The shard's loaded items in plan order; an image that cannot be loaded is skipped and recorded in
    ``skipped`` as (item ref, message, reason), or stops the shard under ``strict``."""
    remote = bool(spec.items) and storage.is_gcs(source.locate(source.items[spec.items[0]]))
    pool = ThreadPoolExecutor(LOAD_WINDOW, thread_name_prefix="tpustream-load") if remote else None
    try:
        for key, item, loaded in _loaded_in_order(source, spec, max_side, hashing, pool):
            if isinstance(loaded, CorruptImage):
                if strict:
                    raise ShardError(
                        f"{loaded} (--strict: stopping; drop --strict to skip and count bad images)"
                    ) from loaded
                log.warning("skipping %s", loaded)
                skipped.append((str(item.ref), str(loaded), skip_reason(loaded)))
                continue
            yield key, item, loaded
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)  # a stopped shard leaves no load running


def write_shard(
    source: Source,
    spec: ShardSpec,
    output: str,
    *,
    max_side: int | None,
    strict: bool,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    perceptual_hashes: bool = True,
    window_hashes: bool = True,
) -> ShardRecord:
    """Write one planned shard to ``output/spec.path`` atomically and record what it holds. Images whose
    header claims more than ``max_pixels`` are skipped (counted) without being decoded. Each image's
    perceptual hash goes into the sample index (``perceptual_hashes=False``: none, which only ``bench write``
    asks for, to measure what the hash costs; ``window_hashes=False``: the thumbnails' window hashes left out,
    likewise)."""
    final = storage.join(output, spec.path)
    skipped: list[tuple[str, str, str]] = []  # (item ref, message, reason)
    class_counts: Counter[str] = Counter()
    formats: Counter[str] = Counter()
    sizes: Counter[tuple[int, int]] = Counter()
    # SampleIndexEntry's fields but the hash, one tuple a sample: the entries are made once the hashes are known
    rows: list[tuple[str, str, int, int, str, str, str]] = []
    # the hashes: a 32x32 PPM's made with the shard's others (phash.Ppm32Hasher), a JPEG's from its check's
    # grey draft with the shard's others of its size (phash.hash_lows_images), any other image's coefficients
    # as its load gave them; each with its row
    role = window_role(spec.split)
    # thumbnails' window hashes of the split's role (image.phash_windows): a 32x32 PPM's with its pHash, from
    # the same grey pixels (one luma pass); any other thumbnail's on a thread of their own (WindowHasher)
    ppm_windows = ppm32_window_map(role) if window_hashes else None
    ppm_hasher = Ppm32Hasher(ppm_windows) if perceptual_hashes else None
    ppm_rows: list[int] = []  # the rows of the PPMs whose windows ppm_hasher makes, in order
    other_lows: list[tuple[int, np.ndarray]] = []
    # small grey images (a JPEG's draft, a thumbnail's pixels), hashed together at the end
    drafts: list[tuple[int, PILImage.Image | np.ndarray]] = []
    windows = WindowHasher(role) if ppm_hasher is not None and window_hashes else None
    with (
        pixel_budget(max_pixels),
        storage.open_write(final, content_type="application/x-tar") as f,
        TarShardWriter(f) as writer,
        contextlib.closing(windows) if windows is not None else contextlib.nullcontext(),
    ):
        for key, item, loaded in _iter_encoded(source, spec, max_side, strict, perceptual_hashes, skipped):
            writer.write(key, {loaded.ext: loaded.data, "cls": str(item.label).encode("ascii")})
            name = source.classes[item.label]
            class_counts[name] += 1
            formats[loaded.ext] += 1
            sizes[loaded.width, loaded.height] += 1
            rows.append(
                (key, loaded.sha256, loaded.width, loaded.height, loaded.ext, source.locate(item), name)
            )
            if ppm_hasher is None:
                continue
            row = len(rows) - 1
            if isinstance(loaded.hash_input, bytes):  # a 32x32 PPM: ppm_hasher makes its windows too
                ppm_hasher.add(loaded.hash_input)
                if windows is not None:
                    windows.skip()
                    ppm_rows.append(row)
                continue
            if windows is not None:
                if is_thumbnail(loaded.width, loaded.height):
                    grey = loaded.thumbnail_grey
                    windows.add(loaded.data if grey is None else grey, str(item.ref))
                else:
                    windows.skip()
            if isinstance(loaded.hash_input, np.ndarray):
                other_lows.append((row, loaded.hash_input))
            else:
                # a small grey image: a thumbnail's as the grey pixels its windows take (the same pixels, out
                # of Pillow once), hashed with the shard's others
                grey = loaded.thumbnail_grey
                drafts.append((row, loaded.hash_input if grey is None else grey))  # type: ignore[arg-type]
                if len(drafts) == _DRAFT_BATCH:
                    other_lows += _draft_lows(drafts)
                    drafts = []
        stats = writer.finish()
        window_texts: list[str | None] = windows.hex() if windows is not None else [None] * len(rows)
    if ppm_rows and ppm_hasher is not None:
        for row, text in zip(ppm_rows, window_hex(ppm_hasher.window_hashes()), strict=True):
            window_texts[row] = text
    hashes: list[str] | list[None] = [None] * len(rows)
    if ppm_hasher is not None:
        hashes = hash_hex_batch(_merged_hashes(len(rows), ppm_hasher.hashes(), other_lows, drafts))
    entries = [SampleIndexEntry(*row, h, w) for row, h, w in zip(rows, hashes, window_texts, strict=True)]
    # The index before the record: a recorded shard always has its index (resume trusts the record).
    index = "".join(entry.to_json_line() + "\n" for entry in entries).encode()
    storage.write_bytes(
        storage.join(output, index_path(spec.path)), index, content_type="application/x-ndjson"
    )
    record = ShardRecord(
        spec.split,
        spec.index,
        spec.path,
        stats.num_samples,
        stats.num_bytes,
        stats.sha256,
        spec.fingerprint,
        dict(class_counts),
        [message for _, message, _ in skipped],
        [ref for ref, _, _ in skipped],
        [reason for _, _, reason in skipped],
        sample_index=index_path(spec.path),
        sample_index_sha256=hashlib.sha256(index).hexdigest(),
        formats=dict(formats),
        sizes={f"{width}x{height}": count for (width, height), count in sizes.items()},
    )
    storage.write_bytes(storage.join(output, spec.record_path), json.dumps(asdict(record)).encode())
    return record


# Grey drafts a writer holds before it hashes them together: a decoded JPEG keeps its metadata (EXIF, ICC:
# up to tens of KB) while held, so at most this many are
_DRAFT_BATCH = 256


def _draft_lows(drafts: list[tuple[int, PILImage.Image | np.ndarray]]) -> list[tuple[int, np.ndarray]]:
    """(row, coefficients) of each (row, grey draft), the drafts hashed together (phash.hash_lows_images)."""
    lows = hash_lows_images([image for _, image in drafts])
    return [(row, lows[i]) for i, (row, _) in enumerate(drafts)]


def _merged_hashes(
    count: int,
    ppm_hashes: np.ndarray,
    other_lows: list[tuple[int, np.ndarray]],
    drafts: list[tuple[int, PILImage.Image | np.ndarray]],
) -> np.ndarray:
    """The hashes (uint64) of a shard's ``count`` samples in order: its 32x32 PPMs' (in order) in the rows that
    ``other_lows`` and ``drafts`` (row, coefficients or grey draft) leave."""
    if not other_lows and not drafts:  # a CIFAR-size shard
        return ppm_hashes
    hashes = np.empty(count, dtype=np.uint64)
    is_ppm = np.ones(count, dtype=bool)
    known = other_lows + _draft_lows(drafts) if drafts else other_lows
    rows = np.array([row for row, _ in known])
    hashes[rows] = hash_bits(np.stack([lows for _, lows in known]))
    is_ppm[rows] = False
    hashes[is_ppm] = ppm_hashes
    return hashes


def existing_record(spec: ShardSpec, output: str) -> ShardRecord | None:
    """The record of a shard finished by an earlier run, if it matches the plan and the shard is there."""
    try:
        record = ShardRecord.from_json(storage.read_bytes(storage.join(output, spec.record_path)))
    except (storage.NotFound, ValueError, TypeError):
        return None
    if record.fingerprint != spec.fingerprint or not record.sample_index:  # no index: an older writer's
        return None
    try:
        if storage.size(storage.join(output, spec.path)) != record.num_bytes:
            return None
    except storage.NotFound:
        return None
    if not storage.exists(storage.join(output, record.sample_index)):
        return None
    return record
