"""A Vertex AI Vizier trial: ``python3 -m tpustream.tune.vertex_trial --config=JSON --space=JSON --lr=0.05 ...``.

The trial job's container (tpustream/tune/vertex.py ``trial_pools``) carries the run's base ``TrainConfig`` and
the space; Vertex appends the trial's values as ``--<parameter_id>=<value>`` and sets ``AIP_MODEL_DIR``, where
the trial trains (``--resume auto``: a restarted trial continues). After each epoch every host reports val top-1
to the metric file Vizier reads (tpustream/tune/hypertune.py), the epoch as its step, so the service's decay
curve can stop a trial that trails. A preempted trial exits 75 like ``tpustream train``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from tpustream.errors import ConfigError
from tpustream.train.config import TrainConfig
from tpustream.tune.space import SearchSpace

__all__ = ["main", "parse_trial"]


def parse_trial(argv: list[str], environ: Mapping[str, str]) -> TrainConfig:
    """The trial's ``TrainConfig``: ``--config``'s with ``--space``'s parameters set from the other flags,
    into ``AIP_MODEL_DIR``. A ConfigError names a flag that is not a searched parameter, or a missing one."""
    from tpustream.tune.trial import trial_config

    flags: dict[str, str] = {}
    for arg in argv:
        name, equals, value = arg.partition("=")
        if not name.startswith("--") or not equals:
            raise ConfigError(f"vertex trial: {arg!r} is not --name=value")
        flags[name[2:]] = value
    try:
        config = TrainConfig(**json.loads(flags.pop("config")))
        space = SearchSpace.from_json(json.loads(flags.pop("space")), "the trial's --space")
    except KeyError as missing:
        raise ConfigError(
            f"vertex trial: --{missing.args[0]} is missing (pipelines/steps.py builds it)"
        ) from None
    output = environ.get("AIP_MODEL_DIR", "").rstrip("/")
    if not output:
        raise ConfigError(
            "vertex trial: AIP_MODEL_DIR is not set: Vertex sets it from the job's base output directory"
        )
    unknown = set(flags) - {parameter.name for parameter in space.parameters}
    if unknown:
        raise ConfigError(f"vertex trial: {sorted(unknown)} are not parameters of the search space")
    return trial_config(config, space, flags, output)


def main(argv: list[str] | None = None) -> None:
    from tpustream.train.preemption import Preempted, exit_preempted
    from tpustream.train.trainer import train
    from tpustream.tune.hypertune import HypertuneReporter

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = parse_trial(sys.argv[1:] if argv is None else argv, os.environ)
    reporter = HypertuneReporter()

    def on_epoch(epoch: int, metrics: Mapping[str, Any]) -> None:
        reporter.report("val_top1", float(metrics["val_top1"]), epoch)

    try:
        train(config, on_epoch)
    except Preempted as exc:
        exit_preempted(exc)


if __name__ == "__main__":
    main()
