"""Hyperparameter search: ``space`` (the search space file, ``read_space``), ``local`` (``tpustream tune``: optuna,
trial by trial), ``vertex`` (the Vertex AI HyperparameterTuningJob: study spec, trial pools, its best trial),
``vertex_trial`` (a Vizier trial's entry point), ``hypertune`` (the metric file Vizier reads), ``record``
(tuning.json, the report's and model card's view of a search).

The names below are the package's public API, imported on first use so that importing the package loads nothing
heavy; the modules themselves are imported by their full path inside tpustream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from tpustream.tune.local import TuneError, tune_locally
    from tpustream.tune.record import TrialRecord, TuningRecord, read_tuning
    from tpustream.tune.space import DEFAULT_SPACE, SearchSpace, SpaceError, read_space

_HOMES = {
    "tune_locally": "local",
    "TuneError": "local",
    "TrialRecord": "record",
    "TuningRecord": "record",
    "read_tuning": "record",
    "DEFAULT_SPACE": "space",
    "SearchSpace": "space",
    "SpaceError": "space",
    "read_space": "space",
}
__all__ = [
    "tune_locally",
    "TuneError",
    "TrialRecord",
    "TuningRecord",
    "read_tuning",
    "DEFAULT_SPACE",
    "SearchSpace",
    "SpaceError",
    "read_space",
]


__getattr__, __dir__ = lazy_front(__name__, _HOMES)
