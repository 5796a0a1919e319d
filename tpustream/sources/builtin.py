"""The sources that need no files: ``digits`` (scikit-learn's bundled handwritten digits, real data) and
the synthetic stand-ins ``synthetic-cifar:N`` (learnable 32x32 images) and ``synthetic-imagenet:N``
(~500x375 JPEGs cropped from scikit-image's bundled photos, for benchmarks)."""

from __future__ import annotations

import io

import numpy as np

from tpustream.image.codec import encode_ppm, prepare_image_bytes, resize_array
from tpustream.sources.types import Item, Source

__all__ = [
    "digits_source",
    "synthetic_cifar_source",
    "synthetic_imagenet_source",
    "synthetic_cifar_image",
    "synthetic_imagenet_jpeg",
    "SYNTHETIC_IMAGENET_PHOTOS",
]

SYNTHETIC_IMAGENET_PHOTOS = [
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
]


# --------------------------------------------------------------------------- digits


def digits_source() -> Source:
    from sklearn.datasets import load_digits

    digits = load_digits()
    # 0..16 grey levels -> 0..255; 8x8 stays 8x8 (the loader resizes to the model's input size)
    images = np.clip(digits.images * 16, 0, 255).astype(np.uint8)
    labels = digits.target.astype(int)

    def load(item: Item, max_side: int | None) -> tuple[bytes, str]:
        return encode_ppm(resize_array(images[int(item.ref)], max_side)), "ppm"

    return Source(
        spec="digits",
        description=f"scikit-learn bundled handwritten digits: {len(images)} 8x8 grey images, 10 classes",
        classes=[str(d) for d in range(10)],
        items=[Item(i, int(label)) for i, label in enumerate(labels)],
        loader=load,
    )


# --------------------------------------------------------------------------- synthetic


def synthetic_cifar_image(index: int, label: int, size: int = 32) -> np.ndarray:
    """A 32x32 RGB image whose class sets a colour and a grating orientation, plus noise and jitter.

    Learnable by a small CNN in a few epochs, but not by a single pixel: the phase, brightness and
    noise vary per image.
    """
    rng = np.random.default_rng([0x5EED, index])
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    angle = np.pi * label / 10.0
    freq = 3.0 + (label % 3)
    phase = rng.uniform(0, 2 * np.pi)
    grating = 0.5 + 0.5 * np.sin(2 * np.pi * freq * (xx * np.cos(angle) + yy * np.sin(angle)) + phase)
    hue = np.array(
        [0.5 + 0.5 * np.cos(2 * np.pi * (label / 10.0 + k / 3.0)) for k in range(3)], dtype=np.float32
    )
    brightness = rng.uniform(0.6, 1.0)
    img = grating[:, :, None] * hue[None, None, :] * brightness
    img += rng.normal(0, 0.08, size=img.shape).astype(np.float32)
    return (np.clip(img, 0, 1) * 255).astype(np.uint8)


def synthetic_cifar_source(count: int) -> Source:
    def load(item: Item, max_side: int | None) -> tuple[bytes, str]:
        image = synthetic_cifar_image(int(item.ref), item.label)
        return encode_ppm(resize_array(image, max_side)), "ppm"

    return Source(
        spec=f"synthetic-cifar:{count}",
        description=f"synthetic CIFAR-size: {count} 32x32 RGB images, 10 classes (colour + grating)",
        classes=[f"class{k}" for k in range(10)],
        items=[Item(i, i % 10) for i in range(count)],
        loader=load,
    )


_PHOTOS: dict[str, np.ndarray] = {}


def _photo(name: str) -> np.ndarray:
    if name not in _PHOTOS:
        import skimage.data

        image = getattr(skimage.data, name)()
        if image.ndim == 2:
            image = np.repeat(image[:, :, None], 3, axis=2)
        _PHOTOS[name] = np.ascontiguousarray(image[:, :, :3].astype(np.uint8))
    return _PHOTOS[name]


def synthetic_imagenet_jpeg(index: int, label: int, width: int = 500, height: int = 375) -> bytes:
    """A ~500x375 JPEG: a random crop of one of scikit-image's bundled photos (the class), jittered."""
    from PIL import Image

    rng = np.random.default_rng([0x1A6E, index])
    photo = _photo(SYNTHETIC_IMAGENET_PHOTOS[label])
    ph, pw = photo.shape[:2]
    scale = rng.uniform(0.45, 1.0)
    crop_w = int(min(pw, ph * width / height) * scale)
    crop_h = int(crop_w * height / width)
    x0 = int(rng.integers(0, pw - crop_w + 1))
    y0 = int(rng.integers(0, ph - crop_h + 1))
    crop = Image.fromarray(photo[y0 : y0 + crop_h, x0 : x0 + crop_w])
    crop = crop.resize((width, height), Image.Resampling.BILINEAR)
    if rng.random() < 0.5:
        crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    pixels = np.asarray(crop).astype(np.float32) * rng.uniform(0.8, 1.2, size=3)
    out = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def synthetic_imagenet_source(count: int) -> Source:
    classes = SYNTHETIC_IMAGENET_PHOTOS

    def load(item: Item, max_side: int | None) -> tuple[bytes, str]:
        data = synthetic_imagenet_jpeg(int(item.ref), item.label)
        if max_side and max_side < 500:
            return prepare_image_bytes(data, "jpg", max_side, f"synthetic-imagenet item {item.ref}")
        return data, "jpg"

    return Source(
        spec=f"synthetic-imagenet:{count}",
        description=f"synthetic ImageNet-size: {count} 500x375 JPEGs cropped from scikit-image photos, "
        f"{len(classes)} classes",
        classes=list(classes),
        items=[Item(i, i % len(classes)) for i in range(count)],
        loader=load,
    )
