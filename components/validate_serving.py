"""Validate step: the candidate in the serving container before promotion (TFX's InfraValidator's place).

Runs in the serving image (``pipeline compile --serving-image``): aiplatform's model server is started on
the candidate as Vertex AI would start it, answers val images as ``evaluate`` did and refuses malformed
requests with 400 (tpustream/serve/validate.py). A failure fails the step, so promote never runs; a pass
writes ``validation.json`` under the ``validation`` artifact, which promote checks against the candidate.
"""

from kfp.dsl import Dataset, Input, Metrics, Model, Output


def validate_serving(
    model: Input[Model],
    dataset: Input[Dataset],
    validation: Output[Metrics],
    samples: int = 64,
    run_outcome: str = "",
) -> str:
    """Returns the summary line; raises (failing the step) when the candidate fails a check."""
    from tpustream.run.outcome import failure_recorded

    with failure_recorded(run_outcome, "validate-serving"):
        from tpustream.serve.validate import validate_serving as validate

        report = validate(model.uri, data=dataset.uri, samples=int(samples), output=validation.uri)
        validation.log_metric("agreed", float(report.agreed))
        validation.log_metric("samples", float(report.samples))
        validation.log_metric("latency_ms_p50", float(report.latency_ms_p50 or 0))
        validation.log_metric("startup_s", float(report.startup_s))
        return f"{report.agreed}/{report.samples} val images answered as evaluation did"
