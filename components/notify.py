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
    import logging

    from tpustream.run.notify import post_webhook, redact_url, webhook_body
    from tpustream.run.outcome import read_failures, read_outcome

    body = webhook_body(
        pipeline=pipeline,
        job=status.pipeline_job_resource_name,
        state=status.state,
        outcome=read_outcome(run_outcome),
        error=status.error_message or "",
        run=run,
        failures=read_failures(run_outcome),
    )
    logging.getLogger("tpustream").info("run %s: %s", status.state, body["text"])
    if not webhook:
        return
    logging.getLogger("tpustream").info("notifying %s", redact_url(webhook))
    post_webhook(webhook, body)
