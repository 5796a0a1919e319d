"""Join-experiment step: a scheduled run adds itself to a Vertex AI Experiment (tpustream/vertex/experiments.py).

Vertex's Schedule has no experiment field (aiplatform_v1 ``Schedule``, ``CreatePipelineJobRequest``): ``pipeline
submit --experiment`` joins a run from outside, and a scheduled run joins from inside with this step. The
experiment then reads the run's ``system.Metrics`` artifacts itself (train, evaluate), side by side with
other runs in the console.
"""


def join_experiment(
    experiment: str, project: str = "", location: str = "", pipeline_job_id: str = "", run_outcome: str = ""
) -> str:
    """Returns the experiment's metadata context ("" when ``experiment`` is "")."""
    from tpustream.launchers.experiment import launch_join_experiment

    return launch_join_experiment(
        experiment=experiment,
        project=project,
        location=location,
        pipeline_job_id=pipeline_job_id,
        run_outcome=run_outcome,
    )
