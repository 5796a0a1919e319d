"""A 64-bit perceptual hash per image (pHash: the low frequencies of a 32x32 grey DCT against their median), so
that a re-saved, resized, shifted or re-lit copy of an image lands within a few bits of the original.

The algorithm is ``imagehash.phash`` (Hackerfactor's "Looks Like It"), written here on numpy so that shard
writing needs no extra package and can hash what it decodes anyway: ``perceptual_hash`` of a PIL image equals
``imagehash.phash`` bit for bit (tests/unit/test_phash.py). ``perceptual_hash_bytes`` hashes encoded bytes and
is the hash shard writing stores: a JPEG is decoded scaled down in the DCT domain by libjpeg (``draft``, at
most 1/8) to the smallest size still at least 32 px a side, which moves a hash by a few bits at most and is
the decode shard writing's check already does for a kept JPEG (there at 1/8 whatever the size): a writer that
opens the JPEG with ``img.draft("RGB", HASH_DRAFT_SIZE)`` and passes the loaded image to ``perceptual_hash``
gets the same hash as ``perceptual_hash_bytes``, for the cost of the hash alone. The planted-copy ROC
(tpustream/dataset/near_duplicates.py) is measured on this path.

Shard writing does exactly that (``image.codec.kept_hash_pixels``), in two halves: per image the 32x32 grey
pixels the hash takes (``hash_pixels``: Pillow's convert and resize), per shard the DCTs and medians of all of
them at once (``hash_grey_batch``), which costs ~1 us an image instead of ~8 us one by one: a CIFAR-size write
spends only tens of microseconds a sample in all, and the hash must stay within 10% of it.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL import Image as PILImage

__all__ = [
    "HASH_BITS",
    "HASH_DRAFT_SIZE",
    "perceptual_hash",
    "perceptual_hash_bytes",
    "hash_grey_pixels",
    "hash_grey_batch",
    "hash_pixels",
    "hash_pixels_bytes",
    "hash_pixels_batch",
    "hash_hex",
]

HASH_BITS = 64
_HASH_SIDE = 8  # 8x8 low-frequency coefficients: 64 bits
_SIDE = 32  # imagehash's hash_size * highfreq_factor (8 * 4)
# The size a JPEG is drafted to before hashing: libjpeg picks the largest reduction (1/2, 1/4, 1/8) whose
# result is still at least this size, so the hash's 32x32 Lanczos step always reduces, never enlarges.
HASH_DRAFT_SIZE = (_SIDE, _SIDE)


def _dct_rows() -> np.ndarray:
    """The first 8 rows of scipy.fftpack's unnormalised DCT-II matrix for 32 points: 2 cos(pi k (2n+1) / 64)."""
    k = np.arange(_HASH_SIDE, dtype=np.float64)[:, None]
    n = np.arange(_SIDE, dtype=np.float64)[None, :]
    return 2.0 * np.cos(np.pi * k * (2 * n + 1) / (2 * _SIDE))


_DCT = _dct_rows()
_DCT_T = np.ascontiguousarray(_DCT.T)


def hash_grey_pixels(pixels: np.ndarray) -> int:
    """The hash of a 32x32 grey image (uint8 or float): bit 63 is coefficient (0, 0), row-major, as imagehash
    prints it (``int(str(imagehash.phash(img)), 16)``)."""
    if pixels.shape != (_SIDE, _SIDE):
        raise ValueError(f"hash_grey_pixels takes a {_SIDE}x{_SIDE} grey image, got shape {pixels.shape}")
    return int(hash_grey_batch(pixels[None])[0])


def hash_grey_batch(pixels: np.ndarray) -> np.ndarray:
    """The hashes (uint64) of N 32x32 grey images (an Nx32x32 array): ``hash_grey_pixels`` of each, computed
    together (one matrix product and one partition for all)."""
    if pixels.ndim != 3 or pixels.shape[1:] != (_SIDE, _SIDE):
        raise ValueError(f"hash_grey_batch takes N {_SIDE}x{_SIDE} grey images, got shape {pixels.shape}")
    count = len(pixels)
    # rounded to 1e-6: a coefficient that is exactly 0 (a flat or mirror-symmetric image) comes out as float
    # noise of either sign from any DCT (imagehash's scipy one included), which would make such an image's
    # bits depend on the BLAS; real coefficients of 8-bit pixels are never within 1e-6 of the median
    low = np.round(_DCT @ pixels.astype(np.float64) @ _DCT_T, 6).reshape(count, _HASH_SIDE * _HASH_SIDE)
    middle = np.partition(low, (31, 32), axis=1)  # np.median of 64 values, without its overhead: the same
    median = (middle[:, 31] + middle[:, 32]) / 2
    return np.packbits(low > median[:, None], axis=1).view(">u8").ravel().astype(np.uint64)


def hash_hex(value: int) -> str:
    """A hash as the sample index stores it (and imagehash prints it): 16 lowercase hex digits."""
    return f"{value:016x}"


def hash_pixels(image: PILImage.Image) -> np.ndarray:
    """The 32x32 grey pixels (uint8) the hash of ``image`` is taken from: Pillow's ITU-R 601 luma, Lanczos."""
    from PIL import Image

    grey = image.convert("L").resize((_SIDE, _SIDE), Image.Resampling.LANCZOS)
    return np.frombuffer(grey.tobytes(), dtype=np.uint8).reshape(_SIDE, _SIDE)


def perceptual_hash(image: PILImage.Image) -> int:
    """The 64-bit pHash of ``image``: grey (Pillow's ITU-R 601 luma), Lanczos to 32x32, DCT, the 8x8 lowest
    frequencies above their median. Equal to ``imagehash.phash(image)`` read as an integer."""
    return hash_grey_pixels(hash_pixels(image))


def perceptual_hash_bytes(data: bytes, name: str = "image") -> int:
    """The 64-bit pHash of encoded image bytes (JPEG, PNG, PPM or any format Pillow reads). A JPEG is decoded
    reduced by libjpeg to ``HASH_DRAFT_SIZE`` or more (its hash is within a few bits of ``perceptual_hash`` of
    the full decode); other formats are decoded in full. Pass the bytes as the shards store them (upright:
    shard creation turns EXIF-rotated images upright).

    Raises:
        ValueError: ``data`` is not an image Pillow can decode (the message names ``name``).
    """
    return hash_grey_pixels(hash_pixels_bytes(data, name))


def hash_pixels_batch(images: Sequence[np.ndarray]) -> np.ndarray:
    """The hash pixels (Nx32x32 uint8) of ``images``, each either its 32x32 grey hash pixels already or an
    HxWx3 uint8 RGB array: those of 32x32 converted to grey all at once (Pillow's own integers; no resize, as
    Pillow's resize to the same size is a copy), other sizes one by one through ``hash_pixels``. What shard
    writing does with the PPMs the in-memory sources make: ~4 us an image instead of ~15."""
    from PIL import Image

    shapes = {image.shape for image in images}
    if shapes == {(_SIDE, _SIDE, 3)}:  # a CIFAR-size shard: all at once
        return _luma(np.stack(images))
    out = np.empty((len(images), _SIDE, _SIDE), dtype=np.uint8)
    for i, image in enumerate(images):
        if image.shape == (_SIDE, _SIDE):
            out[i] = image
        elif image.shape == (_SIDE, _SIDE, 3):
            out[i] = _luma(image)
        elif image.ndim == 3 and image.shape[2] == 3:
            out[i] = hash_pixels(Image.fromarray(image))
        else:
            raise ValueError(
                f"hash_pixels_batch takes 32x32 grey or HxWx3 RGB arrays, got shape {image.shape}"
            )
    return out


def _luma(rgb: np.ndarray) -> np.ndarray:
    """Pillow's ``convert("L")`` of Nx32x32x3 uint8 RGB (or one 32x32x3), in one call: the images stacked into
    one tall image, so Pillow's own integers at one call's overhead."""
    from PIL import Image

    tall = np.ascontiguousarray(rgb).reshape(-1, _SIDE, 3)
    grey = Image.frombuffer("RGB", (_SIDE, len(tall)), tall, "raw", "RGB", 0, 1).convert("L")
    return np.frombuffer(grey.tobytes(), dtype=np.uint8).reshape(rgb.shape[:-1])


def hash_pixels_bytes(data: bytes, name: str = "image") -> np.ndarray:
    """``hash_pixels`` of encoded image bytes, decoded as ``perceptual_hash_bytes`` decodes them.

    Raises:
        ValueError: ``data`` is not an image Pillow can decode (the message names ``name``).
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format == "JPEG":
                img.draft("RGB", HASH_DRAFT_SIZE)
            return hash_pixels(img)
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ValueError(f"{name}: cannot decode the image to hash it ({exc})") from exc
