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
    from tpustream.launchers.deploy import launch_deploy

    return launch_deploy(
        vertex_model=vertex_model,
        endpoint=endpoint,
        vertex_endpoint=vertex_endpoint,
        traffic_percent=traffic_percent,
        machine_type=machine_type,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        run_outcome=run_outcome,
    )
