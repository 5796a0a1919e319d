"""``tpustream tune`` here: the search space searched trial by trial with optuna, each trial a real ``train()``
into OUTPUT/trials/<id>/, a trial whose val top-1 trails the finished trials' median at the same epoch
stopped there (optuna's ``MedianPruner``, through the trainer's per-epoch hook), and the best trial's model
handed on as it is: no retraining. tuning.json (tpustream/tune/record.py) is written last and points at it.

Why optuna and not OSS Vizier (google-vizier): optuna 5.1 is pure Python with six small dependencies
(alembic, colorlog, numpy, packaging, PyYAML, sqlalchemy, tqdm), released monthly; google-vizier 0.1.24
(2025-02) needs grpcio, portpicker and absl even without its algorithms, and its default designer (GP-bandit)
is its ``jax`` extra (jax, flax, optax, tfp-nightly, equinox). On Vertex the search is Vizier itself
(tpustream/tune/vertex.py); here the study runs in this process. Trials run one at a time: the XLA runtime
is one per process, so ``parallel_trials`` is Vertex's alone.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from tpustream.artifacts import ModelCard
from tpustream.storage import io as storage
from tpustream.train.config import TrainConfig, TrainError
from tpustream.tune.record import TrialRecord, TuningRecord
from tpustream.tune.space import Parameter, SearchSpace
from tpustream.tune.trial import trainer_fields, trial_config

__all__ = ["TuneError", "best_trial", "hand_on", "tune_locally"]

log = logging.getLogger(__name__)


class TuneError(TrainError):
    """A search that found no model: every trial failed or was stopped; the message says why each."""


def _suggest(trial: Any, parameter: Parameter) -> Any:
    if parameter.kind == "double":
        return trial.suggest_float(
            parameter.name, parameter.low, parameter.high, log=parameter.scale == "log"
        )
    if parameter.kind == "int":
        return trial.suggest_int(
            parameter.name, int(parameter.low or 0), int(parameter.high or 0), log=parameter.scale == "log"
        )
    return trial.suggest_categorical(parameter.name, list(parameter.values))


def tune_locally(
    config: TrainConfig, space: SearchSpace, *, first_trials: tuple[dict[str, Any], ...] = ()
) -> TuningRecord:
    """Search ``space`` around ``config`` (its ``output`` holds the trials and tuning.json).

    Args:
        config: the base run; each trial is it with the trial's values.
        space: what to search (``read_space``); parameters this build or run cannot take are left out.
        first_trials: values the first trials take, in order (optuna's ``enqueue_trial``), e.g. the defaults.

    Returns:
        The record written to OUTPUT/tuning.json; its ``model`` is the best trial's model artifact.

    Raises:
        TuneError: no trial finished.
    """
    import optuna

    from tpustream.train.trainer import train

    space = space.for_run(trainer_fields(), trained_start=bool(config.pretrained or config.init_from))
    output = storage.absolute(config.output)
    pruner: optuna.pruners.BasePruner = (
        optuna.pruners.MedianPruner(n_startup_trials=space.min_trials, n_warmup_steps=0)
        if space.early_stopping
        else optuna.pruners.NopPruner()
    )
    study = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.TPESampler(seed=config.seed), pruner=pruner
    )
    for values in first_trials:
        study.enqueue_trial(values)
    trials: list[TrialRecord] = []

    def objective(trial: optuna.Trial) -> float:
        values = {parameter.name: _suggest(trial, parameter) for parameter in space.parameters}
        trial_id = str(trial.number + 1)
        run = trial_config(config, space, values, storage.join(output, "trials", trial_id))
        if (
            trial.number
        ):  # XLA's persistent cache is process-wide and opens once: the first trial's serves all
            run = dataclasses.replace(run, compile_cache=None)
        epochs: list[float] = []

        def on_epoch(epoch: int, metrics: Any) -> None:
            epochs.append(float(metrics["val_top1"]))
            trial.report(epochs[-1], epoch)
            if trial.should_prune():
                raise optuna.TrialPruned(
                    f"val top-1 {epochs[-1]:.4f} after epoch {epoch} of {run.epochs} is below the median of "
                    "the trials before it"
                )

        log.info("trial %s of %d: %s", trial_id, space.max_trials, values)
        try:
            card = train(run, on_epoch)
        except optuna.TrialPruned as exc:
            log.info("trial %s stopped early: %s", trial_id, exc)
            trials.append(_record(trial_id, values, "pruned", epochs, reason=str(exc)))
            raise
        except TrainError as exc:  # diverged, say: a failed trial, not a failed search
            log.warning("trial %s failed: %s", trial_id, exc)
            trials.append(_record(trial_id, values, "failed", epochs, reason=str(exc)))
            raise
        metric = float(card.metrics["val_top1"])  # the best epoch's: the model the trial keeps
        trials.append(_record(trial_id, values, "complete", epochs, metric=metric, model=run.output))
        return metric

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study.optimize(objective, n_trials=space.max_trials, catch=(TrainError,))
    return hand_on(output, "optuna", space, tuple(trials))


def _record(
    trial_id: str,
    values: dict[str, Any],
    state: Any,
    epochs: list[float],
    *,
    metric: float | None = None,
    model: str = "",
    reason: str = "",
) -> TrialRecord:
    if metric is None and epochs:
        metric = max(epochs)
    return TrialRecord(
        id=trial_id,
        parameters=values,
        state=state,
        metric=metric,
        epochs_run=len(epochs),
        model=model,
        reason=reason,
    )


def best_trial(trials: tuple[TrialRecord, ...]) -> TrialRecord:
    """The finished trial with the highest metric (the first of equals); a TuneError when none finished."""
    finished = [trial for trial in trials if trial.state == "complete" and trial.metric is not None]
    if not finished:
        why = "; ".join(f"trial {t.id} {t.state}: {t.reason}" for t in trials) or "no trials ran"
        raise TuneError(
            f"no trial finished, so there is no model to hand on ({why}); widen the space or "
            "lower its lr range"
        )
    return max(finished, key=lambda trial: (trial.metric, -int(trial.id) if trial.id.isdigit() else 0))


def hand_on(output: str, engine: Any, space: SearchSpace, trials: tuple[TrialRecord, ...]) -> TuningRecord:
    """Record the search in the best trial's model artifact (tuning.json beside its model.json, and model.json's
    ``tuning``: the report and the model card read them), then write OUTPUT/tuning.json last: the pointer to the
    candidate, which is the best trial's model artifact as it trained."""
    best = best_trial(trials)
    record = TuningRecord(
        engine=engine,
        metric=space.metric,
        space={**space.to_json(), "left_out": list(space.left_out), "source": space.source},
        trials=trials,
        best=best.id,
        model=best.model,
    )
    record.write(best.model)
    card_uri = storage.join(best.model, ModelCard.NAME)
    card = ModelCard.read(card_uri)
    dataclasses.replace(card, tuning=record.card_entry()).write(card_uri)
    if storage.absolute(output) != storage.absolute(best.model):
        record.write(output)
    log.info(
        "best trial %s of %d: val top-1 %.4f with %s; model: %s",
        best.id,
        len(trials),
        best.metric,
        best.parameters,
        best.model,
    )
    return record
