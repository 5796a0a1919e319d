"""The pipeline run's gates: ``new_data`` skips a run when nothing is new (the source's fingerprint against what
the registry says was trained), ``data_gate`` stops one on a data-check anomaly (against the champion's data),
``outcome`` is what a run ended with, ``notify`` tells people.

The names below are the package's public API, imported on first use so that importing the package loads nothing
heavy (``tpustream --help`` stays torch-free); the modules themselves are imported by their full path inside tpustream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from tpustream.run.data_gate import DataCheckFailed, check_for_pipeline
    from tpustream.run.new_data import DataCheck, check_source
    from tpustream.run.notify import post_webhook, webhook_body
    from tpustream.run.outcome import RunFailure, RunOutcome, failure_recorded, read_outcome, record_outcome

_HOMES = {
    "check_source": "new_data",
    "DataCheck": "new_data",
    "check_for_pipeline": "data_gate",
    "DataCheckFailed": "data_gate",
    "RunOutcome": "outcome",
    "RunFailure": "outcome",
    "record_outcome": "outcome",
    "read_outcome": "outcome",
    "failure_recorded": "outcome",
    "webhook_body": "notify",
    "post_webhook": "notify",
}
__all__ = [
    "DataCheck",
    "check_source",
    "DataCheckFailed",
    "check_for_pipeline",
    "RunFailure",
    "RunOutcome",
    "failure_recorded",
    "read_outcome",
    "record_outcome",
    "post_webhook",
    "webhook_body",
]


__getattr__, __dir__ = lazy_front(__name__, _HOMES)
