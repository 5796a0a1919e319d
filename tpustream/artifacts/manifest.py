"""A dataset's ``manifest.json`` (``Manifest``) and its parts: splits, shards, image statistics, what was skipped."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tpustream.artifacts._json import (
    _absent,
    _check_format,
    _extra,
    _object,
    _optional_int,
    _optional_number,
    _read_document,
    _require,
    _shape_errors,
    _written,
)
from tpustream.storage import io as storage

__all__ = [
    "MANIFEST_FORMAT",
    "SizeSummary",
    "SplitStats",
    "Shard",
    "Split",
    "SkippedSummary",
    "IgnoredFiles",
    "LabelEditsApplied",
    "Manifest",
]

MANIFEST_FORMAT = "tpustream.shards/v1"

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
    by_reason: dict[str, int] = field(default_factory=dict)  # sources.types.SKIP_REASONS -> count
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
class LabelEditsApplied:
    """The manifest's ``label_edits``: the samples left out and relabelled when the dataset was written
    (``shards create --exclude-keys/--relabel``, the pipeline's ``exclude_keys``/``relabel``), by source."""

    exclude_keys: str | None = None  # the files as given
    relabel: str | None = None
    excluded: list[str] = field(default_factory=list)  # the sources left out, sorted
    relabelled: dict[str, str] = field(default_factory=dict)  # source -> its new class, sorted by source

    @classmethod
    def from_json(cls, document: Any, where: str) -> LabelEditsApplied:
        document = _object(document, where)
        return cls(
            exclude_keys=None if document.get("exclude_keys") is None else str(document["exclude_keys"]),
            relabel=None if document.get("relabel") is None else str(document["relabel"]),
            excluded=[str(name) for name in document.get("excluded") or []],
            relabelled={str(k): str(v) for k, v in (document.get("relabelled") or {}).items()},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "exclude_keys": self.exclude_keys,
            "relabel": self.relabel,
            "excluded": list(self.excluded),
            "relabelled": dict(self.relabelled),
        }


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """A dataset's ``manifest.json``, written last by ``dataset.finalize.finalize_manifest``
    (docs/ARCHITECTURE.md, "Shards and manifest"). Only ``classes`` and ``splits`` are required; what older
    writers left out reads as a default."""

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
    label_edits: LabelEditsApplied | None = None  # None: none applied (the key is then not written)
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
        "label_edits",
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
                label_edits=(
                    LabelEditsApplied.from_json(document["label_edits"], f"{where}: 'label_edits'")
                    if document.get("label_edits") is not None
                    else None
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
        if self.label_edits is not None:  # only then: a dataset written without edits keeps its bytes
            known["label_edits"] = self.label_edits.to_json()
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
