"""The notify-webhook exit step's launcher (components/notify.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kfp.dsl import PipelineTaskFinalStatus

__all__ = ["launch_notify_webhook"]


def launch_notify_webhook(
    *, webhook: str, run_outcome: str, pipeline: str, status: PipelineTaskFinalStatus, run: str
) -> None:
    """Log the run's state and outcome and POST them to ``webhook`` ("" posts nothing). Never fails: a
    receiver that is down is logged, not raised. Not under ``failure_recorded``: it is the step that reads
    the failures."""
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
