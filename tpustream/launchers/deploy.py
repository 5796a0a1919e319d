"""The deploy step's launcher (components/deploy.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream.run.outcome import failure_recorded

if TYPE_CHECKING:
    from google_cloud_pipeline_components.types.artifact_types import VertexEndpoint, VertexModel

    from tpustream.release.deploy import DeployOutcome

__all__ = ["launch_deploy"]


def launch_deploy(
    *,
    vertex_model: VertexModel,
    endpoint: str,
    vertex_endpoint: VertexEndpoint,
    traffic_percent: int,
    machine_type: str,
    min_replicas: int,
    max_replicas: int,
    run_outcome: str,
) -> str:
    """Deploy ``vertex_model``'s version to ``endpoint`` as a canary; ``vertex_endpoint`` names the endpoint
    and the run's outcome keeps promote's version and report. Returns the outcome line ("not deployed: ..."
    without an endpoint or a Vertex model)."""
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
        line = _deployed_line(model, outcome)
        promoted = read_outcome(run_outcome)  # promote's: the version and the report stay in the outcome
        reason = f"{promoted.reason}; {line}" if promoted else line
        record_outcome(
            run_outcome,
            step="deploy",
            decision="deployed",
            reason=reason,
            code=promoted.code if promoted else None,  # the promotion's, which this deploys
            class_index=promoted.class_index if promoted else None,
            report=promoted.report if promoted else "",
        )
        return line


def _deployed_line(model: str, outcome: DeployOutcome) -> str:
    """The outcome line of a deploy: where ``model`` went, the split after, and the models it undeployed."""
    split = ", ".join(f"{key}: {share}%" for key, share in outcome.traffic_split.items())
    line = f"deployed {model} to {outcome.endpoint} as {outcome.deployed_model_id} (traffic {split})"
    if outcome.undeployed:  # traffic_percent=100: the models it replaced, at 0%, are undeployed
        line += "; undeployed " + ", ".join(
            f"{key} ({version})" for key, version in outcome.undeployed.items()
        )
    return line
