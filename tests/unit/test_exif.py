"""EXIF orientation: phone photos are turned upright once, where images enter (shards, serving, predict)."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from PIL import Image, ImageOps

from tpustream.image.codec import exif_orientation, orient, prepare_image_bytes
from tpustream.image.transforms import Augment, prepare_image


def _scene(width: int = 48, height: int = 32) -> np.ndarray:
    """An image no flip or turn maps onto itself: a bright top-left block on a gradient."""
    image = np.zeros((height, width, 3), np.uint8)
    image[..., 0] = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
    image[..., 1] = np.linspace(0, 255, height, dtype=np.uint8)[:, None]
    image[: height // 3, : width // 4] = 255
    return image


def _encoded(pixels: np.ndarray, orientation: int, fmt: str = "JPEG") -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt, exif=exif, **({"quality": 95} if fmt == "JPEG" else {}))
    return out.getvalue()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orient_turns_pixels_as_pillow_exif_transpose_does(orientation: int) -> None:
    stored = _scene()
    with Image.open(io.BytesIO(_encoded(stored, orientation, "PNG"))) as img:
        assert exif_orientation(img) == orientation
        expected = np.asarray(ImageOps.exif_transpose(img).convert("RGB"))
    np.testing.assert_array_equal(orient(stored, orientation), expected)


def test_shard_bytes_of_a_rotated_photo_are_upright_and_carry_no_orientation() -> None:
    stored = _scene()
    data, ext = prepare_image_bytes(_encoded(stored, 6), "jpg", None, "portrait.jpg")
    assert ext == "jpg"
    with Image.open(io.BytesIO(data)) as img:
        assert exif_orientation(img) == 1
        upright = np.asarray(img.convert("RGB"))
    assert upright.shape == (48, 32, 3)  # stored 48 wide x 32 high, shown turned: 32 wide x 48 high
    expected = orient(stored, 6).astype(np.int16)
    assert np.abs(upright.astype(np.int16) - expected).mean() < 4  # JPEG re-encoded once (quality 90)


def test_an_upright_photo_keeps_its_bytes() -> None:
    data = _encoded(_scene(), 1)
    assert prepare_image_bytes(data, "jpg", None, "upright.jpg") == (data, "jpg")


@pytest.mark.parametrize("fmt,ext", [("JPEG", "jpg"), ("PNG", "png")])
def test_serving_augment_turns_a_rotated_image_upright_and_the_loader_default_does_not(
    fmt: str, ext: str
) -> None:
    data = _encoded(_scene(), 8, fmt)
    as_sent = prepare_image(data, ext, Augment(output_size=16, train=False, exif=True), random.Random(0))
    assert as_sent.image.shape[:2] == (48, 32)
    expected = orient(_scene(), 8).astype(np.int16)
    assert np.abs(as_sent.image.astype(np.int16) - expected).mean() < 4
    as_stored = prepare_image(data, ext, Augment(output_size=16, train=False), random.Random(0))
    assert as_stored.image.shape[:2] == (32, 48)


@pytest.mark.parametrize("fmt,ext", [("TIFF", "tiff"), ("PNG", "png"), ("WEBP", "webp")])
def test_a_rotated_lossless_image_is_stored_turned_once_as_served(fmt: str, ext: str) -> None:
    """Pillow's TIFF plugin turns an image upright as it loads it; shard creation must not turn it again, so
    the stored pixels are the ones the model server decodes from the same file (imagecodec.decode_rgb)."""
    from tpustream.image.codec import decode_rgb

    stored = _scene()
    encoded = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(stored).save(
        encoded, format=fmt, exif=exif, **({"lossless": True} if fmt == "WEBP" else {})
    )
    data, out_ext = prepare_image_bytes(encoded.getvalue(), ext, None, f"portrait.{ext}")
    assert out_ext == "png"
    with Image.open(io.BytesIO(data)) as img:
        shard_pixels = np.asarray(img.convert("RGB"))
    np.testing.assert_array_equal(shard_pixels, orient(stored, 6))
    np.testing.assert_array_equal(decode_rgb(encoded.getvalue(), ext), shard_pixels)
