"""`tpustream predict`: a model (or a registry's champion) on image files, directories, gs:// prefixes,
shards and datasets, with the same classifier the serving container runs (tpustream/serve/server.py).

Inputs: an image (every format ``shards create`` accepts: file_sources.IMAGE_EXTENSIONS), a directory or
gs:// prefix of images (searched recursively; an image in a folder named after a class counts that class as
its true one, as in an ImageFolder dataset), a ``.tar`` shard (its samples, true class from ``.cls``), or a
dataset directory (manifest.json: its val split). Every file or sample left out is counted by reason
(``Skipped``): not an image, a sample without an image, unreadable, too large, undecodable.

Images are read and decoded in worker processes (``workers``), the model runs in batches in this one.
Results go to stdout, or with ``output`` to JSON lines in parts, resumably::

    OUTPUT/predictions-00000.jsonl   one result per image, in input order (the objects --json prints)
    OUTPUT/_parts/00000.json         the part's record (PartRecord): written after its JSON lines
    OUTPUT/_SUCCESS                  the run's summary (PredictionSummary): written last

A part is kept by a re-run when its record names the same model, options and inputs (with their versions);
``_SUCCESS`` marks the output complete, so a partial one is never taken for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import re
import sys
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tpustream.errors import TpustreamError
from tpustream.image.codec import image_member
from tpustream.sources.files import IMAGE_EXTENSIONS
from tpustream.storage import io as storage

if TYPE_CHECKING:
    from tpustream.serve.classifier import Classifier
    from tpustream.serve.settings import Limits

__all__ = [
    "Item",
    "PartRecord",
    "PredictConfig",
    "PredictError",
    "PredictionSummary",
    "Skipped",
    "iter_items",
    "predict_items",
    "predict_to_output",
    "read_summary",
    "run",
    "val_items_of_model",
]

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = tuple(sorted(IMAGE_EXTENSIONS))
NOT_AN_IMAGE = "not-an-image"  # a listed file without an image extension (the other reasons: SKIP_REASONS)
PART_FORMAT = "tpustream.predictions-part/v1"
SUMMARY_FORMAT = "tpustream.predictions/v1"
SUCCESS = "_SUCCESS"
PARTS_DIR = "_parts"
_OUR_FILES = re.compile(rf"(predictions-\d{{5,}}\.jsonl|{PARTS_DIR}/\d{{5,}}\.json|{SUCCESS})")
# Images per task handed to a decode worker, and tasks in flight per worker: enough to keep every worker
# busy while the model runs, few enough that decoded pixels (150 KB each at 224 px) stay in the tens of MB.
DECODE_CHUNK = 8
CHUNKS_IN_FLIGHT = 4


class PredictError(TpustreamError, ValueError):
    """An input cannot be read as given; the message names it and what to do."""


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
    """Files and samples left out, by reason (NOT_AN_IMAGE or one of source_types.SKIP_REASONS), with the
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


# --------------------------------------------------------------------------- inputs


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
            elif lower.endswith(IMAGE_SUFFIXES) or single:
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
        if not found:
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


# --------------------------------------------------------------------------- decoding (worker processes)


@dataclass(frozen=True)
class _Refused:
    """An image that could not be classified: why (a SKIP_REASONS word) and the message naming it."""

    reason: str
    message: str


# A decode worker's classifier: set by _start_worker, from the parent's (inherited at fork, not pickled).
_worker_classifier: Classifier | None = None


def _start_worker(classifier: Classifier, parent_pid: int) -> None:
    """Pool initializer: the classifier the parent loaded, one torch thread (the workers are the
    parallelism), and death with the parent, so that a killed run leaves no worker behind."""
    global _worker_classifier
    import torch

    from tpustream.dataset.write import exit_with_parent  # shards' writers need the same; one implementation

    exit_with_parent(parent_pid)
    torch.set_num_threads(1)
    _worker_classifier = classifier


def _decode_in_worker(items: list[Item]) -> list[np.ndarray | _Refused]:
    assert _worker_classifier is not None, "_start_worker runs first in every worker"
    return _decode(_worker_classifier, items)


def _decode(classifier: Classifier, items: list[Item]) -> list[np.ndarray | _Refused]:
    """Each item read (when it was not), decoded and rendered by the serving classifier: 3 x S x S uint8
    pixels, or why not."""
    from tpustream.image.codec import ImageTooLarge
    from tpustream.serve.classifier import BadImage

    limit = classifier.limits.max_image_bytes
    out: list[np.ndarray | _Refused] = []
    for item in items:
        if item.read_from is not None and item.size is not None and item.size > limit:
            out.append(
                _Refused("too-large", f"{item.name}: {item.size} bytes exceeds the {limit}-byte image limit")
            )
            continue
        try:
            data = item.data if item.read_from is None else storage.read_bytes(item.read_from)
        except storage.StorageError as exc:
            out.append(_Refused("missing-object", f"{item.name}: cannot read ({exc})"))
            continue
        try:
            prepared = classifier.prepare(data, item.name)
        except BadImage as exc:
            too_large = isinstance(exc.__cause__, ImageTooLarge) or len(data) > limit
            out.append(_Refused("too-large" if too_large else "undecodable", str(exc)))
            continue
        out.append(classifier.pixels([prepared]).numpy()[0])
    return out


def _decoded(
    classifier: Classifier, items: Iterator[Item], workers: int
) -> Iterator[tuple[Item, np.ndarray | _Refused]]:
    """``(item, pixels or why not)`` in input order, decoded by ``workers`` forked processes (0: here), with
    a bounded number of images in flight."""
    chunks = iter(lambda: list(itertools.islice(items, DECODE_CHUNK)), [])
    if workers <= 0:
        for chunk in chunks:
            yield from zip(chunk, _decode(classifier, chunk), strict=True)
        return
    # fork: the workers inherit the loaded classifier instead of each loading the model again
    pool = ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_start_worker,
        initargs=(classifier, os.getpid()),
    )
    pending: deque[tuple[list[Item], Future[list[np.ndarray | _Refused]]]] = deque()
    try:
        for chunk in chunks:
            pending.append((chunk, pool.submit(_decode_in_worker, chunk)))
            if len(pending) >= workers * CHUNKS_IN_FLIGHT:
                done, future = pending.popleft()
                yield from zip(done, future.result(), strict=True)
        while pending:
            done, future = pending.popleft()
            yield from zip(done, future.result(), strict=True)
    except BrokenProcessPool as exc:
        raise PredictError(
            "a decode worker died (out of memory on a huge image?): lower --workers or --max-pixels"
        ) from exc
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


# --------------------------------------------------------------------------- classifying


def predict_items(
    classifier: Classifier, items: Iterator[Item], *, top_k: int, batch_size: int, workers: int = 0
) -> Generator[dict[str, Any], None, None]:
    """One result per item, in order: top-k (or ``error`` and its ``reason``), and ``true_class`` where it
    is known. ``workers`` processes read and decode; the model runs here, ``batch_size`` images at a time."""
    import torch

    def flush(batch: list[tuple[Item, np.ndarray | _Refused]]) -> Iterator[dict[str, Any]]:
        good = [pixels for _, pixels in batch if not isinstance(pixels, _Refused)]
        answers = iter(classifier.classify(torch.from_numpy(np.stack(good)), top_k)) if good else iter(())
        for item, pixels in batch:
            result: dict[str, Any] = {"input": item.name}
            if item.source:
                result["source"] = item.source
            true_class = _true_class(item, classifier.classes)
            if true_class is not None:
                result["true_class"] = true_class
            if isinstance(pixels, _Refused):
                result["error"] = pixels.message
                result["reason"] = pixels.reason
            else:
                result.update(next(answers))
                if true_class is not None:
                    result["correct"] = result["classes"][0] == true_class
            yield result

    batch: list[tuple[Item, np.ndarray | _Refused]] = []
    images = 0  # decoded ones in ``batch``: a batch is full with batch_size images, whatever failed beside
    for item, pixels in _decoded(classifier, items, workers):
        batch.append((item, pixels))
        images += not isinstance(pixels, _Refused)
        if images == batch_size:
            yield from flush(batch)
            batch, images = [], 0
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


# --------------------------------------------------------------------------- --output: parts and _SUCCESS


@dataclass
class PartRecord:
    """``OUTPUT/_parts/NNNNN.json``: what one part of JSON lines answers, written after it."""

    index: int
    request: dict[str, Any]  # model, model_sha256, top_k, max_pixels: what every result depends on
    inputs: list[list[str]]  # [name, version] per image, in order
    num_results: int  # lines: one per image, answered or not
    answered: int
    known: int  # answered images whose true class is known
    correct: int
    skipped: dict[str, int]  # reason -> images that could not be classified
    sha256: str  # of the part's JSON lines
    num_bytes: int
    format: str = PART_FORMAT


@dataclass
class PredictionSummary:
    """``OUTPUT/_SUCCESS``, written last: the request, the counts and the parts of a complete output."""

    output: str
    request: dict[str, Any]  # the inputs as given and every option the results depend on
    answered: int
    known: int  # answered images whose true class is known
    correct: int
    failed: int  # images that could not be classified: their results hold ``error`` and ``reason``
    skipped: dict[str, int]  # reason -> count: those ``failed`` and the listing's (not-an-image, ...)
    skipped_examples: dict[str, list[str]]  # the first few the listing skipped (failed images: in the parts)
    parts: list[dict[str, Any]]  # {path, num_results, sha256}, in order
    model_sha256: str
    kept_parts: int = 0  # parts kept from an earlier, interrupted run
    predicted: int = 0  # images this run predicted (not in kept parts)
    seconds: float = 0.0  # from the model loaded to the last part written
    format: str = SUMMARY_FORMAT

    def line(self) -> str:
        skipped = sum(self.skipped.values())
        correct = f"; {self.correct:,}/{self.known:,} correct" if self.known else ""
        rate = self.predicted / self.seconds if self.seconds > 0 else 0.0
        return (
            f"{self.answered + skipped:,} inputs: {self.answered:,} answered, {skipped:,} skipped "
            f"({Skipped(dict(self.skipped)).describe()}){correct} -> "
            f"{storage.join(self.output, 'predictions-*.jsonl')} ({len(self.parts)} parts, "
            f"{self.kept_parts} kept from an earlier run; {rate:,.0f} img/s)"
        )


def _part_name(index: int) -> str:
    return f"predictions-{index:05d}.jsonl"


def _record_uri(output: str, index: int) -> str:
    return storage.join(output, PARTS_DIR, f"{index:05d}.json")


def _read_json(uri: str, fmt: str) -> dict[str, Any] | None:
    """The JSON object at ``uri`` when it is there and says ``format: fmt``, else None."""
    try:
        data = json.loads(storage.read_bytes(uri))
    except (storage.NotFound, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == fmt else None


def read_summary(output: str) -> PredictionSummary | None:
    """The summary of the complete output at ``output``, or None when it has no readable ``_SUCCESS``."""
    data = _read_json(storage.join(output, SUCCESS), SUMMARY_FORMAT)
    try:
        return PredictionSummary(**data) if data else None
    except TypeError:
        return None


def _read_part_record(output: str, index: int) -> PartRecord | None:
    data = _read_json(_record_uri(output, index), PART_FORMAT)
    try:
        return PartRecord(**data) if data else None
    except TypeError:  # another version's fields: predict the part again
        return None


def _existing_output(output: str) -> dict[str, int]:
    """Name (relative to ``output``) -> size of each file an earlier run left there; PredictError when
    anything else is there: an output directory is this command's alone."""
    found: dict[str, int] = {}
    foreign: list[str] = []
    for obj in storage.list_objects(output):
        name = obj.uri[len(output) + 1 :]
        if not name or name.endswith("/"):
            continue  # a folder placeholder object
        if _OUR_FILES.fullmatch(name):
            found[name] = obj.size
        else:
            foreign.append(name)
    if foreign:
        raise PredictError(
            f"--output {output} holds {len(foreign)} file(s) that are not predictions (e.g. {foreign[0]}): "
            "give a new or empty directory or prefix, or one an earlier `tpustream predict --output` wrote"
        )
    return found


def _kept_record(
    output: str, index: int, items: list[Item], request: dict[str, Any], sizes: dict[str, int]
) -> PartRecord | None:
    """Part ``index``'s record, when an earlier run wrote the part for the same model, options and inputs."""
    record = _read_part_record(output, index)
    if record is None or record.request != request:
        return None
    if record.inputs != [[item.name, item.version] for item in items]:
        return None
    if sizes.get(_part_name(index)) != record.num_bytes:
        return None  # its JSON lines were removed or replaced since
    record.inputs = []  # checked: not kept in memory for every part of a large run
    return record


def _write_part(
    output: str, index: int, items: list[Item], results: list[dict[str, Any]], request: dict[str, Any]
) -> PartRecord:
    """The part's JSON lines, then its record: a part without a record is predicted again by a re-run."""
    digest = hashlib.sha256()
    num_bytes = 0
    with storage.open_write(
        storage.join(output, _part_name(index)), content_type="application/x-ndjson"
    ) as f:
        for result in results:
            line = (json.dumps(result) + "\n").encode()
            digest.update(line)
            num_bytes += len(line)
            f.write(line)
    refused = Skipped()
    for result in results:
        if "reason" in result:
            refused.add(result["reason"], result["input"])
    record = PartRecord(
        index=index,
        request=request,
        inputs=[[item.name, item.version] for item in items],
        num_results=len(results),
        answered=sum("error" not in result for result in results),
        known=sum("correct" in result for result in results),
        correct=sum(bool(result.get("correct")) for result in results),
        skipped=refused.counts,
        sha256=digest.hexdigest(),
        num_bytes=num_bytes,
    )
    storage.write_bytes(
        _record_uri(output, index), json.dumps(asdict(record)).encode(), content_type="application/json"
    )
    record.inputs = []
    return record


def _differences(before: dict[str, Any], now: dict[str, Any]) -> str:
    return "; ".join(
        f"{key} {before.get(key)!r} then, {now.get(key)!r} now"
        for key in sorted(set(before) | set(now))
        if before.get(key) != now.get(key)
    )


def _planned_items(classifier: Classifier, config: PredictConfig, skipped: Skipped) -> Iterator[Item]:
    """The images to predict, unread: the inputs (not the output's own files), val samples, the limit."""
    exclude = storage.absolute(config.output) if config.output else ""
    items: Iterator[Item] = iter_items(config.inputs, skipped, exclude=exclude, read=False)
    if config.sample_val:
        val = iter_items(val_items_of_model(classifier.uri), skipped, read=False)
        items = itertools.chain(items, itertools.islice(val, config.sample_val))
    if config.limit:
        items = itertools.islice(items, config.limit)
    return items


def predict_to_output(config: PredictConfig, *, progress: bool = False) -> tuple[PredictionSummary, bool]:
    """Predict into ``config.output`` (JSON lines in parts, then ``_SUCCESS``), keeping the parts an
    interrupted run completed.

    Returns:
        The output's summary, and whether this run wrote it (False: the output was already complete for the
        same request, and nothing was done).

    Raises:
        PredictError: the output holds other files, or another request's complete output (without
            ``overwrite``).
    """
    from tqdm import tqdm

    from tpustream.serve.classifier import Classifier, resolve_model_uri

    assert config.output, "predict_to_output needs config.output"
    output = storage.absolute(config.output)
    limits = config.limits()
    model_uri = resolve_model_uri(config.model)
    request = config.request(model_uri)
    existing = _existing_output(output)
    if SUCCESS in existing:
        complete = read_summary(output)
        if complete is None:
            raise PredictError(
                f"{output}/{SUCCESS} is not a tpustream predictions summary: choose another --output"
            )
        if not config.overwrite:
            if complete.request == request:
                return complete, False
            raise PredictError(
                f"{output} already holds the complete predictions of another request "
                f"({_differences(complete.request, request)}): pass --overwrite to replace them, "
                "or choose another --output"
            )
        storage.delete(storage.join(output, SUCCESS))  # partial from here until the new _SUCCESS
    classifier = Classifier(model_uri, limits=limits, device=device_for_cli())
    _say_top_k_cap(config.top_k, classifier)
    started = time.perf_counter()  # the rate: listing, reading, decoding, classifying and writing
    part_request = {
        "model": classifier.uri,
        "model_sha256": classifier.model_sha256,
        "top_k": config.top_k,
        "max_pixels": limits.max_pixels,
    }
    recorded = set()
    if not config.overwrite:
        recorded = {
            int(name[len(PARTS_DIR) + 1 : -5]) for name in existing if name.startswith(f"{PARTS_DIR}/")
        }
    skipped = Skipped()
    items = _planned_items(classifier, config, skipped)
    records: dict[int, PartRecord] = {}
    kept: set[int] = set()
    todo: deque[tuple[int, list[Item]]] = deque()  # parts fed to the workers, in order, not yet written
    bar = tqdm(desc="predict", unit="img", file=sys.stderr, disable=not progress, delay=1.0)

    def feed() -> Iterator[Item]:
        for index, part in enumerate(iter(lambda: list(itertools.islice(items, config.part_size)), [])):
            record = _kept_record(output, index, part, part_request, existing) if index in recorded else None
            if record is not None:
                records[index] = record
                kept.add(index)
                bar.set_postfix(kept=len(kept), refresh=False)
                continue
            todo.append((index, part))
            yield from part

    results: list[dict[str, Any]] = []
    predictions = predict_items(
        classifier, feed(), top_k=config.top_k, batch_size=limits.batch_size, workers=config.workers
    )
    try:
        for result in predictions:
            results.append(result)
            bar.update()
            index, part = todo[0]
            if len(results) == len(part):
                records[index] = _write_part(output, index, part, results, part_request)
                todo.popleft()
                results = []
                bar.set_postfix(parts=len(records) - len(kept), kept=len(kept), refresh=False)
    finally:
        predictions.close()  # stops the decode workers now, also when interrupted
        bar.close()
    _remove_stale(output, existing, num_parts=len(records))
    ordered = [records[index] for index in sorted(records)]
    for record in ordered:
        for reason, count in record.skipped.items():
            skipped.counts[reason] = skipped.counts.get(reason, 0) + count
    summary = PredictionSummary(
        output=output,
        request=request,
        answered=sum(record.answered for record in ordered),
        known=sum(record.known for record in ordered),
        correct=sum(record.correct for record in ordered),
        failed=sum(record.num_results - record.answered for record in ordered),
        skipped=dict(sorted(skipped.counts.items())),
        skipped_examples=skipped.examples,
        parts=[
            {"path": _part_name(record.index), "num_results": record.num_results, "sha256": record.sha256}
            for record in ordered
        ],
        model_sha256=classifier.model_sha256,
        kept_parts=len(kept),
        predicted=sum(record.num_results for index, record in records.items() if index not in kept),
        seconds=round(time.perf_counter() - started, 3),
    )
    summary_json = json.dumps(asdict(summary), indent=1).encode()
    storage.write_bytes(storage.join(output, SUCCESS), summary_json, content_type="application/json")
    return summary, True


def _remove_stale(output: str, existing: dict[str, int], *, num_parts: int) -> None:
    """Parts an earlier run wrote beyond this run's last (its inputs were more), and temp files of writers
    killed midway: the output holds exactly what _SUCCESS lists."""
    for name in existing:
        if name != SUCCESS and int(re.sub(r"\D", "", name)) >= num_parts:
            storage.delete(storage.join(output, name))
    for directory in (output, storage.join(output, PARTS_DIR)):
        for partial in storage.list_partials(directory):
            storage.delete(partial)


# --------------------------------------------------------------------------- the command


@dataclass(frozen=True, kw_only=True)
class PredictConfig:
    """One ``tpustream predict``: the model, the inputs and the options, with the CLI's defaults."""

    model: str  # a model directory (model.pt + model.json), or a registry: its champion
    inputs: tuple[str, ...] = ()  # images, directories, gs:// prefixes, shards, datasets
    top_k: int = 3
    as_json: bool = False  # print JSON lines instead of text (not with ``output``)
    limit: int | None = None  # images at most
    sample_val: int = 0  # also this many val samples of the model's dataset
    batch_size: int = 0  # images per forward pass; 0: TPUSTREAM_BATCH_SIZE, else 32
    max_pixels: int = 0  # the pixel budget; 0: the serving container's
    workers: int = 0  # decode processes; 0: decode in this one
    output: str | None = None  # write JSON lines in parts there instead of printing results
    part_size: int = 1000  # images per part of ``output``
    overwrite: bool = False  # predict every part of ``output`` again, even a complete one

    def __post_init__(self) -> None:
        if not self.inputs and not self.sample_val:
            raise PredictError(
                "nothing to predict: give images, directories, gs:// prefixes or shards, or --sample-val N"
            )
        if self.output and self.as_json:
            raise PredictError(
                "--json prints the results, --output writes them as JSON lines to OUTPUT: give one of them"
            )
        for name in ("top_k", "part_size"):
            if getattr(self, name) < 1:
                raise PredictError(
                    f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}"
                )
        if self.workers < 0:
            raise PredictError(f"--workers must be 0 or more, got {self.workers}")

    def limits(self) -> Limits:
        from tpustream.serve.settings import Limits

        return Limits(
            batch_size=self.batch_size or default_batch_size(),
            top_k=self.top_k,
            **({"max_pixels": self.max_pixels} if self.max_pixels else {}),
        )

    def request(self, model_uri: str) -> dict[str, Any]:
        """What a complete output's results depend on: a re-run asking another is not complete there."""
        return {
            "inputs": list(self.inputs),
            "model": model_uri,
            "top_k": self.top_k,
            "limit": self.limit,
            "sample_val": self.sample_val,
            "max_pixels": self.limits().max_pixels,
            "part_size": self.part_size,
        }


def run(config: PredictConfig, *, echo: Callable[[str], object] = print, progress: bool | None = None) -> int:
    """Print top-k per image (or one JSON object per line), or with ``config.output`` write them as JSON
    lines and print a summary; returns the exit code: 0, or 1 when an image could not be classified.
    Raises PredictError / serving.BadModel for bad arguments."""
    show_bar = sys.stderr.isatty() if progress is None else progress
    if not config.output:
        return _print_results(config, echo=echo, show_bar=show_bar)
    summary, written = predict_to_output(config, progress=show_bar)
    if not written:
        echo(
            f"{summary.output} is already complete ({summary.answered:,} answered, "
            f"{sum(summary.skipped.values()):,} skipped, {len(summary.parts)} parts): nothing to do; "
            "--overwrite predicts again"
        )
        return 0
    echo(summary.line())
    return 1 if summary.failed else 0


def _say_top_k_cap(top_k: int, classifier: Any) -> None:
    """A top-k over the model's class count answers every class: say so instead of capping it quietly."""
    if top_k > len(classifier.classes):
        log.warning(
            "--top-k %d: the model has %d classes, so each answer lists all %d",
            top_k,
            len(classifier.classes),
            len(classifier.classes),
        )


def _print_results(config: PredictConfig, *, echo: Callable[[str], object], show_bar: bool) -> int:
    from tqdm import tqdm

    from tpustream.serve.classifier import Classifier

    limits = config.limits()
    classifier = Classifier(config.model, limits=limits, device=device_for_cli())
    _say_top_k_cap(config.top_k, classifier)
    skipped = Skipped()
    results = predict_items(
        classifier,
        _planned_items(classifier, config, skipped),
        top_k=config.top_k,
        batch_size=limits.batch_size,
        workers=config.workers,
    )
    # the bar appears only when the run lasts over a second: many images
    bar = tqdm(
        results, desc="predict", unit="img", file=sys.stderr, disable=not show_bar, miniters=1, delay=1.0
    )
    failed = answered = known = correct = 0
    with contextlib.closing(results):  # stops the decode workers now, also when interrupted
        for result in bar:
            if "error" in result:
                failed += 1
                skipped.add(result["reason"], result["input"])
            else:
                answered += 1
            if "correct" in result:
                known += 1
                correct += bool(result["correct"])
            line = json.dumps(result) if config.as_json else _text(result)
            if bar.disable:
                echo(line)
            else:
                bar.write(line, file=sys.stdout)
    if not config.as_json and known:
        echo(f"{correct}/{known} correct ({classifier.uri})")
    if skipped.counts:
        errors = "; the images that could not be classified are the 'error' lines above" if failed else ""
        total = sum(skipped.counts.values())
        print(
            f"skipped {total:,} of {answered + total:,} inputs: {skipped.describe()}{errors}", file=sys.stderr
        )
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
