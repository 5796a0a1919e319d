"""What every tpustream JSON file shares: strict JSON (``json_bytes``), the file a URI names (``json_file_uri``),
the one error type (``ArtifactError``) and the checked readers of a parsed document the typed files are built with.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from tpustream.errors import TpustreamError
from tpustream.storage import io as storage

__all__ = ["ArtifactError", "json_bytes", "json_file_uri"]


class ArtifactError(TpustreamError, ValueError):
    """A manifest, model card or metrics file that is not what this version of tpustream writes; the message
    names the file, what is wrong with it and how to get a good one."""


def json_bytes(document: Any, *, indent: int | None = None) -> bytes:
    """``document`` as strict JSON, a non-finite number (NaN, ±inf) written as null: a bare ``NaN`` is
    not JSON and breaks other readers. Readers here take null (and a legacy NaN) as "no number"."""
    return json.dumps(_finite_or_null(document), indent=indent, allow_nan=False).encode()


def _finite_or_null(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(item) for item in value]
    return value


def _require(document: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``document[key]``, checked to be a ``kind``; an ArtifactError naming ``where`` otherwise."""
    if key not in document:
        raise ArtifactError(f"{where} lacks {key!r}")
    value = document[key]
    # bool is an int to isinstance; a count given as true is a broken file, not 1
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise ArtifactError(
            f"{where}: {key!r} is {type(value).__name__} {value!r}, expected {_kind_name(kind)}"
        )
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ArtifactError(f"{where} is {type(value).__name__}, expected a JSON object")
    return value


def _extra(document: Mapping[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    return {key: value for key, value in document.items() if key not in known}


def _absent(document: Mapping[str, Any], known: tuple[str, ...]) -> frozenset[str]:
    return frozenset(key for key in known if key not in document and key != "format")


def _written(known: dict[str, Any], absent: frozenset[str], extra: dict[str, Any]) -> dict[str, Any]:
    """A document's keys as its file had them: the known ones it had, in the writer's order, then ``extra``."""
    return {**{key: value for key, value in known.items() if key not in absent}, **extra}


def _check_format(
    document: Mapping[str, Any], expected: str, where: str, noun: str, *, required: bool
) -> None:
    """Refuse a file of another format version (or, where ``required``, of none) with what was found;
    ``noun`` says what the file should be."""
    if "format" not in document and not required:
        return
    found = document.get("format")
    if found != expected:
        what = "it has no 'format'" if found is None else f"it has format {found!r}"
        raise ArtifactError(f"{where} is not a {noun} this version reads: {what}, expected {expected!r}")


@contextmanager
def _shape_errors(where: str, fix: str) -> Iterator[None]:
    """A file whose shape is wrong (a key missing, a value of the wrong type) as one ArtifactError that also
    says what to do (``fix``)."""
    try:
        yield
    except ArtifactError as exc:
        raise ArtifactError(f"{exc}: {fix}") from exc
    except (TypeError, ValueError, AttributeError) as exc:
        raise ArtifactError(f"{where} is malformed ({exc}): {fix}") from exc


def json_file_uri(uri: str, name: str) -> str:
    """The file a URI names: ``uri`` itself when it ends in ``.json``, else ``name`` in that directory (the
    URI checked, local or gs://). Every reader of these files takes either."""
    uri = storage.check_uri(uri).rstrip("/")
    return uri if uri.endswith(".json") else storage.join(uri, name)


def _read_document(uri: str, fix: str) -> Mapping[str, Any]:
    """The JSON object at ``uri`` (storage.NotFound passes through: what to do about that is the caller's)."""
    data = storage.read_bytes(uri)
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise ArtifactError(f"{uri} is not valid JSON ({exc}): {fix}") from exc
    return _object(document, uri)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _optional_number(value: Any) -> float | None:
    """A number as written (an int stays an int, so writing it back gives the same bytes), or None."""
    if value is None or isinstance(value, int | float) and not isinstance(value, bool):
        return value
    raise TypeError(f"{value!r} is not a number")
