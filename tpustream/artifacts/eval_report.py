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

__all__ = ["METRICS_FORMAT", "Baseline", "EvalReport", "Evaluation"]

METRICS_FORMAT = "tpustream.metrics/v1"

_METRICS_FIX = "re-run tpustream evaluate"


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """One model's numbers on one split: ``tpustream.train.evaluate.evaluate_model``'s result, and the
    ``candidate``, ``champion`` and ``val`` of metrics.json.

    A number is None when it was not measured, or was not finite (metrics.json stores NaN as null); the
    class-balanced metrics and the curves come from the per-sample scores (evaluations before them have
    none). ``version`` and ``paired`` are the champion's: its registry version, and McNemar's test against
    the candidate on the same samples (``tpustream.metrics.paired_test.PairedTest.to_json``).
    ``order``: the keys as its file had them, written back in that order (evaluations of every tpustream
    version read and write back unchanged); keys no field models are kept in ``extra``."""

    model: str = ""
    model_sha256: str = ""
    arch: str = ""
    split: str | None = None
    top1: float | None = None
    top5: float | None = None
    loss: float | None = None
    num_samples: int | None = None
    complete: bool | None = None  # every sample of the split counted; None: not recorded
    per_class_accuracy: list[float | None] = field(default_factory=list)  # None: no sample of the class
    unmeasured_classes: list[str] = field(default_factory=list)
    confusion_matrix: list[list[int]] = field(default_factory=list)  # [true][predicted]
    macro_f1: float | None = None
    balanced_accuracy: float | None = None
    auprc: float | None = None
    auroc: float | None = None
    per_class: dict[str, list[Any]] | None = None  # precision, recall, f1, support, predicted, auprc
    thresholds: list[dict[str, float]] | None = None  # the confidence-threshold table's rows
    scores_top_k: int | None = None
    scores: str | None = None  # the per-sample scores file, beside metrics.json
    seconds: float | None = None
    version: int | None = None
    paired: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    order: tuple[str, ...] = field(default=(), repr=False)

    _KEYS: ClassVar[tuple[str, ...]] = (
        "model",
        "model_sha256",
        "arch",
        "split",
        "top1",
        "top5",
        "loss",
        "num_samples",
        "complete",
        "per_class_accuracy",
        "unmeasured_classes",
        "confusion_matrix",
        "macro_f1",
        "balanced_accuracy",
        "auprc",
        "auroc",
        "per_class",
        "thresholds",
        "scores_top_k",
        "scores",
        "seconds",
        "version",
        "paired",
    )

    @classmethod
    def from_json(cls, document: Any, where: str = "evaluation") -> Evaluation:
        """An evaluation as metrics.json holds it (``evaluate_model`` builds its result through this too)."""
        document = _object(document, where)
        known = {key: document[key] for key in cls._KEYS if key in document}
        for key in ("model", "model_sha256", "arch"):
            if key in known:
                known[key] = str(known[key] or "")
        for key in ("per_class_accuracy", "unmeasured_classes", "confusion_matrix"):
            if known.get(key) is None:
                known.pop(key, None)
            elif not isinstance(known[key], list):
                raise ArtifactError(f"{where}: {key!r} is {type(known[key]).__name__}, expected a list")
        return cls(**known, extra=_extra(document, cls._KEYS), order=tuple(document))

    def to_json(self) -> dict[str, Any]:
        """The evaluation as its file had it (keys in its order); one made here writes the keys it has."""
        known = {key: getattr(self, key) for key in self._KEYS}
        keys = self.order or tuple(key for key in self._KEYS if self._set(key)) + tuple(self.extra)
        later = [key for key in self._KEYS if key not in keys and self._set(key)]  # e.g. a version set since
        return {key: known[key] if key in known else self.extra[key] for key in (*keys, *later)}

    def has(self, name: str) -> bool:
        """Whether ``name`` was recorded (a non-finite number, written as null, was; a metric evaluate did
        not measure yet when this evaluation was written was not)."""
        return name in self.order or name in self._KEYS and self._set(name)

    def _set(self, key: str) -> bool:
        value = getattr(self, key)
        return value is not None and value != [] and value != ""

    def metric(self, name: str) -> Any:
        """The value of metric ``name`` (top1, top5, loss, macro_f1, balanced_accuracy); None: not measured."""
        return getattr(self, name) if name in self._KEYS else None

    def class_support(self) -> list[int | None]:
        """Each class's sample count on this evaluation's split: ``per_class``'s ``support`` when the scores
        gave it, else the confusion matrix's row sums; None for a class neither records."""
        size = max(len(self.per_class_accuracy), len(self.confusion_matrix))
        support = (self.per_class or {}).get("support")
        if isinstance(support, list) and len(support) == size:
            return [
                int(n) if isinstance(n, int | float) and not isinstance(n, bool) else None for n in support
            ]
        rows = self.confusion_matrix
        if len(rows) == size and all(isinstance(row, list) for row in rows):
            return [int(sum(row)) for row in rows]
        return [None] * size


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """The trivial answer a candidate must beat: always answering ``answer``, the class most frequent in the
    train split (ties: the first in class order), scored on the decision split
    (``tpustream.metrics.baseline.majority_baseline``). ``loss`` is that of answering the train split's class
    frequencies (None: the split has a class the train split lacks, an infinite loss). A number is None when
    not defined; keys no field models are kept in ``extra``."""

    answer: str
    top1: float | None = None
    top5: float | None = None
    loss: float | None = None
    macro_f1: float | None = None
    balanced_accuracy: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = ("answer", "top1", "top5", "loss", "macro_f1", "balanced_accuracy")

    @classmethod
    def from_json(cls, document: Any, where: str = "baseline") -> Baseline:
        document = _object(document, where)
        numbers = {
            key: document[key]
            for key in cls._KEYS[1:]
            if isinstance(document.get(key), int | float) and not isinstance(document.get(key), bool)
        }
        return cls(
            answer=str(_require(document, "answer", str, where)),
            **numbers,
            extra=_extra(document, cls._KEYS),
        )

    def to_json(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self._KEYS} | self.extra

    def metric(self, name: str) -> float | None:
        """The baseline's value of metric ``name`` (top1, top5, loss, macro_f1, balanced_accuracy)."""
        return getattr(self, name) if name in self._KEYS[1:] else None


@dataclass(frozen=True, kw_only=True)
class EvalReport:
    """evaluate's ``metrics.json`` (docs/ARCHITECTURE.md, "Evaluation"): the candidate's and the champion's
    numbers on one dataset's decision split (``split``: test when the dataset has one, else val; files written
    before the test split lack it and read as val). ``candidate`` and ``champion`` are
    ``evaluate.evaluate_model``'s results (``Evaluation``); ``val``, when test decides, is the candidate's on
    val (for reference: val chose its best epoch); ``baseline``: the majority-class answer on the same split
    (``Baseline``; None: files written before it, or a dataset without train class counts)."""

    dataset: DatasetRef
    classes: list[str]
    candidate: Evaluation
    split: str = "val"  # what candidate and champion were measured on, and promotion decides on
    val: Evaluation | None = None  # the candidate on val when split is test; None otherwise (not written)
    champion: Evaluation | None = None  # None: no champion, or it could not be measured (champion_note)
    champion_note: str | None = None
    created: str = ""
    baseline: Baseline | None = None
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
        "baseline",
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
                candidate=Evaluation.from_json(
                    _require(document, "candidate", Mapping, where), f"{where}: 'candidate'"
                ),
                split=split,
                val=None
                if document.get("val") is None
                else Evaluation.from_json(document["val"], f"{where}: 'val'"),
                champion=None if champion is None else Evaluation.from_json(champion, f"{where}: 'champion'"),
                champion_note=None if note is None else str(note),
                created=str(document.get("created") or ""),
                baseline=None
                if document.get("baseline") is None
                else Baseline.from_json(document["baseline"], f"{where}: 'baseline'"),
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
            "candidate": self.candidate.to_json(),
            "val": None if self.val is None else self.val.to_json(),
            "champion": None if self.champion is None else self.champion.to_json(),
            "champion_note": self.champion_note,
            "created": self.created,
            "baseline": None if self.baseline is None else self.baseline.to_json(),
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
