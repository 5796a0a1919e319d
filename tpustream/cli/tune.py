"""`tpustream tune`: the search space searched here, trial by trial (tpustream/tune/local.py)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from tpustream.cli.app import app
from tpustream.cli.options import Opt, from_config
from tpustream.models import MODEL_NAMES
from tpustream.train.config import TrainConfig


@app.command("tune")
@from_config(
    TrainConfig,
    exclude={"commit_timeout_minutes", "init_optional"},
    output=Opt(
        more_help="tune: each trial trains into OUTPUT/trials/<id>/; OUTPUT/tuning.json names the best."
    ),
    model=Opt(more_help=f"One of: {' | '.join(MODEL_NAMES)}."),
    log_steps=Opt(min=1),
    patience=Opt(min=0),
    min_delta=Opt(min=0.0),
)
def tune_cmd(
    config: TrainConfig,
    space: Annotated[
        str | None,
        typer.Option(
            help="Search space file (YAML or JSON, local or gs://; the format: tpustream/tune/space.py). "
            "Default: lr, weight decay, epochs, freeze epochs (with --pretrained/--init-from), augmentation "
            "strength and mixup alpha (when the trainer has them), 8 trials, early stopping on."
        ),
    ] = None,
    max_trials: Annotated[
        int | None, typer.Option(min=1, help="Trials to run (default: the space's max_trials).")
    ] = None,
) -> None:
    """Search training options with optuna, trial by trial: each trial a real training run into its own
    output, a trial trailing the others' median val top-1 stopped at that epoch, and the best trial's model
    handed on as it trained (its model.json records the trial). The other options are `train`'s: the base
    every trial starts from. On Vertex, the pipeline's tune switch runs the same space on Vizier."""
    from tpustream.tune.local import tune_locally
    from tpustream.tune.space import read_space

    searched = read_space(space)
    if max_trials is not None:
        searched = dataclasses.replace(
            searched, max_trials=max_trials, parallel_trials=min(searched.parallel_trials, max_trials)
        )
    record = tune_locally(config, searched)
    for trial in record.trials:
        metric = "-" if trial.metric is None else f"{trial.metric:.4f}"
        chosen = "  <- best" if trial.id == record.best else ""
        typer.echo(
            f"trial {trial.id}: {trial.state}, val top-1 {metric} after {trial.epochs_run} epoch(s), "
            f"{trial.parameters}{chosen}"
        )
    typer.echo(f"model: {record.model} (trial {record.best}; tuning.json in {config.output})")
