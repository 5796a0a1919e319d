"""What ``tpustream predict`` reads: every image its inputs name, in order, and what it leaves out.

Inputs: an image (every format ``shards create`` accepts: sources.image_folder.IMAGE_EXTENSIONS), a directory or
gs:// prefix of images (searched recursively; an image in a folder named after a class counts that class as
its true one, as in an ImageFolder dataset), a ``.tar`` shard (its samples, true class from ``.cls``), or a
dataset directory (manifest.json: its val split). Every file or sample left out is counted by reason
(``Skipped``): not an image, a sample without an image, unreadable, too large, undecodable.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from tpustream.image.codec import image_member, sniff_format
from tpustream.serve.predict.config import PredictConfig, PredictError
from tpustream.sources.image_folder import IMAGE_EXTENSIONS
from tpustream.storage import io as storage

__all__ = [
    "IMAGE_SUFFIXES",
    "Item",
    "NOT_AN_IMAGE",
    "Skipped",
    "iter_items",
    "planned_items",
    "val_items_of_model",
]

IMAGE_SUFFIXES = tuple(sorted(IMAGE_EXTENSIONS))
# A file without an image extension, listed, or named and not beginning as an image does (the other reasons:
# SKIP_REASONS); the same either way, so a .txt is counted the same in a folder and named on the command line.
NOT_AN_IMAGE = "not-an-image"
_SIGNATURE_BYTES = 12  # sniff_format reads at most the first 12 bytes (WebP's RIFF....WEBP)


@dataclass
class Item:
    """One image to predict: a file or object, or a shard's sample."""

    name: str  # the file's URI, or "<shard>.tar:<key>"
    data: bytes  # the image's bytes; b"" until read when ``read_from`` is set
    true_index: int | None = None  # from a shard's .cls
    folder: str | None = None  # the image's parent folder name (a class name in an ImageFolder layout)
    source: str | None = None  # the file a dataset's sample came from (its sample index), when known
    version: str = ""  # the object's generation (local: mtime) or its shard's: what a kept part must match
    size: int | None = None  # bytes, from the listing: a file over the limit is not even read
    read_from: str | None = (
        None  # the file to read ``data`` from where it is decoded (iter_items(read=False))
    )


@dataclass
class Skipped:
    """Files and samples left out, by reason (NOT_AN_IMAGE or one of sources.types.SKIP_REASONS), with the
    first few names of each."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, name: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        names = self.examples.setdefault(reason, [])
        if len(names) < 5:
            names.append(name)

    def describe(self) -> str:
        """``"3 not-an-image, 1 undecodable"``; ``"none"`` when nothing was skipped."""
        return ", ".join(f"{count} {reason}" for reason, count in sorted(self.counts.items())) or "none"


def _is_dataset(uri: str) -> bool:
    return not uri.lower().endswith((".tar", *IMAGE_SUFFIXES)) and storage.exists(
        storage.join(uri, "manifest.json")
    )


def _sample_sources(index_uri: str | None) -> dict[str, str]:
    """key -> source file, from a shard's sample index; empty when the dataset has none (or it is unreadable:
    the names are a help to the reader, not worth failing a prediction for)."""
    if not index_uri:
        return {}
    try:
        lines = storage.read_bytes(index_uri).splitlines()
        return {entry["key"]: entry["source"] for entry in map(json.loads, lines) if entry.get("source")}
    except (storage.StorageError, ValueError, KeyError, TypeError):
        return {}


def _shard_items(uri: str, skipped: Skipped, index_uri: str | None = None) -> Iterator[Item]:
    from tpustream.dataset.tario import TarFormatError, iter_tar_samples

    name = uri.rsplit("/", 1)[-1]
    sources = _sample_sources(index_uri)
    info = storage.stat(uri)
    try:
        with storage.open_read(uri) as stream:
            for key, fields in iter_tar_samples(stream, info.size):
                ext = image_member(fields)
                if ext is None:
                    skipped.add("malformed-sample", f"{name}:{key}")
                    continue
                label = fields.get("cls")
                true_index = int(label) if label and label.strip().isdigit() else None
                yield Item(
                    f"{name}:{key}",
                    fields[ext],
                    true_index,
                    source=sources.get(key),
                    version=f"{uri}#{info.version}",
                )
    except TarFormatError as exc:
        raise PredictError(
            f"{uri}: not a readable tar shard ({exc}): check it with `tpustream shards verify`"
        ) from exc


def _dataset_shards(uri: str) -> list[tuple[str, str | None]]:
    """(shard, its sample index or None) for every val shard of the dataset at ``uri``."""
    from tpustream.dataset.manifest import ShardError, load_manifest

    try:
        manifest = load_manifest(uri)
    except ShardError as exc:
        raise PredictError(str(exc)) from exc
    split = manifest.split("val")
    if split is None or not split.shards:
        raise PredictError(f"dataset {uri} has no val split: give its train shards or images instead")
    return [
        (storage.join(uri, shard.path), storage.join(uri, shard.sample_index) if shard.sample_index else None)
        for shard in split.shards
    ]


def _has_image_signature(uri: str) -> bool:
    """Whether a file named without an image extension begins as an image does (a download saved without
    one): named or listed, a file that is not an image is counted NOT_AN_IMAGE, never read as one."""
    return sniff_format(storage.read_range(uri, 0, _SIGNATURE_BYTES)) is not None


def iter_items(
    inputs: Sequence[str], skipped: Skipped | None = None, *, exclude: str = "", read: bool = True
) -> Iterator[Item]:
    """Every image the inputs name, in order (directories and prefixes sorted).

    Args:
        inputs: files, directories, gs:// prefixes, shards or datasets.
        skipped: counts the files and samples left out (not an image, a sample without one).
        exclude: an absolute directory or prefix whose files are not inputs (the run's own output).
        read: read each file here; False: leave that to whoever decodes it (``Item.read_from``).
    """
    skipped = skipped if skipped is not None else Skipped()
    for raw in inputs:
        uri = storage.check_uri(raw).rstrip("/") if storage.is_gcs(raw) else raw.rstrip("/") or raw
        if _is_dataset(uri):
            for shard, index in _dataset_shards(uri):
                yield from _shard_items(shard, skipped, index)
            continue
        try:
            objects = storage.stat_or_list(uri)
        except storage.NotFound:
            objects = []
        if not objects:
            raise PredictError(f"{raw}: no such file, directory or gs:// object/prefix")
        single = len(objects) == 1 and objects[0].uri.rstrip("/") == uri
        found = 0
        for obj in objects:
            lower = obj.uri.lower()
            if obj.uri.endswith("/") or (exclude and storage.absolute(obj.uri).startswith(exclude + "/")):
                continue  # a folder placeholder (made in the GCS console), or our own output
            if lower.endswith(".tar"):
                found += 1
                yield from _shard_items(obj.uri, skipped)
            elif lower.endswith(IMAGE_SUFFIXES) or (single and _has_image_signature(obj.uri)):
                found += 1
                parts = obj.uri.rsplit("/", 2)
                folder = parts[-2] if len(parts) == 3 else None
                data = storage.read_bytes(obj.uri) if read else b""
                yield Item(
                    obj.uri,
                    data,
                    folder=folder,
                    version=obj.version,
                    size=obj.size,
                    read_from=None if read else obj.uri,
                )
            else:
                skipped.add(NOT_AN_IMAGE, obj.uri)
        if not found and not single:  # a named file that is no image is counted, as it is in a folder
            raise PredictError(
                f"{raw}: holds no images ({', '.join(IMAGE_SUFFIXES)}) or .tar shards"
                + (
                    f" ({skipped.counts[NOT_AN_IMAGE]} other files)"
                    if skipped.counts.get(NOT_AN_IMAGE)
                    else ""
                )
            )


def val_items_of_model(model_uri: str) -> list[str]:
    """The dataset the model was trained on (model.json's dataset.uri), checked to have val shards: as an input
    of ``iter_items``, which reads its val split with the source file of every sample."""
    from tpustream.train.evaluate import load_model_card

    card = load_model_card(model_uri)
    dataset = card.dataset.uri if card.dataset is not None else ""
    if not dataset:
        raise PredictError(
            f"{model_uri}/model.json names no dataset: give images to predict instead of --sample-val"
        )
    _dataset_shards(dataset)
    return [dataset]


def planned_items(config: PredictConfig, model_uri: str, skipped: Skipped) -> Iterator[Item]:
    """The images to predict, unread: the inputs (not the output's own files), val samples of the model at
    ``model_uri``, the limit."""
    exclude = storage.absolute(config.output) if config.output else ""
    items: Iterator[Item] = iter_items(config.inputs, skipped, exclude=exclude, read=False)
    if config.sample_val:
        val = iter_items(val_items_of_model(model_uri), skipped, read=False)
        items = itertools.chain(items, itertools.islice(val, config.sample_val))
    if config.limit:
        items = itertools.islice(items, config.limit)
    return items
