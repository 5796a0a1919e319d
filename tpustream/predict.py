"""`tpustream predict`: a model (or a registry's champion) on image files, directories, gs:// prefixes,
shards and datasets, with the same classifier the serving container runs (tpustream/serving.py).

Inputs: an image (``.jpg``/``.jpeg``/``.png``/``.ppm``), a directory or gs:// prefix of images (searched
recursively; an image in a folder named after a class counts that class as its true one, as in an
ImageFolder dataset), a ``.tar`` shard (its samples, true class from ``.cls``), or a dataset directory
(manifest.json: its val split).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tpustream import storage
from tpustream.errors import TpustreamError
from tpustream.imagecodec import IMAGE_EXTS, image_member

__all__ = ["Item", "PredictError", "iter_items", "predict_items", "val_items_of_model"]

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = tuple(f".{ext}" for ext in IMAGE_EXTS)


class PredictError(TpustreamError, ValueError):
    """An input cannot be read as given; the message names it and what to do."""


@dataclass
class Item:
    name: str
    data: bytes
    true_index: int | None = None  # from a shard's .cls
    folder: str | None = None  # the image's parent folder name (a class name in an ImageFolder layout)
    source: str | None = None  # the file a dataset's sample came from (its sample index), when known


def _is_dataset(uri: str) -> bool:
    return not uri.endswith((".tar", *IMAGE_SUFFIXES)) and storage.exists(storage.join(uri, "manifest.json"))


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


def _shard_items(uri: str, index_uri: str | None = None) -> Iterator[Item]:
    from tpustream.tario import TarFormatError, iter_tar_samples

    name = uri.rsplit("/", 1)[-1]
    sources = _sample_sources(index_uri)
    try:
        with storage.open_read(uri) as stream:
            for key, fields in iter_tar_samples(stream, storage.size(uri)):
                ext = image_member(fields)
                if ext is None:
                    continue
                label = fields.get("cls")
                true_index = int(label) if label and label.strip().isdigit() else None
                yield Item(f"{name}:{key}", fields[ext], true_index, source=sources.get(key))
    except TarFormatError as exc:
        raise PredictError(
            f"{uri}: not a readable tar shard ({exc}): check it with `tpustream shards verify`"
        ) from exc


def _dataset_shards(uri: str) -> list[tuple[str, str | None]]:
    """(shard, its sample index or None) for every val shard of the dataset at ``uri``."""
    from tpustream.manifest import ShardError, read_manifest

    try:
        manifest = read_manifest(uri)
    except ShardError as exc:
        raise PredictError(str(exc)) from exc
    split = manifest["splits"].get("val") or {}
    if not split.get("shards"):
        raise PredictError(f"dataset {uri} has no val split: give its train shards or images instead")
    return [
        (
            storage.join(uri, shard["path"]),
            storage.join(uri, shard["sample_index"]) if shard.get("sample_index") else None,
        )
        for shard in split["shards"]
    ]


def iter_items(inputs: list[str]) -> Iterator[Item]:
    """Every image the inputs name, in order (directories and prefixes sorted)."""
    for raw in inputs:
        uri = storage.check_uri(raw).rstrip("/") if storage.is_gcs(raw) else raw.rstrip("/") or raw
        if _is_dataset(uri):
            for shard, index in _dataset_shards(uri):
                yield from _shard_items(shard, index)
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
            if lower.endswith(".tar"):
                found += 1
                yield from _shard_items(obj.uri)
            elif lower.endswith(IMAGE_SUFFIXES) or single:
                found += 1
                parts = obj.uri.rsplit("/", 2)
                yield Item(
                    obj.uri, storage.read_bytes(obj.uri), folder=parts[-2] if len(parts) == 3 else None
                )
        if not found:
            raise PredictError(f"{raw}: holds no .jpg/.jpeg/.png/.ppm images or .tar shards")


def val_items_of_model(model_uri: str) -> list[str]:
    """The dataset the model was trained on (model.json's dataset.uri), checked to have val shards: as an input
    of ``iter_items``, which reads its val split with the source file of every sample."""
    from tpustream.evaluate import load_model_card

    card = load_model_card(model_uri)
    dataset = (card.get("dataset") or {}).get("uri")
    if not dataset:
        raise PredictError(
            f"{model_uri}/model.json names no dataset: give images to predict instead of --sample-val"
        )
    _dataset_shards(dataset)
    return [dataset]


def predict_items(
    classifier: Any, items: Iterator[Item], *, top_k: int, batch_size: int
) -> Iterator[dict[str, Any]]:
    """One result per item, in order: top-k (or ``error``), and ``true_class`` where it is known."""
    from tpustream.serving import BadImage

    def flush(batch: list[tuple[Item, Any]]) -> Iterator[dict[str, Any]]:
        good = [(item, prepared) for item, prepared in batch if not isinstance(prepared, str)]
        answers = (
            iter(classifier.classify(classifier.pixels([p for _, p in good]), top_k)) if good else iter(())
        )
        for item, prepared in batch:
            result: dict[str, Any] = {"input": item.name}
            if item.source:
                result["source"] = item.source
            true_class = _true_class(item, classifier.classes)
            if true_class is not None:
                result["true_class"] = true_class
            if isinstance(prepared, str):
                result["error"] = prepared
            else:
                result.update(next(answers))
                if true_class is not None:
                    result["correct"] = result["classes"][0] == true_class
            yield result

    batch: list[tuple[Item, Any]] = []
    for item in items:
        try:
            batch.append((item, classifier.prepare(item.data, item.name)))
        except BadImage as exc:
            batch.append((item, str(exc)))
        if len(batch) == batch_size:
            yield from flush(batch)
            batch = []
    if batch:
        yield from flush(batch)


def _true_class(item: Item, classes: list[str]) -> str | None:
    if item.true_index is not None and 0 <= item.true_index < len(classes):
        return classes[item.true_index]
    if item.folder is not None and item.folder in classes:
        return item.folder
    return None


def device_for_cli() -> Any:
    """XLA when PJRT_DEVICE is set (as ``tpustream evaluate``), plain CPU otherwise."""
    from tpustream.xla_runtime import single_device

    return single_device()


def default_batch_size() -> int:
    return int(os.environ.get("TPUSTREAM_BATCH_SIZE", "32"))


def run(
    model: str, inputs: list[str], *, top_k: int = 3, as_json: bool = False, limit: int | None = None,
    sample_val: int = 0, batch_size: int | None = None, max_pixels: int | None = None,
    echo: Any = print, progress: bool | None = None,
) -> int:  # fmt: skip
    """Print top-k per image (or one JSON object per line); returns the exit code: 0, or 1 when an image
    failed. Raises PredictError / serving.BadModel for bad arguments."""
    import itertools
    import json
    import sys

    from tqdm import tqdm

    from tpustream.serving import Classifier, Limits

    if not inputs and not sample_val:
        raise PredictError(
            "nothing to predict: give images, directories, gs:// prefixes or shards, or --sample-val N"
        )
    limits = Limits(batch_size=batch_size or default_batch_size(), top_k=top_k,
                    **({"max_pixels": max_pixels} if max_pixels else {}))  # fmt: skip
    classifier = Classifier(model, limits=limits, device=device_for_cli())
    items: Iterator[Item] = iter_items(inputs)
    if sample_val:
        items = itertools.chain(
            items, itertools.islice(iter_items(val_items_of_model(classifier.uri)), sample_val)
        )
    if limit:
        items = itertools.islice(items, limit)
    results = predict_items(classifier, items, top_k=top_k, batch_size=limits.batch_size)
    show_bar = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(results, desc="predict", unit="img", file=sys.stderr, disable=not show_bar, miniters=1,
               delay=1.0)  # fmt: skip  # appears only when the run lasts over a second: many images
    failed = known = correct = 0
    for result in bar:
        if "error" in result:
            failed += 1
        if "correct" in result:
            known += 1
            correct += bool(result["correct"])
        line = json.dumps(result) if as_json else _text(result)
        if bar.disable:
            echo(line)
        else:
            bar.write(line, file=sys.stdout)
    if not as_json and known:
        echo(f"{correct}/{known} correct ({classifier.uri})")
    if failed:
        print(f"{failed} image(s) could not be classified (see 'error' above)", file=sys.stderr)
    return 1 if failed else 0


def _text(result: dict[str, Any]) -> str:
    if "source" in result:  # a dataset's sample: name the file it came from too
        result = {**result, "input": f"{result['input']} ({result['source']})"}
    if "error" in result:
        return f"{result['input']}  error: {result['error']}"
    top = ", ".join(f"{c} {p:.1%}" for c, p in zip(result["classes"], result["probabilities"], strict=True))
    if "true_class" in result:
        mark = "ok" if result["correct"] else "WRONG"
        return f"{result['input']}  true {result['true_class']}  predicted {top}  {mark}"
    return f"{result['input']}  {top}"
