"""Image bytes in and out: the PPM codec the loader's fast path reads, and the check-or-re-encode step that
every source item goes through at write time (corrupt images are caught here, once)."""

from __future__ import annotations

import contextlib
import contextvars
import io
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from tpustream.errors import TpustreamError

if TYPE_CHECKING:
    from PIL import Image as PILImage

__all__ = [
    "CorruptImage",
    "ImageTooLarge",
    "UnreadableImage",
    "DEFAULT_MAX_PIXELS",
    "check_pixels",
    "pixel_budget",
    "encode_ppm",
    "ppm_header",
    "decode_ppm",
    "resize_array",
    "prepare_image_bytes",
    "to_rgb",
    "exif_orientation",
    "orient",
    "IMAGE_EXTS",
    "image_member",
    "PIL_FORMATS",
    "sniff_format",
    "image_dimensions",
    "decode_rgb",
    "kept_hash_lows",
    "kept_thumbnail_grey",
]

# The pixel budget (--max-pixels): images whose header claims more pixels are refused before any decoding.
# 2**26 = 67,108,864 px (64 Mi, e.g. 8192x8192): above every real photo a dataset holds (61 MP full-frame
# cameras, 48-50 MP phone photos, 8K frames) and below a bomb (the 169 MP 20 KB PNG that took 2.1 GB in a
# worker; 200 MP phone modes must be asked for). Decoded as RGB it is at most 192 MiB per loader worker, so
# 16 workers on a TPU host stay under ~3 GiB even when every one meets such an image at once.
DEFAULT_MAX_PIXELS = 1 << 26
_BUDGET: contextvars.ContextVar[int] = contextvars.ContextVar(
    "tpustream_max_pixels", default=DEFAULT_MAX_PIXELS
)

# Where prepare_image_bytes puts what the perceptual hash of each image it keeps as is is made from
# (kept_hash_lows): its coefficients, or its small grey draft to hash with the shard's others
_HASH_LOWS: contextvars.ContextVar[list[np.ndarray | PILImage.Image] | None] = contextvars.ContextVar(
    "tpustream_hash_lows", default=None
)

# Where prepare_image_bytes puts the grey pixels of each thumbnail it keeps as is (kept_thumbnail_grey)
_THUMBNAIL_GREY: contextvars.ContextVar[list[np.ndarray] | None] = contextvars.ContextVar(
    "tpustream_thumbnail_grey", default=None
)

# Pillow modes holding more than 8 bits per pixel (16-bit PNG/TIFF grey, 32-bit int, float): a plain
# ``convert("RGB")`` clips them at 255, so a 16-bit grey photo comes out solid white.
HIGH_DEPTH_MODES = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I", "F"})


# A shard sample's image member, by extension, in the order a reader looks for it (shards hold the
# original bytes of a JPEG, PNG or PPM file; other formats are re-encoded when the shards are written).
IMAGE_EXTS = ("jpg", "jpeg", "png", "ppm")


def image_member(fields: Mapping[str, Any]) -> str | None:
    """The extension of a tar sample's image member (``fields``: member extension -> bytes), or None."""
    for ext in IMAGE_EXTS:  # a loop, not next(generator): called once per sample by the loader
        if ext in fields:
            return ext
    return None


# Every format shard creation accepts (sources.image_folder.IMAGE_EXTENSIONS: JPEG, PNG and PPM kept as they are, the
# others re-encoded), by the name ``sniff_format`` gives it, with the one Pillow plugin allowed to read it: an
# image sent to the model server or to ``tpustream predict`` is never handed to any other Pillow plugin.
PIL_FORMATS = {
    "jpg": "JPEG",
    "png": "PNG",
    "ppm": "PPM",  # P1-P6: PBM, PGM and PPM, ASCII or binary (.pbm, .pgm, .pnm, .ppm)
    "bmp": "BMP",
    "gif": "GIF",
    "webp": "WEBP",
    "tiff": "TIFF",  # classic and BigTIFF, either byte order (.tif, .tiff)
}


class CorruptImage(TpustreamError, ValueError):
    """One item could not be read or decoded (skipped and counted unless --strict)."""


class UnreadableImage(CorruptImage):
    """An item's file or object is missing or cannot be read (skipped as "missing-object")."""


class ImageTooLarge(CorruptImage):
    """An image's header claims more pixels than the budget (--max-pixels): refused before decoding."""


def check_pixels(width: int, height: int, max_pixels: int | None, name: str = "image") -> None:
    """Raise ImageTooLarge when ``width`` x ``height`` exceeds ``max_pixels`` (None: the current budget)."""
    budget = _BUDGET.get() if max_pixels is None else max_pixels
    if width * height > budget:
        raise ImageTooLarge(
            f"{name}: {width}x{height} = {width * height / 1e6:.1f} MP exceeds the pixel budget of "
            f"{budget / 1e6:.1f} MP (a decompression bomb? raise --max-pixels to accept it)"
        )


@contextlib.contextmanager
def pixel_budget(max_pixels: int) -> Iterator[None]:
    """Within this block, ``prepare_image_bytes`` refuses images above ``max_pixels`` (default 64 Mi px)."""
    token = _BUDGET.set(max_pixels)
    try:
        yield
    finally:
        _BUDGET.reset(token)


def encode_ppm(image: np.ndarray) -> bytes:
    """Binary PPM (P6) of an HxWx3 uint8 array (HxW is replicated to RGB)."""
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    height, width = image.shape[:2]
    return b"P6\n%d %d\n255\n" % (width, height) + np.ascontiguousarray(image, dtype=np.uint8).tobytes()


# The header encode_ppm writes ("P6\nW H\n255\n"), then any P6 header (Netpbm: whitespace and '#' comments
# to the end of the line between fields, one whitespace byte after maxval). Both are matched within the first
# _PPM_HEADER_MAX bytes with bounded digit counts: parsing cannot loop or read past the data, whatever it holds.
_PPM_FAST = re.compile(rb"P6\n([0-9]{1,9}) ([0-9]{1,9})\n255\n")
_PPM_SEP = rb"(?:[ \t\r\n\v\f]|#[^\n]*\n)+"
_PPM_ANY = re.compile(
    rb"P6"
    + _PPM_SEP
    + rb"([0-9]{1,9})"
    + _PPM_SEP
    + rb"([0-9]{1,9})"
    + _PPM_SEP
    + rb"([0-9]{1,5})[ \t\r\n\v\f]"
)
_PPM_HEADER_MAX = 4096


def ppm_header(data: bytes) -> tuple[int, int, int]:
    """(width, height, offset of the pixels) of a binary P6 PPM with maxval 255; ValueError when the
    header is malformed, cut short or not P6/255. Reads at most the first 4 KiB."""
    match = _PPM_FAST.match(data)
    if match is not None:
        return int(match[1]), int(match[2]), match.end()
    if data[:2] != b"P6":
        raise ValueError("not a binary PPM (P6)")
    match = _PPM_ANY.match(data, 0, _PPM_HEADER_MAX)
    if match is None:
        raise ValueError(f"malformed or truncated PPM header ({bytes(data[:24])!r})")
    if int(match[3]) != 255:
        raise ValueError(f"PPM maxval {int(match[3])} unsupported")
    return int(match[1]), int(match[2]), match.end()


def decode_ppm(data: bytes, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode a binary P6 PPM with maxval 255 to HxWx3 uint8 without PIL (a header parse + a view).

    Raises ValueError on a malformed or truncated PPM, ImageTooLarge above ``max_pixels`` (None: no limit)."""
    width, height, offset = ppm_header(data)
    if max_pixels is not None:
        check_pixels(width, height, max_pixels, "PPM")
    expected = width * height * 3
    if expected == 0:
        raise ValueError(f"empty PPM ({width}x{height})")
    if len(data) - offset < expected:
        raise ValueError("truncated PPM")
    return np.frombuffer(data, np.uint8, expected, offset).reshape(height, width, 3)


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


# EXIF Orientation (tag 0x0112): how a camera's pixels must be turned to show the scene upright; each value as
# Pillow's ImageOps.exif_transpose applies it (2: mirror, 3: 180, 4: flip, 5: transpose, 6: 90 clockwise,
# 7: transverse, 8: 90 counter-clockwise). Phones store portrait photos as landscape pixels + 6 or 8.
_ORIENTATION_TAG = 0x0112


def exif_orientation(img: PILImage.Image) -> int:
    """The EXIF orientation (1-8) of an opened image (header only); 1 when absent or unreadable."""
    try:
        value = img.getexif().get(_ORIENTATION_TAG, 1)
    except Exception:  # a damaged EXIF block: the pixels are still the image, shown as stored
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def orient(image: np.ndarray, orientation: int) -> np.ndarray:
    """``image`` (HxW[xC]) turned upright for EXIF ``orientation``, as ImageOps.exif_transpose does it."""
    if orientation == 2:
        return image[:, ::-1]
    if orientation == 3:
        return image[::-1, ::-1]
    if orientation == 4:
        return image[::-1]
    if orientation == 5:
        return image.swapaxes(0, 1)
    if orientation == 6:
        return np.rot90(image, -1)
    if orientation == 7:
        return image[::-1, ::-1].swapaxes(0, 1)
    if orientation == 8:
        return np.rot90(image, 1)
    return image


def prepare_image_bytes(
    data: bytes, ext_hint: str, max_side: int | None, name: str, max_pixels: int | None = None
) -> tuple[bytes, str]:
    """Check that ``data`` decodes; keep it byte-for-byte when possible, else (re-)encode.

    An image whose header claims more than ``max_pixels`` (None: the ``pixel_budget`` in force, 64 Mi px by
    default) is refused (ImageTooLarge) before any pixel is decoded. JPEG is checked with a reduced-size
    (draft) decode, which still reads the whole entropy-coded stream and so catches truncation, at a
    fraction of the cost of a full decode. An image with an EXIF orientation other than "upright" (a phone's
    portrait photo) is turned upright and re-encoded, so every reader (the loader's JPEG decoder ignores EXIF)
    sees it as the camera showed it.
    """
    from PIL import Image, UnidentifiedImageError

    hash_sink = _HASH_LOWS.get()
    try:
        with Image.open(io.BytesIO(data)) as img:  # reads the header only
            fmt = img.format
            width, height = img.size
            check_pixels(width, height, max_pixels, name)
            orientation = exif_orientation(img)
            too_big = bool(max_side) and max(width, height) > (max_side or 0)
            if fmt == "JPEG" and not too_big and orientation == 1:  # kept as is: checking suffices
                if hash_sink is None:
                    img.draft("RGB", (max(1, width // 8), max(1, height // 8)))
                else:  # for the hash: grey (libjpeg decodes the Y plane alone), 1/8 from 192 px a side up
                    from tpustream.image.phash import HASH_DRAFT_SIZE

                    img.draft("L", HASH_DRAFT_SIZE)
            img.load()
            # read again once loaded: Pillow's TIFF plugin turns the image upright as it loads (and drops the
            # tag), so the orientation read from the header would turn a TIFF twice
            orientation = exif_orientation(img)
            keep = {"JPEG": "jpg", "PNG": "png", "PPM": "ppm"}.get(fmt or "")
            if keep == "ppm" and (img.mode != "RGB" or not data.startswith(b"P6")):
                keep = None  # PGM/PBM or ASCII PPM: re-encode so the loader's fast PPM path applies
            if img.mode in HIGH_DEPTH_MODES:
                keep = None  # 16-bit PNG: re-encode to 8 bits, which every decoder reads right
            if keep and not too_big and orientation == 1:
                if hash_sink is not None:
                    from tpustream.image.phash import hash_input_of_image

                    hash_input = hash_input_of_image(img)
                    hash_sink.append(hash_input)
                    grey_sink = _THUMBNAIL_GREY.get()
                    if grey_sink is not None and img.size == (width, height):  # not drafted
                        # a thumbnail's hash input is its grey image already: one luma pass for both
                        grey = hash_input if isinstance(hash_input, Image.Image) else img
                        _keep_thumbnail_grey(grey, grey_sink)
                return data, keep
            if fmt == "JPEG" and too_big:
                img.draft("RGB", (max_side, max_side))  # type: ignore[arg-type]
            rgb = to_rgb(img)
    except CorruptImage:
        raise
    except Image.DecompressionBombError as exc:  # Pillow's own limit (2x 89 MP): only above our budget
        raise ImageTooLarge(f"{name}: refused as a decompression bomb ({exc})") from exc
    except UnidentifiedImageError as exc:  # its message names the BytesIO object, not the file: say it here
        raise CorruptImage(
            f"{name}: cannot decode image (no image format recognised: damaged, or not an image file)"
        ) from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise CorruptImage(f"{name}: cannot decode image ({exc})") from exc
    except Exception as exc:  # a malformed file can trip a decoder in other ways: still one bad image
        raise CorruptImage(f"{name}: cannot decode image ({type(exc).__name__}: {exc})") from exc
    if too_big:
        rgb.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)  # type: ignore[arg-type]
    if orientation != 1:
        rgb = Image.fromarray(np.ascontiguousarray(orient(np.asarray(rgb), orientation)))
    out = io.BytesIO()
    if fmt == "JPEG":
        rgb.save(out, format="JPEG", quality=90)
        return out.getvalue(), "jpg"
    if fmt == "PPM":
        return encode_ppm(np.asarray(rgb)), "ppm"
    rgb.save(out, format="PNG", compress_level=1)
    return out.getvalue(), "png"


class kept_hash_lows:  # noqa: N801 - used as a function: `with kept_hash_lows() as kept`
    """Within this block, ``prepare_image_bytes`` appends to the list it yields what the perceptual hash of each
    image it keeps byte for byte is made from, out of the decode its check makes anyway
    (``image.phash.hash_input_of_image``: a small grey draft itself, to hash with the shard's others, else its
    64 low DCT coefficients); a kept JPEG is then drafted to grey at ``phash.HASH_DRAFT_SIZE`` rather than to RGB at
    1/8 (libjpeg still reads the whole stream, so the check is the same), so that they are what
    ``phash.hash_lows_bytes`` takes of the stored bytes. An image it re-encodes appends nothing (its stored
    bytes are not the ones decoded): shard writing hashes those from the bytes. A class, not a generator
    context manager: entered once per image on a CIFAR-size write, where that saves ~0.5 us of ~17."""

    __slots__ = ("_sink", "_token")

    def __init__(self) -> None:
        self._sink: list[np.ndarray | PILImage.Image] = []

    def __enter__(self) -> list[np.ndarray | PILImage.Image]:
        self._token = _HASH_LOWS.set(self._sink)
        return self._sink

    def __exit__(self, *exc: object) -> None:
        _HASH_LOWS.reset(self._token)


def _keep_thumbnail_grey(img: PILImage.Image, sink: list[np.ndarray]) -> None:
    from tpustream.image.phash_windows import is_thumbnail

    if is_thumbnail(img.width, img.height):
        grey = img if img.mode == "L" else img.convert("L")
        sink.append(np.frombuffer(grey.tobytes(), dtype=np.uint8).reshape(img.height, img.width))


class kept_thumbnail_grey:  # noqa: N801 - used as a function, as kept_hash_lows
    """Within this block (and a ``kept_hash_lows`` one), ``prepare_image_bytes`` appends to the list it yields
    the grey pixels (Pillow's luma, uint8 HxW) of each thumbnail (``image.phash_windows.is_thumbnail``) it
    keeps byte for byte and decoded in full for its check: shard writing takes the window hashes from them,
    not from a second decode of the stored bytes (a 32 px PNG's: ~70 us, half its whole write)."""

    __slots__ = ("_sink", "_token")

    def __init__(self) -> None:
        self._sink: list[np.ndarray] = []

    def __enter__(self) -> list[np.ndarray]:
        self._token = _THUMBNAIL_GREY.set(self._sink)
        return self._sink

    def __exit__(self, *exc: object) -> None:
        _THUMBNAIL_GREY.reset(self._token)


# ---------------------------------------------------------------------------------- any accepted format


def sniff_format(data: bytes) -> str | None:
    """The ``PIL_FORMATS`` name of encoded image bytes from their first bytes (the file's signature), else
    None. The signature, not a file name or a client's word, picks the one decoder that may read them."""
    if data.startswith(b"\xff\xd8\xff"):
        return "jpg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data[:1] == b"P" and data[1:2] in (b"1", b"2", b"3", b"4", b"5", b"6"):
        return "ppm"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data.startswith((b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")):
        return "tiff"
    if data.startswith(b"BM"):
        return "bmp"
    return None


def _webp_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a WebP's first chunk header (RFC 9649 sections 2.5-2.7), read here: Pillow's WebP
    plugin hands the whole file to libwebp's decoder, which sets up its canvas, before the size is known."""
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        return int.from_bytes(data[26:28], "little") & 0x3FFF, int.from_bytes(data[28:30], "little") & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    raise ValueError("no VP8, VP8L or VP8X chunk with a size")


@contextlib.contextmanager
def _decoding(name: str, kind: str) -> Iterator[None]:
    """Any failure of a decoder on a damaged file as one short CorruptImage naming the image and its format;
    Pillow's own bomb refusal (twice its 89 MP warning limit: above any budget) as ImageTooLarge."""
    from PIL import Image, UnidentifiedImageError

    try:
        yield
    except CorruptImage:
        raise
    except Image.DecompressionBombError as exc:
        raise ImageTooLarge(f"{name}: refused as a decompression bomb ({str(exc)[:120]})") from exc
    except UnidentifiedImageError as exc:  # its message names a BytesIO object, not the image
        raise CorruptImage(f"{name}: undecodable {kind} (damaged, or not a {kind} file)") from exc
    except Exception as exc:  # PIL, libtiff and libwebp raise many types for a damaged file
        raise CorruptImage(f"{name}: undecodable {kind} ({type(exc).__name__}: {str(exc)[:120]})") from exc


def image_dimensions(data: bytes, ext: str, name: str = "image") -> tuple[int, int]:
    """(width, height) of a ``sniff_format`` ``ext`` image from its header alone, no pixel decoded: what pixel
    budgets are checked against. Raises CorruptImage when the header cannot be read."""
    kind = PIL_FORMATS[ext]
    with _decoding(name, kind):
        if ext == "webp":
            return _webp_size(data)
        if ext == "ppm" and data[:2] == b"P6":
            width, height, _ = ppm_header(data)
            return width, height
        if ext == "jpg":
            try:
                import simplejpeg

                height, width, _, _ = simplejpeg.decode_jpeg_header(data)
                return width, height
            except Exception:  # not a JPEG simplejpeg reads (CMYK, arithmetic coding): Pillow's parse
                pass
        from PIL import Image

        with Image.open(io.BytesIO(data), formats=[kind]) as img:  # reads the header only
            return img.size


def decode_rgb(data: bytes, ext: str, max_pixels: int | None = None, name: str = "image") -> np.ndarray:
    """HxWx3 uint8 pixels of a ``sniff_format`` ``ext`` image, upright, as shard creation stores an image it
    re-encodes (``prepare_image_bytes``: ``to_rgb``, then the EXIF orientation; the PNG it writes is
    lossless, so these are the pixels the trainer and ``tpustream evaluate`` read back). Refused from its header (ImageTooLarge) above ``max_pixels`` (None: the
    ``pixel_budget`` in force); CorruptImage when it does not decode."""
    from PIL import Image

    kind = PIL_FORMATS[ext]
    width, height = image_dimensions(data, ext, name)
    check_pixels(width, height, max_pixels, name)
    with _decoding(name, kind), Image.open(io.BytesIO(data), formats=[kind]) as img:
        check_pixels(img.width, img.height, max_pixels, name)  # a GIF's first frame may widen its screen
        rgb = to_rgb(img)
        # read once loaded: Pillow's TIFF plugin turns the image upright as it loads (and drops the tag)
        orientation = exif_orientation(img)
        pixels = np.asarray(rgb)
    if orientation != 1:
        pixels = np.ascontiguousarray(orient(pixels, orientation))
    return pixels
