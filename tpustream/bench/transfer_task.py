"""A procedural transfer task for ``bench finetune``: classes drawn from shared visual primitives, a source
task to pretrain on and a disjoint target task made of the same primitives in new combinations.

A class is a (shape, fill texture) pair: 6 shapes (circle, square, triangle, ring, cross, half-disc; no diamond: under a random rotation it is
a square) times 5
textures (solid, stripes, checker, dots, grid) make 30 classes; 8 of them, chosen so that each of their
shapes and textures also appears in at least two source classes, are the target task and the other 22 the
source task. What a network learns on the source (the edges of each shape, the frequency and layout of each
texture) is what the target needs, but no target class is ever seen in pretraining. Each image draws its
own colours (shape, texture's second tone, background), position, scale, rotation, texture angle and period,
and pixel noise, so colour alone separates nothing. Every image is a pure function of (seed, class, index):
the same seed gives the same pixels on every machine.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "SHAPES",
    "TEXTURES",
    "TransferClass",
    "SOURCE_CLASSES",
    "TARGET_CLASSES",
    "draw_image",
    "write_folder",
]

SHAPES = ("circle", "square", "triangle", "ring", "cross", "half-disc")
TEXTURES = ("solid", "stripes", "checker", "dots", "grid")
IMAGE_SIDE = 64


@dataclass(frozen=True)
class TransferClass:
    """One class: a shape filled with a texture; ``name`` is its folder name."""

    shape: str
    texture: str

    @property
    def name(self) -> str:
        return f"{self.shape}-{self.texture}"


# One target class per shape (two shapes twice) and per texture (three textures twice), on a diagonal of the
# shape x texture grid: every target shape keeps 3-4 source textures and every target texture 4-5 source
# shapes.
_TARGET_PAIRS = ((0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 0), (0, 1), (1, 2))
TARGET_CLASSES: tuple[TransferClass, ...] = tuple(
    TransferClass(SHAPES[s], TEXTURES[t]) for s, t in _TARGET_PAIRS
)
SOURCE_CLASSES: tuple[TransferClass, ...] = tuple(
    TransferClass(shape, texture)
    for shape in SHAPES
    for texture in TEXTURES
    if TransferClass(shape, texture) not in TARGET_CLASSES
)


def _shape_mask(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Where ``shape`` covers the plane, in its own coordinates (unit radius, centred, upright)."""
    radius = np.sqrt(u * u + v * v)
    if shape == "circle":
        return radius <= 1.0
    if shape == "square":
        return np.maximum(np.abs(u), np.abs(v)) <= 0.78
    if shape == "triangle":
        inside = np.ones_like(u, dtype=bool)
        for angle in (np.pi / 2, np.pi / 2 + 2 * np.pi / 3, np.pi / 2 + 4 * np.pi / 3):
            inside &= u * np.cos(angle) + v * np.sin(angle) <= 0.55
        return inside
    if shape == "ring":
        return (radius <= 1.0) & (radius >= 0.55)
    if shape == "cross":
        return ((np.abs(u) <= 0.32) & (np.abs(v) <= 1.0)) | ((np.abs(v) <= 0.32) & (np.abs(u) <= 1.0))
    if shape == "half-disc":
        return (radius <= 1.0) & (v >= -0.15)
    raise ValueError(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}")


def _texture(texture: str, x: np.ndarray, y: np.ndarray, period: float) -> np.ndarray:
    """The texture's first tone (True) or second (False) at each pixel, in the texture's rotated frame."""
    if texture == "solid":
        return np.ones_like(x, dtype=bool)
    if texture == "stripes":
        return np.mod(x, period) < period / 2
    if texture == "checker":
        return (np.floor(x / period) + np.floor(y / period)) % 2 == 0
    if texture == "dots":
        dx, dy = np.mod(x, period) - period / 2, np.mod(y, period) - period / 2
        return dx * dx + dy * dy > (period / 3.2) ** 2
    if texture == "grid":
        return (np.mod(x, period) >= 1.5) & (np.mod(y, period) >= 1.5)
    raise ValueError(f"unknown texture {texture!r}: one of {', '.join(TEXTURES)}")


def _colour(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0, 255, size=3)


def draw_image(cls: TransferClass, seed: int, index: int) -> np.ndarray:
    """Image ``index`` of class ``cls`` under ``seed``: a 64x64x3 uint8 array (the same on every machine)."""
    class_id = (SHAPES.index(cls.shape), TEXTURES.index(cls.texture))
    rng = np.random.default_rng([seed, *class_id, index])
    side = IMAGE_SIDE
    y, x = np.mgrid[0:side, 0:side].astype(np.float64) + 0.5
    # the shape: a random radius, centre (inside the image), rotation
    radius = rng.uniform(0.28, 0.42) * side
    cx, cy = rng.uniform(radius * 0.9, side - radius * 0.9, size=2)
    turn = rng.uniform(0, 2 * np.pi)
    dx, dy = (x - cx) / radius, (y - cy) / radius
    u, v = dx * np.cos(turn) + dy * np.sin(turn), -dx * np.sin(turn) + dy * np.cos(turn)
    mask = _shape_mask(cls.shape, u, v)
    # the texture: a random angle and period, its own two tones; the two tones far enough apart to show
    # periods of 10-16 px: a ResNet's stem downsamples 4x, and a texture of 5-9 px (the first version) reached
    # its first block as 1-2 px stripes: resnet18 stayed at chance on the source task (8 epochs: 0.068, chance
    # 0.045), against 0.173 with these periods in the same steps (the tiny CNN, no stride: 0.346)
    angle, period = rng.uniform(0, np.pi), rng.uniform(10.0, 16.0)
    tx, ty = x * np.cos(angle) + y * np.sin(angle), -x * np.sin(angle) + y * np.cos(angle)
    first = _colour(rng)
    second = first + rng.choice([-1.0, 1.0], size=3) * rng.uniform(80, 160, size=3)
    second = np.clip(second, 0, 255)
    background = _colour(rng)
    tone = _texture(cls.texture, tx, ty, period)
    fill = np.where(tone[..., None], first, second)
    pixels = np.where(mask[..., None], fill, background)
    pixels = pixels + rng.normal(0, 12.0, size=pixels.shape)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def write_folder(root: str, classes: Sequence[TransferClass], seed: int, indices: Sequence[int]) -> str:
    """An ImageFolder under ``root``: one folder per class, image ``i`` of it for each ``i`` in ``indices``
    (PNG, lossless: the pixels ``draw_image`` gives). Returns ``root``."""
    from PIL import Image

    for cls in classes:
        folder = os.path.join(root, cls.name)
        os.makedirs(folder, exist_ok=True)
        for index in indices:
            Image.fromarray(draw_image(cls, seed, index)).save(os.path.join(folder, f"{index:05d}.png"))
    return root
