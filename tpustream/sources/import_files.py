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
ml_use have no split: ``shard_plan`` draws 10% of those per class into val, while rows with ml_use keep theirs.
An explicit ``--val-fraction`` re-splits every train/val row, ml_use or not, as it does for every source (one
rule for CIFAR's own split, import files and shards alike); test rows stay test.

Bad rows never raise and never vanish: unparseable rows (also a line over MAX_ROW_CHARS, JSON nested deeper
than MAX_JSON_DEPTH, a control character in a path or label, a row without a label whose path is no path),
rows without a label, multi-label rows and images listed twice with two labels become
``Rejected("<import file>:<line>", ...)`` in ``Source.rejected``. An image listed twice with the same label
is one item (the first row's ml_use is kept). Items are sorted by image URI and classes
by name, so the dataset depends on the set of rows, not their order. Import files are streamed line by line:
nothing holds a whole file's text.
"""

from __future__ import annotations

import array
import bisect
import contextlib
import csv
import gc
import io
import json
import logging
import os
import posixpath
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from tpustream.image.codec import UnreadableImage, prepare_image_bytes
from tpustream.sources.types import Item, Rejected, Source, SourceError
from tpustream.storage import io as storage

__all__ = [
    "import_files_source",
    "import_file_objects",
    "expand_import_files",
    "expand_pattern",
    "ML_USE_SPLITS",
]

log = logging.getLogger(__name__)

ML_USE_KEY = "aiplatform.googleapis.com/ml_use"
# Vertex's ml_use values -> our split. test is its own split: held out from training and model selection.
ML_USE_SPLITS: dict[str, str | None] = {
    "training": "train",
    "validation": "val",
    "test": "test",
    "unassigned": None,
    "": None,
}
CSV_USAGE = "[ML_USE,]GCS_FILE_PATH,LABEL"
MAX_ROW_CHARS = 1 << 20  # a Vertex row is well under 4 KiB; a longer line is refused unread, never held whole
MAX_JSON_DEPTH = 16  # a Vertex JSONL row nests 3 deep; deeper is refused before json recurses into it
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")
_TOO_LONG = "\x00too-long\x00"  # what a CSV line over MAX_ROW_CHARS is read as: one field no real row has
_JSON = json.JSONDecoder()  # json.loads minus its per-call argument handling: a million rows is the scale


class _BadRow(Exception):
    """One row left out: ``reason`` is one of source_types.SKIP_REASONS."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


# A parsed row: (image as written, label, split or None).
_Row = tuple[str, str, "str | None"]


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


# --------------------------------------------------------------------------- rows of one file


def _split_of(ml_use: object) -> str | None:
    if not isinstance(ml_use, str) or ml_use.strip().lower() not in ML_USE_SPLITS:
        raise _BadRow(
            "malformed-row", f"unknown ml_use {ml_use!r}: use training, validation or test (or leave it out)"
        )
    return ML_USE_SPLITS[ml_use.strip().lower()]


def _json_depth(line: str) -> int:
    """How deep ``line``'s arrays and objects nest (brackets inside strings do not count)."""
    depth = deepest = 0
    for bracket in _JSON_BRACKET.findall(_JSON_STRING.sub("", line)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _jsonl_row(line: str) -> _Row:
    """One JSONL line as (image, label, split); raises _BadRow."""
    if line.count("[") + line.count("{") > MAX_JSON_DEPTH and _json_depth(line) > MAX_JSON_DEPTH:
        raise _BadRow(
            "malformed-row", f"JSON nested deeper than {MAX_JSON_DEPTH} levels (a Vertex row has 3)"
        )
    try:
        row = _JSON.decode(line)
    except ValueError as exc:
        raise _BadRow("malformed-row", f"not valid JSON ({exc})") from None
    if not isinstance(row, dict):
        raise _BadRow("malformed-row", f"a JSON {type(row).__name__}, not an object")
    image = row.get("imageGcsUri")
    if not isinstance(image, str) or not image.strip():
        raise _BadRow("malformed-row", "no imageGcsUri (the image's gs:// URI or path)")
    if "classificationAnnotations" in row:  # the multi-label form: fine while it holds one label
        annotations = row["classificationAnnotations"]
        if not isinstance(annotations, list) or not all(isinstance(a, dict) for a in annotations):
            raise _BadRow("malformed-row", "classificationAnnotations is not a list of objects")
        names = {str(a.get("displayName") or "").strip() for a in annotations} - {""}
        if len(names) > 1:
            raise _BadRow(
                "multi-label",
                f"{image} has {len(names)} labels ({', '.join(sorted(names))}): tpustream trains single-label "
                "classifiers; keep one classificationAnnotation per image",
            )
        label = names.pop() if names else ""
    else:
        annotation = row.get("classificationAnnotation")
        if annotation is not None and not isinstance(annotation, dict):
            raise _BadRow("malformed-row", "classificationAnnotation is not an object")
        # {"display_name": ...} is a misspelt key (malformed), not an unlabelled image
        if annotation and "displayName" not in annotation:
            raise _BadRow(
                "malformed-row",
                f"classificationAnnotation has no displayName (keys: {sorted(annotation)[:5]})",
            )
        label = (annotation or {}).get("displayName") or ""
        if not isinstance(label, str):
            raise _BadRow("malformed-row", f"displayName {label!r} is not a string")
    if not label.strip():
        _check_path_like(image)
        raise _BadRow("empty-label", f"{image}: no label (classificationAnnotation.displayName)")
    resource_labels = row.get("dataItemResourceLabels") or {}
    if not isinstance(resource_labels, dict):
        raise _BadRow("malformed-row", "dataItemResourceLabels is not an object")
    ml_use = resource_labels.get(ML_USE_KEY)
    return image.strip(), label.strip(), None if ml_use is None else _split_of(ml_use)


def _path_like(image: str) -> bool:
    """Whether ``image`` can name an image file: a URI, a path with a folder, or a name with an extension."""
    if "/" in image:
        return True
    return bool(re.search(r"[.][A-Za-z0-9]{2,5}$", image)) and not any(c.isspace() for c in image)


def _check_path_like(image: str) -> None:
    """Raise malformed-row for a row whose path column is no path: garbage, not an unlabelled image."""
    if not _path_like(image):
        raise _BadRow(
            "malformed-row", f"{image[:80]!r} is not an image path or gs:// URI (and the row has no label)"
        )


def _csv_path_column(fields: list[str]) -> str:
    """The GCS_FILE_PATH field of a CSV record, as _csv_row reads it."""
    fields = [f.strip() for f in fields]
    if len(fields) == 3 or (len(fields) == 2 and fields[0].lower() in ML_USE_SPLITS and fields[0]):
        return fields[1]
    return fields[0]


def _is_header(fields: list[str]) -> bool:
    """A first CSV row that is a header (``image,label``): every field set, the path column no path."""
    return (
        1 <= len(fields) <= 3 and all(f.strip() for f in fields) and not _path_like(_csv_path_column(fields))
    )


def _csv_row(fields: list[str]) -> _Row:
    """One CSV record ``[ML_USE,]GCS_FILE_PATH,LABEL`` as (image, label, split); raises _BadRow."""
    fields = [f.strip() for f in fields]
    if len(fields) == 3:
        ml_use, image, label = fields
    elif len(fields) == 2 and fields[0].lower() in ML_USE_SPLITS and fields[0]:
        ml_use, image, label = fields[0], fields[1], ""  # ML_USE,GCS_FILE_PATH: an unlabelled image
    elif len(fields) == 2:
        ml_use, image, label = "", *fields
    elif len(fields) == 1:
        ml_use, image, label = "", fields[0], ""
    else:
        raise _BadRow(
            "malformed-row",
            f"{len(fields)} columns: expected {CSV_USAGE} (several labels per image, the multi-label "
            "form, are not supported: tpustream trains single-label classifiers)",
        )
    if not image:
        raise _BadRow("malformed-row", f"no image path: expected {CSV_USAGE}")
    if not label:
        _check_path_like(image)
        raise _BadRow("empty-label", f"{image}: no label: expected {CSV_USAGE}")
    return image, label, _split_of(ml_use)


def _open_text(uri: str) -> io.TextIOWrapper:
    """A text stream over an import file; bytes that are not UTF-8 turn into U+FFFD and reject their row."""
    try:
        raw = storage.open_read(uri)
    except storage.NotFound as exc:
        raise SourceError(f"import file {uri} does not exist: fix the path or upload it") from exc
    except storage.StorageError as exc:
        raise SourceError(f"import file {uri}: {exc}") from exc
    return io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace", newline="")


def _bounded_lines(text: io.TextIOWrapper) -> Iterator[str | None]:
    """The lines of ``text``; None for a line over MAX_ROW_CHARS, which is read through but never held."""
    while line := text.readline(MAX_ROW_CHARS + 1):
        if len(line) <= MAX_ROW_CHARS or line.endswith(("\n", "\r")):
            yield line
            continue
        while (rest := text.readline(MAX_ROW_CHARS)) and not rest.endswith(("\n", "\r")):
            pass
        yield None


_LONG_ROW = f"longer than {MAX_ROW_CHARS:,} characters: not a Vertex import row"


def _rows(uri: str) -> Iterator[tuple[int, _Row | _BadRow | None]]:
    """(line number, row or why not) for every non-blank row of one import file, streamed; None for a
    CSV header row."""
    with _open_text(uri) as text:
        if uri.lower().endswith(".csv"):
            reader = csv.reader(_TOO_LONG + "\n" if line is None else line for line in _bounded_lines(text))
            start = 1
            first = True
            try:
                for fields in reader:
                    line, start = start, reader.line_num + 1
                    if not any(f.strip() for f in fields):
                        continue
                    is_first, first = first, False
                    if any(_TOO_LONG in f for f in fields):
                        yield line, _BadRow("malformed-row", f"line {_LONG_ROW}")
                        continue
                    if is_first and _is_header(fields):
                        log.info("%s:%d is a header row (%s): skipped", uri, line, ",".join(fields)[:200])
                        yield line, None
                        continue
                    if any("\ufffd" in f for f in fields):
                        yield line, _BadRow("malformed-row", "not UTF-8 text")
                        continue
                    if any("\n" in f or "\r" in f for f in fields):
                        message = f"a field runs over lines {line}-{reader.line_num} (an unclosed quote?)"
                        yield line, _BadRow("malformed-row", message)
                        continue
                    try:
                        yield line, _csv_row(fields)
                    except _BadRow as bad:
                        yield line, bad
            except csv.Error as exc:  # a field over the csv module's size limit: the reader cannot go on
                yield start, _BadRow("malformed-row", f"CSV error, rest of the file not read ({exc})")
            return
        for line, content in enumerate(_bounded_lines(text), start=1):
            if content is None:
                yield line, _BadRow("malformed-row", _LONG_ROW)
                continue
            if not content.strip():
                continue
            if "\ufffd" in content:
                yield line, _BadRow("malformed-row", "not UTF-8 text")
                continue
            try:
                yield line, _jsonl_row(content)
            except _BadRow as bad:
                yield line, bad


def _base_of(import_file: str) -> str:
    """The directory relative image paths in ``import_file`` are resolved against."""
    if storage.is_gcs(import_file):
        return import_file[: import_file.rfind("/")]
    return os.path.dirname(os.path.abspath(import_file))


def _resolve(image: str, base: str) -> str:
    """An image as written in an import file -> the URI it names (gs://, or a normalised local path)."""
    if control := _CONTROL.search(image):
        raise _BadRow(
            "malformed-row",
            f"{image[:200]!r}: a control character (U+{ord(control.group()):04X}) in the path",
        )
    if image.startswith(storage.GCS_SCHEME):
        if not image[len(storage.GCS_SCHEME) :].partition("/")[2]:
            raise _BadRow("malformed-row", f"{image!r} names a bucket, not an image: gs://BUCKET/PATH")
        return image
    try:
        path = storage.check_uri(image)  # refuses pipe: and other schemes; file:///x -> /x
    except storage.StorageError as exc:
        raise _BadRow("malformed-row", str(exc)) from None
    if storage.is_gcs(base):
        if path.startswith("/"):
            raise _BadRow(
                "local-path",
                f"{image!r} is a local path in an import file on GCS: name images there by gs:// URI (or "
                "relative to the import file), as Vertex AI requires",
            )
        bucket_root = base[: base.index("/", len(storage.GCS_SCHEME)) + 1] if base.count("/") > 2 else base
        name = posixpath.normpath(posixpath.join(base[len(bucket_root) :], path))
        if name == ".." or name.startswith("../"):
            raise _BadRow("malformed-row", f"{image!r} points outside the import file's bucket")
        return bucket_root.rstrip("/") + "/" + name
    return os.path.normpath(os.path.join(base, path))


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
        base = _base_of(uri)
        for line, row in _rows(uri):
            if row is None:
                headers.append(f"{uri}:{line}")
                continue
            rows += 1
            if isinstance(row, _BadRow):
                rejected.append(Rejected(f"{uri}:{line}", row.reason, row.message))
                continue
            image, label, split = row
            if control := _CONTROL.search(label):
                message = f"label {label[:80]!r}: a control character (U+{ord(control.group()):04X})"
                rejected.append(Rejected(f"{uri}:{line}", "malformed-row", message))
                continue
            try:
                resolved = _resolve(image, base)
            except _BadRow as bad:
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
