"""Peer loaders for ``tpustream bench load``: each reads the same samples and delivers the same output
(RandomResizedCrop + flip -> uint8 CHW batches), in two variants: its documented pipeline, and its plumbing
with our decoder (``transforms.prepare_image`` + ``render_batch``), so that only the plumbing differs.

Peers whose package is not installed are reported as one ``skipped`` line each, never an error.
"""

from __future__ import annotations

import importlib.util
import os
import random
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["peer_pipelines", "missing_peers"]

# The peers with no adapter here yet (litdata and grain install from PyPI, but the adapters that write
# each one's own format with its own writer are not written): reported as skipped, with the reason.
_NOT_ADAPTED = {
    "litdata": "litdata",
    "grain": "grain",
    "mosaic-streaming": "streaming",
}


def missing_peers() -> dict[str, str]:
    """Peer name -> why it is not run (its package is absent, or no adapter writes its format yet)."""
    notes = {}
    for name, module in _NOT_ADAPTED.items():
        if importlib.util.find_spec(module) is None:
            notes[name] = f"{module} not installed (and no adapter writes its own format here yet)"
        else:
            notes[name] = f"{module} installed, but no adapter for its own format writer yet"
    if importlib.util.find_spec("webdataset") is None:
        notes["webdataset-webloader"] = "webdataset not installed"
    return notes


def _documented_transform(size: int, train: bool) -> Any:
    """torchvision's uint8 pipeline: the same crop sampling and output as ours, PIL doing the pixels."""
    from torchvision import transforms as T

    if train:
        scale = (0.08, 1.0) if size >= 128 else (0.35, 1.0)
        return T.Compose([T.RandomResizedCrop(size, scale=scale), T.RandomHorizontalFlip(), T.PILToTensor()])
    return T.Compose([T.Resize(int(size / 0.875)), T.CenterCrop(size), T.PILToTensor()])


def _stack(items: list[Any]) -> tuple[Any, Any]:
    import torch

    images, labels = zip(*items, strict=True)
    return torch.stack(images), torch.tensor(labels)


class _OurDecoder:
    """Picklable: raw sample -> (Prepared, label); a batch of them -> (uint8 [B,3,S,S], labels)."""

    def __init__(self, size: int, train: bool) -> None:
        from tpustream.transforms import Augment

        self.size = size
        self.augment = Augment(output_size=size, train=train, min_crop_scale=0.08 if size >= 128 else 0.35)
        self.rng: random.Random | None = None

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, int]:
        from tpustream.imagecodec import image_member
        from tpustream.transforms import prepare_image

        if self.rng is None:  # per worker process: forked copies must not draw the same crops
            self.rng = random.Random(os.getpid())
        ext = image_member(sample) or ""
        return prepare_image(sample[ext], ext, self.augment, self.rng), int(sample["cls"])

    def collate(self, items: list[tuple[Any, int]]) -> tuple[Any, Any]:
        import torch

        from tpustream.transforms import render_batch

        images = torch.empty((len(items), 3, self.size, self.size), dtype=torch.uint8)
        render_batch([prepared for prepared, _ in items], self.size, images)
        return images, torch.tensor([label for _, label in items])


def _webloader(
    urls: list[str], size: int, batch: int, workers: int, train: bool, ours: bool
) -> Iterable[Any]:
    import webdataset as wds

    dataset = wds.WebDataset(
        urls, shardshuffle=100 if train else False, empty_check=False, nodesplitter=None,
        workersplitter=wds.split_by_worker,
    ).shuffle(1000 if train else 0)  # fmt: skip
    if ours:
        decoder = _OurDecoder(size, train)
        dataset = dataset.map(decoder).batched(batch, collation_fn=decoder.collate, partial=False)
    else:
        dataset = (
            dataset.decode("pil")
            .to_tuple("ppm;jpg;jpeg;png", "cls")
            .map_tuple(_documented_transform(size, train), int)
            .batched(batch, collation_fn=_stack, partial=False)
        )
    return wds.WebLoader(dataset, batch_size=None, num_workers=workers)


def peer_pipelines(
    urls: list[str], size: int, batch: int, workers: int, train: bool
) -> dict[str, Callable[[], Iterable[Any]]]:
    """Name -> a maker of an iterable of batches (image tensor first), for each installed peer."""
    pipelines: dict[str, Callable[[], Iterable[Any]]] = {}
    if importlib.util.find_spec("webdataset") is not None:
        pipelines["webdataset-webloader"] = lambda: _webloader(urls, size, batch, workers, train, ours=False)
        pipelines["webdataset-webloader+our-decoder"] = lambda: _webloader(
            urls, size, batch, workers, train, ours=True
        )
    return pipelines
