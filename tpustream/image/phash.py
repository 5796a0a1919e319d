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
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL import Image as PILImage

__all__ = ["HASH_BITS", "HASH_DRAFT_SIZE", "perceptual_hash", "perceptual_hash_bytes", "hash_grey_pixels"]

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
    # rounded to 1e-6: a coefficient that is exactly 0 (a flat or mirror-symmetric image) comes out as float
    # noise of either sign from any DCT (imagehash's scipy one included), which would make such an image's
    # bits depend on the BLAS; real coefficients of 8-bit pixels are never within 1e-6 of the median
    low = np.round(_DCT @ pixels.astype(np.float64) @ _DCT_T, 6).ravel()
    middle = np.partition(low, (31, 32))  # np.median of 64 values, without its overhead: the same float
    median = (middle[31] + middle[32]) / 2
    return int.from_bytes(np.packbits(low > median).tobytes(), "big")


def perceptual_hash(image: PILImage.Image) -> int:
    """The 64-bit pHash of ``image``: grey (Pillow's ITU-R 601 luma), Lanczos to 32x32, DCT, the 8x8 lowest
    frequencies above their median. Equal to ``imagehash.phash(image)`` read as an integer."""
    from PIL import Image

    grey = image.convert("L").resize((_SIDE, _SIDE), Image.Resampling.LANCZOS)
    return hash_grey_pixels(np.frombuffer(grey.tobytes(), dtype=np.uint8).reshape(_SIDE, _SIDE))


def perceptual_hash_bytes(data: bytes, name: str = "image") -> int:
    """The 64-bit pHash of encoded image bytes (JPEG, PNG, PPM or any format Pillow reads). A JPEG is decoded
    reduced by libjpeg to ``HASH_DRAFT_SIZE`` or more (its hash is within a few bits of ``perceptual_hash`` of
    the full decode); other formats are decoded in full. Pass the bytes as the shards store them (upright:
    shard creation turns EXIF-rotated images upright).

    Raises:
        ValueError: ``data`` is not an image Pillow can decode (the message names ``name``).
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format == "JPEG":
                img.draft("RGB", HASH_DRAFT_SIZE)
            return perceptual_hash(img)
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ValueError(f"{name}: cannot decode the image to hash it ({exc})") from exc
