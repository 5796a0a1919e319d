"""A 64-bit perceptual hash per image (pHash: the low frequencies of a 32x32 grey DCT against their median), so
that a re-saved, resized, shifted or re-lit copy of an image lands within a few bits of the original.

The algorithm is ``imagehash.phash`` (Hackerfactor's "Looks Like It"), written here on numpy in two forms:

- ``perceptual_hash`` of a PIL image equals ``imagehash.phash`` bit for bit (tests/unit/test_phash.py): grey by
  Pillow's ITU-R 601 luma, Pillow's Lanczos resize to 32x32 (to uint8), the 32x32 DCT's 8x8 lowest
  frequencies against their median.
- the hash shard writing stores (``perceptual_hash_bytes``; ``hash_lows_*`` for its parts) is the same
  algorithm on our own decode, because shard creation may not get more than 10% slower for it: a JPEG is
  decoded by libjpeg straight to grey (its Y plane: no chroma upsampling nor colour conversion), scaled down
  in the DCT domain (``draft``) to the smallest size still at least ``HASH_DRAFT_SIZE`` (1/8 from 192 px up,
  as shard writing's check decodes it anyway); the Lanczos resize to 32x32 and the DCT are then one linear
  map (Pillow's Lanczos weights in float, ``low = (D Rv) X (D Rh)^T``, no uint8 rounding in between) made
  once per image size, and a shard's small drafts go through it together at its end, by size
  (``hash_lows_images``); a shard's 32x32 PPMs (CIFAR-size) are copied into one buffer and hashed 256 at a
  time (``Ppm32Hasher``, ``_Ppm32Quarters``): one float32 luma pass, then per 8 images one product along the
  height (the DCT's 8 rows and, for the thumbnails' window hashes of image.phash_windows, their 24 rows
  stacked: one luma pass for both) and one along the width for each. It equals imagehash on 32x32
  grey images and is within a few bits of it on photos; the planted-copy ROC (bench datacheck) is measured on
  it, and every split's hashes come from it. Batched or alone, an image gets the same bits (tests/unit/
  test_phash.py).

What it costs (``bench write``'s ``write-phash`` lines: shard creation's CPU time with the hash on against off,
in one process, on a busy 2-core VM, three runs): 500x375 JPEGs +1-2% (5-10 us of ~570-615 a sample), 224 px JPEGs
+4-9% (14-28 us of ~285-330; the drafts' arithmetic is ~1 us of it, the rest not broken down). The 10% goal
holds at photo sizes, not at CIFAR size: 32 px PPMs' pHash alone adds +21-24% (``write-phash-windows``'
``slowdown_cpu_phash_only``: ~3.5-4 us of ~16-18), with the thumbnails' window hashes +45-48%
(``slowdown_cpu_phash_and_windows``, two runs on a quiet VM; +62-67% in the same runs before a chunk's
products along the height were one for its 8 images, the pHash's and the windows' rows together: each
image's own products then, 4 calls into OpenBLAS an image, which cost more than their arithmetic). Where a
32 px PPM's pHash goes (a write with parts replaced by zeros, the same process, 7 interleaved runs): ~1.6 us
the writer's per-sample bookkeeping (the PPM's copy into the batch buffer, the check that it is one, its
row, the index line's hash), already the budget of ~1.5 us (10%); ~2.5 us its arithmetic inside a write
(~1.5 us alone: the float32 copy and luma pass ~0.8 us of it), whose tar and sha256 work evicts the caches
between batches. Tried and dropped: the luma folded into the first product (3x its multiply-adds), the
even/odd folding of the DCT (half the multiply-adds, but numpy's strided casting costs 7x what it saves),
np.partition for the median (3-10x numpy's SIMD sort of 64 values), batches of 32, 64 and 128 (+2 to +10
points of shard creation against 256, one run of 9 rounds; earlier 8-1024 within noise), chunks of 16-64 with OpenBLAS held to
one thread (the hasher alone: within 10% of 8; without the hold, past 2.6e5 multiply-adds OpenBLAS splits a
product over threads, which on a busy machine cost 2-3x CPU), hashing the pixels of an array-backed source
after the write instead of the PPMs' bytes during it (the same cost in one run: the bookkeeping moves, the
cold caches stay). Before these (earlier runs), the hash thread, fresh memory per batch (page faults) and
OpenBLAS threading cost 32 px PPMs +27-41%, and hashing each JPEG's draft right after its decode cost 224 px
+14-18%. The thread tried again since (each full batch of 256 hashed on it while the writer fills a second
buffer; 20,000 PPMs, two runs against this code in alternate processes, the VM otherwise idle): pHash and
windows +83-112% of the write's wall time and +127-162% of its CPU, against +21-44% and +22-47% here, as the
writer's Python and the thread's numpy calls hand the GIL back and forth.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL import Image as PILImage

__all__ = [
    "HASH_BITS",
    "HASH_DRAFT_SIZE",
    "PPM32_HEADER",
    "perceptual_hash",
    "perceptual_hash_bytes",
    "hash_grey_pixels",
    "hash_grey_batch",
    "hash_pixels",
    "hash_lows",
    "hash_lows_image",
    "hash_lows_images",
    "hash_input_of_image",
    "DEFERRED_HASH_PIXELS",
    "hash_lows_bytes",
    "hash_lows_ppm32",
    "Ppm32Hasher",
    "ppm32_array",
    "ppm32_hashes",
    "quarter_bits",
    "bits_of_quarters",
    "PPM32_SIZE",
    "hash_bits",
    "hash_hex",
    "hash_hex_batch",
]

HASH_BITS = 64
_HASH_SIDE = 8  # 8x8 low-frequency coefficients: 64 bits
_SIDE = 32  # imagehash's hash_size * highfreq_factor (8 * 4)
# The size a JPEG is drafted to before hashing: libjpeg picks the largest reduction (1/2, 1/4, 1/8) whose
# result is still at least this size. 24, not 32: a 224 px image (ImageNet-size, pre-resized) is then decoded
# at 1/8 (28 px, each 8x8 block's mean: the decode shard writing's check does anyway) rather than at 1/4,
# which cost +24% of its shard creation at 32 (bench write) for 1 point of planted-copy recall at d=8
# (bench datacheck photos: 97.6% against 98.6%); the Lanczos map then enlarges 28 to 32 px, a smooth step.
HASH_DRAFT_SIZE = (24, 24)
# The header of a 32x32 PPM as image.codec.encode_ppm writes it (the cifar10 and synthetic sources): such
# images are hashed a shard at a time (hash_lows_ppm32)
PPM32_HEADER = b"P6\n32 32\n255\n"


def _dct_rows() -> np.ndarray:
    """The first 8 rows of scipy.fftpack's unnormalised DCT-II matrix for 32 points: 2 cos(pi k (2n+1) / 64)."""
    k = np.arange(_HASH_SIDE, dtype=np.float64)[:, None]
    n = np.arange(_SIDE, dtype=np.float64)[None, :]
    return 2.0 * np.cos(np.pi * k * (2 * n + 1) / (2 * _SIDE))


_DCT = _dct_rows()
_DCT_T = np.ascontiguousarray(_DCT.T)


def hash_bits(lows: np.ndarray) -> np.ndarray:
    """The hashes (uint64) of N images from their 8x8 lowest DCT frequencies (an Nx64 float array, row-major):
    bit 63 is coefficient (0, 0), set where a coefficient is above the row's median, as imagehash prints it."""
    if lows.ndim != 2 or lows.shape[1] != _HASH_SIDE * _HASH_SIDE:
        raise ValueError(
            f"hash_bits takes N x {_HASH_SIDE * _HASH_SIDE} coefficients, got shape {lows.shape}"
        )
    # rounded to 1e-6: a coefficient that is exactly 0 (a flat or mirror-symmetric image) comes out as float
    # noise of either sign from any DCT (imagehash's scipy one included), which would make such an image's
    # bits depend on the BLAS; real coefficients of 8-bit pixels are never within 1e-6 of the median
    low = np.round(lows, 6)
    middle = np.sort(low, axis=1)  # np.median of 64 values without its overhead (a SIMD sort): the same
    median = (middle[:, 31] + middle[:, 32]) / 2
    return np.packbits(low > median[:, None], axis=1).view(">u8").ravel().astype(np.uint64)


# Images per matrix product in _dct_lows: their float64 pixels (512 KiB) stay in the core's cache, and
# OpenBLAS keeps such a product on one thread (measured on 2,000 32x32 images: 0.9 us an image in chunks of 64,
# 1.9 us in one product on one thread, 4.5 us when OpenBLAS threads it on a busy 2-core machine)
_DCT_CHUNK = 64


def _dct_lows(pixels: np.ndarray) -> np.ndarray:
    """The 8x8 lowest DCT frequencies (Nx64 float64) of N 32x32 grey images: two matrix products a chunk."""
    count = len(pixels)
    out = np.empty((count, _HASH_SIDE * _HASH_SIDE))
    for start in range(0, count, _DCT_CHUNK):
        chunk = pixels[start : start + _DCT_CHUNK]
        n = len(chunk)
        rows = (chunk.reshape(n * _SIDE, _SIDE).astype(np.float64) @ _DCT_T).reshape(n, _SIDE, _HASH_SIDE)
        columns = rows.transpose(1, 0, 2).reshape(_SIDE, n * _HASH_SIDE)
        low = (_DCT @ columns).reshape(_HASH_SIDE, n, _HASH_SIDE).transpose(1, 0, 2)
        out[start : start + n] = low.reshape(n, _HASH_SIDE * _HASH_SIDE)
    return out


def hash_grey_pixels(pixels: np.ndarray) -> int:
    """The hash of a 32x32 grey image (uint8 or float): bit 63 is coefficient (0, 0), row-major, as imagehash
    prints it (``int(str(imagehash.phash(img)), 16)``)."""
    if pixels.shape != (_SIDE, _SIDE):
        raise ValueError(f"hash_grey_pixels takes a {_SIDE}x{_SIDE} grey image, got shape {pixels.shape}")
    return int(hash_grey_batch(pixels[None])[0])


def hash_grey_batch(pixels: np.ndarray) -> np.ndarray:
    """The hashes (uint64) of N 32x32 grey images (an Nx32x32 array): ``hash_grey_pixels`` of each, computed
    together (two matrix products and one sort for all)."""
    if pixels.ndim != 3 or pixels.shape[1:] != (_SIDE, _SIDE):
        raise ValueError(f"hash_grey_batch takes N {_SIDE}x{_SIDE} grey images, got shape {pixels.shape}")
    return hash_bits(_dct_lows(pixels))


def hash_hex(value: int) -> str:
    """A hash as the sample index stores it (and imagehash prints it): 16 lowercase hex digits."""
    return f"{value:016x}"


def hash_hex_batch(hashes: np.ndarray) -> list[str]:
    """``hash_hex`` of each of N uint64 hashes, in one conversion."""
    text = np.asarray(hashes, dtype=np.uint64).astype(">u8").tobytes().hex()
    return [text[i : i + 16] for i in range(0, len(text), 16)]


def hash_pixels(image: PILImage.Image) -> np.ndarray:
    """The 32x32 grey pixels (uint8) imagehash takes the hash of ``image`` from: Pillow's luma, Lanczos."""
    from PIL import Image

    grey = image.convert("L").resize((_SIDE, _SIDE), Image.Resampling.LANCZOS)
    return np.frombuffer(grey.tobytes(), dtype=np.uint8).reshape(_SIDE, _SIDE)


def perceptual_hash(image: PILImage.Image) -> int:
    """The 64-bit pHash of ``image``: grey (Pillow's ITU-R 601 luma), Lanczos to 32x32, DCT, the 8x8 lowest
    frequencies above their median. Equal to ``imagehash.phash(image)`` read as an integer."""
    return hash_grey_pixels(hash_pixels(image))


def _lanczos_weights(size: int) -> np.ndarray:
    """Pillow's Lanczos resampling of ``size`` samples to 32 as a 32 x ``size`` matrix (Resample.c's
    precompute_coeffs, in float: Pillow then rounds them to 22-bit fixed point); the identity at 32."""
    if size == _SIDE:
        return np.eye(_SIDE)
    scale = size / _SIDE
    filter_scale = max(scale, 1.0)
    support = 3.0 * filter_scale
    weights = np.zeros((_SIDE, size))
    for out in range(_SIDE):
        center = (out + 0.5) * scale
        low = max(0, math.trunc(center - support + 0.5))
        high = min(size, math.trunc(center + support + 0.5))
        x = (np.arange(low, high) - center + 0.5) / filter_scale
        sinc = np.sinc(x) * np.sinc(x / 3)  # np.sinc(x) = sin(pi x) / (pi x): Pillow's sinc_filter
        sinc[(x < -3.0) | (x >= 3.0)] = 0.0
        total = sinc.sum()
        weights[out, low:high] = sinc / total if total != 0.0 else sinc
    return weights


@functools.lru_cache(maxsize=512)
def _resize_dct(size: int) -> np.ndarray:
    """The resize to 32 then the hash's 8 DCT rows, as one 8 x ``size`` matrix (read-only: it is shared)."""
    matrix = _DCT @ _lanczos_weights(size)
    matrix.setflags(write=False)
    return matrix


def hash_lows(grey: np.ndarray) -> np.ndarray:
    """The 64 lowest DCT frequencies (float64, row-major) of an HxW grey image (uint8) resized to 32x32 by
    Lanczos, as one linear map: ``hash_bits`` of them is its hash on the shard-writing path."""
    if grey.ndim != 2 or grey.size == 0:
        raise ValueError(f"hash_lows takes an HxW grey image, got shape {grey.shape}")
    height, width = grey.shape
    return (_resize_dct(height) @ grey.astype(np.float64) @ _resize_dct(width).T).ravel()


def hash_lows_image(image: PILImage.Image) -> np.ndarray:
    """``hash_lows`` of a PIL image made grey by Pillow's ITU-R 601 luma (a JPEG drafted to "L" already is)."""
    grey = image if image.mode == "L" else image.convert("L")
    # tobytes, not np.asarray: the same bytes without the array interface's own ~1 us
    return hash_lows(np.frombuffer(grey.tobytes(), dtype=np.uint8).reshape(grey.height, grey.width))


# The most pixels of a grey draft that shard writing keeps to hash with the shard's others of its size
# (hash_input_of_image): a JPEG drafted to 1/8 up to ~512x512 px, a few KiB each
DEFERRED_HASH_PIXELS = 64 * 64


def hash_input_of_image(image: PILImage.Image) -> PILImage.Image | np.ndarray:
    """What shard writing keeps to hash a decoded image: a small image (at most ``DEFERRED_HASH_PIXELS``: a
    JPEG's grey draft, a thumbnail) as the grey image ``hash_lows_image`` takes (Pillow's luma; itself when it
    is grey already), hashed later with the shard's others (``hash_lows_images``, bit for bit the same:
    numpy's calls once per shard instead of once per image, which after each decode cost ~20 us a 224 px JPEG
    with cold caches, and as much a 32 px PNG's whole hash), else its coefficients now
    (``hash_lows_image``), so that no large image is held."""
    if image.width * image.height <= DEFERRED_HASH_PIXELS:
        return image if image.mode == "L" else image.convert("L")
    return hash_lows_image(image)


def hash_lows_images(images: Sequence[PILImage.Image | np.ndarray]) -> np.ndarray:
    """``hash_lows_image`` (Nx64) of N images, bit for bit, computed together for the images of each size: one
    buffer of their grey pixels, then the same two matrix products per image (numpy runs a stack of them one
    by one). An image may be given as its grey pixels (an HxW uint8 array, ``hash_lows``' input): shard
    writing hands a thumbnail's that way, taken out of Pillow once for its window hashes too (each
    ``tobytes`` of a 32 px image costs ~5 us)."""
    greys: list[PILImage.Image | np.ndarray] = []
    by_size: dict[tuple[int, int], list[int]] = {}
    for i, image in enumerate(images):
        if isinstance(image, np.ndarray):
            if image.ndim != 2 or image.dtype != np.uint8:
                raise ValueError(
                    f"hash_lows_images takes HxW uint8 grey pixels, got {image.dtype} {image.shape}"
                )
            greys.append(image)
            size = (image.shape[1], image.shape[0])
        else:
            greys.append(image if image.mode == "L" else image.convert("L"))
            size = image.size
        by_size.setdefault(size, []).append(i)
    out = np.empty((len(greys), _HASH_SIDE * _HASH_SIDE))
    for (width, height), rows in by_size.items():
        if width * height == 0:
            raise ValueError(f"hash_lows_images takes images with pixels, got one of {width}x{height}")
        joined = b"".join(greys[i].tobytes() for i in rows)
        pixels = np.frombuffer(joined, dtype=np.uint8).reshape(len(rows), height, width).astype(np.float64)
        lows = _resize_dct(height) @ pixels @ _resize_dct(width).T
        out[rows] = lows.reshape(len(rows), _HASH_SIDE * _HASH_SIDE)
    return out


def hash_lows_bytes(data: bytes, name: str = "image") -> np.ndarray:
    """``hash_lows`` of encoded image bytes (JPEG, PNG, PPM or any format Pillow reads): a JPEG is decoded by
    libjpeg to grey, reduced to ``HASH_DRAFT_SIZE`` or more; other formats are decoded in full.

    Raises:
        ValueError: ``data`` is not an image Pillow can decode (the message names ``name``).
    """
    from PIL import Image

    if len(data) == PPM32_SIZE and data.startswith(PPM32_HEADER):
        return hash_lows_ppm32([data])[0]  # as shard writing hashes it
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format == "JPEG":
                img.draft("L", HASH_DRAFT_SIZE)
            return hash_lows_image(img)
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ValueError(f"{name}: cannot decode the image to hash it ({exc})") from exc


def perceptual_hash_bytes(data: bytes, name: str = "image") -> int:
    """The 64-bit pHash of encoded image bytes as shard writing stores it (``hash_lows_bytes``): equal to
    ``perceptual_hash`` of the decoded image at 32x32, within a few bits of it otherwise. Pass the bytes as the
    shards store them (upright: shard creation turns EXIF-rotated images upright).

    Raises:
        ValueError: ``data`` is not an image Pillow can decode (the message names ``name``).
    """
    return int(hash_bits(hash_lows_bytes(data, name)[None])[0])


# Pillow's ITU-R 601 luma weights (convert("L"): (R*19595 + G*38470 + B*7471 + 0x8000) >> 16), here unrounded
_LUMA = np.array([19595, 38470, 7471], dtype=np.float64) / 65536
_LUMA_F32 = _LUMA.astype(np.float32)
_DCT_F32 = _DCT.astype(np.float32)
_PPM32_HEADER = np.frombuffer(PPM32_HEADER, dtype=np.uint8)
PPM32_SIZE = len(PPM32_HEADER) + _SIDE * _SIDE * 3
# PPMs per pair of matrix products: a chunk's first product (the rows' maps times its grey pixels, 32 x 32 x
# (8 x 32) multiply-adds with the windows) stays at the size OpenBLAS keeps on one thread (2.6e5: above it a
# product is split over threads, which on a busy machine cost 2-3x CPU time), and its buffers in the cache
_PPM_CHUNK = 8
# PPMs a Ppm32Hasher holds before it hashes them: its buffers are made once and refilled, so that shard writing
# neither keeps the PPMs' bytes alive nor touches fresh memory (on a CIFAR-size write each new page's fault
# cost ~1 us a sample, as much as the hash's arithmetic)
_PPM_BATCH = 256
# The DCT's rows scaled by 4, transposed: a second product with it gives the coefficients in quarters (a power
# of two scales every product and sum exactly, so this is 4 times the unscaled product, bit for bit)
_DCT4_T_F32 = np.ascontiguousarray((4 * _DCT).T.astype(np.float32))


def _ppm32_pixels(ppms: np.ndarray) -> np.ndarray:
    """The RGB pixels (N x 32 x 32 x 3 uint8) of N 32x32 PPMs (an N x PPM32_SIZE uint8 array), headers
    checked."""
    if (
        ppms.ndim != 2
        or ppms.shape[1] != PPM32_SIZE
        or not (ppms[:, : len(_PPM32_HEADER)] == _PPM32_HEADER).all()
    ):
        raise ValueError(f"hash_lows_ppm32 takes 32x32 PPMs of {PPM32_SIZE} bytes, {PPM32_HEADER!r} first")
    return ppms[:, len(_PPM32_HEADER) :].reshape(len(ppms), _SIDE, _SIDE, 3)


def ppm32_array(images: Sequence[bytes], what: str = "hash_lows_ppm32") -> np.ndarray:
    """N 32x32 PPMs' bytes in one N x PPM32_SIZE uint8 array (their headers are checked where it is hashed).

    Raises:
        ValueError: an item is not ``PPM32_SIZE`` bytes long (the message names ``what``).
    """
    joined = b"".join(images)
    if len(joined) != len(images) * PPM32_SIZE:
        raise ValueError(f"{what} takes 32x32 PPMs of {PPM32_SIZE} bytes, {PPM32_HEADER!r} first")
    return np.frombuffer(joined, dtype=np.uint8).reshape(len(images), PPM32_SIZE)


class _Ppm32Quarters:
    """The coefficients, in quarters (int32), of up to ``_PPM_BATCH`` 32x32 PPMs at a time: the pHash's 8x8
    lows, and with ``window_map`` (a (k x 8) x 32 float32 map of k windows' offsets along one axis, resize
    and DCT rows: image.phash_windows' ``ppm32_window_map``) the k x k windows' 8x8 lows, from one float32
    luma pass, in buffers made once.

    Per chunk of ``_PPM_CHUNK`` PPMs: the grey pixels laid out row-major across the chunk (row, image,
    column), so that the map along the height, the hash's 8 DCT rows and the windows' rows stacked, is one
    product for the whole chunk; then the map along the width, one product for the hash's rows and one for the
    windows' (the pairs of a hash row and a window column are never made). Every chunk is the same three
    products of the same shapes (a last chunk's spare images are the buffer's stale pixels, not read), so an
    image's coefficients do not depend on which batch or where in it it is."""

    def __init__(self, window_map: np.ndarray | None) -> None:
        window_rows = 0 if window_map is None else len(window_map)
        if window_map is not None and (window_map.shape[1] != _SIDE or window_rows % _HASH_SIDE):
            raise ValueError(f"a PPM window map is (k x {_HASH_SIDE}) x {_SIDE}, got {window_map.shape}")
        self.windows = (window_rows // _HASH_SIDE) ** 2
        rows = _HASH_SIDE + window_rows
        self._rows_map = np.ascontiguousarray(
            _DCT_F32 if window_map is None else np.concatenate([_DCT_F32, window_map]), dtype=np.float32
        )
        self._window_t = None if window_map is None else np.ascontiguousarray(4 * window_map.T, np.float32)
        chunks = _PPM_BATCH // _PPM_CHUNK
        # zeros: a last chunk's spare images are whatever the buffer held, always finite
        self._rgb = np.zeros((_SIDE, _PPM_CHUNK, _SIDE, 3), dtype=np.float32)
        self._grey = np.empty((_SIDE, _PPM_CHUNK * _SIDE), dtype=np.float32)
        self._rows = np.empty((rows, _PPM_CHUNK * _SIDE), dtype=np.float32)
        self._low = np.empty((chunks, _HASH_SIDE, _PPM_CHUNK, _HASH_SIDE), dtype=np.float32)
        self._window_low = np.empty((chunks, window_rows, _PPM_CHUNK, window_rows), dtype=np.float32)
        self._quarters = np.empty((_PPM_BATCH, _HASH_SIDE * _HASH_SIDE), dtype=np.int32)
        self._window_quarters = np.empty((_PPM_BATCH * self.windows, _HASH_SIDE**2), dtype=np.int32)

    def __call__(self, ppms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the pHash's lows, N x 64, and the windows', (N x k x k) x 64 window-major per image, both int32
        quarters) of N <= ``_PPM_BATCH`` PPMs (an N x PPM32_SIZE uint8 array): views of buffers the next call
        refills.

        Raises:
            ValueError: an item is not a 32x32 PPM.
        """
        pixels = _ppm32_pixels(ppms)
        count = len(pixels)
        chunks = -(-count // _PPM_CHUNK)
        window_rows = len(self._rows_map) - _HASH_SIDE
        for chunk in range(chunks):
            start = chunk * _PPM_CHUNK
            n = min(_PPM_CHUNK, count - start)
            np.copyto(self._rgb[:, :n], pixels[start : start + n].transpose(1, 0, 2, 3))
            np.matmul(self._rgb.reshape(-1, 3), _LUMA_F32, out=self._grey.reshape(-1))
            np.matmul(self._rows_map, self._grey, out=self._rows)
            np.matmul(
                self._rows[:_HASH_SIDE].reshape(_HASH_SIDE * _PPM_CHUNK, _SIDE),
                _DCT4_T_F32,
                out=self._low[chunk].reshape(_HASH_SIDE * _PPM_CHUNK, _HASH_SIDE),
            )
            if self._window_t is not None:
                np.matmul(
                    self._rows[_HASH_SIDE:].reshape(window_rows * _PPM_CHUNK, _SIDE),
                    self._window_t,
                    out=self._window_low[chunk].reshape(window_rows * _PPM_CHUNK, window_rows),
                )
        padded = chunks * _PPM_CHUNK
        # [chunk, row, image, column] -> [chunk, image, row, column]
        low = self._low[:chunks].transpose(0, 2, 1, 3)
        np.rint(low, out=self._quarters[:padded].reshape(low.shape), casting="unsafe")
        steps = window_rows // _HASH_SIDE
        # [chunk, row offset, row, image, column offset, column] -> [chunk, image, row offset, column offset,
        # row, column]
        shape = (chunks, steps, _HASH_SIDE, _PPM_CHUNK, steps, _HASH_SIDE)
        window_low = self._window_low[:chunks].reshape(shape).transpose(0, 3, 1, 4, 2, 5)
        window_quarters = self._window_quarters[: padded * self.windows]
        np.rint(window_low, out=window_quarters.reshape(window_low.shape), casting="unsafe")
        return self._quarters[:count], window_quarters[: count * self.windows]


def ppm32_hashes(ppms: np.ndarray, window_map: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(pHashes, N uint64; window hashes, N x k uint64, k 0 without ``window_map``) of N 32x32 PPMs (an N x
    PPM32_SIZE uint8 array), ``_PPM_BATCH`` at a time."""
    quarters = _Ppm32Quarters(window_map)
    hashes, windows = [], []
    for start in range(0, len(ppms), _PPM_BATCH):
        low, window_low = quarters(ppms[start : start + _PPM_BATCH])
        hashes.append(bits_of_quarters(low))
        windows.append(bits_of_quarters(window_low).reshape(len(low), quarters.windows))
    if not hashes:
        return np.empty(0, dtype=np.uint64), np.empty((0, quarters.windows), dtype=np.uint64)
    return np.concatenate(hashes), np.concatenate(windows)


def hash_lows_ppm32(images: Sequence[bytes]) -> np.ndarray:
    """``hash_lows`` (Nx64) of N 32x32 PPMs, each ``PPM32_HEADER`` then its 3,072 RGB bytes, as shard writing
    computes them (``_Ppm32Quarters``: one float32 luma pass, then the DCT's rows and columns as float32 matrix
    products ``_PPM_CHUNK`` images at a time), rounded to quarters.

    An image's coefficients do not depend on its neighbours (every chunk's products have the same shapes; a
    product past ~2.6e5 multiply-adds would be split over threads by OpenBLAS, which on a busy machine cost up
    to 100x). The luma is Pillow's weights unrounded (within half a grey level of Pillow's): a hash here is
    within a bit or two of ``perceptual_hash`` of the same pixels as a PNG (measured on 300 synthetic CIFAR
    images: 79% equal, none more than 4 bits apart). Rounded to quarters because float32 sums of up to ~10^6
    differ by up to ~0.06 with the BLAS kernel: an exactly 0 coefficient (a flat image) must not take its
    sign from the machine.

    Raises:
        ValueError: an item is not such a PPM.
    """
    ppms = ppm32_array(images)
    quarters = _Ppm32Quarters(None)
    out = np.empty((len(ppms), _HASH_SIDE * _HASH_SIDE))
    for start in range(0, len(ppms), _PPM_BATCH):
        low, _ = quarters(ppms[start : start + _PPM_BATCH])
        out[start : start + len(low)] = low
    return out / 4


class Ppm32Hasher:
    """The hashes of a stream of 32x32 PPMs (a CIFAR-size shard's), ``hash_bits(hash_lows_ppm32(ppms))`` bit for
    bit: each PPM's bytes are copied into a buffer made once, hashed ``_PPM_BATCH`` at a time, and only the
    hashes are kept. With ``window_map`` (image.phash_windows' ``ppm32_window_map`` of a role), each PPM's
    window hashes too, from the same grey pixels (``window_hashes``)."""

    def __init__(self, window_map: np.ndarray | None = None) -> None:
        self._bytes = bytearray(_PPM_BATCH * PPM32_SIZE)
        self._buffer = np.frombuffer(self._bytes, dtype=np.uint8).reshape(_PPM_BATCH, PPM32_SIZE)
        self._quarters = _Ppm32Quarters(window_map)
        self._count = 0  # PPMs in the buffer
        self._hashes: list[np.ndarray] = []
        self._window_hashes: list[np.ndarray] = []

    def add(self, data: bytes) -> None:
        """Take one PPM (``PPM32_SIZE`` bytes; its header is checked when its batch is hashed).

        Raises:
            ValueError: ``data`` is not ``PPM32_SIZE`` bytes long.
        """
        if len(data) != PPM32_SIZE:
            raise ValueError(f"Ppm32Hasher takes 32x32 PPMs of {PPM32_SIZE} bytes, got {len(data)} bytes")
        offset = self._count * PPM32_SIZE
        self._bytes[offset : offset + PPM32_SIZE] = data
        self._count += 1
        if self._count == _PPM_BATCH:
            self._flush()

    def hashes(self) -> np.ndarray:
        """The hashes (uint64) of every PPM taken, in order.

        Raises:
            ValueError: a PPM's header is not ``PPM32_HEADER``.
        """
        self._flush()
        return np.concatenate(self._hashes) if self._hashes else np.empty(0, dtype=np.uint64)

    def window_hashes(self) -> np.ndarray:
        """The window hashes (N x k uint64) of every PPM taken, in order (k: the window map's; N x 0
        without one).

        Raises:
            ValueError: a PPM's header is not ``PPM32_HEADER``.
        """
        self._flush()
        if not self._window_hashes:
            return np.empty((0, self._quarters.windows), dtype=np.uint64)
        return np.concatenate(self._window_hashes)

    def _flush(self) -> None:
        if self._count:
            n = self._count
            low, window_low = self._quarters(self._buffer[:n])
            self._hashes.append(bits_of_quarters(low))
            if self._quarters.windows:
                self._window_hashes.append(bits_of_quarters(window_low).reshape(n, self._quarters.windows))
            self._count = 0


def bits_of_quarters(quarters: np.ndarray) -> np.ndarray:
    """The hashes (uint64) of N rows of 64 coefficients in quarters (int32, N x 64): bit 63 is the first, set
    where a coefficient is above the row's median. The median of 64 is the mean of the two middle ones, so a
    quarter count q is above it where 2q exceeds their sum s, that is where q > floor(s / 2) (integers); a
    32x32 image's coefficients are at most 4 x 255 x 1,024 ~ 1.04e6, ~4.2e6 quarters: int32 is exact, and its
    sort ~2/3 of float32's (0.41 against 0.61 us for 9 windows' rows)."""
    middle = np.sort(quarters, axis=1)
    half = (middle[:, 31] + middle[:, 32]) >> 1
    return np.packbits(quarters > half[:, None], axis=1).view(">u8").ravel().astype(np.uint64)


def quarter_bits(lows: np.ndarray) -> np.ndarray:
    """``hash_bits`` of float32 lows (N x 64) rounded to quarters first (float32 sums of up to ~10^6 differ by
    up to ~0.06 with the BLAS's order and the chunk's shape, so an exactly 0 coefficient, of a flat or
    mirror-symmetric image, must not take its sign from them): ``bits_of_quarters``."""
    return bits_of_quarters(np.rint(lows * np.float32(4)).astype(np.int32))
