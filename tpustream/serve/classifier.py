"""The classifier the model server and ``tpustream predict`` run: a model artifact (model.pt + model.json, or a
registry's champion) that turns image bytes into top-k classes with probabilities.

Images go through the validation transform the trainer and ``tpustream evaluate`` use (``prepare_image``
with ``Augment(train=False)``: centre crop + antialiased resize, then ``normalize`` with model.json's mean
and std). Small images are upscaled with the batched resample the evaluation loader applies to a batch of
same-shaped images (``render_upscales``), for a lone image too, so an image's answer does not depend on
which other images share its request. Every format shard creation accepts is served
(``sources.image_folder.IMAGE_EXTENSIONS``, recognised by its first bytes: ``image.codec.sniff_format``): JPEG, PNG
and PPM as the loader decodes them; PGM/PBM, BMP, GIF, WebP and TIFF as shard creation decodes them before
storing them losslessly (``image.codec.decode_rgb``), each with the same pixel budget, checked from its header.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from tpustream.errors import TpustreamError
from tpustream.image.codec import PIL_FORMATS, sniff_format
from tpustream.registry.store import CHAMPION, read_champion, version_uri
from tpustream.serve.settings import Limits
from tpustream.storage import io as storage

if TYPE_CHECKING:
    import torch

    from tpustream.image.transforms import Prepared

__all__ = [
    "BadImage",
    "BadModel",
    "Classifier",
    "IMAGE_FORMATS",
    "TopK",
    "image_format",
    "resolve_model_uri",
]

log = logging.getLogger(__name__)

# The formats image_format recognises: every one shard creation accepts (sources.image_folder.IMAGE_EXTENSIONS).
IMAGE_FORMATS = tuple(PIL_FORMATS)
_FORMAT_NAMES = "JPEG, PNG, PPM/PGM/PBM, BMP, GIF, WebP or TIFF"
# Decoded as the loader decodes shard members; the other formats as shard creation decodes them.
_LOADER_FORMATS = ("jpg", "png", "ppm")


class BadImage(TpustreamError, ValueError):
    """One image cannot be classified (not an image, too large, undecodable); the message says which."""


class BadModel(TpustreamError, ValueError):
    """The model artifact cannot be served; the message says what and what to do."""


def image_format(data: bytes) -> str | None:
    """``jpg``, ``png``, ``ppm`` (also PGM/PBM), ``bmp``, ``gif``, ``webp`` or ``tiff`` from the file's first
    bytes, else None: the formats shard creation accepts."""
    return sniff_format(data)


class TopK(TypedDict):
    """One image's answer (``Classifier.classify``), as the server sends it: the classes, their indices and
    softmax probabilities, most probable first."""

    classes: list[str]
    class_indices: list[int]
    probabilities: list[float]


def resolve_model_uri(uri: str) -> str:
    """A model directory (model.json) as is; a registry (champion.json) -> its champion's version."""
    uri = storage.check_uri(uri).rstrip("/")
    if storage.exists(storage.join(uri, "model.json")):
        return uri
    if storage.exists(storage.join(uri, CHAMPION)):
        champion = read_champion(uri)
        assert champion is not None
        version = version_uri(uri, champion.version)
        log.info("%s is a registry: using its champion, version %s (%s)", uri, champion.version, version)
        return version
    raise BadModel(
        f"--model {uri}: neither a model directory (model.json) nor a registry with a champion "
        "(champion.json): give the output of `tpustream train` or a promoted registry"
    )


def _budget_hint(message: str) -> str:
    return message.replace("raise --max-pixels", "raise TPUSTREAM_MAX_PIXELS")


class Classifier:
    """A model artifact ready to classify image bytes: top-k classes with probabilities per image."""

    def __init__(self, model_uri: str, *, limits: Limits | None = None, device: Any = None) -> None:
        import torch

        from tpustream.image.transforms import IMAGENET_MEAN, IMAGENET_STD, Augment
        from tpustream.models import network_for_card
        from tpustream.train.checkpoint import CheckpointError, load_torch_file
        from tpustream.train.evaluate import EvaluationError, load_model_card

        self.limits = limits or Limits()
        self.uri = resolve_model_uri(model_uri)
        try:
            card = load_model_card(self.uri)
        except EvaluationError as exc:
            raise BadModel(str(exc)) from exc
        self.classes: list[str] = list(card.classes)
        self.input_size = card.input_size
        norm = card.normalization
        self.mean = tuple(float(v) for v in norm.get("mean", IMAGENET_MEAN))
        self.std = tuple(float(v) for v in norm.get("std", IMAGENET_STD))
        if float(norm.get("scale", 255)) != 255:
            raise BadModel(
                f"{self.uri}/model.json: normalization scale {norm['scale']} is not 255 (uint8 pixels)"
            )
        try:
            weights, self.model_sha256 = load_torch_file(
                storage.join(self.uri, "model.pt"), what="model weights"
            )
        except CheckpointError as exc:
            raise BadModel(f"{exc}: the model artifact is incomplete or corrupt; re-export it") from exc
        model = network_for_card(card)  # the stem model.json records, however the weights began
        try:
            model.load_state_dict(weights)
        except RuntimeError as exc:
            raise BadModel(f"{self.uri}/model.pt does not match its model.json ({card.arch}): {exc}") from exc
        self.device = device if device is not None else torch.device("cpu")
        self.model = model.to(self.device).eval()
        self.augment = Augment(
            output_size=self.input_size,
            train=False,
            max_pixels=self.limits.max_pixels,
            exif=True,
            val_crop_fraction=card.val_crop_fraction,  # model.json's preprocessing, as evaluate's loader
        )

    # ------------------------------------------------------------------ images -> uint8 pixels

    def _format(self, data: bytes, name: str) -> str:
        if len(data) > self.limits.max_image_bytes:
            raise BadImage(
                f"{name}: {len(data)} bytes exceeds the {self.limits.max_image_bytes}-byte image limit "
                "(TPUSTREAM_MAX_IMAGE_BYTES): send a smaller image"
            )
        ext = image_format(data)
        if ext is None:  # its first bytes are not quoted: an answer never repeats request content
            raise BadImage(f"{name}: not a {_FORMAT_NAMES} image (no such file signature in its first bytes)")
        return ext

    def measure(self, data: bytes, name: str = "image") -> int:
        """The pixel count an image's header claims, decoding nothing; refuses (BadImage) what ``prepare``
        would refuse before decoding: too many bytes, not a supported format, an unreadable header, more
        pixels than ``limits.max_pixels``."""
        from tpustream.image.codec import CorruptImage, ImageTooLarge, check_pixels, image_dimensions

        ext = self._format(data, name)
        try:
            width, height = image_dimensions(data, ext, name)
            check_pixels(width, height, self.limits.max_pixels, name)
        except ImageTooLarge as exc:
            raise self._too_large(exc, name) from exc
        except CorruptImage as exc:
            raise self._undecodable(exc, name, PIL_FORMATS[ext]) from exc
        if width < 1 or height < 1:
            raise BadImage(f"{name}: undecodable {PIL_FORMATS[ext]} (an empty {width}x{height} image)")
        return width * height

    def prepare(self, data: bytes, name: str = "image") -> Prepared:
        """Decode one image (its header's pixel count checked before decoding) and place its centre crop."""
        from tpustream.image.codec import ImageTooLarge, decode_rgb
        from tpustream.image.transforms import Prepared, center_crop_box, prepare_image

        ext = self._format(data, name)
        kind = PIL_FORMATS[ext]
        try:
            if ext in _LOADER_FORMATS:
                return prepare_image(data, ext, self.augment, random.Random(0))  # val: no randomness used
            image = decode_rgb(data, ext, self.limits.max_pixels, name)
        except ImageTooLarge as exc:
            raise self._too_large(exc, name) from exc
        except Exception as exc:  # CorruptImage, or PIL/simplejpeg's many types for a damaged file
            raise self._undecodable(exc, name, kind) from exc
        if image.size == 0:
            raise BadImage(f"{name}: undecodable {kind} (an empty {image.shape[1]}x{image.shape[0]} image)")
        box = center_crop_box(  # prepare_image's val crop
            image.shape[1], image.shape[0], self.input_size, self.augment.val_crop_fraction
        )
        return Prepared(image, (float(box[0]), float(box[1]), float(box[2]), float(box[3])), False)

    def _too_large(self, exc: Exception, name: str) -> BadImage:
        """Our pixel budget, named as the server's setting, also where Pillow's own bomb limit (2 x 89 MP,
        above any budget) refused the header first: its message is Pillow's, not ours."""
        from PIL import Image

        if isinstance(exc.__cause__, Image.DecompressionBombError):
            return BadImage(
                f"{name}: its header claims more than {2 * (Image.MAX_IMAGE_PIXELS or 0) / 1e6:.0f} MP, over "
                f"the pixel budget of {self.limits.max_pixels / 1e6:.1f} MP per image (TPUSTREAM_MAX_PIXELS): "
                "send a smaller image"
            )
        message = str(exc) if str(exc).startswith(name) else f"{name}: {exc}"
        return BadImage(_budget_hint(message))

    @staticmethod
    def _undecodable(exc: Exception, name: str, kind: str) -> BadImage:
        """A damaged image, said without the decoder's message (Pillow's can quote the file's bytes, e.g. a
        PNG chunk name): that goes to the server log."""
        cause = exc.__cause__ if isinstance(exc, TpustreamError) and exc.__cause__ is not None else exc
        log.info("%s: undecodable %s: %s", name, kind, exc)
        return BadImage(f"{name}: undecodable {kind} (truncated or damaged: {type(cause).__name__})")

    def pixels(self, prepared: list[Prepared]) -> torch.Tensor:
        """N x 3 x S x S uint8: the evaluation loader's render (render_batch), with small same-shaped
        images always upscaled by the batched resample, also when one is alone in its request."""
        import torch

        from tpustream.image.transforms import render_batch

        size = self.input_size
        out = torch.empty((len(prepared), 3, size, size), dtype=torch.uint8)
        render_batch(prepared, size, out, batch_alone=True)
        return out

    def render_images(
        self, images: Sequence[tuple[bytes, str]], *, failed: dict[int, str] | None = None
    ) -> torch.Tensor:
        """``pixels([prepare(data, name) ...])`` with one decoded image alive at a time: each large image is
        rendered into the batch as soon as it is decoded and then released; the small ones ``render_batch``
        upscales together (at most 2 x S^2 px each) are kept and rendered at the end, as it would.

        With ``failed``, an image that cannot be decoded does not fail the others: its message is recorded
        there under its index in ``images`` and it has no row in the batch (the rows are the other images',
        in order); without it, the first such image raises BadImage."""
        import torch

        from tpustream.image.transforms import render, render_batch

        size = self.input_size
        out = torch.empty((len(images), 3, size, size), dtype=torch.uint8)
        small: list[Prepared] = []
        small_at: list[int] = []
        for index, (data, name) in enumerate(images):
            try:
                prepared = self.prepare(data, name)
            except BadImage as exc:
                if failed is None:
                    raise
                failed[index] = str(exc)
                continue
            if prepared.batchable(size):
                small.append(prepared)
                small_at.append(index)
            else:  # rendered alone by render_batch too: nothing else in the batch changes its pixels
                render(prepared, size, out[index])
            del prepared  # before the next image is decoded
        if small:
            block = torch.empty((len(small), 3, size, size), dtype=torch.uint8)
            render_batch(small, size, block, batch_alone=True)
            out[small_at] = block
        if failed:
            return out[[index for index in range(len(images)) if index not in failed]]
        return out

    # ------------------------------------------------------------------ pixels -> top-k

    def classify(self, pixels: torch.Tensor, top_k: int | None = None) -> list[TopK]:
        """Top-k classes, their indices and softmax probabilities for each image of ``pixels``."""
        import torch

        from tpustream.image.transforms import normalize

        k = max(1, min(top_k or self.limits.top_k, len(self.classes)))
        batch = self.limits.batch_size
        results: list[TopK] = []
        xla = self.device.type not in ("cpu", "cuda")
        with torch.no_grad():
            for start in range(0, len(pixels), batch):
                chunk = pixels[start : start + batch]
                count = len(chunk)
                if xla and count < batch:  # one compiled shape on XLA: pad the last batch
                    chunk = torch.cat([chunk, chunk.new_zeros((batch - count, *chunk.shape[1:]))])
                logits = self.model(normalize(chunk.to(self.device), self.mean, self.std)).float()
                probabilities, indices = logits.softmax(dim=1).topk(k, dim=1)
                probabilities, indices = probabilities[:count].cpu(), indices[:count].cpu()
                for p_row, i_row in zip(probabilities.tolist(), indices.tolist(), strict=True):
                    results.append(
                        TopK(
                            classes=[self.classes[i] for i in i_row],
                            class_indices=i_row,
                            probabilities=[round(p, 6) for p in p_row],
                        )
                    )
        return results
