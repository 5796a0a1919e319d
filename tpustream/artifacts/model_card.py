"""A trained model's ``model.json`` (``ModelCard``) and the dataset reference it (and metrics.json) carries."""

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
    json_file_uri,
)
from tpustream.storage import io as storage

__all__ = ["MODEL_FORMAT", "DatasetRef", "ModelCard"]

MODEL_FORMAT = "tpustream.model/v1"

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
    peak_lr: float | None = None  # the LR the schedule peaked at, however it was chosen (None: not recorded)
    global_batch: int | None = None  # samples per optimizer step over every device (None: not recorded)
    # The recipe the run trained with (tpustream/train/recipe.py): name, why, its values, which the run
    # overrode, and the weights model.pt holds ("ema" or "raw") (None: not recorded)
    recipe: dict[str, Any] | None = None
    init: dict[str, Any] | None = None  # warm start: where the weights began (None: random)
    # --pretrained: spec, uri, name, sha256 of the weights the backbone started from (None: not pretrained)
    pretrained: dict[str, Any] | None = None
    # resize_size, crop_size, mean, std, interpolation: what evaluate, predict and serving apply ({}: the
    # default, Resize(S/0.875) + CenterCrop(S) with ``normalization``)
    preprocessing: dict[str, Any] = field(default_factory=dict)
    compile_cache: dict[str, Any] | None = None  # its lookups in the training process (None: no cache)
    stopped_early: bool = False
    created: str = ""
    # a tune run's chosen trial: engine, trial id, parameters, metric, trials (tpustream/tune/record.py; None: not tuned)
    tuning: dict[str, Any] | None = None
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
        "peak_lr",
        "global_batch",
        "recipe",
        "init",
        "pretrained",
        "preprocessing",
        "compile_cache",
        "stopped_early",
        "created",
        "tuning",
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
                peak_lr=_optional_number(document.get("peak_lr")),
                global_batch=_optional_int(document.get("global_batch")),
                recipe=document.get("recipe") if isinstance(document.get("recipe"), Mapping) else None,
                init=document.get("init"),
                pretrained=document.get("pretrained"),
                preprocessing=dict(document.get("preprocessing") or {}),
                compile_cache=document.get("compile_cache"),
                stopped_early=bool(document.get("stopped_early", False)),
                created=str(document.get("created") or ""),
                tuning=document.get("tuning"),
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
            "peak_lr": self.peak_lr,
            "global_batch": self.global_batch,
            "recipe": self.recipe,
            "init": self.init,
            "pretrained": self.pretrained,
            "preprocessing": dict(self.preprocessing),
            "compile_cache": self.compile_cache,
            "stopped_early": self.stopped_early,
            "created": self.created,
            "tuning": self.tuning,
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
