"""Vertex AI image-classification import files as a SOURCE: labels in JSONL or CSV, images anywhere.

The single-label forms of Vertex AI's "Prepare image training data for classification" (the ioformat
``image_classification_single_label_io_format_1.0.0.yaml`` of ``google.cloud.aiplatform.schema``):

- JSONL, one object per line: ``{"imageGcsUri": "gs://b/raw/1.jpg", "classificationAnnotation":
  {"displayName": "daisy"}, "dataItemResourceLabels": {"aiplatform.googleapis.com/ml_use": "training"}}``.
  A row whose ``classificationAnnotations`` names several labels is rejected as "multi-label" (we train
  single-label classifiers); a one-label ``classificationAnnotations`` is read.
- CSV, ``[ML_USE,]GCS_FILE_PATH,LABEL``: ML_USE is TRAINING, VALIDATION, TEST (or empty/UNASSIGNED), in
  any case; rows may mix two and three columns. A two-column row whose first field is an ML_USE word is
  ``ML_USE,GCS_FILE_PATH`` with no label (Vertex allows unlabelled images: here an "empty-label" row).
  Vertex's CSV has no header row; a first row whose path column is no path (``image,label``,
  ``ml_use,gcs_file_path,label``) is taken for a header, logged and skipped (not counted: it is no data).

A SOURCE is one import file, a comma-separated list of them, or a pattern ``gs://b/labels/*.jsonl`` /
``DIR/export-*.csv``: one ``*``, matching every object under the text before it (across ``/``, as a GCS
prefix does) whose name ends with the text after it, in sorted order. All files make one dataset.

Images may live in any bucket or on local disk: a path that is neither ``gs://`` nor ``file://`` is
resolved against the import file's own directory when relative (for an import file on GCS, within its
bucket). Any other scheme (``pipe:``, ``s3://``) makes that row a rejected row, not an error. An import file
on gs:// names only gs:// images (relative paths stay in its bucket), as Vertex's own import files do
(https://cloud.google.com/vertex-ai/docs/image-data/classification/prepare-data): a local path there
(``/mnt/x.jpg``, ``file://``) is rejected as "local-path", since the container reading it is not the
machine that wrote the file. Only regular files are read as images (a FIFO or device is "missing-object").

Splits: ``training`` -> "train", ``validation`` -> "val", ``test`` -> "test" (Vertex's convention: test is
held out from training and model selection, and is what ``evaluate`` and promotion decide on). Rows without
ml_use have no split: ``dataset.plan`` draws 10% of those per class into val, while rows with ml_use keep theirs.
An explicit ``--val-fraction`` re-splits every train/val row, ml_use or not, as it does for every source (one
rule for CIFAR's own split, import files and shards alike); test rows stay test.

Bad rows never raise and never vanish: unparseable rows (also a line over MAX_ROW_CHARS, JSON nested deeper
than MAX_JSON_DEPTH, a control character in a path or label, a row without a label whose path is no path),
rows without a label, multi-label rows and images listed twice with two labels become
``Rejected("<import file>:<line>", ...)`` in ``Source.rejected``. An image listed twice with the same label
is one item (the first row's ml_use is kept). Items are sorted by image URI and classes
by name, so the dataset depends on the set of rows, not their order. Import files are streamed line by line:
nothing holds a whole file's text.

This module owns which files a SOURCE names, the listing of all their rows (one item per image, conflicts and
rejects) and the SOURCE itself; reading and parsing one file's rows is ``sources.import_rows``.
"""

from __future__ import annotations

import array
import bisect
import contextlib
import gc
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from tpustream.image.codec import UnreadableImage, prepare_image_bytes
from tpustream.sources.import_rows import CONTROL, CSV_USAGE, BadRow, base_of, iter_rows, resolve
from tpustream.sources.types import Item, Rejected, Source, SourceError
from tpustream.storage import io as storage

__all__ = [
    "import_files_source",
    "import_file_objects",
    "expand_import_files",
    "expand_pattern",
]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- which files


def expand_import_files(spec: str) -> list[str]:
    """The import files a SOURCE names: each comma part a file or a ``PREFIX*SUFFIX`` pattern, deduplicated."""
    files: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        try:
            uri = storage.check_uri(part)
        except storage.StorageError as exc:
            raise SourceError(f"source {spec!r}: {exc}") from exc
        matches = expand_pattern(spec, uri) if "*" in uri else [uri]
        files.extend(m for m in matches if m not in files)
    return files


def expand_pattern(
    spec: str, pattern: str, *, example: str = "gs://BUCKET/labels/*.jsonl", suffixes: str = ".jsonl or .csv"
) -> list[str]:
    """Every object under the text before ``*`` whose name ends with the text after it, sorted (``example``
    and ``suffixes`` word the errors for the SOURCE form at hand)."""
    if pattern.count("*") > 1:
        raise SourceError(f"source {spec!r}: {pattern!r} has more than one '*'; use one, as in {example}")
    head, tail = pattern.split("*")
    if "/" in tail:
        raise SourceError(
            f"source {spec!r}: in {pattern!r} the '*' must be in the file name ({example}), not a folder"
        )
    if storage.is_gcs(head):
        directory = head[: head.rfind("/")] if head.count("/") > 2 else head.rstrip("/")
    else:
        directory = os.path.dirname(head) or "."
        head = os.path.join(directory, os.path.basename(head))  # the spelling os.walk gives its paths
    try:
        listed = storage.list_objects(directory)
    except storage.StorageError as exc:
        raise SourceError(f"source {spec!r}: cannot list {directory}: {exc}") from exc
    matches = [obj.uri for obj in listed if obj.uri.startswith(head) and obj.uri.endswith(tail)]
    if not matches:
        raise SourceError(
            f"source {spec!r}: no file matches {pattern!r}: check the prefix and the suffix ({suffixes})"
        )
    return matches


# --------------------------------------------------------------------------- all files -> one listing


@dataclass
class _Listing:
    """Everything the import files say, once parsed: the items and where each came from."""

    files: list[str]
    classes: list[str]
    uris: list[str]  # sorted; the items' refs
    items: list[Item]
    file_of: array.array  # per item, aligned with uris: the index into files of the row that listed it
    line_of: array.array  # and that row's line (arrays: 12 bytes an item, where tuples took ~80)
    rejected: list[Rejected] = field(default_factory=list)

    def origin(self, uri: str) -> str:
        """``<import file>:<line>`` of the row that listed ``uri``."""
        position = bisect.bisect_left(self.uris, uri)
        if position == len(self.uris) or self.uris[position] != uri:
            return "?"
        return f"{self.files[self.file_of[position]]}:{self.line_of[position]}"


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: a listing makes millions of objects that never form a cycle, and
    the collector's repeated passes over them cost a third of a million-row listing's time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _list(spec: str, files: list[str] | None = None) -> _Listing:
    """Parse every import file of ``spec`` (``files``: already expanded) into one listing, streamed."""
    with _gc_paused():
        return _list_rows(spec, expand_import_files(spec) if files is None else files)


def _list_rows(spec: str, files: list[str]) -> _Listing:
    started = time.perf_counter()
    # image URI -> (label, split, file index, line); labels are shared strings (names)
    entries: dict[str, tuple[str, str | None, int, int]] = {}
    names: dict[str, str] = {}
    conflicts: dict[str, list[tuple[int, int, str]]] = {}  # image -> every row listing it, once in conflict
    rejected: list[Rejected] = []
    headers: list[str] = []  # CSV header rows skipped
    merged = split_differs = rows = 0
    for file_index, uri in enumerate(files):
        base = base_of(uri)
        for line, row in iter_rows(uri):
            if row is None:
                headers.append(f"{uri}:{line}")
                continue
            rows += 1
            if isinstance(row, BadRow):
                rejected.append(Rejected(f"{uri}:{line}", row.reason, row.message))
                continue
            image, label, split = row
            if control := CONTROL.search(label):
                message = f"label {label[:80]!r}: a control character (U+{ord(control.group()):04X})"
                rejected.append(Rejected(f"{uri}:{line}", "malformed-row", message))
                continue
            try:
                resolved = resolve(image, base)
            except BadRow as bad:
                rejected.append(Rejected(f"{uri}:{line}", bad.reason, bad.message))
                continue
            label = names.setdefault(label, label)
            if resolved in conflicts:
                conflicts[resolved].append((file_index, line, label))
                continue
            first = entries.get(resolved)
            if first is None:
                entries[resolved] = (label, split, file_index, line)
            elif first[0] == label:
                merged += 1
                split_differs += first[1] != split
            else:
                conflicts[resolved] = [(first[2], first[3], first[0]), (file_index, line, label)]
                del entries[resolved]
    for image, listings in conflicts.items():
        labels = sorted({label for _, _, label in listings})
        for file_index, line, label in listings:
            message = (
                f"{image} is listed as {' and as '.join(labels)}: keep one label (this row says {label})"
            )
            rejected.append(Rejected(f"{files[file_index]}:{line}", "conflicting-labels", message))
    if not entries:
        example = f" (e.g. {rejected[0].ref}: {rejected[0].message})" if rejected else ""
        if headers:
            example += f", {len(headers)} header row(s) skipped ({headers[0]})"
        raise SourceError(
            f"source {spec!r}: no valid row in {len(files)} import file(s), {len(rejected)} rejected{example}; "
            'expected JSONL rows {"imageGcsUri": ..., "classificationAnnotation": {"displayName": ...}} '
            f"or CSV rows {CSV_USAGE}"
        )
    classes = sorted(names.keys() & {label for label, *_ in entries.values()})
    class_index = {name: i for i, name in enumerate(classes)}
    uris = sorted(entries)
    items: list[Item] = []
    file_of = array.array("I")
    line_of = array.array("Q")
    for image in uris:
        label, split, file_index, line = entries[image]
        items.append(Item(image, class_index[label], split))
        file_of.append(file_index)
        line_of.append(line)
    if merged:
        log.info(
            "%d duplicate row(s) merged (same image, same label)%s",
            merged,
            f"; {split_differs} with another ml_use: the first row's is kept" if split_differs else "",
        )
    if conflicts:
        log.warning("%d image(s) listed with two or more labels: all their rows are rejected", len(conflicts))
    log.info(
        "read %d row(s) of %d import file(s) in %.1f s: %d images, %d rejected",
        rows,
        len(files),
        time.perf_counter() - started,
        len(items),
        len(rejected),
    )
    return _Listing(files, classes, uris, items, file_of, line_of, rejected)


# --------------------------------------------------------------------------- the SOURCE form


def import_files_source(spec: str) -> Source:
    """The Vertex AI import-file SOURCE form (one file, a comma list, or ``PREFIX*.jsonl``): see the module."""
    listing = _list(spec)

    def load(item: Item, max_side: int | None) -> tuple[bytes, str]:
        uri = str(item.ref)
        name = f"{uri} (listed at {listing.origin(uri)})"
        try:
            data = storage.read_bytes(uri)
        except storage.StorageError as exc:
            raise UnreadableImage(f"{name}: cannot read ({exc})") from exc
        return prepare_image_bytes(data, os.path.splitext(uri)[1], max_side, name)

    counts = {
        split: sum(1 for item in listing.items if item.split == split) for split in ("train", "val", "test")
    }
    unassigned = len(listing.items) - sum(counts.values())
    named = ", ".join(listing.files[:3]) + (
        f" and {len(listing.files) - 3} more" if len(listing.files) > 3 else ""
    )
    description = (
        f"Vertex AI import file(s) {named}: {len(listing.items)} images, "
        f"{len(listing.classes)} classes ({counts['train']} train / {counts['val']} val / {counts['test']} test / "
        f"{unassigned} unassigned), {len(listing.rejected)} rows rejected"
    )
    return Source(
        spec=spec,
        description=description,
        classes=listing.classes,
        items=listing.items,
        loader=load,
        rejected=listing.rejected,
        locator=lambda item: str(item.ref),
    )


def _parent(uri: str) -> str:
    return uri[: uri.rfind("/")] if storage.is_gcs(uri) else os.path.dirname(uri)


def import_file_objects(spec: str) -> list[storage.ObjectInfo]:
    """What the data fingerprint hashes: the import files and every image they list, sorted by URI.

    Each image's version (GCS generation, local mtime) comes from listing its parent prefix once, not from
    a request per image; an image listed but absent has version "missing".
    """
    files = expand_import_files(spec)
    try:  # before the rows are read: a file edited meanwhile then differs from this next time
        objects = [storage.stat(uri) for uri in files]
    except storage.StorageError as exc:
        raise SourceError(f"source {spec!r}: {exc}") from exc
    listing = _list(spec, files)
    by_parent: dict[str, list[str]] = {}
    for uri in listing.uris:
        by_parent.setdefault(_parent(uri), []).append(uri)
    for parent, images in by_parent.items():
        try:
            listed = {obj.uri: obj for obj in storage.list_objects(parent, recursive=False)}
        except storage.StorageError as exc:
            raise SourceError(f"source {spec!r}: cannot list the images under {parent}: {exc}") from exc
        objects.extend(listed.get(uri) or storage.ObjectInfo(uri, 0, "missing") for uri in images)
    return sorted(objects, key=lambda obj: obj.uri)
