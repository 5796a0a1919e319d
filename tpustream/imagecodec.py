"""Image bytes in and out: the PPM codec the loader's fast path reads, and the check-or-re-encode step that
every source item goes through at write time (corrupt images are caught here, once)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL import Image as PILImage

__all__ = ["CorruptImage", "encode_ppm", "decode_ppm", "resize_array", "prepare_image_bytes", "to_rgb"]

# Pillow modes holding more than 8 bits per pixel (16-bit PNG/TIFF grey, 32-bit int, float): a plain
# ``convert("RGB")`` clips them at 255, so a 16-bit grey photo comes out solid white.
HIGH_DEPTH_MODES = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I", "F"})


class CorruptImage(ValueError):
    """One item could not be read or decoded (skipped and counted unless --strict)."""


def encode_ppm(image: np.ndarray) -> bytes:
    """Binary PPM (P6) of an HxWx3 uint8 array (HxW is replicated to RGB)."""
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    height, width = image.shape[:2]
    return b"P6\n%d %d\n255\n" % (width, height) + np.ascontiguousarray(image, dtype=np.uint8).tobytes()


def decode_ppm(data: bytes) -> np.ndarray:
    """Decode a binary P6 PPM with maxval 255 to HxWx3 uint8 without PIL (a header parse + a view)."""
    if data[:2] != b"P6":
        raise ValueError("not a binary PPM (P6)")
    parts = data.split(b"\n", 3)  # fast path: the header encode_ppm writes ("P6\nW H\n255\n")
    if len(parts) == 4 and parts[0] == b"P6" and parts[2] == b"255":
        dims = parts[1].split()
        if len(dims) == 2 and dims[0].isdigit() and dims[1].isdigit():
            width, height = int(dims[0]), int(dims[1])
            offset = len(data) - len(parts[3])
            if len(parts[3]) < width * height * 3:
                raise ValueError("truncated PPM")
            return np.frombuffer(data, np.uint8, width * height * 3, offset).reshape(height, width, 3)
    fields: list[bytes] = []
    pos = 2
    while len(fields) < 3:
        while data[pos : pos + 1].isspace():
            pos += 1
        if data[pos : pos + 1] == b"#":
            pos = data.index(b"\n", pos) + 1
            continue
        end = pos
        while not data[end : end + 1].isspace():
            end += 1
        fields.append(data[pos:end])
        pos = end
    width, height, maxval = (int(f) for f in fields)
    if maxval != 255:
        raise ValueError(f"PPM maxval {maxval} unsupported")
    pos += 1  # the single whitespace byte after maxval
    expected = width * height * 3
    if len(data) - pos < expected:
        raise ValueError("truncated PPM")
    return np.frombuffer(data, dtype=np.uint8, count=expected, offset=pos).reshape(height, width, 3)


def resize_array(image: np.ndarray, max_side: int | None) -> np.ndarray:
    if not max_side or max(image.shape[:2]) <= max_side:
        return image
    from PIL import Image

    pil = Image.fromarray(image)
    pil.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    return np.asarray(pil)


def to_rgb(img: PILImage.Image) -> PILImage.Image:
    """``img`` as 8-bit RGB, with high-bit-depth grey scaled down rather than clipped.

    16-bit and integer modes keep their top 8 bits (``>> 8``, what PNG's 16-bit samples mean); float
    images are taken as 0..1 when they fit in it, else as 0..255.
    """
    if img.mode not in HIGH_DEPTH_MODES:
        return img.convert("RGB")
    from PIL import Image

    values = np.asarray(img)
    if img.mode == "F":
        scale = 255.0 if float(np.nanmax(values, initial=0.0)) <= 1.0 else 1.0
        grey = np.clip(np.nan_to_num(values * scale), 0, 255).round().astype(np.uint8)
    else:
        grey = (np.clip(values.astype(np.int64), 0, 0xFFFF) >> 8).astype(np.uint8)
    return Image.fromarray(grey).convert("RGB")


def prepare_image_bytes(data: bytes, ext_hint: str, max_side: int | None, name: str) -> tuple[bytes, str]:
    """Check that ``data`` decodes; keep it byte-for-byte when possible, else (re-)encode.

    JPEG is checked with a reduced-size (draft) decode, which still reads the whole entropy-coded
    stream and so catches truncation, at a fraction of the cost of a full decode.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt = img.format
            width, height = img.size
            too_big = bool(max_side) and max(width, height) > (max_side or 0)
            if fmt == "JPEG" and not too_big:
                img.draft("RGB", (max(1, width // 8), max(1, height // 8)))
            img.load()
            keep = {"JPEG": "jpg", "PNG": "png", "PPM": "ppm"}.get(fmt or "")
            if keep == "ppm" and (img.mode != "RGB" or not data.startswith(b"P6")):
                keep = None  # PGM/PBM or ASCII PPM: re-encode so the loader's fast PPM path applies
            if img.mode in HIGH_DEPTH_MODES:
                keep = None  # 16-bit PNG: re-encode to 8 bits, which every decoder reads right
            if keep and not too_big:
                return data, keep
            if fmt == "JPEG" and too_big:
                img.draft("RGB", (max_side, max_side))  # type: ignore[arg-type]
            rgb = to_rgb(img)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise CorruptImage(f"{name}: cannot decode image ({exc})") from exc
    if too_big:
        rgb.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)  # type: ignore[arg-type]
    out = io.BytesIO()
    if fmt == "JPEG":
        rgb.save(out, format="JPEG", quality=90)
        return out.getvalue(), "jpg"
    if fmt == "PPM":
        return encode_ppm(np.asarray(rgb)), "ppm"
    rgb.save(out, format="PNG", compress_level=1)
    return out.getvalue(), "png"
