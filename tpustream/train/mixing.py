"""MixUp and CutMix inside the compiled step, with fixed shapes: one graph whatever a step draws.

The host draws each step's mix (``draw_mix``, seeded by the run's seed and the step, so a resumed run draws
what the uninterrupted one did) as seven numbers, sent to the device as one small tensor: the graph sees
data, never a Python branch or a box-sized slice. ``mix_images`` blends every image with its partner in the
batch reversed (timm's ``Mixup``: the batch is shuffled already, so reversing it pairs at random) through a
per-pixel weight, the box's for CutMix and lambda everywhere for MixUp; ``mixed_loss`` is the soft-target
cross entropy (label smoothing on top) of the targets mixed by the same lambda.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["MIX_FIELDS", "draw_mix", "mix_images", "mixed_loss", "soft_targets"]

# draw_mix's numbers, in order: the box [x0, x1) x [y0, y1) in pixels, the image's own weight inside and
# outside it, and lambda (the own label's weight: the share of the image that is its own).
MIX_FIELDS = ("x0", "x1", "y0", "y1", "inside", "outside", "lam")
_STREAM = 46  # keys the mix's draws apart from the seed's other uses


def draw_mix(step: int, *, seed: int, mixup_alpha: float, cutmix_alpha: float, size: int) -> list[float]:
    """Step ``step``'s mix of ``size`` px images (``MIX_FIELDS``): CutMix or MixUp, half the time each when
    both alphas are positive (timm's ``switch_prob`` 0.5), lambda ~ Beta(alpha, alpha). CutMix's box is timm's
    ``rand_bbox`` (centre uniform, sides sqrt(1 - lambda) of the image's, clipped) and its lambda corrected
    to the share of the image outside the clipped box."""
    if mixup_alpha <= 0 and cutmix_alpha <= 0:
        raise ValueError("draw_mix needs mixup_alpha or cutmix_alpha above 0")
    rng = np.random.default_rng([seed, step, _STREAM])
    cutmix = cutmix_alpha > 0 and (mixup_alpha <= 0 or rng.random() < 0.5)
    if not cutmix:
        lam = float(rng.beta(mixup_alpha, mixup_alpha))
        return [0.0, 0.0, 0.0, 0.0, lam, lam, lam]
    cut = math.sqrt(1.0 - float(rng.beta(cutmix_alpha, cutmix_alpha)))
    side = int(size * cut)
    cx, cy = int(rng.integers(size)), int(rng.integers(size))
    x0, x1 = min(max(cx - side // 2, 0), size), min(max(cx + side // 2, 0), size)
    y0, y1 = min(max(cy - side // 2, 0), size), min(max(cy + side // 2, 0), size)
    lam = 1.0 - (x1 - x0) * (y1 - y0) / (size * size)
    return [float(x0), float(x1), float(y0), float(y1), 0.0, 1.0, lam]


def mix_images(images: Any, mix: Any) -> Any:
    """``images`` (N x C x H x W, float) blended with the batch reversed by ``mix`` (a device tensor of
    ``MIX_FIELDS``): each pixel is ``w * own + (1 - w) * partner``, w = inside or outside the box."""
    import torch

    height, width = images.shape[-2:]
    x0, x1, y0, y1, inside, outside, _ = mix.unbind()
    rows = torch.arange(height, device=images.device, dtype=mix.dtype).view(1, 1, height, 1)
    cols = torch.arange(width, device=images.device, dtype=mix.dtype).view(1, 1, 1, width)
    in_box = (cols >= x0) & (cols < x1) & (rows >= y0) & (rows < y1)
    weight = torch.where(in_box, inside, outside).to(images.dtype)
    return images * weight + images.flip(0) * (1 - weight)


def soft_targets(labels: Any, mix: Any, num_classes: int) -> Any:
    """Each sample's target distribution (N x classes, rows summing to 1): lambda on its own label, 1 - lambda
    on its partner's (the batch reversed)."""
    import torch.nn.functional as F

    lam = mix[-1]
    one_hot = F.one_hot(labels, num_classes).to(mix.dtype)
    return one_hot * lam + one_hot.flip(0) * (1 - lam)


def mixed_loss(
    logits: Any, labels: Any, mix: Any, *, label_smoothing: float, class_weights: Any = None, mask: Any = None
) -> Any:
    """Mean soft-target cross entropy: each sample's target is lambda of its one-hot label and 1 - lambda of
    its partner's (smoothed by ``label_smoothing`` as ``F.cross_entropy`` smooths probabilities); with
    ``class_weights``, each sample's loss weighs lambda of its class's weight and 1 - lambda of its partner's.
    ``mask`` (None: every sample): the mean is over the samples it marks (the padded last batch's real ones;
    its padding slots are copies of real samples, so a real sample's partner is a real image either way)."""
    import torch.nn.functional as F

    from tpustream.metrics.masked import masked_mean

    lam = mix[-1]
    targets = soft_targets(labels, mix, logits.shape[-1]).to(logits.dtype)
    losses = F.cross_entropy(logits, targets, label_smoothing=label_smoothing, reduction="none")
    if class_weights is not None:
        weights = class_weights[labels]
        losses = losses * (weights * lam + weights.flip(0) * (1 - lam))
    return losses.mean() if mask is None else masked_mean(losses, mask)
