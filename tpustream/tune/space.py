"""The search space of ``tpustream tune`` and the pipeline's tune switch: one file (YAML or JSON), one reader.

A space names the trainer options it searches (``TrainConfig`` fields), each a range or a list of values; the
metric and its goal; how many trials, how many at once, and whether bad trials stop early. The same
``SearchSpace`` becomes an optuna study locally (tpustream/tune/local.py) and a Vertex AI ``StudySpec``
(tpustream/tune/vertex.py), so a run-local and a Vertex run search the same thing::

    metric: val_top1          # the trainer's per-epoch validation metric (the only one: top-1, 0-1)
    goal: maximize
    max_trials: 8
    parallel_trials: 1        # trials at once (on Vertex: parallel TPU slices; preflight checks the quota)
    early_stopping: true      # stop a trial whose epochs trail the others' (median locally, decay curve on Vertex)
    min_trials: 2             # ... once this many trials have finished
    parameters:
      lr: {min: 0.003, max: 0.3, scale: log}
      weight_decay: {min: 1.0e-5, max: 1.0e-3, scale: log}
      epochs: {min: 5, max: 15, type: int}
      freeze_epochs: {values: [0, 1, 2]}
      mixup_alpha: {min: 0.0, max: 0.4, optional: true}

A parameter is a double range (``min``/``max``, ``scale`` linear or log), an integer range (``type: int``) or a
list of ``values`` (numbers: Vertex's discrete spec; strings: categorical). ``optional: true``: left out,
with a log line, when this build's ``TrainConfig`` lacks the field, as the default space's augmentation
strength and mixup alpha are until the recipe's fields land (issue 46 item 2; their names here,
``augment_strength`` and ``mixup_alpha``, are the ones to map then). ``freeze_epochs`` is left out of a run
that starts from random weights (the trainer refuses it there).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from tpustream.errors import ConfigError

__all__ = ["DEFAULT_SPACE", "Parameter", "SearchSpace", "SpaceError", "read_space"]

log = logging.getLogger(__name__)

Scale = Literal["linear", "log"]
Kind = Literal["double", "int", "discrete", "categorical"]


class SpaceError(ConfigError):
    """A search space file that cannot be searched; the message names the file, the entry and the fix."""


@dataclass(frozen=True, kw_only=True)
class Parameter:
    """One searched ``TrainConfig`` field: a range (``low``/``high``) or a list of ``values``."""

    name: str
    kind: Kind
    low: float | None = None
    high: float | None = None
    scale: Scale = "linear"
    values: tuple[float | int | str, ...] = ()
    optional: bool = False

    def __post_init__(self) -> None:
        where = f"parameter {self.name!r}"
        if self.kind in ("double", "int"):
            if self.low is None or self.high is None or not self.low <= self.high:
                raise SpaceError(f"{where}: give min <= max, got min {self.low} max {self.high}")
            if self.kind == "int" and not (float(self.low).is_integer() and float(self.high).is_integer()):
                raise SpaceError(
                    f"{where}: an int range needs whole min and max, got {self.low}, {self.high}"
                )
            if self.scale == "log" and self.low <= 0:
                raise SpaceError(f"{where}: a log scale needs min > 0, got {self.low}")
        elif not self.values:
            raise SpaceError(f"{where}: give values: [...] (at least one)")
        if self.scale not in ("linear", "log"):
            raise SpaceError(f"{where}: scale must be linear or log, got {self.scale!r}")

    @classmethod
    def from_json(cls, name: str, entry: Any) -> Parameter:
        if not isinstance(entry, dict):
            raise SpaceError(
                f"parameter {name!r}: give a mapping ({{min, max}} or {{values}}), got {entry!r}"
            )
        unknown = set(entry) - {"min", "max", "scale", "type", "values", "optional"}
        if unknown:
            raise SpaceError(
                f"parameter {name!r}: unknown keys {sorted(unknown)} (min, max, scale, type, values)"
            )
        optional = bool(entry.get("optional", False))
        if "values" in entry:
            values = tuple(entry["values"] or ())
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
            kind: Kind = "discrete" if numeric else "categorical"
            return cls(name=name, kind=kind, values=values, optional=optional)
        kind = "int" if entry.get("type", "double") == "int" else "double"
        if entry.get("type", "double") not in ("int", "double"):
            raise SpaceError(f"parameter {name!r}: type must be int or double, got {entry['type']!r}")
        low, high = entry.get("min"), entry.get("max")
        return cls(
            name=name,
            kind=kind,
            low=None if low is None else float(low),
            high=None if high is None else float(high),
            scale=entry.get("scale", "linear"),
            optional=optional,
        )

    def to_json(self) -> dict[str, Any]:
        if self.kind in ("discrete", "categorical"):
            entry: dict[str, Any] = {"values": list(self.values)}
        else:
            entry = {"min": self.low, "max": self.high, "scale": self.scale}
            if self.kind == "int":
                entry.update(type="int", min=int(self.low or 0), max=int(self.high or 0))
        if self.optional:
            entry["optional"] = True
        return entry

    def value(self, raw: Any) -> float | int | str:
        """A suggested or reported value in the field's type (Vertex reports every number as a double)."""
        if self.kind == "int":
            return int(round(float(raw)))
        if self.kind == "double":
            return float(raw)
        for choice in self.values:  # "3" from a command line is the discrete value 3
            if str(choice) == str(raw) or (not isinstance(choice, str) and float(choice) == float(raw)):
                return choice
        raise SpaceError(f"parameter {self.name!r}: {raw!r} is not one of {list(self.values)}")


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """What a tune run searches and how (the module doc's file, read by ``read_space``)."""

    parameters: tuple[Parameter, ...]
    metric: Literal["val_top1"] = "val_top1"
    goal: Literal["maximize"] = "maximize"
    max_trials: int = 8
    parallel_trials: int = 1
    early_stopping: bool = True
    min_trials: int = 2
    source: str = "default"  # the file it was read from, for messages and the report
    left_out: tuple[str, ...] = field(default=())  # optional parameters this build cannot search

    def __post_init__(self) -> None:
        if self.metric != "val_top1" or self.goal != "maximize":
            raise SpaceError(
                f"{self.source}: metric must be val_top1 and goal maximize (the trainer's per-epoch validation "
                f"metric), got {self.metric!r} {self.goal!r}"
            )
        if self.max_trials < 1 or self.parallel_trials < 1 or self.min_trials < 0:
            raise SpaceError(
                f"{self.source}: max_trials and parallel_trials must be at least 1 and min_trials >= 0, got "
                f"{self.max_trials}, {self.parallel_trials}, {self.min_trials}"
            )
        if self.parallel_trials > self.max_trials:
            raise SpaceError(
                f"{self.source}: parallel_trials {self.parallel_trials} is more than max_trials "
                f"{self.max_trials}: lower it"
            )
        names = [p.name for p in self.parameters]
        if len(set(names)) != len(names):
            raise SpaceError(f"{self.source}: a parameter is named twice in {names}")

    @classmethod
    def from_json(cls, document: Any, source: str) -> SearchSpace:
        if not isinstance(document, dict) or not isinstance(document.get("parameters"), dict):
            raise SpaceError(f"{source}: a search space is a mapping with parameters: {{name: {{min, max}}}}")
        known = {f.name for f in dataclasses.fields(cls)} - {"source", "left_out"}
        unknown = set(document) - known
        if unknown:
            raise SpaceError(f"{source}: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        try:
            parameters = tuple(Parameter.from_json(str(k), v) for k, v in document["parameters"].items())
            settings = {k: v for k, v in document.items() if k != "parameters"}
            for key in ("max_trials", "parallel_trials", "min_trials"):
                if key in settings:
                    settings[key] = _whole(key, settings[key])
            return cls(parameters=parameters, source=source, **settings)
        except SpaceError as exc:
            raise SpaceError(f"{source}: {exc}" if not str(exc).startswith(source) else str(exc)) from None

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "goal": self.goal,
            "max_trials": self.max_trials,
            "parallel_trials": self.parallel_trials,
            "early_stopping": self.early_stopping,
            "min_trials": self.min_trials,
            "parameters": {p.name: p.to_json() for p in self.parameters},
        }

    def for_run(self, fields: set[str], *, trained_start: bool) -> SearchSpace:
        """The space this build and run can search: an optional parameter ``fields`` (``TrainConfig``'s)
        lacks is left out, as is ``freeze_epochs`` without trained weights to start from (``trained_start``);
        another unknown name is a SpaceError naming it."""
        kept, left_out = [], []
        for parameter in self.parameters:
            if parameter.name not in fields:
                if not parameter.optional:
                    raise SpaceError(
                        f"{self.source}: parameter {parameter.name!r} is not a trainer option (TrainConfig "
                        f"fields: {', '.join(sorted(fields))}); fix the name, or mark it optional: true"
                    )
                left_out.append(parameter.name)
                log.info("search space: %s left out: this trainer has no such option", parameter.name)
            elif parameter.name == "freeze_epochs" and not trained_start:
                left_out.append(parameter.name)
                log.info("search space: freeze_epochs left out: the run starts from random weights")
            else:
                kept.append(parameter)
        if not kept:
            raise SpaceError(f"{self.source}: nothing to search (left out: {', '.join(left_out)})")
        return dataclasses.replace(self, parameters=tuple(kept), left_out=tuple(left_out))

    def parameter(self, name: str) -> Parameter:
        for parameter in self.parameters:
            if parameter.name == name:
                return parameter
        raise SpaceError(f"{self.source}: no parameter {name!r}")


def _whole(key: str, value: Any) -> int:
    if isinstance(value, bool) or not float(value).is_integer():
        raise SpaceError(f"{key} must be a whole number, got {value!r}")
    return int(value)


# The default: ranges around the trainer's own defaults (tpustream/train/optimizer.py's scaled LR, the SGD
# recipe's 1e-4 decay), wide enough that a search can find what they miss, few enough trials for one slice.
DEFAULT_SPACE = SearchSpace(
    parameters=(
        Parameter(name="lr", kind="double", low=1e-3, high=0.3, scale="log"),
        Parameter(name="weight_decay", kind="double", low=1e-5, high=1e-3, scale="log"),
        Parameter(name="epochs", kind="int", low=5, high=20),
        Parameter(name="freeze_epochs", kind="int", low=0, high=3),
        Parameter(name="augment_strength", kind="double", low=0.0, high=1.0, optional=True),
        Parameter(name="mixup_alpha", kind="double", low=0.0, high=0.4, optional=True),
    ),
    max_trials=8,
    parallel_trials=2,
)


def read_space(uri: str | None) -> SearchSpace:
    """The space in the YAML or JSON file at ``uri`` (local or gs://); None or "": ``DEFAULT_SPACE``."""
    if not uri:
        return DEFAULT_SPACE
    import yaml

    from tpustream.storage import io as storage

    try:
        text = storage.read_bytes(uri).decode()
    except storage.NotFound:
        raise SpaceError(f"search space {uri}: no such file (omit it for the default space)") from None
    try:
        document = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise SpaceError(f"search space {uri}: not YAML or JSON ({exc})") from None
    return SearchSpace.from_json(document, uri)
