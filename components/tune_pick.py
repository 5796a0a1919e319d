"""Pick-trial step (Vertex): the finished HyperparameterTuningJob's best trial, its model handed on as the
candidate (no retraining)."""

from kfp.dsl import Metrics, Model, Output


def pick_trial(
    gcp_resources: str,
    base_output_directory: str,
    space: dict,
    model: Output[Model],
    metrics: Output[Metrics],
    run_outcome: str = "",
) -> None:
    """``gcp_resources``: the job GCPC's launcher created; ``base_output_directory``: the job's, under which each
    trial trained into ``<trial id>/model``; ``space``: what plan_tuning searched."""
    from tpustream.launchers.tune import pick_best_trial

    pick_best_trial(
        gcp_resources=gcp_resources,
        base_output_directory=base_output_directory,
        space=space,
        model=model,
        metrics=metrics,
        run_outcome=run_outcome,
    )
