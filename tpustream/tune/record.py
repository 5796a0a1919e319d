"""``tuning.json``: what a tune run tried and chose, written last in its output (the best pointer), read by the
report. One reader, one writer, a format version, as the other contracts (tpustream/artifacts/)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from tpustream.errors import ConfigError
from tpustream.storage import io as storage

__all__ = ["TUNING_FILE", "TUNING_FORMAT", "TrialRecord", "TuningRecord", "read_tuning"]

TUNING_FILE = "tuning.json"
TUNING_FORMAT = "tpustream-tuning/1"

TrialState = Literal["complete", "pruned", "failed"]


@dataclass(frozen=True, kw_only=True)
class TrialRecord:
    """One trial: its parameters, its best val top-1 (None: never measured), the epochs it ran, how it ended
    (``state``, ``reason`` for a pruned or failed one) and its model artifact's URI ("" none)."""

    id: str
    parameters: dict[str, Any]
    state: TrialState
    metric: float | None = None
    epochs_run: int = 0
    model: str = ""
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "parameters": dict(self.parameters),
            "state": self.state,
            "metric": self.metric,
            "epochs_run": self.epochs_run,
            "model": self.model,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> TrialRecord:
        metric = entry.get("metric")
        return cls(
            id=str(entry["id"]),
            parameters=dict(entry.get("parameters") or {}),
            state=entry["state"],
            metric=None if metric is None else float(metric),
            epochs_run=int(entry.get("epochs_run") or 0),
            model=str(entry.get("model") or ""),
            reason=str(entry.get("reason") or ""),
        )


@dataclass(frozen=True, kw_only=True)
class TuningRecord:
    """A tune run: the space it searched (as JSON), where (``engine``: optuna or vertex-vizier), its trials and
    the chosen one (``best``, its id; ``model``, its model artifact: the candidate, not retrained)."""

    engine: Literal["optuna", "vertex-vizier"]
    metric: str
    space: dict[str, Any]
    trials: tuple[TrialRecord, ...]
    best: str
    model: str

    def best_trial(self) -> TrialRecord:
        return next(trial for trial in self.trials if trial.id == self.best)

    def card_entry(self) -> dict[str, Any]:
        """model.json's ``tuning``: the chosen trial and its parameters, and how many were tried."""
        best = self.best_trial()
        return {
            "engine": self.engine,
            "trial": best.id,
            "parameters": dict(best.parameters),
            "metric": {self.metric: best.metric},
            "trials": len(self.trials),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "format": TUNING_FORMAT,
            "engine": self.engine,
            "metric": self.metric,
            "space": self.space,
            "trials": [trial.to_json() for trial in self.trials],
            "best": self.best,
            "model": self.model,
        }

    def write(self, output: str) -> str:
        uri = storage.join(output, TUNING_FILE)
        storage.write_bytes(
            uri, json.dumps(self.to_json(), indent=1).encode(), content_type="application/json"
        )
        return uri


def read_tuning(uri: str) -> TuningRecord:
    """The record at ``uri`` (tuning.json, or the tune run's output holding it)."""
    if not uri.endswith(".json"):
        uri = storage.join(uri, TUNING_FILE)
    document = json.loads(storage.read_bytes(uri))
    if document.get("format") != TUNING_FORMAT:
        raise ConfigError(f"{uri}: not a {TUNING_FORMAT} record (format {document.get('format')!r})")
    return TuningRecord(
        engine=document["engine"],
        metric=str(document["metric"]),
        space=dict(document["space"]),
        trials=tuple(TrialRecord.from_json(entry) for entry in document["trials"]),
        best=str(document["best"]),
        model=str(document["model"]),
    )
