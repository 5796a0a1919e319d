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
    from tpustream.launchers.validate_serving import launch_validate_serving

    return launch_validate_serving(
        model=model, dataset=dataset, validation=validation, samples=samples, run_outcome=run_outcome
    )
