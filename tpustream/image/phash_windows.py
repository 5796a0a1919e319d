"""Window hashes of a thumbnail: the perceptual hash (image.phash) of inner windows at a few offsets, so that a
copy shifted by 1-4 px is found by a pair of windows that hold the same pixels.

pHash does not survive a 1-4 px shift of a 32 px image (3-12% of its side; the planted-copy ROC, bench
datacheck: 4% of shifted copies of the bundled digits found at 8 bits), nor does anything that moves the
whole image back (re-centring by the intensity centroid: 23%; hashes of the copy moved back by each of the
80 shifts: 75% at 4 bits), because a shift pushes a strip of the image out and repeats the edge into the gap.
A window that stays inside both images does not lose anything: the window of a copy shifted by (dx, dy) at
offset (x + dx, y + dy) holds exactly the pixels of the original's window at (x, y).

So each thumbnail (sides ``WINDOW_MIN_SIDE`` to ``WINDOW_MAX_SIDE`` px) gets the pHashes of its windows of
``(height - 2 MARGIN) x (width - 2 MARGIN)`` px (24x24 in a 32 px image) at two sets of offsets in its own
pixels: the base windows at ``MARGIN + {-3, 0, 3}`` per axis (what a train image is searched by) and the
query windows at ``MARGIN + {-1, 0, 1}`` (what a val or test image searches with). Their differences cover
every shift of -4..4 px per axis, so some (query, base) window pair of a shifted copy is aligned to the pixel:
9 + 9 hashes per image cover the 81 shifts that 81 query probes against one base hash would. The windows'
pHash is the shard path's (Lanczos to 32x32, the 8x8 lowest DCT frequencies against their median), the
resize and the DCT as one linear map per window size and offset.
"""

from __future__ import annotations

import functools
import io

import numpy as np

from tpustream.image.phash import PPM32_HEADER, _lanczos_weights, hash_bits, hash_hex_batch

__all__ = [
    "MARGIN",
    "WINDOWS",
    "WINDOW_MIN_SIDE",
    "WINDOW_MAX_SIDE",
    "BASE_OFFSETS",
    "QUERY_OFFSETS",
    "is_thumbnail",
    "window_hashes_grey",
    "window_hashes_bytes",
    "window_hashes_hex",
    "split_window_hex",
]

MARGIN = 4  # the largest shift (px, per axis) the windows align
_STEPS_BASE = (-3, 0, 3)
_STEPS_QUERY = (-1, 0, 1)
# (dy, dx) of each window, row-major: the 9 base windows, then the 9 query windows
BASE_OFFSETS: tuple[tuple[int, int], ...] = tuple((dy, dx) for dy in _STEPS_BASE for dx in _STEPS_BASE)
QUERY_OFFSETS: tuple[tuple[int, int], ...] = tuple((dy, dx) for dy in _STEPS_QUERY for dx in _STEPS_QUERY)
WINDOWS = len(BASE_OFFSETS)  # 9 of each
# Thumbnails: the images a few pixels' shift moves by a large part of the hash's 32 px input. From 32 px (the
# data check leaves smaller images exact-only) to 64 px: above that a 4 px shift is at most 2 of the hash's 32
# px and pHash itself finds most shifted copies (94% of 224 px photos' at 8 bits); the windows need the full
# decode, cheap at these sizes.
WINDOW_MIN_SIDE = 32
WINDOW_MAX_SIDE = 64
_DCT_SIDE = 8
_SIDE = 32
_OFFSETS_AXIS = tuple(sorted({MARGIN + s for s in (*_STEPS_BASE, *_STEPS_QUERY)}))  # 1, 3, 4, 5, 7


def is_thumbnail(width: int, height: int) -> bool:
    """Whether an image of this size gets window hashes."""
    return min(width, height) >= WINDOW_MIN_SIDE and max(width, height) <= WINDOW_MAX_SIDE


@functools.lru_cache(maxsize=64)
def _axis_maps(size: int) -> np.ndarray:
    """Per offset in ``_OFFSETS_AXIS``: the window of ``size - 2 MARGIN`` samples at it resized to 32 by
    Lanczos, then the hash's 8 DCT rows, as one (5 * 8) x ``size`` matrix (read-only: shared)."""
    from tpustream.image.phash import _DCT

    window = size - 2 * MARGIN
    rows = _DCT @ _lanczos_weights(window)  # 8 x window
    maps = np.zeros((len(_OFFSETS_AXIS), _DCT_SIDE, size))
    for i, offset in enumerate(_OFFSETS_AXIS):
        maps[i, :, offset : offset + window] = rows
    flat = maps.reshape(len(_OFFSETS_AXIS) * _DCT_SIDE, size)
    flat.setflags(write=False)
    return flat


_PICK = tuple(
    (_OFFSETS_AXIS.index(MARGIN + dy), _OFFSETS_AXIS.index(MARGIN + dx))
    for dy, dx in BASE_OFFSETS + QUERY_OFFSETS
)


def window_hashes_grey(grey: np.ndarray) -> np.ndarray:
    """The 18 window hashes (uint64: 9 base then 9 query windows, ``BASE_OFFSETS`` then ``QUERY_OFFSETS``) of
    an HxW grey image (uint8 or float) with sides ``WINDOW_MIN_SIDE`` to ``WINDOW_MAX_SIDE``.

    Raises:
        ValueError: the image is not 2-D or its size is outside the thumbnails'.
    """
    if grey.ndim != 2 or not is_thumbnail(grey.shape[1], grey.shape[0]):
        raise ValueError(
            f"window hashes take a grey image of {WINDOW_MIN_SIDE} to {WINDOW_MAX_SIDE} px a side, "
            f"got shape {grey.shape}"
        )
    height, width = grey.shape
    # every (row offset, column offset) window's 8x8 lows: 40 x 40, offsets in _OFFSETS_AXIS
    lows = _axis_maps(height) @ grey.astype(np.float64) @ _axis_maps(width).T
    blocks = lows.reshape(len(_OFFSETS_AXIS), _DCT_SIDE, len(_OFFSETS_AXIS), _DCT_SIDE)
    picked = np.stack([blocks[i, :, j, :].ravel() for i, j in _PICK])
    return hash_bits(picked)


# Pillow's ITU-R 601 luma weights, unrounded (as phash.hash_lows_ppm32 takes a 32x32 PPM's)
_LUMA = np.array([19595, 38470, 7471], dtype=np.float64) / 65536


def window_hashes_bytes(data: bytes, name: str = "image") -> np.ndarray:
    """``window_hashes_grey`` of encoded image bytes (any format Pillow reads), decoded in full to grey
    (Pillow's luma; a 32x32 PPM's luma as shard writing hashes it, unrounded).

    Raises:
        ValueError: ``data`` does not decode (the message names ``name``), or is no thumbnail.
    """
    from PIL import Image

    if len(data) == len(PPM32_HEADER) + _SIDE * _SIDE * 3 and data.startswith(PPM32_HEADER):
        rgb = np.frombuffer(data, dtype=np.uint8, offset=len(PPM32_HEADER)).reshape(_SIDE, _SIDE, 3)
        return window_hashes_grey(np.rint((rgb @ _LUMA) * 4) / 4)
    try:
        with Image.open(io.BytesIO(data)) as img:
            grey = img if img.mode == "L" else img.convert("L")
            pixels = np.frombuffer(grey.tobytes(), dtype=np.uint8).reshape(grey.height, grey.width)
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ValueError(f"{name}: cannot decode the image to hash its windows ({exc})") from exc
    return window_hashes_grey(pixels)


def window_hashes_hex(data: bytes, name: str = "image") -> str:
    """The window hashes as the sample index stores them: 18 x 16 hex digits, base windows first."""
    return "".join(hash_hex_batch(window_hashes_bytes(data, name)))


def split_window_hex(text: str) -> tuple[np.ndarray, np.ndarray]:
    """(base, query) window hashes (9 uint64 each) of a sample index's ``phash_windows`` value.

    Raises:
        ValueError: ``text`` is not 18 x 16 hex digits.
    """
    if len(text) != 2 * WINDOWS * 16:
        raise ValueError(f"phash_windows: {2 * WINDOWS} x 16 hex digits, got {len(text)} characters")
    values = np.frombuffer(bytes.fromhex(text), dtype=">u8").astype(np.uint64)
    return values[:WINDOWS], values[WINDOWS:]
