"""``tpustream predict --output``: the results as JSON lines in parts, each with a record, and a summary written
last, so that a re-run keeps the parts an interrupted one completed::

    OUTPUT/predictions-00000.jsonl   one result per image, in input order (the objects --json prints)
    OUTPUT/_parts/00000.json         the part's record (PartRecord): written after its JSON lines
    OUTPUT/_SUCCESS                  the run's summary (PredictionSummary): written last

A part is kept by a re-run when its record names the same model, options and inputs (with their versions);
``_SUCCESS`` marks the output complete, so a partial one is never taken for it. ``OutputParts`` is the order a
run depends on: which part each result belongs to, and when a part is complete.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypedDict

from tpustream.serve.predict.config import PredictError, PredictRequest
from tpustream.serve.predict.inputs import Item, Skipped
from tpustream.serve.predict.pool import PredictResult
from tpustream.storage import io as storage

__all__ = [
    "OutputParts",
    "PartEntry",
    "PartRecord",
    "PartRequest",
    "PredictionSummary",
    "SUCCESS",
    "differences",
    "existing_output",
    "part_name",
    "read_summary",
    "recorded_parts",
    "remove_stale",
]

PART_FORMAT = "tpustream.predictions-part/v1"
SUMMARY_FORMAT = "tpustream.predictions/v1"
SUCCESS = "_SUCCESS"
PARTS_DIR = "_parts"
_OUR_FILES = re.compile(rf"(predictions-\d{{5,}}\.jsonl|{PARTS_DIR}/\d{{5,}}\.json|{SUCCESS})")


class PartRequest(TypedDict):
    """What every result of a part depends on (its record's ``request``): a kept part must match it."""

    model: str
    model_sha256: str
    top_k: int
    max_pixels: int


class PartEntry(TypedDict):
    """One part as ``_SUCCESS`` lists it."""

    path: str
    num_results: int
    sha256: str


@dataclass
class PartRecord:
    """``OUTPUT/_parts/NNNNN.json``: what one part of JSON lines answers, written after it."""

    index: int
    request: PartRequest  # what every result depends on
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
    request: PredictRequest  # the inputs as given and every option the results depend on
    answered: int
    known: int  # answered images whose true class is known
    correct: int
    failed: int  # images that could not be classified: their results hold ``error`` and ``reason``
    skipped: dict[str, int]  # reason -> count: those ``failed`` and the listing's (not-an-image, ...)
    skipped_examples: dict[str, list[str]]  # the first few the listing skipped (failed images: in the parts)
    parts: list[PartEntry]  # in order
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


def part_name(index: int) -> str:
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


def existing_output(output: str) -> dict[str, int]:
    """Name (relative to ``output``) -> size of each file an earlier run left there; PredictError when
    anything else is there: an output directory is this command's alone.

    Lists what this output's files can be (its top level and ``_parts/``), then at most one object more: if
    anything else is anywhere under ``output``, the first (ours + 1) objects there hold it. A prefix full of
    other objects is refused after that one short listing, never paged through."""
    found: dict[str, int] = {}
    foreign: list[str] = []
    ours = storage.list_objects(output, recursive=False) + storage.list_objects(
        storage.join(output, PARTS_DIR)
    )
    for obj in ours:
        name = obj.uri[len(output) + 1 :]
        if name in ("", f"{PARTS_DIR}/"):
            continue  # a folder placeholder object
        if _OUR_FILES.fullmatch(name):
            found[name] = obj.size
        else:
            foreign.append(name)
    if not foreign:  # anything in another sub-folder (a folder placeholder too: not ours either)
        listed = {obj.uri for obj in ours}
        beyond = [obj for obj in storage.sample_objects(output, len(ours) + 1) if obj.uri not in listed]
        foreign = [obj.uri[len(output) + 1 :] for obj in beyond]
    if foreign:
        raise PredictError(
            f"--output {output} holds file(s) that are not predictions (e.g. {foreign[0]}): give a new or "
            "empty directory or prefix, or one an earlier `tpustream predict --output` wrote"
        )
    return found


def _kept_record(
    output: str, index: int, items: list[Item], request: PartRequest, sizes: dict[str, int]
) -> PartRecord | None:
    """Part ``index``'s record, when an earlier run wrote the part for the same model, options and inputs."""
    record = _read_part_record(output, index)
    if record is None or record.request != request:
        return None
    if record.inputs != [[item.name, item.version] for item in items]:
        return None
    if sizes.get(part_name(index)) != record.num_bytes:
        return None  # its JSON lines were removed or replaced since
    record.inputs = []  # checked: not kept in memory for every part of a large run
    return record


def _write_part(
    output: str, index: int, items: list[Item], results: list[PredictResult], request: PartRequest
) -> PartRecord:
    """The part's JSON lines, then its record: a part without a record is predicted again by a re-run."""
    digest = hashlib.sha256()
    num_bytes = 0
    with storage.open_write(storage.join(output, part_name(index)), content_type="application/x-ndjson") as f:
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


def differences(before: Mapping[str, object], now: Mapping[str, object]) -> str:
    """What differs between two requests, key by key: the error that refuses a complete output says it."""
    return "; ".join(
        f"{key} {before.get(key)!r} then, {now.get(key)!r} now"
        for key in sorted(set(before) | set(now))
        if before.get(key) != now.get(key)
    )


def recorded_parts(existing: dict[str, int]) -> set[int]:
    """The indexes of the parts whose record an earlier run left (``existing_output``'s names)."""
    return {int(name[len(PARTS_DIR) + 1 : -5]) for name in existing if name.startswith(f"{PARTS_DIR}/")}


def remove_stale(output: str, existing: dict[str, int], *, num_parts: int) -> None:
    """Parts an earlier run wrote beyond this run's last (its inputs were more), and temp files of writers
    killed midway: the output holds exactly what _SUCCESS lists."""
    for name in existing:
        if name != SUCCESS and int(re.sub(r"\D", "", name)) >= num_parts:
            storage.delete(storage.join(output, name))
    for directory in (output, storage.join(output, PARTS_DIR)):
        for partial in storage.list_partials(directory):
            storage.delete(partial)


class OutputParts:
    """The parts of one ``--output`` run, and the one order its producer and consumer depend on.

    ``feed`` (the producer, pulled by the decode pool, ahead of the results) cuts the planned items into parts
    of ``part_size``. A part an earlier run completed for the same request is kept and not fed; every other part
    is queued *before* its first item is yielded. ``take`` (the consumer) gets one result per fed item, in the
    same order (``predict_items`` keeps input order), so the part a result belongs to is always the head of the
    queue: when its last result arrives the part is written (JSON lines, then its record) and dequeued.

    Args:
        output: the output directory or prefix (absolute).
        request: what every result depends on: a kept part's record must name the same.
        existing: name -> size of the files an earlier run left there (``existing_output``).
        resumable: the indexes of the parts whose record is there (and may be kept).
        part_size: items per part.
        on_part: called after each part is kept or written (the progress bar's counts).
    """

    def __init__(
        self,
        output: str,
        request: PartRequest,
        existing: dict[str, int],
        *,
        resumable: set[int],
        part_size: int,
        on_part: Callable[[OutputParts], None] = lambda parts: None,
    ) -> None:
        self.output, self.request, self.existing = output, request, existing
        self.resumable, self.part_size, self.on_part = resumable, part_size, on_part
        self.records: dict[int, PartRecord] = {}  # every part kept or written, by index
        self.kept: set[int] = set()
        self._queue: deque[tuple[int, list[Item]]] = deque()  # parts fed, in order, not yet written
        self._results: list[PredictResult] = []  # the results of the queue's head so far

    def feed(self, items: Iterator[Item]) -> Iterator[Item]:
        """The producer: the items of every part not kept, in order; each part queued before its first item."""
        for index, part in enumerate(iter(lambda: list(itertools.islice(items, self.part_size)), [])):
            record = self._kept(index, part)
            if record is not None:
                self.records[index] = record
                self.kept.add(index)
                self.on_part(self)
                continue
            self._queue.append((index, part))  # before its items: their results find it at the head
            yield from part

    def take(self, result: PredictResult) -> None:
        """The consumer: the next result, which belongs to the queue's head; a complete part is written."""
        self._results.append(result)
        index, part = self._queue[0]
        if len(self._results) == len(part):
            self.records[index] = _write_part(self.output, index, part, self._results, self.request)
            self._queue.popleft()
            self._results = []
            self.on_part(self)

    @property
    def written(self) -> int:
        """Parts this run wrote."""
        return len(self.records) - len(self.kept)

    def ordered(self) -> list[PartRecord]:
        """Every part's record, in order."""
        return [self.records[index] for index in sorted(self.records)]

    def _kept(self, index: int, part: list[Item]) -> PartRecord | None:
        if index not in self.resumable:
            return None
        return _kept_record(self.output, index, part, self.request, self.existing)
