"""Deploy step: the Vertex AI model version promote published joins an endpoint as a canary with
``traffic_percent`` of its traffic, the models serving there keeping the rest (tpustream/release/deploy.py; undo it
with ``tpustream rollback --endpoint ENDPOINT``).

Its input is promote's ``vertex_model`` (GCPC's ``google.VertexModel``, ``metadata.resourceName`` =
``projects/P/locations/L/models/ID@VERSION``): that exact version is deployed, in its own project and region.
Its output ``vertex_endpoint`` is GCPC's ``google.VertexEndpoint`` (``resourceName`` and the REST URI, as
GCPC's EndpointCreateOp writes them), so GCPC's endpoint components can follow. Not GCPC's ModelDeployOp:
it takes a fixed traffic_split, which cannot keep the serving models' proportions read at run time; it needs
an endpoint artifact (EndpointCreateOp makes a new endpoint every run); it records nothing to roll back;
and as a container component it cannot run in kfp.local.

At ``traffic_percent=100`` the models the version replaces are left at 0% and undeployed (deploy's
``undeploy_idle`` default; the pipeline does not ramp, so it has no switch for it: `tpustream deploy
--keep-idle` is the door that keeps them); the outcome line names them.
"""

from google_cloud_pipeline_components.types import artifact_types
from kfp.dsl import Input, Output


def deploy_model(
    vertex_model: Input[artifact_types.VertexModel],
    endpoint: str,
    vertex_endpoint: Output[artifact_types.VertexEndpoint],
    traffic_percent: int = 10,
    machine_type: str = "n1-standard-4",
    min_replicas: int = 1,
    max_replicas: int = 1,
    run_outcome: str = "",
) -> str:
    """Returns the outcome line. Without ``endpoint``, or without a Vertex model (promote published none),
    nothing is deployed and ``vertex_endpoint`` carries no resourceName."""
    from tpustream.run.outcome import failure_recorded

    with failure_recorded(run_outcome, "deploy-model"):
        from tpustream.release.deploy import deploy
        from tpustream.run.outcome import read_outcome, record_outcome

        model = vertex_model.metadata.get("resourceName", "")
        if not endpoint or not model:
            return "not deployed: " + (
                "no endpoint given" if not endpoint else "promote published no Vertex AI model"
            )
        outcome = deploy(
            model,
            endpoint,
            traffic_percent=traffic_percent,
            machine_type=machine_type,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
        )
        location = outcome.endpoint.split("/")[3]
        vertex_endpoint.uri = f"https://{location}-aiplatform.googleapis.com/v1/{outcome.endpoint}"
        vertex_endpoint.metadata["resourceName"] = outcome.endpoint
        split = ", ".join(f"{key}: {share}%" for key, share in outcome.traffic_split.items())
        line = f"deployed {model} to {outcome.endpoint} as {outcome.deployed_model_id} (traffic {split})"
        if outcome.undeployed:  # traffic_percent=100: the models it replaced, at 0%, are undeployed
            line += "; undeployed " + ", ".join(
                f"{key} ({version})" for key, version in outcome.undeployed.items()
            )
        promoted = read_outcome(run_outcome)  # promote's: the version and the report stay in the outcome
        reason = f"{promoted.reason}; {line}" if promoted else line
        record_outcome(
            run_outcome,
            step="deploy",
            decision="deployed",
            reason=reason,
            report=promoted.report if promoted else "",
        )
        return line
