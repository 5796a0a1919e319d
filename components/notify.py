"""Notify step: the DAG's exit task (it runs however the run ended) POSTs the run's state and outcome to a
webhook. KFP gives an exit task no other task's outputs, so it reads what the steps recorded at
``run_outcome`` (tpustream/run/outcome.py: the decision, and the task that failed with its error line);
``status`` is filled in by the runner (Vertex, kfp.local), ``run`` is the run's name (on Vertex its job ID,
on kfp.local its run directory's: pipelines/training.py)."""

from kfp.dsl import PipelineTaskFinalStatus


def notify_webhook(
    webhook: str, run_outcome: str, pipeline: str, status: PipelineTaskFinalStatus, run: str = ""
) -> None:
    """Nothing without ``webhook``. Never fails: a receiver that is down is logged, not raised."""
    from tpustream.launchers.notify import launch_notify_webhook

    launch_notify_webhook(webhook=webhook, run_outcome=run_outcome, pipeline=pipeline, status=status, run=run)
