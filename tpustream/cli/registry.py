"""The registry's commands: `promote`, `deploy`, `rollback`, `champion show|history`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from tpustream.cli.app import app, champion_app
from tpustream.cli.options import Opt, fail, from_config
from tpustream.registry.policy import PromotionPolicy

# promote's and report's options (report decides as promote does): each a PromotionPolicy (or its floor's,
# QualityFloor) field, its docstring the help; click checks the bounds first.
policy_options = from_config(
    PromotionPolicy, min_class_recall=Opt(min=0.0, max=1.0), min_class_support=Opt(min=0)
)


@app.command("promote")
@policy_options
def promote_cmd(
    policy: PromotionPolicy,
    candidate: Annotated[str, typer.Option(help="Candidate model artifact URI.")],
    metrics: Annotated[str, typer.Option(help="metrics.json (or its directory) from tpustream evaluate.")],
    registry: Annotated[str, typer.Option(help="Registry URI (versions/, champion.json, events/).")],
    vertex_model: Annotated[
        str | None, typer.Option(help="Also publish to this Vertex AI Model Registry model (display name).")
    ] = None,
    vertex_project: Annotated[
        str | None, typer.Option(help="Vertex project (default GOOGLE_CLOUD_PROJECT).")
    ] = None,
    vertex_region: Annotated[str | None, typer.Option(help="Vertex region (default us-central1).")] = None,
    serving_image: Annotated[
        str | None,
        typer.Option(
            help="With --vertex-model: the pushed serve image (containers/serve; Cloud Build's serve.ref). "
            "Default TPUSTREAM_SERVING_IMAGE."
        ),
    ] = None,
    validation: Annotated[
        str | None,
        typer.Option(
            help="validation.json (or its directory) from `tpustream validate-serving` on this candidate: "
            "promote only if it passed for this model.pt (the pipeline always gives it)."
        ),
    ] = None,
) -> None:
    """Promote the candidate if it beats the champion on the same data; atomic, idempotent.

    With --vertex-model, a promoted model is uploaded to the Vertex AI Model Registry from its immutable
    registry version with the serving image, and gets the `champion` alias there (deployable as is)."""
    from tpustream.release import promote
    from tpustream.vertex import model_registry as vertex

    if validation:
        from tpustream.serve.validate import require_validated

        require_validated(validation, candidate)
    target = vertex.target_from_env(vertex_model, vertex_project, vertex_region, serving_image)
    outcome = promote.promote(candidate, metrics, registry, policy, vertex=target)
    if outcome.vertex is not None:
        typer.echo(f"vertex: {outcome.vertex.versioned_name} (alias champion)")
    elif target is not None:
        typer.echo("vertex: nothing uploaded (only promoted models are)")
    if outcome.promoted:
        typer.echo(f"promoted: version {outcome.version} is the champion ({outcome.reason})")
    else:
        typer.echo(f"not promoted: {outcome.reason}")


VertexProjectOption = Annotated[
    str | None, typer.Option(help="Vertex project (default GOOGLE_CLOUD_PROJECT).")
]
VertexRegionOption = Annotated[
    str | None, typer.Option(help="Vertex region (default GOOGLE_CLOUD_REGION, us-central1).")
]


def _traffic(split: dict[str, int]) -> str:
    return ", ".join(f"{deployed_id} {share}%" for deployed_id, share in split.items()) or "none"


def _model_path(deployed: str, version: str) -> str:
    """The resource name of ``version`` (ID@VERSION), in the project and region of ``deployed``'s."""
    return f"{deployed.split('/models/')[0]}/models/{version}"


@app.command("deploy")
def deploy_cmd(
    endpoint: Annotated[
        str,
        typer.Option(
            help="Endpoint display name (created if absent) or resource name projects/P/locations/L/endpoints/ID."
        ),
    ],
    model: Annotated[
        str,
        typer.Option(
            help="Vertex AI model: the display name promote published (--vertex-model; its `champion` version) or "
            "a resource name projects/P/locations/L/models/ID[@VERSION|@ALIAS]."
        ),
    ],
    traffic: Annotated[
        int,
        typer.Option(
            min=0,
            max=100,
            help="Percent of the endpoint's traffic for this version; the models serving keep the rest in their "
            "proportions (an endpoint serving nothing gives it 100). Deploying a served version again sets its share.",
        ),
    ] = 10,
    registry: Annotated[
        str | None,
        typer.Option(
            help="Deploy the version uploaded from this registry's champion (an error if Vertex lacks it)."
        ),
    ] = None,
    machine_type: Annotated[str, typer.Option(help="Serving machine type.")] = "n1-standard-4",
    min_replicas: Annotated[int, typer.Option(min=1, help="Replicas always running.")] = 1,
    max_replicas: Annotated[int, typer.Option(min=1, help="Most replicas under load.")] = 1,
    dedicated_endpoint: Annotated[
        bool,
        typer.Option(
            help="Create the endpoint (when none has the name) as a dedicated public endpoint: its own DNS "
            "name and requests up to 10 MB. A shared public endpoint (the default) takes requests up to 1.5 MB, "
            "far below the model server's 16 MiB body limit: a few photos per request at most."
        ),
    ] = False,
    undeploy_idle: Annotated[
        bool,
        typer.Option(
            "--undeploy-idle/--keep-idle",
            help="Once this version has 100% of the traffic, undeploy the models left at 0% (a deployed model's "
            "replicas are billed at 0%); --keep-idle keeps them deployed, to `rollback` or ramp back down to.",
        ),
    ] = True,
    project: VertexProjectOption = None,
    region: VertexRegionOption = None,
) -> None:
    """Deploy a Model Registry version (the champion) to a Vertex AI endpoint as a canary; undo with `rollback`.

    Request size: a shared public endpoint takes requests up to 1.5 MB, a dedicated one (--dedicated-endpoint)
    up to 10 MB; batch prediction (`predict --vertex-batch`) goes to the model server directly, within its own
    budgets."""
    from tpustream.release import deploy

    outcome = deploy.deploy(
        model,
        endpoint,
        traffic_percent=traffic,
        machine_type=machine_type,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        registry=registry,
        project=project,
        region=region,
        dedicated_endpoint=dedicated_endpoint,
        undeploy_idle=undeploy_idle,
    )
    done = "deployed" if outcome.deployed else "already deployed"
    typer.echo(f"{done}: {outcome.model} on {outcome.endpoint} as {outcome.deployed_model_id}")
    typer.echo(f"traffic: {_traffic(outcome.traffic_split)}")
    for deployed_id, version in outcome.undeployed.items():
        typer.echo(
            f"undeployed {deployed_id} (model {version}): it served 0% of the traffic; to serve it again: "
            f"tpustream deploy --endpoint {outcome.endpoint} --model {_model_path(outcome.model, version)} "
            "--traffic 100"
        )
    if outcome.previous_split and not outcome.undeployed:
        typer.echo(f"undo: tpustream rollback --endpoint {outcome.endpoint}")


@app.command("rollback")
def rollback_cmd(
    endpoint: Annotated[str, typer.Option(help="Endpoint display name or resource name.")],
    project: VertexProjectOption = None,
    region: VertexRegionOption = None,
) -> None:
    """Undo the latest `tpustream deploy` on an endpoint: the models that served before it get their recorded
    shares back and the canary is undeployed."""
    from tpustream.release import deploy

    outcome = deploy.rollback(endpoint, project=project, region=region)
    typer.echo(
        f"rolled back: undeployed {outcome.undeployed} (model {outcome.model}) from {outcome.endpoint}"
    )
    typer.echo(f"traffic: {_traffic(outcome.traffic_split)}")


# Both champion commands take the registry either way: `champion show REGISTRY` and `champion history
# --registry REGISTRY` read as well as the forms each had first (show took --registry, history an argument).
RegistryArgument = Annotated[
    str | None,
    typer.Argument(
        metavar="REGISTRY",
        help="Registry URI (a local directory or gs://); or give it as --registry.",
        show_default=False,
    ),
]
RegistryOption = Annotated[
    str | None, typer.Option("--registry", help="Registry URI, as an option (the same as REGISTRY).")
]


def _registry(argument: str | None, option: str | None, command: str) -> str:
    """The registry of a champion command, given as its argument or as --registry (one of them, or both
    the same)."""
    if argument and option and argument != option:
        fail(f"champion {command}: the registry is given twice, {argument} and --registry {option}: give one")
    registry = argument or option
    if not registry:
        fail(
            f"champion {command}: give the registry: `tpustream champion {command} REGISTRY` (or --registry)"
        )
    return registry


@champion_app.command("show")
def champion_show(registry: RegistryArgument = None, registry_option: RegistryOption = None) -> None:
    """Print the champion pointer and check that the version it names is complete."""
    from tpustream.registry.store import champion_status

    status = champion_status(_registry(registry, registry_option, "show"))
    typer.echo(json.dumps(status.to_json(), indent=1))
    if not status.ok:
        raise typer.Exit(1)


@champion_app.command("history")
def champion_history(
    registry: RegistryArgument = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the entries as one JSON list (oldest first) instead.")
    ] = False,
    limit: Annotated[int | None, typer.Option(help="Only the newest N entries.", min=1)] = None,
    metric: Annotated[
        str | None,
        typer.Option(
            help="Show this metric (top1, top5, loss); default: the one each decision was taken on."
        ),
    ] = None,
    registry_option: RegistryOption = None,
) -> None:
    """Every version promoted and every candidate refused, oldest first: date, dataset, metric, decision.

    Read from the registry's append-only event log (REGISTRY/events). The run report (`tpustream report`,
    the pipeline's evaluate and promote steps) plots the same history."""
    from tpustream.registry.history import champion_history as read_history
    from tpustream.registry.history import format_history_table

    registry = _registry(registry, registry_option, "history")
    entries = read_history(registry, metric=metric)
    if limit is not None:
        entries = entries[-limit:]
    if json_output:
        typer.echo(json.dumps(entries, indent=1))
    elif not entries:
        typer.echo(f"no decisions yet in {registry} (its events/ log is empty)")
    else:
        typer.echo(format_history_table(entries))
