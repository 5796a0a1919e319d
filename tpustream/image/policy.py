"""The training recipe's ``torchvision.transforms.v2`` policies on a whole batch at once, per sample.

TrivialAugmentWide, RandAugment and RandomErasing as torchvision defines them (the op sets and magnitude tables
are torchvision's own, read from the transform classes), but drawn per sample from one generator seeded per batch
and applied one op at a time to the samples that drew it, in batched calls on the uint8 NCHW batch. A v2
transform called on a batch draws one op for all of it; called per image (the loader did, issue 46) it cost
~0.4-1 ms of Python per image, ten times the decode and crop of a CIFAR-size sample. Each op's pixels equal
torchvision's functional op for that sample's op and magnitude (tests/unit/test_policy.py): the per-sample
parameters go into the same arithmetic (the affine grids through one ``grid_sample``, the colour factors as
per-sample tensors, the blends with torchvision's fused multiply-add rounding); a rotation by a multiple of 90
degrees (torchvision transposes) and a chunk of one image (from 256 px) are torchvision's functional op itself.
RandomErasing writes each drawn box as torchvision's ``erase`` does.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpustream.image.transforms import IMAGENET_MEAN, Augment, AugmentPolicy

if TYPE_CHECKING:
    import torch

__all__ = [
    "ERASING_FILL",
    "PolicyDraws",
    "apply_batch_policy",
    "apply_ops",
    "apply_policy",
    "draw_policy",
    "erase",
    "op_names",
]

# RandAugment's "rand-m9": 2 ops at magnitude 9 of 31 bins (timm's default, MAE's fine-tuning); TrivialAugmentWide
# draws 1 op and its magnitude bin (torchvision's defaults: 31 bins, nearest interpolation, fill 0).
_BINS = 31
_RANDAUGMENT_OPS = 2
_RANDAUGMENT_MAGNITUDE = 9
# RandomErasing's defaults (torchvision): erased area 2-33% of the image, aspect ratio 0.3-3.3, 10 tries.
_ERASE_SCALE = (0.02, 0.33)
_ERASE_RATIO = (0.3, 3.3)
_ERASE_TRIES = 10
# An op runs on the samples that drew it this many pixels at a time (64 images at 32 px, one from 256 px): a larger
# batch as float leaves the caches, and at 224 px a whole batch's op ran 2-4x slower per image than image by image
# (measured on the loader's one thread, issue 46), where batching saves little per-call overhead.
_CHUNK_PIXELS = 1 << 16
# The reference recipes erase after normalising, to 0: the mean colour, which these uint8 levels are.
ERASING_FILL = tuple(round(255 * channel) for channel in IMAGENET_MEAN)


def _space(policy: AugmentPolicy) -> dict[str, tuple[Callable[..., Any], bool]]:
    from torchvision.transforms import v2

    table = v2.TrivialAugmentWide if policy == "trivial" else v2.RandAugment
    return table._AUGMENTATION_SPACE


def op_names(policy: AugmentPolicy) -> tuple[str, ...]:
    """The policy's op set, in torchvision's order (an op's index in it is what ``PolicyDraws.ops`` holds)."""
    return () if policy == "none" else tuple(_space(policy))


@dataclass(frozen=True)
class PolicyDraws:
    """One batch's draws: ``ops[k][i]`` the op index (in ``op_names``) and ``magnitudes[k][i]`` its signed
    magnitude for round ``k`` (RandAugment: 2 rounds, in turn) of sample ``i``; ``erase[i]`` the (top, left,
    height, width) RandomErasing covers on sample ``i``, or None."""

    ops: tuple[tuple[int, ...], ...]
    magnitudes: tuple[tuple[float, ...], ...]
    erase: tuple[tuple[int, int, int, int] | None, ...]


@functools.lru_cache(maxsize=16)
def _magnitude_table(
    policy: AugmentPolicy, height: int, width: int
) -> tuple[tuple[tuple[float, ...], bool], ...]:
    """Per op: its magnitude per bin (empty: the op takes none) and whether it is signed (torchvision's table)."""
    rows = []
    for magnitudes_fn, signed in _space(policy).values():
        magnitudes = magnitudes_fn(_BINS, height, width)
        rows.append((() if magnitudes is None else tuple(float(m) for m in magnitudes), signed))
    return tuple(rows)


def draw_policy(
    policy: AugmentPolicy, random_erasing: float, count: int, height: int, width: int, seed: int
) -> PolicyDraws:
    """Each of ``count`` samples' ops, magnitudes and erased box, drawn as torchvision draws them for one image
    (op uniform over the set; TrivialAugmentWide: magnitude bin uniform over 31, RandAugment: bin 9; a signed
    magnitude negated with probability 1/2; erasing with probability ``random_erasing`` over the first of 10
    tried boxes that fits), from a generator seeded with ``seed``: the same draws for the same seed, always the
    same number of them whatever is drawn."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    rounds = {"none": 0, "trivial": 1, "randaugment": _RANDAUGMENT_OPS}[policy]
    ops_drawn: list[tuple[int, ...]] = []
    magnitudes_drawn: list[tuple[float, ...]] = []
    if rounds:
        table = _magnitude_table(policy, height, width)
        op_index = torch.randint(len(table), (rounds, count), generator=generator).tolist()
        bins = torch.randint(_BINS, (rounds, count), generator=generator).tolist()
        negate = (torch.rand((rounds, count), generator=generator) <= 0.5).tolist()
        for k in range(rounds):
            row: list[float] = []
            for i in range(count):
                magnitudes, signed = table[op_index[k][i]]
                if not magnitudes:
                    row.append(0.0)
                    continue
                magnitude = magnitudes[bins[k][i] if policy == "trivial" else _RANDAUGMENT_MAGNITUDE]
                row.append(-magnitude if signed and negate[k][i] else magnitude)
            ops_drawn.append(tuple(op_index[k]))
            magnitudes_drawn.append(tuple(row))
    erase: list[tuple[int, int, int, int] | None] = [None] * count
    if random_erasing > 0:
        area = height * width
        shape = (count, _ERASE_TRIES)
        areas = torch.empty(shape, dtype=torch.float64).uniform_(*_ERASE_SCALE, generator=generator) * area
        log_low, log_high = math.log(_ERASE_RATIO[0]), math.log(_ERASE_RATIO[1])
        aspects = (
            torch.empty(shape, dtype=torch.float64).uniform_(log_low, log_high, generator=generator).exp()
        )
        place = torch.rand((count, _ERASE_TRIES, 2), dtype=torch.float64, generator=generator)
        heights = torch.sqrt(areas * aspects).round_().long()  # round half to even, as Python's round
        widths = torch.sqrt(areas / aspects).round_().long()
        fits = (heights < height) & (
            widths < width
        )  # torchvision's test; none of the 10 fits: nothing erased
        first = fits.long().argmax(dim=1, keepdim=True)  # the first try that fits
        h, w = heights.gather(1, first)[:, 0], widths.gather(1, first)[:, 0]
        top = (place[:, :, 0].gather(1, first)[:, 0] * (height - h + 1)).long()
        left = (place[:, :, 1].gather(1, first)[:, 0] * (width - w + 1)).long()
        chosen = (torch.rand(count, generator=generator) < random_erasing) & fits.any(dim=1)
        boxes = torch.stack([top, left, h, w], dim=1).tolist()
        for i in chosen.nonzero()[:, 0].tolist():
            erase[i] = (boxes[i][0], boxes[i][1], boxes[i][2], boxes[i][3])
    return PolicyDraws(tuple(ops_drawn), tuple(magnitudes_drawn), tuple(erase))


def _fma_blend(image: torch.Tensor, other: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """torchvision's ``_blend`` (``image * r`` then ``add_(other, alpha=1 - r)``, clamped, truncated to uint8)
    with a per-sample ``ratio`` (N x 1 x 1 x 1, float64 holding each sample's Python float). The ``add_`` is
    one fused multiply-add in torch's vectorised kernel: computed here in float64 (exact for these operands:
    an 8-bit level times a float32 factor plus a float32 sum fits 53 bits) and rounded once to float32."""
    import torch

    scaled = image.to(torch.float32).mul_(ratio.to(torch.float32))
    alpha = (1.0 - ratio).to(torch.float32).to(torch.float64)
    fused = scaled.to(torch.float64).add_(other.to(torch.float64).mul_(alpha)).to(torch.float32)
    return fused.clamp_(0, 255).to(torch.uint8)


def _grayscale(images: torch.Tensor) -> torch.Tensor:
    """torchvision's ``_rgb_to_grayscale_image`` (float, then floored for uint8 input), N x 1 x H x W."""
    red, green, blue = images.unbind(dim=-3)
    luma = red.mul(0.2989).add_(green, alpha=0.587).add_(blue, alpha=0.114)
    return luma.unsqueeze(dim=-3).floor_()


def _sharpness(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's ``adjust_sharpness_image`` with a per-sample factor: the 3x3 smoothing kernel, rounded, the
    border kept, the inside blended as ``x + (1 - f) * (blur - x)`` (one fused multiply-add, as ``_fma_blend``)."""
    import torch
    from torch.nn.functional import conv2d

    height, width = images.shape[-2:]
    if height <= 2 or width <= 2:
        return images
    a, b = 1.0 / 13.0, 5.0 / 13.0
    kernel = torch.tensor([[a, a, a], [a, b, a], [a, a, a]], dtype=torch.float32).expand(3, 1, 3, 3)
    output = images.to(dtype=torch.float32, copy=True)
    blurred = conv2d(output, kernel, groups=3).round_()
    view = output[..., 1:-1, 1:-1]
    alpha = (1.0 - factor).to(torch.float32).to(torch.float64)
    difference = blurred.sub_(view).to(torch.float64)
    view.copy_(view.to(torch.float64).add_(difference.mul_(alpha)).to(torch.float32))
    return output.clamp_(0, 255).to(torch.uint8)


def _inverse_affine(op: str, magnitude: float, height: int, width: int) -> list[float] | None:
    """The inverse affine matrix torchvision's F.affine / F.rotate builds for this shear (ShearX, ShearY) or
    rotation, or None for a rotation torchvision does without one (0, 90, 180, 270 degrees: a transpose)."""
    from torchvision.transforms.v2.functional._geometry import _get_inverse_affine_matrix

    if op == "Rotate":
        angle = magnitude % 360
        if angle in (0, 90, 180, 270):
            return None
        return _get_inverse_affine_matrix([0.0, 0.0], -angle, [0.0, 0.0], 1.0, [0.0, 0.0])
    corner = [-width * 0.5, -height * 0.5]  # the policies shear about the top-left corner (center=[0, 0])
    if op == "ShearX":
        return _get_inverse_affine_matrix(
            corner, 0.0, [0.0, 0.0], 1.0, [math.degrees(math.atan(magnitude)), 0.0]
        )
    return _get_inverse_affine_matrix(corner, 0.0, [0.0, 0.0], 1.0, [0.0, math.degrees(math.atan(magnitude))])


@functools.lru_cache(maxsize=4)
def _base_grid(height: int, width: int) -> torch.Tensor:
    """torchvision's ``_affine_grid`` base: output pixel centres about the image centre, and a 1, (H*W) x 3."""
    import torch

    grid = torch.empty(1, height, width, 3, dtype=torch.float32)
    grid[..., 0].copy_(torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, steps=width))
    grid[..., 1].copy_(
        torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, steps=height).unsqueeze_(-1)
    )
    grid[..., 2].fill_(1)
    return grid.view(1, height * width, 3)


def _warp(images: torch.Tensor, matrices: list[list[float]]) -> torch.Tensor:
    """Each image through its own inverse affine matrix: torchvision's ``_affine_grid`` per sample (its
    product, batched) and one nearest ``grid_sample`` for all, zeros outside, rounded."""
    import torch
    from torch.nn.functional import grid_sample

    height, width = images.shape[-2:]
    theta = torch.tensor(matrices, dtype=torch.float32).reshape(-1, 2, 3)
    rescaled = theta.transpose(1, 2).div_(torch.tensor([0.5 * width, 0.5 * height], dtype=torch.float32))
    base = _base_grid(height, width)
    grids = base.expand(len(matrices), -1, -1).bmm(rescaled)
    warped = grid_sample(
        images.to(torch.float32),
        grids.view(-1, height, width, 2),
        mode="nearest",
        padding_mode="zeros",
        align_corners=False,
    )
    return warped.round_().to(torch.uint8)


def _translate(images: torch.Tensor, magnitudes: list[float], *, horizontal: bool) -> torch.Tensor:
    """Each image shifted by ``int(m)`` whole pixels (right or down for m > 0), zeros shifted in: the pixels of
    torchvision's nearest ``grid_sample`` at a whole-pixel translation (each output pixel's source lands within
    float rounding of a pixel centre, never near the half-way), as two slices instead of a float grid."""
    import torch

    out = torch.zeros_like(images)
    side = images.shape[-1] if horizontal else images.shape[-2]
    for index, magnitude in enumerate(magnitudes):
        shift = int(magnitude)
        if abs(shift) >= side:
            continue
        source = slice(max(-shift, 0), side - max(shift, 0))
        target = slice(max(shift, 0), side - max(-shift, 0))
        if horizontal:
            out[index, :, :, target] = images[index, :, :, source]
        else:
            out[index, :, target, :] = images[index, :, source, :]
    return out


def _apply_op(op: str, images: torch.Tensor, magnitudes: list[float]) -> torch.Tensor:
    """``op`` on ``images`` (uint8 N x 3 x H x W), sample ``i`` at ``magnitudes[i]``: torchvision's pixels."""
    import torch
    from torchvision.transforms.v2 import functional as F

    def per_sample(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float64).view(-1, 1, 1, 1)

    height, width = images.shape[-2:]
    if op == "Identity":
        return images
    if op in ("TranslateX", "TranslateY"):
        return _translate(images, magnitudes, horizontal=op == "TranslateX")
    if op in ("ShearX", "ShearY", "Rotate"):
        matrices = [_inverse_affine(op, magnitude, height, width) for magnitude in magnitudes]
        out = images.clone()
        warped = [i for i, matrix in enumerate(matrices) if matrix is not None]
        if warped:
            out[warped] = _warp(images[warped], [matrices[i] for i in warped])  # type: ignore[misc]
        for angle in {magnitudes[i] for i, matrix in enumerate(matrices) if matrix is None}:
            turned = [i for i, magnitude in enumerate(magnitudes) if magnitude == angle]
            out[turned] = F.rotate(images[turned], angle=angle)
        return out
    if op == "Brightness":  # image * (1 + m), clamped, truncated
        factor = per_sample([1.0 + magnitude for magnitude in magnitudes]).to(torch.float32)
        return images.mul(factor).clamp_(0, 255).to(torch.uint8)
    if op == "Color":  # blend with the floored greyscale image
        return _fma_blend(images, _grayscale(images), per_sample([1.0 + m for m in magnitudes]))
    if op == "Contrast":  # blend with the floored greyscale image's mean
        mean = torch.mean(_grayscale(images), dim=(-3, -2, -1), keepdim=True)
        return _fma_blend(images, mean, per_sample([1.0 + m for m in magnitudes]))
    if op == "Sharpness":
        return _sharpness(images, per_sample([1.0 + m for m in magnitudes]))
    if op == "Posterize":  # keep the top ``bits`` bits
        masks = [(((1 << int(m)) - 1) << (8 - int(m))) if int(m) < 8 else 255 for m in magnitudes]
        return images & torch.tensor(masks, dtype=torch.uint8).view(-1, 1, 1, 1)
    if op == "Solarize":  # invert the levels at or above 255 * m (as float32): at or above its ceiling
        threshold = per_sample([255 * magnitude for magnitude in magnitudes]).to(torch.float32).ceil_()
        return torch.where(images >= threshold.to(torch.uint8), images.bitwise_not(), images)
    if op == "AutoContrast":  # per image and channel: torchvision's kernel is per sample on a batch
        return F.autocontrast(images)
    if op == "Equalize":
        return F.equalize(images)
    raise ValueError(f"no batched form of the policy op {op!r}")


def _one(op: str, image: torch.Tensor, magnitude: float) -> torch.Tensor:
    """``op`` on one image as torchvision's policies call it (``_AutoAugmentBase._apply_image_or_video_transform``:
    nearest interpolation, fill 0, shears about the top-left corner); solarizing (a uint8 comparison where
    torchvision's is in float32, the same levels) and the ops without a magnitude through ``_apply_op``."""
    from torchvision.transforms.v2 import functional as F

    if op in ("ShearX", "ShearY"):
        degrees = math.degrees(math.atan(magnitude))
        shear = [degrees, 0.0] if op == "ShearX" else [0.0, degrees]
        return F.affine(image, angle=0.0, translate=[0, 0], scale=1.0, shear=shear, center=[0, 0])
    if op == "Rotate":
        return F.rotate(image, angle=magnitude)
    if op == "Brightness":
        return F.adjust_brightness(image, brightness_factor=1.0 + magnitude)
    if op == "Color":
        return F.adjust_saturation(image, saturation_factor=1.0 + magnitude)
    if op == "Contrast":
        return F.adjust_contrast(image, contrast_factor=1.0 + magnitude)
    if op == "Sharpness":
        return F.adjust_sharpness(image, sharpness_factor=1.0 + magnitude)
    if op == "Posterize":
        return F.posterize(image, bits=int(magnitude))
    return _apply_op(op, image[None], [magnitude])[0]


def apply_ops(
    images: torch.Tensor, names: tuple[str, ...], ops: tuple[int, ...], magnitudes: tuple[float, ...]
) -> None:
    """One round of per-sample ops on ``images`` in place: each op on the samples that drew it, ``_CHUNK_PIXELS``
    at a time (one image at a time from 256 x 256: torchvision's functional op on it)."""
    groups: dict[int, list[int]] = {}
    for index, op in enumerate(ops):
        groups.setdefault(op, []).append(index)
    step = max(1, _CHUNK_PIXELS // (images.shape[-2] * images.shape[-1]))
    for op, members in groups.items():
        name = names[op]
        if name == "Identity":
            continue
        for start in range(0, len(members), step):
            chunk = members[start : start + step]
            if len(chunk) == 1:
                images[chunk[0]] = _one(name, images[chunk[0]], magnitudes[chunk[0]])
            else:
                images[chunk] = _apply_op(name, images[chunk], [magnitudes[i] for i in chunk])


def erase(images: torch.Tensor, boxes: tuple[tuple[int, int, int, int] | None, ...]) -> None:
    """RandomErasing's boxes (top, left, height, width; None: not erased) filled with ``ERASING_FILL``, in place:
    each box written as torchvision's ``erase`` writes it, a slice assignment of its area alone."""
    import torch

    fill = torch.tensor(ERASING_FILL, dtype=torch.uint8).view(3, 1, 1)
    for index, box in enumerate(boxes):
        if box is not None:
            top, left, height, width = box
            images[index, :, top : top + height, left : left + width] = fill


def apply_batch_policy(images: torch.Tensor, policy: AugmentPolicy, random_erasing: float, seed: int) -> None:
    """``policy`` then RandomErasing at ``random_erasing`` on each of ``images`` (uint8 N x 3 x H x W), in place,
    every sample drawing its own ops and box from the batch's ``seed`` (``draw_policy``)."""
    count, _, height, width = images.shape
    draws = draw_policy(policy, random_erasing, count, height, width, seed)
    names = op_names(policy)
    for ops, magnitudes in zip(draws.ops, draws.magnitudes, strict=True):
        apply_ops(images, names, ops, magnitudes)
    erase(images, draws.erase)


def apply_policy(images: torch.Tensor, augment: Augment, seed: int) -> None:
    """``augment``'s v2 policy and random erasing on each of ``images`` (N x 3 x S x S uint8), in place.

    Each image draws its own ops from a generator seeded with ``seed`` (the loader's, per worker and batch), so
    the pixels follow from the seed alone and no global generator is touched; each op runs on all the images
    that drew it at once (a v2 transform called per image cost ~0.4-1 ms of Python each: a tenth of the
    loader's speed at 32 px, issue 46).
    """
    if not augment.has_policy:
        return
    apply_batch_policy(images, augment.policy, augment.random_erasing, seed)
