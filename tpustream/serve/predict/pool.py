"""Items to results: images read and decoded in worker processes (the decode pool), classified here in batches
by the serving classifier, one result per item in input order.

The workers are forked, so they inherit the loaded classifier instead of loading the model again; each runs
one torch thread (the workers are the parallelism) and dies with the parent. A bounded number of images is in
flight: ``DECODE_CHUNK`` per task, ``CHUNKS_IN_FLIGHT`` tasks per worker.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
from collections import deque
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Required, TypedDict

import numpy as np

from tpustream.serve.predict.config import PredictError
from tpustream.serve.predict.inputs import Item
from tpustream.storage import io as storage

if TYPE_CHECKING:
    from tpustream.serve.classifier import Classifier

__all__ = ["PredictResult", "device_for_cli", "predict_items", "say_top_k_cap"]

log = logging.getLogger(__name__)

# Images per task handed to a decode worker, and tasks in flight per worker: enough to keep every worker
# busy while the model runs, few enough that decoded pixels (150 KB each at 224 px) stay in the tens of MB.
DECODE_CHUNK = 8
CHUNKS_IN_FLIGHT = 4


class PredictResult(TypedDict, total=False):
    """One image's result, as ``--json`` prints it and ``--output`` writes it: its top-k (the serving
    classifier's ``TopK``) or why it was not classified, and its true class where that is known."""

    input: Required[str]  # the file's URI, or "<shard>.tar:<key>"
    source: str  # the file a dataset's sample came from
    true_class: str
    error: str  # the image could not be classified: why, naming it
    reason: str  # ... and the word it is counted under (SKIP_REASONS)
    classes: list[str]
    class_indices: list[int]
    probabilities: list[float]
    correct: bool  # the top class is the true one


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

    from tpustream.dataset.pool import exit_with_parent  # shards' writers need the same; one implementation

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


def predict_items(
    classifier: Classifier, items: Iterator[Item], *, top_k: int, batch_size: int, workers: int = 0
) -> Generator[PredictResult, None, None]:
    """One result per item, in order: top-k (or ``error`` and its ``reason``), and ``true_class`` where it
    is known. ``workers`` processes read and decode; the model runs here, ``batch_size`` images at a time."""
    import torch

    def flush(batch: list[tuple[Item, np.ndarray | _Refused]]) -> Iterator[PredictResult]:
        good = [pixels for _, pixels in batch if not isinstance(pixels, _Refused)]
        answers = iter(classifier.classify(torch.from_numpy(np.stack(good)), top_k)) if good else iter(())
        for item, pixels in batch:
            result: PredictResult = {"input": item.name}
            if item.source:
                result["source"] = item.source
            true_class = _true_class(item, classifier.classes)
            if true_class is not None:
                result["true_class"] = true_class
            if isinstance(pixels, _Refused):
                result["error"] = pixels.message
                result["reason"] = pixels.reason
            else:
                answer = next(answers)
                result["classes"] = answer["classes"]
                result["class_indices"] = answer["class_indices"]
                result["probabilities"] = answer["probabilities"]
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


def say_top_k_cap(top_k: int, classifier: Classifier) -> None:
    """A top-k over the model's class count answers every class: say so instead of capping it quietly."""
    if top_k > len(classifier.classes):
        log.warning(
            "--top-k %d: the model has %d classes, so each answer lists all %d",
            top_k,
            len(classifier.classes),
            len(classifier.classes),
        )
