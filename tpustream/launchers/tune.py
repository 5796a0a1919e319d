"""The tune steps' launchers (components/tune.py, tune_plan.py, tune_pick.py): the pipeline's train parameters
and search space to a search, locally (optuna, in the step) or on Vertex (the HyperparameterTuningJob's
inputs, then its best trial), and the chosen trial's model into the step's model artifact, as it trained."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from tpustream.run.outcome import failure_recorded

if TYPE_CHECKING:
    from kfp.dsl import Metrics, Model

    from tpustream.train.config import TrainConfig
    from tpustream.tune.record import TuningRecord

__all__ = ["launch_tune", "plan_tuning_job", "pick_best_trial"]


def _config(data: str, output: str, train: dict[str, Any]) -> TrainConfig:
    from tpustream.train.config import TrainConfig

    return TrainConfig.from_pipeline(data=data, output=output, **train)


def _hand_on(record: TuningRecord, model: Model, metrics: Metrics) -> None:
    """The best trial's model artifact copied into ``model`` (its files, not its checkpoints: the candidate is
    the trial's model as it trained); its val top-1 and the trial in the KFP outputs."""
    from tpustream.storage import io as storage

    best = record.best_trial()
    source = best.model.rstrip("/")
    for entry in storage.list_objects(source, recursive=True):
        relative = entry.uri[len(source) :].lstrip("/")
        if relative and not relative.startswith("checkpoints/"):
            storage.copy(entry.uri, storage.join(model.uri, relative))
    metrics.log_metric("val_top1", float(best.metric or 0.0))
    metrics.log_metric("trials", float(len(record.trials)))
    model.metadata.update({"tuning_trial": best.id, "tuning_parameters": json.dumps(best.parameters)})


def launch_tune(
    *, dataset: str, space: str, model: Model, metrics: Metrics, run_outcome: str, **train: Any
) -> None:
    """Off Vertex: the search run here, trial by trial (tpustream/tune/local.py), trials under
    ``<model>-trials``; the best trial's model becomes ``model``."""
    with failure_recorded(run_outcome, "tune-model"):
        from tpustream.tune.local import tune_locally
        from tpustream.tune.space import read_space

        record = tune_locally(_config(dataset, f"{model.uri.rstrip('/')}-trials", train), read_space(space))
        _hand_on(record, model, metrics)


def plan_tuning_job(
    *, dataset: str, space: str, trial_pool: dict[str, Any], image: str, run_outcome: str, **train: Any
) -> dict[str, Any]:
    """On Vertex: the HyperparameterTuningJob's inputs that depend on the run (its dataset, its champion, the
    space file): the trials' worker pools, study metrics and parameters, trial counts, and the space searched."""
    with failure_recorded(run_outcome, "plan-tuning"):
        from tpustream.tune.space import read_space
        from tpustream.tune.trial import trainer_fields
        from tpustream.tune.vertex import study_spec_metrics, study_spec_parameters, trial_pools

        config = _config(dataset, "AIP_MODEL_DIR", train)  # each trial trains into its own AIP_MODEL_DIR
        searched = read_space(space).for_run(
            trainer_fields(), trained_start=bool(config.pretrained or config.init_from)
        )
        return {
            "worker_pool_specs": trial_pools(trial_pool, image, config, searched),
            "study_spec_metrics": study_spec_metrics(searched),
            "study_spec_parameters": study_spec_parameters(searched),
            "max_trial_count": searched.max_trials,
            "parallel_trial_count": searched.parallel_trials,
            "space": {**searched.to_json(), "source": searched.source, "left_out": list(searched.left_out)},
        }


def pick_best_trial(
    *,
    gcp_resources: str,
    base_output_directory: str,
    space: dict[str, Any],
    model: Model,
    metrics: Metrics,
    run_outcome: str,
) -> None:
    """On Vertex: the finished job's trials (read from Vertex by the resource ``gcp_resources`` names), the best
    one's model handed on (tpustream/tune/vertex.py ``tuning_record``)."""
    with failure_recorded(run_outcome, "pick-trial"):
        from tpustream.tune.space import SearchSpace
        from tpustream.tune.vertex import read_job_trials, tuning_record

        searched = dataclasses.replace(
            SearchSpace.from_json(
                {k: v for k, v in space.items() if k not in ("source", "left_out")}, str(space.get("source"))
            ),
            left_out=tuple(space.get("left_out") or ()),
        )
        record = tuning_record(read_job_trials(gcp_resources), base_output_directory, searched)
        _hand_on(record, model, metrics)
