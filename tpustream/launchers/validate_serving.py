"""The validate-serving step's launcher (components/validate_serving.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream.run.outcome import failure_recorded

if TYPE_CHECKING:
    from kfp.dsl import Dataset, Metrics, Model

__all__ = ["launch_validate_serving"]


def launch_validate_serving(
    *, model: Model, dataset: Dataset, validation: Metrics, samples: int, run_outcome: str
) -> str:
    """Validate ``model`` in the serving container's server; validation.json under ``validation`` and its
    numbers as KFP metrics. Returns the summary line; raises when the candidate fails a check."""
    with failure_recorded(run_outcome, "validate-serving"):
        from tpustream.serve.validate import validate_serving

        report = validate_serving(model.uri, data=dataset.uri, samples=int(samples), output=validation.uri)
        validation.log_metric("agreed", float(report.agreed))
        validation.log_metric("samples", float(report.samples))
        validation.log_metric("latency_ms_p50", float(report.latency_ms_p50 or 0))
        validation.log_metric("startup_s", float(report.startup_s))
        return f"{report.agreed}/{report.samples} val images answered as evaluation did"
