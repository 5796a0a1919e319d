"""Peer loaders for ``tpustream bench load``: each reads the same samples and delivers the same output
(RandomResizedCrop + flip -> uint8 CHW batches), in two variants: its documented pipeline (PIL decode +
torchvision transforms), and its plumbing with our decoder (``transforms.prepare_image`` + ``render_batch``),
so that only the plumbing differs.

webdataset reads our tar shards as they are. litdata, grain and mosaic-streaming each get the split's samples
(the image bytes as stored in our shards, their extension and class) written once per bench run into their
own format by their own writer (``write_peer_formats``): litdata's ``BinaryWriter`` chunks, an ArrayRecord
file for grain, mosaic's MDS shards. Every variant shuffles (training split), uses the bench's batch size and
worker count, and yields full batches only.

Peers whose package is not installed are reported as one ``skipped`` line each, never an error.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import os
import pickle
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import Any

__all__ = ["Sample", "missing_peers", "peer_pipelines", "skipped_lines", "write_peer_formats"]

# One sample as the peers' writers get it: key, image bytes as stored in our shards, their extension, class.
Sample = tuple[str, bytes, str, int]

# Peer -> the module it needs. webdataset is a main dependency; the others are the `bench` extra (pyproject).
_PEER_MODULES = {
    "webdataset-webloader": "webdataset",
    "litdata": "litdata",
    "grain": "grain",
    "mosaic-streaming": "streaming",
}
# Each peer's install hint. mosaic-streaming has its own extra: it caps numpy < 2.2 and
# google-cloud-storage < 3.3, which would downgrade this project's environment (pyproject.toml).
_INSTALL_HINTS = {
    "webdataset-webloader": "pip install -e .",
    "litdata": "pip install -e '.[bench]'",
    "grain": "pip install -e '.[bench]'",
    "mosaic-streaming": "pip install -e '.[bench-mosaic]'",
}


def _installed(peer: str) -> bool:
    return importlib.util.find_spec(_PEER_MODULES[peer]) is not None


def missing_peers() -> dict[str, str]:
    """Peer name -> why it is not run (its package is absent, and how to install it)."""
    return {
        peer: f"{module} not installed: {_INSTALL_HINTS[peer]}"
        for peer, module in _PEER_MODULES.items()
        if importlib.util.find_spec(module) is None
    }


def skipped_lines() -> list[dict[str, str]]:
    """The bench's line for each peer not run."""
    return [{"bench": "load", "pipeline": peer, "skipped": note} for peer, note in missing_peers().items()]


def _documented_transform(size: int, train: bool) -> Any:
    """torchvision's uint8 pipeline: the same crop sampling and output as ours, PIL doing the pixels."""
    from torchvision import transforms as T

    from tpustream.image.transforms import default_min_crop_scale

    if train:
        scale = (default_min_crop_scale(size), 1.0)
        return T.Compose([T.RandomResizedCrop(size, scale=scale), T.RandomHorizontalFlip(), T.PILToTensor()])
    return T.Compose([T.Resize(int(size / 0.875)), T.CenterCrop(size), T.PILToTensor()])


def _stack(items: list[Any]) -> tuple[Any, Any]:
    import torch

    images, labels = zip(*items, strict=True)
    return torch.stack(images), torch.tensor(labels)


class _OurDecoder:
    """Picklable: raw sample -> (Prepared, label); a batch of them -> (uint8 [B,3,S,S], labels)."""

    def __init__(self, size: int, train: bool) -> None:
        from tpustream.image.transforms import Augment, default_min_crop_scale

        self.size = size
        self.augment = Augment(output_size=size, train=train, min_crop_scale=default_min_crop_scale(size))
        self.rng: random.Random | None = None

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, int]:
        from tpustream.image.codec import image_member
        from tpustream.image.transforms import prepare_image

        if self.rng is None:  # per worker process: forked copies must not draw the same crops
            self.rng = random.Random(os.getpid())
        ext = image_member(sample) or ""
        return prepare_image(sample[ext], ext, self.augment, self.rng), int(sample["cls"])

    def collate(self, items: list[tuple[Any, int]]) -> tuple[Any, Any]:
        import torch

        from tpustream.image.transforms import render_batch

        images = torch.empty((len(items), 3, self.size, self.size), dtype=torch.uint8)
        render_batch([prepared for prepared, _ in items], self.size, images)
        return images, torch.tensor([label for _, label in items])


class _DecodeRecord:
    """Picklable: a peer's stored record ``{"image", "ext", "cls"}`` -> (pixels, label). Documented: PIL
    decode + torchvision (a uint8 CHW tensor); ours: ``_OurDecoder`` (a Prepared, rendered by its collate)."""

    def __init__(self, size: int, train: bool, ours: bool) -> None:
        self.ours = _OurDecoder(size, train) if ours else None
        self.transform = None if ours else _documented_transform(size, train)

    def __call__(self, record: Mapping[str, Any]) -> tuple[Any, int]:
        data = bytes(record["image"])  # litdata hands out a memoryview
        if self.ours is not None:
            return self.ours({record["ext"]: data, "cls": record["cls"]})
        from PIL import Image

        with Image.open(io.BytesIO(data)) as image:
            return self.transform(image.convert("RGB")), int(record["cls"])  # type: ignore[misc]

    def collate(self, items: list[tuple[Any, int]]) -> tuple[Any, Any]:
        return self.ours.collate(items) if self.ours is not None else _stack(items)


def _full_batches(batches: Iterable[Any], batch: int) -> Iterator[Any]:
    """The batches of ``batch`` samples (a loader over an IterableDataset may end a worker's share short)."""
    for images, labels in batches:
        if len(images) == batch:
            yield images, labels


# --------------------------------------------------------------------------- webdataset (our shards as-is)


def _webloader(
    urls: list[str], size: int, batch: int, workers: int, train: bool, ours: bool
) -> Iterable[Any]:
    import webdataset as wds

    dataset = wds.WebDataset(
        urls,
        shardshuffle=100 if train else False,
        empty_check=False,
        nodesplitter=None,
        workersplitter=wds.split_by_worker,
    ).shuffle(1000 if train else 0)
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


# --------------------------------------------------------------------------- litdata


def _write_litdata(out: str, samples: Iterable[Sample]) -> None:
    """litdata's chunk writer (what ``litdata.optimize`` runs in each of its workers), in this process."""
    from litdata.streaming.writer import BinaryWriter

    os.makedirs(out, exist_ok=True)
    writer = BinaryWriter(out, chunk_bytes="64MB")
    for index, (_, data, ext, label) in enumerate(samples):
        writer[index] = {"image": data, "ext": ext, "cls": label}
    writer.done()
    writer.merge()


def _litdata(root: str, size: int, batch: int, workers: int, train: bool, ours: bool) -> Iterable[Any]:
    import litdata

    decode = _DecodeRecord(size, train, ours)
    dataset = litdata.StreamingDataset(root, shuffle=train, drop_last=True, transform=decode)
    loader = litdata.StreamingDataLoader(
        dataset, batch_size=batch, num_workers=workers, collate_fn=decode.collate if ours else None
    )
    return _full_batches(loader, batch)


# --------------------------------------------------------------------------- grain (ArrayRecord)

_ARRAY_RECORD = "samples.array_record"


def _write_grain(out: str, samples: Iterable[Sample]) -> None:
    """One ArrayRecord file (group_size:1, grain's random-access layout); each record a pickled dict."""
    from array_record.python.array_record_module import ArrayRecordWriter

    os.makedirs(out, exist_ok=True)
    writer = ArrayRecordWriter(os.path.join(out, _ARRAY_RECORD), "group_size:1")
    try:
        for _, data, ext, label in samples:
            writer.write(pickle.dumps({"image": data, "ext": ext, "cls": label}))
    finally:
        writer.close()


def _grain(root: str, size: int, batch: int, workers: int, train: bool, ours: bool) -> Iterator[Any]:
    import grain.python as grain
    import numpy as np
    import torch

    decode = _DecodeRecord(size, train, ours)

    class Decode(grain.MapTransform):
        """Unpickle + decode. Once per worker process, what torch's DataLoader does in its workers and grain
        (not torch-specific) does not: one torch thread (our collate's resize runs torch ops; with torch's
        default of a thread per core, N workers oversubscribe the cores), and a torch seed of its own
        (torchvision's crops draw from torch's RNG, which spawned workers all start from one default seed)."""

        in_process: int | None = None

        def map(self, element: bytes) -> Any:
            if self.in_process != os.getpid():
                self.in_process = os.getpid()
                torch.manual_seed(self.in_process)
                if workers > 0:
                    torch.set_num_threads(1)
            images, label = decode(pickle.loads(element))
            return (images, label) if ours else (images.numpy(), label)

    def collate(items: list[tuple[Any, int]]) -> tuple[Any, Any]:
        images, labels = decode.collate(items)
        return images.numpy(), labels.numpy()

    source = grain.ArrayRecordDataSource([os.path.join(root, _ARRAY_RECORD)])
    sampler = grain.IndexSampler(
        len(source), shard_options=grain.NoSharding(), shuffle=train, num_epochs=None, seed=0
    )
    # grain's defaults throughout, ReadOptions included: 16 reader threads and a 500-record buffer whose ready
    # prefix grain 0.2.18 scans at every record (measured at 32 px on 2 cores: +our-decoder at half the rate
    # it reaches with ReadOptions(num_threads=2, prefetch_buffer_size=64)).
    # Documented: grain's own batching (numpy, in shared memory from its workers). Ours: our collate renders
    # the batch, handed over as numpy (torch tensors would cross grain's queues as file descriptors, which
    # its shutdown cannot drain once the workers are gone). Either way torch tensors here, without a copy.
    operations = [Decode(), grain.Batch(batch, drop_remainder=True, batch_fn=collate if ours else None)]
    loader = grain.DataLoader(
        data_source=source, sampler=sampler, operations=operations, worker_count=workers
    )
    for images, labels in loader:
        yield torch.from_numpy(np.asarray(images)), torch.from_numpy(np.asarray(labels))


# --------------------------------------------------------------------------- mosaic-streaming (MDS)


def _write_mosaic(out: str, samples: Iterable[Sample]) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=out, columns={"image": "bytes", "ext": "str", "cls": "int"}) as writer:
        for _, data, ext, label in samples:
            writer.write({"image": data, "ext": ext, "cls": label})


def _mosaic(root: str, size: int, batch: int, workers: int, train: bool, ours: bool) -> Iterable[Any]:
    """A new ``StreamingDataset`` for every loader: the bench abandons loaders mid-epoch, which kills their
    workers, possibly inside the dataset's shared-memory barrier, and the next loader's workers over the same
    dataset then wait on that barrier forever (seen). Each instance takes a shared-memory prefix and creates two
    lock files, which mosaic never removes, in the temp dir: here the bench's workdir, next to the MDS copy."""
    import tempfile

    import torch.utils.data
    from streaming import StreamingDataset

    decode = _DecodeRecord(size, train, ours)

    class Decoded(StreamingDataset):
        """mosaic's documented way to transform: a subclass whose ``__getitem__`` decodes."""

        def __getitem__(self, index: Any) -> Any:
            return decode(super().__getitem__(index))

    saved, tempfile.tempdir = tempfile.tempdir, os.path.dirname(root)
    try:
        dataset = Decoded(local=root, shuffle=train, batch_size=batch)
    finally:
        tempfile.tempdir = saved
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch,
        num_workers=workers,
        drop_last=True,
        collate_fn=decode.collate if ours else None,
    )


# --------------------------------------------------------------------------- the peers

_Maker = Callable[[], Iterable[Any]]
# (source, size, batch, workers, train, ours) -> the loader's batches
_Reader = Callable[[Any, int, int, int, bool, bool], Iterable[Any]]

# Peer -> (its writer into a directory, its loader over that directory). webdataset reads our shards as-is.
_FORMATS: dict[str, tuple[Callable[[str, Iterable[Sample]], None], _Reader]] = {
    "litdata": (_write_litdata, _litdata),
    "grain": (_write_grain, _grain),
    "mosaic-streaming": (_write_mosaic, _mosaic),
}


def write_peer_formats(
    workdir: str, samples: Callable[[], Iterable[Sample]], peers: Iterable[str] | None = None
) -> dict[str, str]:
    """Write the samples (``samples()``: a fresh iterator each call) in each installed peer's own format
    (of ``peers``, default all), with its own writer, under ``workdir``; peer name -> its directory."""
    written = {}
    for peer, (write, _) in _FORMATS.items():
        if _installed(peer) and (peers is None or peer in peers):
            written[peer] = os.path.join(workdir, peer)
            write(written[peer], samples())
    return written


def peer_pipelines(
    urls: list[str],
    size: int,
    batch: int,
    workers: int,
    train: bool,
    written: Mapping[str, str] | None = None,
) -> dict[str, _Maker]:
    """Name -> a maker of an iterable of batches (image tensor first), for each installed peer: webdataset
    over ``urls``, the others over their copies in ``written`` (from ``write_peer_formats``)."""
    for logger in ("litdata", "streaming"):  # their INFO lines repeat at every loader they build
        logging.getLogger(logger).setLevel(logging.WARNING)
    pipelines: dict[str, _Maker] = {}

    def add(name: str, read: _Reader, source: Any) -> None:
        pipelines[name] = partial(read, source, size, batch, workers, train, False)
        pipelines[name + "+our-decoder"] = partial(read, source, size, batch, workers, train, True)

    if _installed("webdataset-webloader"):
        add("webdataset-webloader", _webloader, urls)
    for peer, root in (written or {}).items():
        add(peer, _FORMATS[peer][1], root)
    return pipelines
