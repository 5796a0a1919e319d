"""One Vertex AI import file's rows: streamed line by line (a line over MAX_ROW_CHARS refused unread), parsed
as JSONL or CSV (``[ML_USE,]GCS_FILE_PATH,LABEL``) into (image as written, label, split), each bad row a
``BadRow`` with its reason; and where a row's image is (``resolve``: relative to the import file, gs:// only
for an import file on GCS). ``sources.import_files`` turns every file's rows into one listing and a SOURCE.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import posixpath
import re
from collections.abc import Iterator

from tpustream.sources.types import SourceError
from tpustream.storage import io as storage

__all__ = [
    "BadRow",
    "CONTROL",
    "CSV_USAGE",
    "MAX_JSON_DEPTH",
    "MAX_ROW_CHARS",
    "ML_USE_KEY",
    "ML_USE_SPLITS",
    "Row",
    "base_of",
    "resolve",
    "iter_rows",
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
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")
_TOO_LONG = "\x00too-long\x00"  # what a CSV line over MAX_ROW_CHARS is read as: one field no real row has
_JSON = json.JSONDecoder()  # json.loads minus its per-call argument handling: a million rows is the scale


class BadRow(Exception):
    """One row left out: ``reason`` is one of sources.types.SKIP_REASONS."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


# A parsed row: (image as written, label, split or None).
Row = tuple[str, str, "str | None"]


def _split_of(ml_use: object) -> str | None:
    if not isinstance(ml_use, str) or ml_use.strip().lower() not in ML_USE_SPLITS:
        raise BadRow(
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


def _jsonl_row(line: str) -> Row:
    """One JSONL line as (image, label, split); raises BadRow."""
    if line.count("[") + line.count("{") > MAX_JSON_DEPTH and _json_depth(line) > MAX_JSON_DEPTH:
        raise BadRow("malformed-row", f"JSON nested deeper than {MAX_JSON_DEPTH} levels (a Vertex row has 3)")
    try:
        row = _JSON.decode(line)
    except ValueError as exc:
        raise BadRow("malformed-row", f"not valid JSON ({exc})") from None
    if not isinstance(row, dict):
        raise BadRow("malformed-row", f"a JSON {type(row).__name__}, not an object")
    image = row.get("imageGcsUri")
    if not isinstance(image, str) or not image.strip():
        raise BadRow("malformed-row", "no imageGcsUri (the image's gs:// URI or path)")
    if "classificationAnnotations" in row:  # the multi-label form: fine while it holds one label
        annotations = row["classificationAnnotations"]
        if not isinstance(annotations, list) or not all(isinstance(a, dict) for a in annotations):
            raise BadRow("malformed-row", "classificationAnnotations is not a list of objects")
        names = {str(a.get("displayName") or "").strip() for a in annotations} - {""}
        if len(names) > 1:
            raise BadRow(
                "multi-label",
                f"{image} has {len(names)} labels ({', '.join(sorted(names))}): tpustream trains single-label "
                "classifiers; keep one classificationAnnotation per image",
            )
        label = names.pop() if names else ""
    else:
        annotation = row.get("classificationAnnotation")
        if annotation is not None and not isinstance(annotation, dict):
            raise BadRow("malformed-row", "classificationAnnotation is not an object")
        # {"display_name": ...} is a misspelt key (malformed), not an unlabelled image
        if annotation and "displayName" not in annotation:
            raise BadRow(
                "malformed-row",
                f"classificationAnnotation has no displayName (keys: {sorted(annotation)[:5]})",
            )
        label = (annotation or {}).get("displayName") or ""
        if not isinstance(label, str):
            raise BadRow("malformed-row", f"displayName {label!r} is not a string")
    if not label.strip():
        _check_path_like(image)
        raise BadRow("empty-label", f"{image}: no label (classificationAnnotation.displayName)")
    resource_labels = row.get("dataItemResourceLabels") or {}
    if not isinstance(resource_labels, dict):
        raise BadRow("malformed-row", "dataItemResourceLabels is not an object")
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
        raise BadRow(
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


def _csv_row(fields: list[str]) -> Row:
    """One CSV record ``[ML_USE,]GCS_FILE_PATH,LABEL`` as (image, label, split); raises BadRow."""
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
        raise BadRow(
            "malformed-row",
            f"{len(fields)} columns: expected {CSV_USAGE} (several labels per image, the multi-label "
            "form, are not supported: tpustream trains single-label classifiers)",
        )
    if not image:
        raise BadRow("malformed-row", f"no image path: expected {CSV_USAGE}")
    if not label:
        _check_path_like(image)
        raise BadRow("empty-label", f"{image}: no label: expected {CSV_USAGE}")
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


def iter_rows(uri: str) -> Iterator[tuple[int, Row | BadRow | None]]:
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
                        yield line, BadRow("malformed-row", f"line {_LONG_ROW}")
                        continue
                    if is_first and _is_header(fields):
                        log.info("%s:%d is a header row (%s): skipped", uri, line, ",".join(fields)[:200])
                        yield line, None
                        continue
                    if any("\ufffd" in f for f in fields):
                        yield line, BadRow("malformed-row", "not UTF-8 text")
                        continue
                    if any("\n" in f or "\r" in f for f in fields):
                        message = f"a field runs over lines {line}-{reader.line_num} (an unclosed quote?)"
                        yield line, BadRow("malformed-row", message)
                        continue
                    try:
                        yield line, _csv_row(fields)
                    except BadRow as bad:
                        yield line, bad
            except csv.Error as exc:  # a field over the csv module's size limit: the reader cannot go on
                yield start, BadRow("malformed-row", f"CSV error, rest of the file not read ({exc})")
            return
        for line, content in enumerate(_bounded_lines(text), start=1):
            if content is None:
                yield line, BadRow("malformed-row", _LONG_ROW)
                continue
            if not content.strip():
                continue
            if "\ufffd" in content:
                yield line, BadRow("malformed-row", "not UTF-8 text")
                continue
            try:
                yield line, _jsonl_row(content)
            except BadRow as bad:
                yield line, bad


def base_of(import_file: str) -> str:
    """The directory relative image paths in ``import_file`` are resolved against."""
    if storage.is_gcs(import_file):
        return import_file[: import_file.rfind("/")]
    return os.path.dirname(os.path.abspath(import_file))


def resolve(image: str, base: str) -> str:
    """An image as written in an import file -> the URI it names (gs://, or a normalised local path)."""
    if control := CONTROL.search(image):
        raise BadRow(
            "malformed-row",
            f"{image[:200]!r}: a control character (U+{ord(control.group()):04X}) in the path",
        )
    if image.startswith(storage.GCS_SCHEME):
        if not image[len(storage.GCS_SCHEME) :].partition("/")[2]:
            raise BadRow("malformed-row", f"{image!r} names a bucket, not an image: gs://BUCKET/PATH")
        return image
    try:
        path = storage.check_uri(image)  # refuses pipe: and other schemes; file:///x -> /x
    except storage.StorageError as exc:
        raise BadRow("malformed-row", str(exc)) from None
    if storage.is_gcs(base):
        if path.startswith("/"):
            raise BadRow(
                "local-path",
                f"{image!r} is a local path in an import file on GCS: name images there by gs:// URI (or "
                "relative to the import file), as Vertex AI requires",
            )
        bucket_root = base[: base.index("/", len(storage.GCS_SCHEME)) + 1] if base.count("/") > 2 else base
        name = posixpath.normpath(posixpath.join(base[len(bucket_root) :], path))
        if name == ".." or name.startswith("../"):
            raise BadRow("malformed-row", f"{image!r} points outside the import file's bucket")
        return bucket_root.rstrip("/") + "/" + name
    return os.path.normpath(os.path.join(base, path))
