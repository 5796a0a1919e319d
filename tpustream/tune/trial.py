"""One trial's training options: the base run's ``TrainConfig`` with the searched values, into the trial's own
output. Shared by the local search (tpustream/tune/local.py) and a Vertex trial (tpustream/tune/vertex_trial.py)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from tpustream.train.config import TrainConfig
from tpustream.tune.space import SearchSpace

__all__ = ["trial_config", "trainer_fields"]

log = logging.getLogger(__name__)


def trainer_fields() -> set[str]:
    """The ``TrainConfig`` fields a space may search (the run's own places and flags excluded)."""
    return {field.name for field in dataclasses.fields(TrainConfig)} - {"data", "output", "resume"}


def trial_config(base: TrainConfig, space: SearchSpace, values: dict[str, Any], output: str) -> TrainConfig:
    """``base`` with ``values`` (each in its parameter's type) and ``output``. A freeze_epochs above the trial's
    epochs is lowered to them (a linear probe), as the trainer allows no more."""
    changes: dict[str, Any] = {name: space.parameter(name).value(value) for name, value in values.items()}
    epochs = int(changes.get("epochs", base.epochs))
    if int(changes.get("freeze_epochs", 0)) > epochs:
        log.info("trial: freeze_epochs %s lowered to its epochs, %d", changes["freeze_epochs"], epochs)
        changes["freeze_epochs"] = epochs
    return dataclasses.replace(base, output=output, **changes)
