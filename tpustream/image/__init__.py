"""Images: ``codec`` decodes and checks bytes (EXIF orientation, pixel budget, PPM), ``transforms`` resizes,
crops, augments and renders them into a batch.

The names below are the package's public API, imported on first use so that importing the package loads nothing
heavy (``tpustream --help`` stays torch-free); the modules themselves are imported by their full path inside tpustream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from tpustream.image.codec import CorruptImage, ImageTooLarge, UnreadableImage, decode_rgb
    from tpustream.image.transforms import Augment, prepare_image, render_batch

_HOMES = {
    "decode_rgb": "codec",
    "CorruptImage": "codec",
    "UnreadableImage": "codec",
    "ImageTooLarge": "codec",
    "Augment": "transforms",
    "prepare_image": "transforms",
    "render_batch": "transforms",
}
__all__ = [
    "CorruptImage",
    "ImageTooLarge",
    "UnreadableImage",
    "decode_rgb",
    "Augment",
    "prepare_image",
    "render_batch",
]

__getattr__, __dir__ = lazy_front(__name__, _HOMES)
