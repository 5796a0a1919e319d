"""Decode + augment one sample to a fixed-size uint8 HxWx3 array, fast.

train: RandomResizedCrop (torchvision's sampling) + horizontal flip; val: centre crop + resize
(torchvision's Resize(int(S/0.875)) + CenterCrop(S) done as one resample). Crop and resize are a
single Pillow ``resize(box=...)`` (antialiased), and JPEGs are decoded at a reduced DCT scale when
the crop still has at least the output's resolution there, so no detail the output could show is
lost. Floats never appear here: normalisation happens on the device (``normalize``).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np

from tpustream.sources import decode_ppm

__all__ = [
    "Augment",
    "decode_image",
    "random_resized_crop_box",
    "center_crop_box",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "normalize",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
VAL_CROP_FRACTION = 0.875  # 224/256


@dataclass(frozen=True, kw_only=True)
class Augment:
    """How one sample becomes an ``output_size`` square."""

    output_size: int
    train: bool
    min_crop_scale: float = 0.08
    flip: bool = True

    def __post_init__(self) -> None:
        if self.output_size < 1:
            raise ValueError(f"output_size must be positive, got {self.output_size}")
        if not 0.0 < self.min_crop_scale <= 1.0:
            raise ValueError(f"min_crop_scale must be in (0, 1], got {self.min_crop_scale}")


def random_resized_crop_box(
    width: int, height: int, rng: np.random.Generator, scale: tuple[float, float], ratio: tuple[float, float]
) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params, as (left, top, right, bottom)."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return left, top, left + w, top + h
    in_ratio = width / height  # fallback: whole-image centre crop within the ratio bounds
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def center_crop_box(width: int, height: int, output_size: int) -> tuple[int, int, int, int]:
    """The square centre crop Resize(S/0.875)+CenterCrop(S) would keep; the whole image when it is
    already smaller than the output (small sources such as digits would lose content otherwise)."""
    side = min(width, height)
    if side > output_size:
        side = max(1, int(round(side * VAL_CROP_FRACTION)))
    left, top = (width - side) // 2, (height - side) // 2
    return left, top, left + side, top + side


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    try:
        import simplejpeg

        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        return width, height
    except Exception:  # not a baseline/progressive JPEG simplejpeg can read: PIL will try
        return None


def _decode_jpeg_reduced(
    data: bytes, width: int, height: int, box: tuple[int, int, int, int], out: int
) -> tuple[np.ndarray, float]:
    """Decode at the smallest DCT scale (1, 1/2, 1/4, 1/8) keeping the crop >= ``out`` pixels a side."""
    import simplejpeg

    crop_side = min(box[2] - box[0], box[3] - box[1])
    factor = 1
    while factor < 8 and crop_side / (factor * 2) >= out:
        factor *= 2
    image = simplejpeg.decode_jpeg(
        data,
        colorspace="RGB",
        fastdct=True,
        fastupsample=True,
        min_height=math.ceil(height / factor),
        min_width=math.ceil(width / factor),
    )
    return image, image.shape[1] / width


def _decode_any(data: bytes, ext: str) -> np.ndarray:
    if ext == "ppm" and data[:2] == b"P6":
        return decode_ppm(data)
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


def decode_image(data: bytes, ext: str, augment: Augment, rng: np.random.Generator) -> np.ndarray:
    """Decode ``data`` (``ext`` = jpg/jpeg/png/ppm) and return the augmented uint8 HxWx3 square.

    Raises ``ValueError``/``OSError`` on undecodable input (the loader skips and counts those).
    """
    from PIL import Image

    size = augment.output_size
    scale = (augment.min_crop_scale, 1.0)
    ratio = (3 / 4, 4 / 3)
    image: np.ndarray | None = None
    factor = 1.0
    dims = _jpeg_size(data) if ext in ("jpg", "jpeg") else None
    if dims is not None:
        width, height = dims
        box = (
            random_resized_crop_box(width, height, rng, scale, ratio)
            if augment.train
            else center_crop_box(width, height, size)
        )
        try:
            image, factor = _decode_jpeg_reduced(data, width, height, box, size)
        except ValueError:
            image = None
    if image is None:
        image = _decode_any(data, ext)
        height, width = image.shape[:2]
        box = (
            random_resized_crop_box(width, height, rng, scale, ratio)
            if augment.train
            else center_crop_box(width, height, size)
        )
        factor = 1.0
    if factor != 1.0:
        box = (box[0] * factor, box[1] * factor, box[2] * factor, box[3] * factor)  # type: ignore[assignment]
    pil = Image.frombuffer(
        "RGB", (image.shape[1], image.shape[0]), np.ascontiguousarray(image), "raw", "RGB", 0, 1
    )
    resized = pil.resize((size, size), Image.Resampling.BILINEAR, box=box)
    if augment.train and augment.flip and rng.random() < 0.5:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(resized)


def normalize(images_uint8, mean=IMAGENET_MEAN, std=IMAGENET_STD, dtype=None):  # type: ignore[no-untyped-def]
    """On-device normalisation of a uint8 NCHW batch: (x/255 - mean) / std, in ``dtype`` (default float32).

    Works on any torch device (XLA included), so loader workers ship uint8 and the device does the math.
    """
    import torch

    dtype = dtype or torch.float32
    x = images_uint8.to(dtype).div_(255.0)
    mean_t = torch.tensor(mean, dtype=dtype, device=x.device).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=dtype, device=x.device).view(1, -1, 1, 1)
    return (x - mean_t) / std_t
