"""The join-experiment step's launcher (components/experiment.py)."""

from __future__ import annotations

from tpustream.run.outcome import failure_recorded

__all__ = ["launch_join_experiment"]


def launch_join_experiment(
    *, experiment: str, project: str, location: str, pipeline_job_id: str, run_outcome: str
) -> str:
    """Add the running job to ``experiment``; returns its metadata context ("" when ``experiment`` is "")."""
    with failure_recorded(run_outcome, "join-experiment"):
        from tpustream.vertex.experiments import join_experiment

        return (
            join_experiment(experiment, project=project, location=location, pipeline_job_id=pipeline_job_id)
            or ""
        )
