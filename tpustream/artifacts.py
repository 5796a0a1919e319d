"""The files the stages hand each other, as types: a dataset's ``manifest.json`` (``Manifest``), a trained
model's ``model.json`` (``ModelCard``) and evaluate's ``metrics.json`` (``EvalReport``).

Each type reads and writes its own JSON (``from_json``/``to_json``, ``read``/``write``), so mypy checks every
place that uses a field, and a file of another format version is refused in one place with one message.
Torch-free (and free of every heavy import): the CLI, the KFP components and the report read these.

Format versions and old files:
- Every file carries ``format``. The manifest's reader has always required it; ``model.json`` and
  ``metrics.json`` have always been written with it but were never checked, so a file without one (hand-made,
  a test's) is still read as the current version, while one naming another version is refused.
- Keys a file lacks because it was written before they existed read as their defaults (a manifest without
  ``max_pixels``, shards without a sample index, ``skipped`` without ``by_reason``); the type remembers them
  (``absent``) and ``to_json`` leaves them out again, so ``to_json(from_json(x)) == x`` for old files too,
  ``format`` aside: it is always written.
- Keys no type models are kept in ``extra`` and written back after the known ones: a file a later version
  wrote loses nothing when this one writes it back.
- On-disk bytes are those of the writers before these types: the same keys in the same order, the same
  ``json.dumps`` settings (``manifest_digest`` hashes the manifest's bytes).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tpustream.errors import TpustreamError
from tpustream.storage import io as storage

__all__ = [
    "MANIFEST_FORMAT",
    "MODEL_FORMAT",
    "METRICS_FORMAT",
    "ArtifactError",
    "SizeSummary",
    "SplitStats",
    "Shard",
    "Split",
    "SkippedSummary",
    "IgnoredFiles",
    "Manifest",
    "DatasetRef",
    "ModelCard",
    "EvalReport",
    "json_bytes",
    "json_file_uri",
]

MANIFEST_FORMAT = "tpustream.dataset.write/v1"
MODEL_FORMAT = "tpustream.model/v1"
METRICS_FORMAT = "tpustream.metrics.masked/v1"


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


# --------------------------------------------------------------------------- manifest.json


_MANIFEST_FIX = "re-create the dataset with this version (tpustream shards create --overwrite)"


@dataclass(frozen=True, kw_only=True)
class SizeSummary:
    """min / median / max over the samples of a split (pixels)."""

    min: int
    median: int
    max: int

    @classmethod
    def from_json(cls, document: Any, where: str) -> SizeSummary:
        document = _object(document, where)
        return cls(**{key: _require(document, key, (int, float), where) for key in ("min", "median", "max")})

    def to_json(self) -> dict[str, Any]:
        return {"min": self.min, "median": self.median, "max": self.max}


@dataclass(frozen=True, kw_only=True)
class SplitStats:
    """A split's image statistics; the sizes are None when no header could be read."""

    formats: dict[str, int]  # image member extension -> samples
    width: SizeSummary | None = None
    height: SizeSummary | None = None
    short_side: SizeSummary | None = None

    _SIZES: ClassVar[tuple[str, ...]] = ("width", "height", "short_side")

    @classmethod
    def from_json(cls, document: Any, where: str) -> SplitStats:
        document = _object(document, where)
        sizes = {
            key: SizeSummary.from_json(document[key], f"{where}.{key}")
            for key in cls._SIZES
            if key in document
        }
        return cls(formats={str(k): int(v) for k, v in (document.get("formats") or {}).items()}, **sizes)

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"formats": dict(self.formats)}
        for key in self._SIZES:
            size: SizeSummary | None = getattr(self, key)
            if size is not None:
                document[key] = size.to_json()
        return document


@dataclass(frozen=True, kw_only=True)
class Shard:
    """One tar shard of a split; ``path`` and ``sample_index`` are relative to the dataset."""

    path: str
    num_samples: int
    num_bytes: int
    sha256: str
    sample_index: str = ""  # "": written before the sample index existed
    sample_index_sha256: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    absent: frozenset[str] = field(default=frozenset(), repr=False)  # keys its file lacked: not written back

    _KEYS: ClassVar[tuple[str, ...]] = (
        "path",
        "num_samples",
        "num_bytes",
        "sha256",
        "sample_index",
        "sample_index_sha256",
    )

    @classmethod
    def from_json(cls, document: Any, where: str) -> Shard:
        document = _object(document, where)
        return cls(
            path=_require(document, "path", str, where),
            num_samples=_require(document, "num_samples", int, where),
            num_bytes=_require(document, "num_bytes", int, where),
            sha256=_require(document, "sha256", str, where),
            sample_index=str(document.get("sample_index") or ""),
            sample_index_sha256=str(document.get("sample_index_sha256") or ""),
            extra=_extra(document, cls._KEYS),
            absent=_absent(document, cls._KEYS),
        )

    def to_json(self) -> dict[str, Any]:
        known = {
            "path": self.path,
            "num_samples": self.num_samples,
            "num_bytes": self.num_bytes,
            "sha256": self.sha256,
            "sample_index": self.sample_index,
            "sample_index_sha256": self.sample_index_sha256,
        }
        return _written(known, self.absent, self.extra)


@dataclass(frozen=True, kw_only=True)
class Split:
    """A split (train or val): its totals, per-class counts (in the manifest's class order) and shards."""

    num_samples: int
    num_bytes: int
    class_counts: list[int]
    shards: list[Shard]
    stats: SplitStats | None = None  # None: written before the statistics existed (and not written back)
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = ("num_samples", "num_bytes", "class_counts", "stats", "shards")

    @classmethod
    def from_json(cls, document: Any, where: str) -> Split:
        document = _object(document, where)
        shards = _require(document, "shards", list, where)
        return cls(
            num_samples=_require(document, "num_samples", int, where),
            num_bytes=_require(document, "num_bytes", int, where),
            class_counts=[int(count) for count in _require(document, "class_counts", list, where)],
            stats=SplitStats.from_json(document["stats"], f"{where}.stats") if "stats" in document else None,
            shards=[Shard.from_json(shard, f"{where}.shards[{i}]") for i, shard in enumerate(shards)],
            extra=_extra(document, cls._KEYS),
        )

    def to_json(self) -> dict[str, Any]:
        known: dict[str, Any] = {
            "num_samples": self.num_samples,
            "num_bytes": self.num_bytes,
            "class_counts": list(self.class_counts),
            "stats": None if self.stats is None else self.stats.to_json(),
            "shards": [shard.to_json() for shard in self.shards],
        }
        return _written(known, frozenset() if self.stats is not None else frozenset({"stats"}), self.extra)


@dataclass(frozen=True, kw_only=True)
class SkippedSummary:
    """The manifest's ``skipped``: source images and import-file rows that are not in the dataset."""

    count: int = 0  # images skipped while writing + rows the source rejected while listing
    sample_slots: int = 0  # the planned samples lost (an upsampled train image counts once per copy)
    by_reason: dict[str, int] = field(default_factory=dict)  # source_types.SKIP_REASONS -> count
    rejected_rows: int = 0  # of ``count``: rows or items the source refused before any image was read
    examples: list[str] = field(default_factory=list)
    absent: frozenset[str] = field(default=frozenset(), repr=False)  # keys its file lacked: not written back

    _KEYS: ClassVar[tuple[str, ...]] = ("count", "sample_slots", "by_reason", "rejected_rows", "examples")

    @classmethod
    def from_json(cls, document: Any, where: str) -> SkippedSummary:
        """Manifests written before ``by_reason`` read as having none by reason (count and examples kept),
        before ``sample_slots`` as one slot per skipped image."""
        document = _object(document or {}, where)
        count = int(document.get("count", 0))
        return cls(
            count=count,
            sample_slots=int(document.get("sample_slots", count)),
            by_reason={str(k): int(v) for k, v in (document.get("by_reason") or {}).items()},
            rejected_rows=int(document.get("rejected_rows", 0)),
            examples=[str(e) for e in document.get("examples", [])],
            absent=_absent(document, cls._KEYS),
        )

    def to_json(self) -> dict[str, Any]:
        known = {
            "count": self.count,
            "sample_slots": self.sample_slots,
            "by_reason": dict(self.by_reason),
            "rejected_rows": self.rejected_rows,
            "examples": list(self.examples),
        }
        return _written(known, self.absent, {})


@dataclass(frozen=True, kw_only=True)
class IgnoredFiles:
    """Files under the source that are not images (the manifest's ``ignored_files``)."""

    count: int = 0
    examples: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, document: Any, where: str) -> IgnoredFiles:
        document = _object(document or {}, where)
        return cls(
            count=int(document.get("count", 0)), examples=[str(e) for e in document.get("examples", [])]
        )

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "examples": list(self.examples)}


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """A dataset's ``manifest.json``, written last by ``shards.finalize_manifest`` (docs/ARCHITECTURE.md,
    "Shards and manifest"). Only ``classes`` and ``splits`` are required; what older writers left out
    reads as a default."""

    classes: list[str]
    splits: dict[
        str, Split
    ]  # "train", "val", "test"; a split with no item is absent (test in older datasets)
    created: str = ""
    source: str = ""
    source_description: str = ""
    num_classes: int | None = None  # len(classes) whenever present
    seed: int | None = None
    upsample: int = 1
    val_fraction: float | None = None  # None: the source's own split
    test_fraction: float = 0.0  # carved for a source without its own test split; 0: none carved
    max_side: int | None = None  # None: images kept at their size
    max_pixels: int | None = None  # None: written before the pixel budget was recorded
    skipped: SkippedSummary = field(default_factory=SkippedSummary)
    ignored_files: IgnoredFiles = field(default_factory=IgnoredFiles)
    extra: dict[str, Any] = field(default_factory=dict)
    absent: frozenset[str] = field(default=frozenset(), repr=False)  # keys its file lacked: not written back

    FORMAT: ClassVar[str] = MANIFEST_FORMAT
    _KEYS: ClassVar[tuple[str, ...]] = (
        "format",
        "created",
        "source",
        "source_description",
        "classes",
        "num_classes",
        "seed",
        "upsample",
        "val_fraction",
        "test_fraction",
        "max_side",
        "max_pixels",
        "splits",
        "skipped",
        "ignored_files",
    )

    @classmethod
    def from_json(cls, document: Any, where: str = "manifest.json") -> Manifest:
        """Check the format version and shape of a parsed manifest (``where`` names it in errors)."""
        with _shape_errors(where, _MANIFEST_FIX):
            document = _object(document, where)
            _check_format(document, MANIFEST_FORMAT, where, "tpustream manifest", required=True)
            splits = _object(_require(document, "splits", Mapping, where), f"{where}: 'splits'")
            classes = _require(document, "classes", list, where)
            return cls(
                classes=[str(name) for name in classes],
                splits={
                    str(name): Split.from_json(split, f"{where}: split {name!r}")
                    for name, split in splits.items()
                },
                created=str(document.get("created") or ""),
                source=str(document.get("source") or ""),
                source_description=str(document.get("source_description") or ""),
                num_classes=_optional_int(document.get("num_classes")),
                seed=_optional_int(document.get("seed")),
                upsample=int(document.get("upsample") or 1),
                val_fraction=_optional_number(document.get("val_fraction")),
                test_fraction=_optional_number(document.get("test_fraction")) or 0.0,
                max_side=_optional_int(document.get("max_side")),
                max_pixels=_optional_int(document.get("max_pixels")),
                skipped=SkippedSummary.from_json(document.get("skipped"), f"{where}: 'skipped'"),
                ignored_files=IgnoredFiles.from_json(
                    document.get("ignored_files"), f"{where}: 'ignored_files'"
                ),
                extra=_extra(document, cls._KEYS),
                absent=_absent(document, cls._KEYS),
            )

    def to_json(self) -> dict[str, Any]:
        """The manifest as written: keys in the writer's order, so equal manifests have equal bytes."""
        known = {
            "format": MANIFEST_FORMAT,
            "created": self.created,
            "source": self.source,
            "source_description": self.source_description,
            "classes": list(self.classes),
            "num_classes": len(self.classes) if self.num_classes is None else self.num_classes,
            "seed": self.seed,
            "upsample": self.upsample,
            "val_fraction": self.val_fraction,
            "test_fraction": self.test_fraction,
            "max_side": self.max_side,
            "max_pixels": self.max_pixels,
            "splits": {name: split.to_json() for name, split in self.splits.items()},
            # count: source images skipped + rows the source rejected while listing; sample_slots: the samples
            # the images cost (x upsample in train); by_reason: tpustream.sources.types.SKIP_REASONS
            "skipped": self.skipped.to_json(),
            "ignored_files": self.ignored_files.to_json(),
        }
        return _written(known, self.absent, self.extra)

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), indent=1).encode()

    @classmethod
    def read(cls, uri: str) -> Manifest:
        """The manifest at ``uri`` (the file's own URI). storage.NotFound passes through."""
        return cls.from_json(_read_document(uri, _MANIFEST_FIX), uri)

    def write(self, uri: str) -> None:
        """Write it to ``uri`` in one atomic step (readers see the old file or the whole new one)."""
        storage.write_bytes(uri, self.to_bytes(), content_type="application/json")

    def split(self, name: str) -> Split | None:
        """The split called ``name``, None when the dataset has none (every item went to the other)."""
        return self.splits.get(name)

    def num_samples(self, name: str) -> int:
        """Samples in split ``name``; 0 when there is no such split."""
        split = self.splits.get(name)
        return split.num_samples if split is not None else 0

    def all_shards(self) -> list[Shard]:
        """Every shard, split by split in manifest order."""
        return [shard for split in self.splits.values() for shard in split.shards]

    def has_sample_index(self) -> bool:
        """Whether every shard lists its sample index (datasets written before it have none)."""
        shards = self.all_shards()
        return bool(shards) and all(shard.sample_index for shard in shards)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _optional_number(value: Any) -> float | None:
    """A number as written (an int stays an int, so writing it back gives the same bytes), or None."""
    if value is None or isinstance(value, int | float) and not isinstance(value, bool):
        return value
    raise TypeError(f"{value!r} is not a number")


# --------------------------------------------------------------------------- model.json


_MODEL_FIX = "re-train, or re-export the model with this version (tpustream train)"


@dataclass(frozen=True, kw_only=True)
class DatasetRef:
    """The dataset a model was trained or measured on: its URI and manifest digest (and, in metrics.json, how
    many val and test samples its manifest lists)."""

    uri: str = ""
    manifest_digest: str = ""
    val_samples: int | None = None  # metrics.json only; None: not written
    test_samples: int | None = None  # metrics.json only; None: the dataset has no test split (not written)
    absent: frozenset[str] = field(default=frozenset(), repr=False)  # keys its file lacked: not written back

    _KEYS: ClassVar[tuple[str, ...]] = ("uri", "manifest_digest", "val_samples", "test_samples")

    @classmethod
    def from_json(cls, document: Any, where: str) -> DatasetRef:
        document = _object(document or {}, where)
        val_samples, test_samples = document.get("val_samples"), document.get("test_samples")
        return cls(
            uri=str(document.get("uri") or ""),
            manifest_digest=str(document.get("manifest_digest") or ""),
            val_samples=None if val_samples is None else int(val_samples),
            test_samples=None if test_samples is None else int(test_samples),
            absent=_absent(document, cls._KEYS),
        )

    def to_json(self) -> dict[str, Any]:
        known = {
            "uri": self.uri,
            "manifest_digest": self.manifest_digest,
            "val_samples": self.val_samples,
            "test_samples": self.test_samples,
        }
        unset = {key for key in ("val_samples", "test_samples") if known[key] is None}
        return _written(known, self.absent | unset, {})

    def samples(self, split: str) -> int | None:
        """How many samples of ``split`` (val or test) the manifest lists; None: not recorded."""
        return self.test_samples if split == "test" else self.val_samples


@dataclass(frozen=True, kw_only=True)
class ModelCard:
    """A model artifact's ``model.json``, written last by the trainer (docs/ARCHITECTURE.md, "Training output
    and model artifact"). Required: ``arch``, ``classes``, ``input_size``; the rest reads as a default."""

    arch: str
    classes: list[str]
    input_size: int
    num_classes: int | None = None  # len(classes) whenever present
    input_size_reason: str = ""
    in_channels: int = 3
    small_input_stem: bool = False
    normalization: dict[str, Any] = field(default_factory=dict)  # mean, std (per channel), scale
    metrics: dict[str, Any] = field(default_factory=dict)  # the best epoch: epoch, val_top1, val_top5, ...
    history: list[dict[str, Any]] = field(default_factory=list)  # one row per epoch
    dataset: DatasetRef | None = None
    model_sha256: str = ""
    steps: int = 0
    training: dict[str, Any] = field(default_factory=dict)  # the TrainConfig, as JSON
    init: dict[str, Any] | None = None  # warm start: where the weights began (None: random)
    # --pretrained: spec, uri, name, sha256 of the weights the backbone started from (None: not pretrained)
    pretrained: dict[str, Any] | None = None
    # resize_size, crop_size, mean, std, interpolation: what evaluate, predict and serving apply ({}: the
    # default, Resize(S/0.875) + CenterCrop(S) with ``normalization``)
    preprocessing: dict[str, Any] = field(default_factory=dict)
    compile_cache: dict[str, Any] | None = None  # its lookups in the training process (None: no cache)
    stopped_early: bool = False
    created: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    absent: frozenset[str] = field(default=frozenset(), repr=False)  # keys its file lacked: not written back

    FORMAT: ClassVar[str] = MODEL_FORMAT
    NAME: ClassVar[str] = "model.json"
    _KEYS: ClassVar[tuple[str, ...]] = (
        "format",
        "arch",
        "num_classes",
        "classes",
        "input_size",
        "input_size_reason",
        "in_channels",
        "small_input_stem",
        "normalization",
        "metrics",
        "history",
        "dataset",
        "model_sha256",
        "steps",
        "training",
        "init",
        "pretrained",
        "preprocessing",
        "compile_cache",
        "stopped_early",
        "created",
    )

    @classmethod
    def from_json(cls, document: Any, where: str = "model.json") -> ModelCard:
        with _shape_errors(where, _MODEL_FIX):
            document = _object(document, where)
            _check_format(document, MODEL_FORMAT, where, "tpustream model card", required=False)
            return cls(
                arch=str(_require(document, "arch", str, where)),
                classes=[str(name) for name in _require(document, "classes", list, where)],
                input_size=int(_require(document, "input_size", (int, str), where)),
                num_classes=_optional_int(document.get("num_classes")),
                input_size_reason=str(document.get("input_size_reason") or ""),
                in_channels=int(document.get("in_channels", 3)),
                small_input_stem=bool(document.get("small_input_stem", False)),
                normalization=dict(document.get("normalization") or {}),
                metrics=dict(document.get("metrics") or {}),
                history=[row for row in document.get("history") or [] if isinstance(row, dict)],
                dataset=DatasetRef.from_json(document["dataset"], f"{where}: 'dataset'")
                if isinstance(document.get("dataset"), Mapping)
                else None,
                model_sha256=str(document.get("model_sha256") or ""),
                steps=int(document.get("steps") or 0),
                training=dict(document.get("training") or {}),
                init=document.get("init"),
                pretrained=document.get("pretrained"),
                preprocessing=dict(document.get("preprocessing") or {}),
                compile_cache=document.get("compile_cache"),
                stopped_early=bool(document.get("stopped_early", False)),
                created=str(document.get("created") or ""),
                extra=_extra(document, cls._KEYS),
                absent=_absent(document, cls._KEYS),
            )

    def to_json(self) -> dict[str, Any]:
        """The card as the trainer writes it, keys in its order."""
        known = {
            "format": MODEL_FORMAT,
            "arch": self.arch,
            "num_classes": len(self.classes) if self.num_classes is None else self.num_classes,
            "classes": list(self.classes),
            "input_size": self.input_size,
            "input_size_reason": self.input_size_reason,
            "in_channels": self.in_channels,
            "small_input_stem": self.small_input_stem,
            "normalization": dict(self.normalization),
            "metrics": dict(self.metrics),
            "history": list(self.history),
            "dataset": None if self.dataset is None else self.dataset.to_json(),
            "model_sha256": self.model_sha256,
            "steps": self.steps,
            "training": self.training,
            "init": self.init,
            "pretrained": self.pretrained,
            "preprocessing": dict(self.preprocessing),
            "compile_cache": self.compile_cache,
            "stopped_early": self.stopped_early,
            "created": self.created,
        }
        return _written(known, self.absent, self.extra)

    @classmethod
    def read(cls, uri: str) -> ModelCard:
        """The card at ``uri`` (model.json itself, or the model directory). storage.NotFound passes through."""
        uri = json_file_uri(uri, cls.NAME)
        return cls.from_json(_read_document(uri, _MODEL_FIX), uri)

    def write(self, uri: str) -> None:
        """Write it to ``uri`` (model.json's own URI) atomically; as the trainer always has (``json.dumps``)."""
        storage.write_bytes(
            uri, json.dumps(self.to_json(), indent=1).encode(), content_type="application/json"
        )

    @property
    def val_crop_fraction(self) -> float:
        """The evaluation centre crop's share of the shorter side (``preprocessing``; 0.875 without it)."""
        if self.preprocessing.get("resize_size") and self.preprocessing.get("crop_size"):
            return float(self.preprocessing["crop_size"]) / float(self.preprocessing["resize_size"])
        return 0.875

    @property
    def best_top1(self) -> float | None:
        """The best epoch's val top-1 (None when not measured)."""
        value = self.metrics.get("val_top1")
        return None if value is None else float(value)


# --------------------------------------------------------------------------- metrics.json


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
