"""evaluate's ``metrics.json`` (``EvalReport``): the candidate's and the champion's numbers on one split."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tpustream.artifacts._json import (
    ArtifactError,
    _absent,
    _check_format,
    _extra,
    _object,
    _read_document,
    _require,
    _shape_errors,
    _written,
    json_bytes,
    json_file_uri,
)
from tpustream.artifacts.model_card import DatasetRef
from tpustream.storage import io as storage

__all__ = ["METRICS_FORMAT", "EvalReport"]

METRICS_FORMAT = "tpustream.metrics.masked/v1"

_METRICS_FIX = "re-run tpustream evaluate"


@dataclass(frozen=True, kw_only=True)
class EvalReport:
    """evaluate's ``metrics.json`` (docs/ARCHITECTURE.md, "Evaluation"): the candidate's and the champion's
    numbers on one dataset's decision split (``split``: test when the dataset has one, else val; files written
    before the test split lack it and read as val). ``candidate`` and ``champion`` are
    ``evaluate.evaluate_model``'s results (top1, top5, loss, per_class_accuracy, confusion_matrix,
    model_sha256, ...); ``val``, when test decides, is the candidate's on val (for reference: val chose its
    best epoch)."""

    dataset: DatasetRef
    classes: list[str]
    candidate: dict[str, Any]
    split: str = "val"  # what candidate and champion were measured on, and promotion decides on
    val: dict[str, Any] | None = None  # the candidate on val when split is test; None otherwise (not written)
    champion: dict[str, Any] | None = None  # None: no champion, or it could not be measured (champion_note)
    champion_note: str | None = None
    created: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    absent: frozenset[str] = field(default=frozenset(), repr=False)  # keys its file lacked: not written back

    FORMAT: ClassVar[str] = METRICS_FORMAT
    NAME: ClassVar[str] = "metrics.json"
    _KEYS: ClassVar[tuple[str, ...]] = (
        "format",
        "dataset",
        "classes",
        "split",
        "candidate",
        "val",
        "champion",
        "champion_note",
        "created",
    )

    @classmethod
    def from_json(cls, document: Any, where: str = "metrics.json") -> EvalReport:
        with _shape_errors(where, _METRICS_FIX):
            document = _object(document, where)
            _check_format(document, METRICS_FORMAT, where, "tpustream metrics.json", required=False)
            champion, note = document.get("champion"), document.get("champion_note")
            for key, value in (("champion", champion), ("val", document.get("val"))):
                if value is not None and not isinstance(value, Mapping):
                    raise ArtifactError(
                        f"{where}: {key!r} is {type(value).__name__}, expected an object or null"
                    )
            split = str(document.get("split") or "val")
            if split not in ("val", "test"):
                raise ArtifactError(f"{where}: 'split' is {split!r}, expected 'val' or 'test'")
            return cls(
                dataset=DatasetRef.from_json(
                    _require(document, "dataset", Mapping, where), f"{where}: 'dataset'"
                ),
                classes=[str(name) for name in _require(document, "classes", list, where)],
                candidate=dict(_require(document, "candidate", Mapping, where)),
                split=split,
                val=None if document.get("val") is None else dict(document["val"]),
                champion=None if champion is None else dict(champion),
                champion_note=None if note is None else str(note),
                created=str(document.get("created") or ""),
                extra=_extra(document, cls._KEYS),
                absent=_absent(document, cls._KEYS),
            )

    def to_json(self) -> dict[str, Any]:
        """The report as evaluate writes it, keys in its order."""
        known = {
            "format": METRICS_FORMAT,
            "dataset": self.dataset.to_json(),
            "classes": list(self.classes),
            "split": self.split,
            "candidate": self.candidate,
            "val": self.val,
            "champion": self.champion,
            "champion_note": self.champion_note,
            "created": self.created,
        }
        return _written(known, self.absent | ({"val"} if self.val is None else set()), self.extra)

    @classmethod
    def read(cls, uri: str) -> EvalReport:
        """The report at ``uri`` (metrics.json itself, or its directory). storage.NotFound passes through."""
        uri = json_file_uri(uri, cls.NAME)
        return cls.from_json(_read_document(uri, _METRICS_FIX), uri)

    def write(self, uri: str) -> None:
        """Write it to ``uri`` (metrics.json's own URI) atomically, as strict JSON (a NaN loss is null)."""
        storage.write_bytes(uri, json_bytes(self.to_json(), indent=1), content_type="application/json")
