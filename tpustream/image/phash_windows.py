"""Window hashes of a thumbnail: the perceptual hash (image.phash) of inner windows at a few offsets, so that a
copy shifted by 1-4 px is found by a pair of windows that hold the same pixels.

pHash does not survive a 1-4 px shift of a 32 px image (3-12% of its side; the planted-copy ROC, bench
datacheck: 4% of shifted copies of the bundled digits found at 8 bits), nor does anything that moves the
whole image back (re-centring by the intensity centroid: 23%; hashes of the copy moved back by each of the
80 shifts: 75% at 4 bits), because a shift pushes a strip of the image out and repeats the edge into the gap.
A window that stays inside both images does not lose anything: the window of a copy shifted by (dx, dy) at
offset (x + dx, y + dy) holds exactly the pixels of the original's window at (x, y).

So each thumbnail (sides ``WINDOW_MIN_SIDE`` to ``WINDOW_MAX_SIDE`` px) has the pHashes of its windows of
``(height - 2 MARGIN) x (width - 2 MARGIN)`` px (24x24 in a 32 px image) at two sets of offsets in its own
pixels: the base windows at ``MARGIN + {-3, 0, 3}`` per axis (what a train image is searched by) and the
query windows at ``MARGIN + {-1, 0, 1}`` (what a val or test image searches with). Their differences cover
every shift of -4..4 px per axis, so some (query, base) window pair of a shifted copy is aligned to the pixel:
9 + 9 hashes per image cover the 81 shifts that 81 query probes against one base hash would. A shard stores
only its split's role (``window_role``: train the base windows, val and test the query windows): the data
check searches val/test's query windows among train's base windows and nothing else, so the other 9 would
double the cost at write time for nothing.

The windows' pHash is the shard path's (Lanczos to 32x32, the 8x8 lowest DCT frequencies against their
median): per axis, the resize and the DCT's 8 rows of each of a role's 3 offsets are one linear map, stacked
into one 24 x side matrix, so all 9 windows of an image are two matrix products, and a shard's thumbnails
of one size are hashed ``_CHUNK`` at a time (``window_hashes_batch``, ``WindowHasher`` in shard writing): two
float32 products over the chunk, one sort over all their windows. A 32x32 PPM's windows are made with its
pHash (``phash.Ppm32Hasher`` with ``ppm32_window_map``): the same float32 grey pixels (one luma pass for both),
the window map's 24 rows stacked under the DCT's 8 in one product along the height for 8 images at a time,
then one along the width. At CIFAR size that cut what the windows add to shard creation (``bench write``'s
``write-phash-windows``, ``slowdown_cpu_windows_alone``) from +84-87% to +41% (sharing the luma pass; two runs
each, the same process pair), then from +38-43% to +21-26% (one product for 8 images' rows instead of one per
image; two runs each, a quiet VM).
One image is a chunk of one (``window_hashes_grey``, ``window_hashes_bytes``): each image's products are
the same calls in both (``np.matmul`` over the stack, one small product per image; a 32x32 PPM's, the same
products of the same shapes for a chunk of 8 whatever the batch), so a batch gives the same hashes bit for
bit on one machine (tests/unit/test_phash_windows.py, on the digits and synthetic CIFAR
images). Another machine's BLAS may sum float32 in another order (~0.1 in coefficients of up to ~10^6),
which moves a bit only where two coefficients sit that close at the median, well inside the 4 bits the data
check matches windows within (dataset.near_duplicates.DEFAULT_WINDOW_DISTANCE); coefficients are rounded to
quarters first, so that an exactly 0 one (a flat or mirror-symmetric window) does not take its sign from
float noise. Float64 cost twice as much at write time; the planted-copy ROC (bench datacheck) is the same
with float32 (37 of the 1,797 digits' 18 hashes moved by a bit or two against float64).
"""

from __future__ import annotations

import functools
import io
from collections.abc import Sequence
from typing import Literal

import numpy as np

from tpustream.image.phash import (
    _DCT,
    PPM32_HEADER,
    PPM32_SIZE,
    _lanczos_weights,
    ppm32_array,
    ppm32_hashes,
    quarter_bits,
)

__all__ = [
    "MARGIN",
    "WINDOWS",
    "WINDOW_MIN_SIDE",
    "WINDOW_MAX_SIDE",
    "BASE_OFFSETS",
    "QUERY_OFFSETS",
    "WindowRole",
    "window_role",
    "is_thumbnail",
    "window_hashes_grey",
    "window_hashes_bytes",
    "window_hashes_batch",
    "ppm32_window_map",
    "window_hex_batch",
    "window_hex",
    "window_hashes_hex",
    "split_window_hex",
    "WindowHasher",
]

# base: the windows a train image is searched by; query: those a val or test image searches with
WindowRole = Literal["base", "query"]

MARGIN = 4  # the largest shift (px, per axis) the windows align
_STEPS: dict[WindowRole, tuple[int, ...]] = {"base": (-3, 0, 3), "query": (-1, 0, 1)}
# (dy, dx) of each window, row-major: what window_hashes_grey returns, the 9 base windows then the 9 query ones
BASE_OFFSETS: tuple[tuple[int, int], ...] = tuple((dy, dx) for dy in _STEPS["base"] for dx in _STEPS["base"])
QUERY_OFFSETS: tuple[tuple[int, int], ...] = tuple(
    (dy, dx) for dy in _STEPS["query"] for dx in _STEPS["query"]
)
WINDOWS = len(BASE_OFFSETS)  # 9 of each
# Thumbnails: the images a few pixels' shift moves by a large part of the hash's 32 px input. From 32 px (the
# data check leaves smaller images exact-only) to 64 px: above that a 4 px shift is at most 2 of the hash's 32
# px and pHash itself finds most shifted copies (94% of 224 px photos' at 8 bits); the windows need the full
# decode, cheap at these sizes.
WINDOW_MIN_SIDE = 32
WINDOW_MAX_SIDE = 64
_DCT_SIDE = 8
_SIDE = 32
# Thumbnails (other than 32x32 PPMs: phash.Ppm32Hasher) per pair of matrix products: their float32 buffers
# stay in the core's cache
_CHUNK = 64
_HEX = 16  # hex digits per hash


def window_role(split: str) -> WindowRole:
    """The windows a split's thumbnails store: train's are searched (base), val's and test's search (query)."""
    return "base" if split == "train" else "query"


def is_thumbnail(width: int, height: int) -> bool:
    """Whether an image of this size gets window hashes."""
    return min(width, height) >= WINDOW_MIN_SIDE and max(width, height) <= WINDOW_MAX_SIDE


def _axis_map_float64(size: int, role: WindowRole) -> np.ndarray:
    """Per offset of ``role`` (``MARGIN + step``): the window of ``size - 2 MARGIN`` samples at it resized to
    32 by Lanczos, then the hash's 8 DCT rows, stacked: one (3 * 8) x ``size`` matrix."""
    window = size - 2 * MARGIN
    rows = _DCT @ _lanczos_weights(window)  # 8 x window
    steps = _STEPS[role]
    maps = np.zeros((len(steps), _DCT_SIDE, size))
    for i, step in enumerate(steps):
        maps[i, :, MARGIN + step : MARGIN + step + window] = rows
    return maps.reshape(len(steps) * _DCT_SIDE, size)


@functools.lru_cache(maxsize=128)
def _axis_map(size: int, role: WindowRole) -> np.ndarray:
    """``_axis_map_float64`` in float32, read-only (shared)."""
    flat = _axis_map_float64(size, role).astype(np.float32)
    flat.setflags(write=False)
    return flat


def _blocks(rows: np.ndarray, role: WindowRole) -> np.ndarray:
    """The windows' 8x8 lows ((N * 9) x 64, window-major per image) from N images' rows already mapped along
    their width (N x height x 24): the map along their height, one small product per image (``np.matmul``
    over the stack: each under the size at which OpenBLAS splits a product over threads, which cost 2-3x
    CPU time on a busy machine for one product over the chunk)."""
    count, height, _ = rows.shape
    lows = np.matmul(_axis_map(height, role), rows)  # N x (3 * 8) x (3 * 8)
    steps = len(_STEPS[role])
    # [image, row offset, DCT row, column offset, DCT column] -> [image, row offset, column offset, 8, 8]
    blocks = lows.reshape(count, steps, _DCT_SIDE, steps, _DCT_SIDE).transpose(0, 1, 3, 2, 4)
    return blocks.reshape(count * steps * steps, _DCT_SIDE * _DCT_SIDE)


def ppm32_window_map(role: WindowRole) -> np.ndarray:
    """The ``role`` windows' map along one axis of a 32x32 image (24 x 32 float32, read-only): what a
    ``phash.Ppm32Hasher`` takes to make a 32x32 PPM's window hashes with its pHash, from the same grey pixels
    (one luma pass for both)."""
    return _axis_map(_SIDE, role)


def _grey_window_lows(grey: np.ndarray, role: WindowRole) -> np.ndarray:
    """The ``role`` windows' 8x8 lows ((N * 9) x 64 float32, window-major per image) of N HxW grey thumbnails of
    one size (an N x H x W float32 array): the map along their width, then along their height, one small
    product per image each."""
    return _blocks(np.matmul(grey, _axis_map(grey.shape[2], role).T), role)


def _grey_lows(grey: np.ndarray, role: WindowRole) -> np.ndarray:
    """(N * 9) x 64 lows of N HxW grey thumbnails of one size (an N x H x W array)."""
    count = len(grey)
    out = np.empty((count * WINDOWS, _DCT_SIDE * _DCT_SIDE), dtype=np.float32)
    for start in range(0, count, _CHUNK):
        chunk = grey[start : start + _CHUNK].astype(np.float32)
        out[start * WINDOWS : (start + len(chunk)) * WINDOWS] = _grey_window_lows(chunk, role)
    return out


def _ppm32_window_hashes(images: Sequence[bytes], role: WindowRole) -> np.ndarray:
    """The ``role`` window hashes (N x 9 uint64) of N 32x32 PPMs (``PPM32_HEADER`` then 3,072 RGB bytes), as
    shard writing's ``phash.Ppm32Hasher`` makes them (``phash.ppm32_hashes``: their grey pixels as their pHash
    takes them, Pillow's luma weights unrounded, float32; then the windows' maps)."""
    _, windows = ppm32_hashes(ppm32_array(images, "window_hashes_batch"), ppm32_window_map(role))
    return windows


def _is_ppm32(data: bytes) -> bool:
    return len(data) == PPM32_SIZE and data.startswith(PPM32_HEADER)


def _check_thumbnail(grey: np.ndarray, name: str) -> None:
    if grey.ndim != 2 or not is_thumbnail(grey.shape[1], grey.shape[0]):
        raise ValueError(
            f"{name}: window hashes take a grey image of {WINDOW_MIN_SIDE} to {WINDOW_MAX_SIDE} px a side, "
            f"got shape {grey.shape}"
        )


def _decode_grey(data: bytes, name: str) -> np.ndarray:
    """An image's bytes decoded in full to grey (Pillow's luma, uint8)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            grey = img if img.mode == "L" else img.convert("L")
            return np.frombuffer(grey.tobytes(), dtype=np.uint8).reshape(grey.height, grey.width)
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ValueError(f"{name}: cannot decode the image to hash its windows ({exc})") from exc


def window_hashes_batch(
    images: Sequence[bytes | np.ndarray], role: WindowRole, names: Sequence[str] | None = None
) -> np.ndarray:
    """The ``role`` window hashes of N thumbnails (an N x 9 uint64 array, ``BASE_OFFSETS`` or ``QUERY_OFFSETS``
    order), all computed together: the 32x32 PPMs among them ``_CHUNK`` at a time from their bytes, the others
    from their grey pixels (an HxW uint8 array, e.g. the decode shard writing's check made) or their bytes
    decoded to grey, grouped by size. What shard writing stores, a shard at a time; equal to
    ``window_hashes_bytes`` / ``window_hashes_grey`` of each.

    Args:
        images: each a 32x32 PPM's bytes, other encoded bytes (any format Pillow reads) or grey pixels.
        role: "base" (train) or "query" (val, test): ``window_role``.
        names: what to call each image in an error (its source item); default "image i".

    Returns:
        N x 9 uint64 hashes, in the order of ``images``.

    Raises:
        ValueError: an image does not decode or is not a thumbnail (the message names it).
    """
    if role not in _STEPS:
        raise ValueError(f"window role {role!r}: 'base' (train) or 'query' (val, test)")
    ppm_rows = [i for i, image in enumerate(images) if isinstance(image, bytes) and _is_ppm32(image)]
    if len(ppm_rows) == len(images):  # a CIFAR-size shard: no gather
        return _ppm32_window_hashes(images, role)  # type: ignore[arg-type]
    by_size: dict[tuple[int, int], list[int]] = {}
    greys: dict[int, np.ndarray] = {}
    ppm = set(ppm_rows)
    for i, image in enumerate(images):
        if i in ppm:
            continue
        name = names[i] if names is not None else f"image {i}"
        grey = _decode_grey(image, name) if isinstance(image, bytes) else np.asarray(image)
        _check_thumbnail(grey, name)
        greys[i] = grey
        by_size.setdefault(grey.shape, []).append(i)
    hashes = np.empty((len(images), WINDOWS), dtype=np.uint64)
    if ppm_rows:
        hashes[ppm_rows] = _ppm32_window_hashes([images[i] for i in ppm_rows], role)  # type: ignore[misc]
    for rows in by_size.values():
        lows = _grey_lows(np.stack([greys[i] for i in rows]), role)
        hashes[rows] = quarter_bits(lows).reshape(len(rows), WINDOWS)
    return hashes


def window_hex_batch(
    images: Sequence[bytes | np.ndarray], role: WindowRole, names: Sequence[str] | None = None
) -> list[str]:
    """``window_hashes_batch`` as the sample index stores each image's: its 9 hashes as 9 x 16 hex digits."""
    return window_hex(window_hashes_batch(images, role, names))


def window_hex(hashes: np.ndarray) -> list[str]:
    """N images' window hashes (N x 9 uint64) as the sample index stores each image's: 9 x 16 hex digits."""
    text = np.asarray(hashes, dtype=np.uint64).astype(">u8").tobytes().hex()
    step = WINDOWS * _HEX
    return [text[i : i + step] for i in range(0, len(text), step)]


def window_hashes_grey(grey: np.ndarray, name: str = "image") -> np.ndarray:
    """The 18 window hashes (uint64: 9 base then 9 query windows, ``BASE_OFFSETS`` then ``QUERY_OFFSETS``) of
    an HxW grey image (uint8 or float) with sides ``WINDOW_MIN_SIDE`` to ``WINDOW_MAX_SIDE``.

    Raises:
        ValueError: the image is not 2-D or its size is outside the thumbnails'.
    """
    _check_thumbnail(grey, name)
    return np.concatenate([window_hashes_batch([grey], role, [name])[0] for role in ("base", "query")])


def window_hashes_bytes(data: bytes, name: str = "image") -> np.ndarray:
    """``window_hashes_grey`` of encoded image bytes (any format Pillow reads), decoded in full to grey
    (Pillow's luma; a 32x32 PPM's luma unrounded and folded into the first product, as shard writing hashes
    it).

    Raises:
        ValueError: ``data`` does not decode (the message names ``name``), or is no thumbnail.
    """
    image: bytes | np.ndarray = data if _is_ppm32(data) else _decode_grey(data, name)
    return np.concatenate([window_hashes_batch([image], role, [name])[0] for role in ("base", "query")])


def window_hashes_hex(data: bytes, role: WindowRole, name: str = "image") -> str:
    """One image's ``role`` windows as the sample index stores them (9 x 16 hex digits): ``window_hex_batch``
    of it alone."""
    return window_hex_batch([data], role, [name])[0]


def split_window_hex(text: str) -> np.ndarray:
    """The 9 window hashes (uint64) of a sample index's ``phash_windows`` value (its split's role).

    Raises:
        ValueError: ``text`` is not 9 x 16 hex digits.
    """
    if len(text) != WINDOWS * _HEX:
        raise ValueError(f"phash_windows: {WINDOWS} x {_HEX} hex digits, got {len(text)} characters")
    return np.frombuffer(bytes.fromhex(text), dtype=">u8").astype(np.uint64)


# Thumbnails whose windows are hashed together on the window hasher's thread
_HASHER_BATCH = 256


class WindowHasher:
    """A shard's thumbnails' window hashes of one role, in the order they are written, made ``_HASHER_BATCH``
    at a time (``window_hex_batch``) on a thread of their own while the writer goes on (numpy's products and
    sort release the GIL; a 32x32 PPM's windows are made in the writer's thread, with its pHash:
    phash.Ppm32Hasher). Close it (``contextlib.closing``) when the shard ends, finished or not."""

    def __init__(self, role: WindowRole) -> None:
        from concurrent.futures import Future, ThreadPoolExecutor

        self.role: WindowRole = role
        self._parts: list[Future[list[str]]] = []
        self._images: list[bytes | np.ndarray] = []
        self._names: list[str] = []
        self._rows: list[int] = []  # the index of each thumbnail among every image added
        self._added = 0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tpustream-phash-windows")

    def add(self, image: bytes | np.ndarray | None, name: str) -> None:
        """The next image written: a thumbnail's bytes (or grey pixels), or None for an image with none."""
        if image is not None:
            self._images.append(image)
            self._names.append(name)
            self._rows.append(self._added)
            if len(self._images) >= _HASHER_BATCH:
                self._submit()
        self._added += 1

    def skip(self) -> None:
        """The next image written has no windows here (``add(None, ...)``)."""
        self._added += 1

    def _submit(self) -> None:
        self._parts.append(self._pool.submit(window_hex_batch, self._images, self.role, self._names))
        self._images, self._names = [], []

    def hex(self) -> list[str | None]:
        """The windows (9 x 16 hex digits) of every image added, None where it had none."""
        if self._images:
            self._submit()
        out: list[str | None] = [None] * self._added
        done = [text for part in self._parts for text in part.result()]
        for row, text in zip(self._rows, done, strict=True):
            out[row] = text
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
