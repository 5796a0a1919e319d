"""Decode + augment one sample to a fixed-size uint8 HxWx3 array, fast.

train: RandomResizedCrop (torchvision's sampling) + horizontal flip, then (``Augment.policy``,
``Augment.random_erasing``, ``tpustream.image.policy``) a ``torchvision.transforms.v2`` policy on the rendered uint8
pixels; val: centre crop + resize
(torchvision's Resize(int(S/0.875)) + CenterCrop(S) done as one resample). Crop and resize are one
antialiased bilinear resample of the crop, and JPEGs are decoded at a reduced DCT scale when
the crop still has at least the output's resolution there, so no detail the output could show is
lost. Floats never appear here: normalisation happens on the device (``normalize``).
"""

from __future__ import annotations

import io
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from tpustream.errors import ConfigError
from tpustream.image.codec import (
    DEFAULT_MAX_PIXELS,
    check_pixels,
    decode_ppm,
    exif_orientation,
    orient,
    ppm_header,
    to_rgb,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "AUGMENT_POLICIES",
    "Augment",
    "AugmentPolicy",
    "default_min_crop_scale",
    "decode_image",
    "skip_image",
    "image_size",
    "prepare_image",
    "render",
    "render_batch",
    "Prepared",
    "random_resized_crop_box",
    "center_crop_box",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "normalize",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
VAL_CROP_FRACTION = 0.875  # 224/256
AugmentPolicy = Literal["none", "trivial", "randaugment"]
AUGMENT_POLICIES: tuple[AugmentPolicy, ...] = ("none", "trivial", "randaugment")


def default_min_crop_scale(output_size: int) -> float:
    """RandomResizedCrop's smallest crop area, as a fraction of the image: ImageNet's 0.08 for outputs of
    128 px and more; 0.35 below (an 8% crop of a 32 px image is ~9 px across before it is upscaled).
    The loader's default, and the benchmark's for every pipeline it compares."""
    return 0.08 if output_size >= 128 else 0.35


@dataclass(frozen=True, kw_only=True)
class Augment:
    """How one sample becomes an ``output_size`` square (``min_crop_scale``: see ``default_min_crop_scale``)."""

    output_size: int
    train: bool
    min_crop_scale: float = 0.08
    flip: bool = True
    max_pixels: int = DEFAULT_MAX_PIXELS  # larger images are refused by their header, never decoded
    # Turn images upright by their EXIF orientation: for images as users send them (serving, predict).
    # Shards need none: shard creation wrote every image upright (image.codec.prepare_image_bytes).
    exif: bool = False
    # The evaluation crop's share of the shorter side (Resize(S/f) + CenterCrop(S)): 0.875 (256/224) from
    # random weights; pretrained weights' own (torchvision's resnet50.IMAGENET1K_V2: 224/232).
    val_crop_fraction: float = VAL_CROP_FRACTION
    # Train only, after the crop and flip (``tpustream.image.policy``): a torchvision.transforms.v2 policy
    # (trivial: TrivialAugmentWide, randaugment: RandAugment) and RandomErasing's probability.
    policy: AugmentPolicy = "none"
    random_erasing: float = 0.0

    def __post_init__(self) -> None:
        if self.output_size < 1:
            raise ConfigError(f"output_size must be positive, got {self.output_size}")
        if self.max_pixels < 1:
            raise ConfigError(f"max_pixels must be positive, got {self.max_pixels}")
        if not 0.0 < self.min_crop_scale <= 1.0:
            raise ConfigError(f"min_crop_scale must be in (0, 1], got {self.min_crop_scale}")
        if not 0.0 < self.val_crop_fraction <= 1.0:
            raise ConfigError(f"val_crop_fraction must be in (0, 1], got {self.val_crop_fraction}")
        if self.policy not in AUGMENT_POLICIES:
            raise ConfigError(f"policy must be one of {', '.join(AUGMENT_POLICIES)}, got {self.policy!r}")
        if not 0.0 <= self.random_erasing <= 1.0:
            raise ConfigError(f"random_erasing must be a probability in [0, 1], got {self.random_erasing}")

    @property
    def has_policy(self) -> bool:
        """Whether ``policy.apply_policy`` changes anything: a train split with a policy or random erasing."""
        return self.train and (self.policy != "none" or self.random_erasing > 0)


def random_resized_crop_box(
    width: int, height: int, rng: random.Random, scale: tuple[float, float], ratio: tuple[float, float]
) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params, as (left, top, right, bottom).

    ``rng`` is a ``random.Random`` (seeded per worker and epoch by the loader): its scalar draws cost
    ~0.1 µs against ~2 µs for numpy's Generator, which matters at tens of thousands of samples/s.
    """
    area = width * height
    log_low = math.log(ratio[0])
    log_span = math.log(ratio[1]) - log_low
    scale_span = scale[1] - scale[0]
    draw = rng.random  # uniform(a, b) and randint(0, n) as a + span * random() and int(random() * (n + 1)):
    for _ in range(10):  # the same distributions, without those methods' Python-level call layers
        target_area = area * (scale[0] + scale_span * draw())
        aspect = math.exp(log_low + log_span * draw())
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(draw() * (height - h + 1))
            left = int(draw() * (width - w + 1))
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


def center_crop_box(
    width: int, height: int, output_size: int, fraction: float = VAL_CROP_FRACTION
) -> tuple[int, int, int, int]:
    """The square centre crop Resize(S/fraction)+CenterCrop(S) would keep; the whole image when it is
    already smaller than the output (small sources such as digits would lose content otherwise)."""
    side = min(width, height)
    if side > output_size:
        side = max(1, int(round(side * fraction)))
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
    """Decode at the smallest DCT scale (1, 1/2, 1/4, 1/8) keeping the crop >= ``out`` pixels a side.

    Powers of two only: libjpeg-turbo also scales by 7/8, 3/4 and 5/8 (simplejpeg picks them from
    ``min_height``/``min_width``), but those have no SIMD IDCT, and a 500x375 JPEG decoded at 7/8, 3/4
    and 5/8 took 1.29x, 1.07x and 2.08x as long as at full size (1/2: 0.43x; bench of 20 images, issue 13).
    """
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


# The formats a shard's image may hold (docs/ARCHITECTURE.md): Pillow tries no other decoder on a sample.
_PIL_FORMATS = ("JPEG", "PNG", "PPM")


def _orientation(data: bytes) -> int:
    """The EXIF orientation of encoded image bytes (header only); 1 for a PPM or an undecodable header."""
    if data[:2] == b"P6":
        return 1
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data), formats=_PIL_FORMATS) as img:
            return exif_orientation(img)
    except Exception:  # the decode that follows reports what is wrong with the image
        return 1


def _decode_any(data: bytes, ext: str, max_pixels: int) -> np.ndarray:
    if ext == "ppm" and data[:2] == b"P6":
        return decode_ppm(data, max_pixels)
    from PIL import Image

    with Image.open(io.BytesIO(data), formats=_PIL_FORMATS) as img:  # reads the header only
        check_pixels(img.width, img.height, max_pixels)
        return np.asarray(to_rgb(img))  # 16-bit PNGs in shards written before they were re-encoded


@dataclass
class Prepared:
    """A decoded image and where to crop it: ``box`` in the decoded array's pixels, ``flip`` or not."""

    image: np.ndarray  # HxWx3 uint8
    box: tuple[float, float, float, float]
    flip: bool

    def batchable(self, size: int) -> bool:
        """True for small images whose crop is no larger than the output: plain bilinear is exact (no
        antialias needed) and converting the whole image for a batched resize costs little. A large
        image (500x375 for a 224 crop) is not: the batched path converts all of it to float, ~1.5 ms
        against ~0.3 ms for resizing its crop alone (measured)."""
        small = self.image.shape[0] * self.image.shape[1] <= 2 * size * size
        return small and self.box[2] - self.box[0] <= size and self.box[3] - self.box[1] <= size


def prepare_image(data: bytes, ext: str, augment: Augment, rng: random.Random) -> Prepared:
    """Decode ``data`` (jpg/jpeg/png/ppm) and draw its crop and flip. Raises on undecodable input, and
    (ImageTooLarge) on an image whose header claims more than ``augment.max_pixels``, before decoding it."""
    size = augment.output_size
    scale = (augment.min_crop_scale, 1.0)
    ratio = (3 / 4, 4 / 3)

    def pick_box(width: int, height: int) -> tuple[int, int, int, int]:
        if augment.train:
            return random_resized_crop_box(width, height, rng, scale, ratio)
        return center_crop_box(width, height, size, augment.val_crop_fraction)

    if augment.exif:
        orientation = _orientation(data)
        if orientation != 1:  # rare (a phone photo): decoded whole, turned, then cropped as any image
            image = np.ascontiguousarray(orient(_decode_any(data, ext, augment.max_pixels), orientation))
            box = pick_box(image.shape[1], image.shape[0])
            flip = augment.train and augment.flip and rng.random() < 0.5
            return Prepared(image, tuple(float(v) for v in box), flip)  # type: ignore[arg-type]
    dims = _jpeg_size(data) if ext in ("jpg", "jpeg") else None
    if dims is not None:
        check_pixels(dims[0], dims[1], augment.max_pixels)
        box = pick_box(*dims)
        try:
            image, factor = _decode_jpeg_reduced(data, dims[0], dims[1], box, size)
        except ValueError:
            pass
        else:
            flip = augment.train and augment.flip and rng.random() < 0.5
            return Prepared(image, tuple(v * factor for v in box), flip)  # type: ignore[arg-type]
    image = _decode_any(data, ext, augment.max_pixels)
    box = pick_box(image.shape[1], image.shape[0])
    flip = augment.train and augment.flip and rng.random() < 0.5
    return Prepared(image, tuple(float(v) for v in box), flip)  # type: ignore[arg-type]


def image_size(data: bytes, ext: str) -> tuple[int, int]:
    """(width, height) from the header alone: JPEG SOF, PPM header, or Pillow's lazy open (no decode)."""
    dims = _jpeg_size(data) if ext in ("jpg", "jpeg") else None
    if dims is not None:
        return dims
    if ext == "ppm" and data[:2] == b"P6":
        width, height, _ = ppm_header(data)
        return width, height
    from PIL import Image

    with Image.open(io.BytesIO(data), formats=_PIL_FORMATS) as img:  # reads the header only
        return img.width, img.height


def skip_image(data: bytes, ext: str, augment: Augment, rng: random.Random) -> None:
    """Draw from ``rng`` exactly what ``prepare_image`` draws for this sample (its crop box and flip)
    from the header alone, decoding nothing: a resumed epoch skips its first batches this way and the
    samples after them get the same crops and flips as in an uninterrupted epoch. (A sample that would
    fail to decode is counted as decoded-and-skipped here; only a corrupt image can tell the two apart.)"""
    width, height = image_size(data, ext)
    check_pixels(width, height, augment.max_pixels)
    if augment.train:
        random_resized_crop_box(width, height, rng, (augment.min_crop_scale, 1.0), (3 / 4, 4 / 3))
        if augment.flip:
            rng.random()


def _as_tensor(out: np.ndarray | torch.Tensor) -> torch.Tensor:
    import torch

    return torch.from_numpy(out) if isinstance(out, np.ndarray) else out


def render(prepared: Prepared, size: int, out: np.ndarray | torch.Tensor) -> None:
    """Crop + antialiased bilinear resize of one prepared image into ``out`` (3 x size x size, CHW).

    torch's uint8 channels-last kernel: the same pixels as Pillow's BILINEAR resize (mean difference
    0.02 levels measured) at 3-4x the speed, which is most of an ImageNet-size sample's budget. It
    returns planar (CHW) pixels, the batch's own layout, so they are copied once, straight into place.
    """
    import torch
    import torch.nn.functional as F

    height, width = prepared.image.shape[:2]
    left, top, right, bottom = (int(round(v)) for v in prepared.box)
    left, top = min(max(left, 0), width - 1), min(max(top, 0), height - 1)
    right, bottom = max(min(right, width), left + 1), max(min(bottom, height), top + 1)
    region = prepared.image[top:bottom, left:right]
    if not prepared.image.flags.writeable:
        region = region.copy()  # torch wants writable memory; decoded PPMs are read-only views
    chw = torch.from_numpy(region).permute(2, 0, 1)
    if chw.shape[1] != size or chw.shape[2] != size:
        nchw = chw[None].contiguous(memory_format=torch.channels_last)
        chw = F.interpolate(nchw, size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
    _as_tensor(out).copy_(chw.flip(2) if prepared.flip else chw)


def render_upscales(items: list[Prepared], size: int, out: np.ndarray | torch.Tensor) -> None:
    """Bilinear crop + resize of many same-shaped images at once into ``out`` (N x 3 x size x size;
    all crops <= ``size``: upscaling, so no antialiasing is needed). One ``grid_sample`` call for the
    group instead of one resize per image: for CIFAR-size images the per-call overhead is most of the cost.
    """
    import torch
    import torch.nn.functional as F

    images = torch.from_numpy(np.stack([p.image for p in items])).permute(0, 3, 1, 2).float()
    height, width = images.shape[2:]
    boxes = torch.tensor([p.box for p in items], dtype=torch.float32)
    centers = (torch.arange(size, dtype=torch.float32) + 0.5) / size
    # output pixel centres in input pixel units, then to grid_sample's [-1, 1] (align_corners=False)
    xs = boxes[:, 0:1] + centers[None, :] * (boxes[:, 2:3] - boxes[:, 0:1])
    ys = boxes[:, 1:2] + centers[None, :] * (boxes[:, 3:4] - boxes[:, 1:2])
    flips = torch.tensor([p.flip for p in items])
    xs = torch.where(flips[:, None], xs.flip(1), xs)
    grid = torch.stack(
        [
            (2 * xs / width - 1)[:, None, :].expand(-1, size, -1),
            (2 * ys / height - 1)[:, :, None].expand(-1, -1, size),
        ],
        dim=-1,
    )
    result = F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)
    _as_tensor(out).copy_(result.round_().clamp_(0, 255))


def render_batch(
    items: list[Prepared], size: int, out: np.ndarray | torch.Tensor, *, batch_alone: bool = False
) -> None:
    """Render prepared images into ``out[i]`` (N x 3 x size x size, a numpy array or uint8 tensor):
    upscaling crops of small same-shaped images in one batched call, everything else one by one with
    the antialiased resize. ``batch_alone``: a small image alone of its shape takes the batched call
    too, so its pixels do not depend on what else is in the batch (serving)."""
    target = _as_tensor(out)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, prepared in enumerate(items):
        if prepared.batchable(size):
            groups.setdefault(prepared.image.shape, []).append(i)
        else:
            render(prepared, size, target[i])
    for indices in groups.values():
        if len(indices) == 1 and not batch_alone:
            render(items[indices[0]], size, target[indices[0]])
        elif indices == list(range(indices[0], indices[-1] + 1)):
            render_upscales([items[i] for i in indices], size, target[indices[0] : indices[-1] + 1])
        else:
            import torch

            block = torch.empty((len(indices), 3, size, size), dtype=torch.uint8)
            render_upscales([items[i] for i in indices], size, block)
            target[indices] = block


def decode_image(data: bytes, ext: str, augment: Augment, rng: random.Random) -> np.ndarray:
    """Decode + augment one sample to a ``output_size`` square uint8 HxWx3 array."""
    out = np.empty((3, augment.output_size, augment.output_size), np.uint8)
    render(prepare_image(data, ext, augment, rng), augment.output_size, out)
    return np.ascontiguousarray(out.transpose(1, 2, 0))


def normalize(images_uint8, mean=IMAGENET_MEAN, std=IMAGENET_STD, dtype=None):
    """On-device normalisation of a uint8 NCHW batch: (x/255 - mean) / std, in ``dtype`` (default float32).

    Works on any torch device (XLA included), so loader workers ship uint8 and the device does the math.
    """
    import torch

    dtype = dtype or torch.float32
    x = images_uint8.to(dtype).div_(255.0)
    mean_t = torch.tensor(mean, dtype=dtype, device=x.device).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=dtype, device=x.device).view(1, -1, 1, 1)
    return (x - mean_t) / std_t
