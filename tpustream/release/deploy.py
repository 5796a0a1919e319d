"""Canary deployment of a Model Registry version to a Vertex AI endpoint, and its rollback.

``deploy``: the version (by default the model's ``champion``, which promote moves) joins the endpoint with
``traffic_percent`` of its traffic; the models serving now keep the rest in their current proportions,
rounded to whole percents by largest remainder (Vertex's ``trafficSplit`` is integers that sum to 100:
aiplatform_v1 ``DeployModelRequest.traffic_split``, "0" naming the model being deployed). The endpoint is
found by display name and created when absent, or named by its resource name. On an endpoint that serves
nothing yet the model takes 100%. Deploying a version the endpoint already serves sets its share instead
(a canary ramps 10 -> 50 -> 100 by deploying it again), and a retried deploy changes nothing.

Once the deployed version has 100% of the traffic, the models left on the endpoint serve none and are
undeployed (``undeploy_idle``; ``tpustream deploy --keep-idle`` keeps them): a deployed model keeps its minimum
replicas running, and billed, at 0% traffic. The canary record goes with them (the split it recorded is gone);
a version undeployed stays in the Model Registry, one ``tpustream deploy --traffic 100`` away.

What ``rollback`` undoes, precisely: before ``deploy`` adds a model next to serving ones, it records in the
endpoint's labels the canary (its model ID and version) and the traffic split it is deployed into
(``CanaryRecord``). "Previous" is that split: the deployed models that served, with their shares, right
before the canary arrived. Labels, because they are the endpoint's own user metadata (UpdateEndpoint with
``update_mask=labels``) and show in the console and ``gcloud ai endpoints describe``; a deployed model has
none. Only the latest deploy is recorded: rollback undoes one step. ``rollback`` gives the previous models
their recorded shares back (one undeployed since is left out, the others re-scaled) and undeploys the canary
in the same UndeployModel call (its ``traffic_split``), then removes the record. Undeployed rather than kept
at 0%: a deployed model keeps its minimum replicas running, and billed, at 0% traffic; the version stays in
the Model Registry, one ``tpustream deploy`` away.

Calls go through the aiplatform v1 EndpointServiceClient (configured by ``tpustream.vertex.model_registry.init``), one
request per step with exactly the fields meant: ``aiplatform.Endpoint.update`` drops an empty label map
(``if labels:`` in models.py), which removing the record can leave.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpustream.errors import ConfigError, TpustreamError
from tpustream.release.canary import (
    _CANARY_MODEL,
    NEW_MODEL,
    CanaryRecord,
    _scale,
    _without_record,
    canary_split,
)
from tpustream.vertex import model_registry as vertex

__all__ = ["DeployError", "DeployOutcome", "RollbackOutcome", "deploy", "rollback"]

log = logging.getLogger(__name__)

_ENDPOINT_NAME = re.compile(
    r"^projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/endpoints/(?P<id>[^/]+)$"
)
# An endpoint ID as Vertex defines it (aiplatform_v1 ``types/endpoint_service.py``,
# ``CreateEndpointRequest.endpoint_id``): a lowercase letter, then up to 62 of ``[a-z0-9-]``, the last a letter
# or digit; or a number without leading zeros (one a user picks has up to 9 digits; the IDs Vertex generates
# are longer numbers).
ENDPOINT_ID = re.compile(r"^(?:[1-9][0-9]*|[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?)$")


class DeployError(TpustreamError, ValueError):
    """The endpoint is not in a state this step can act on; the message says what to do."""


@dataclass(frozen=True, kw_only=True)
class DeployOutcome:
    """What ``deploy`` did: the ``endpoint`` (resource name; ``created_endpoint``: by this call), the ``model``
    version (ID@VERSION) and its ``deployed_model_id``; ``deployed``: False when it was deployed already and
    only its share changed, or nothing did; ``traffic_split`` after (deployed model id -> percent) and
    ``previous_split``: the serving models' shares before ({}: none served, nothing to roll back to);
    ``undeployed``: the models left at 0% once it took 100% that this call undeployed (deployed model id ->
    the version it served, ID@VERSION; {}: none, or ``undeploy_idle`` was off)."""

    endpoint: str
    created_endpoint: bool
    model: str
    deployed_model_id: str
    deployed: bool
    traffic_split: dict[str, int]
    previous_split: dict[str, int]
    undeployed: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class RollbackOutcome:
    """What ``rollback`` did: on ``endpoint``, the canary ``undeployed`` (its deployed model id), the ``model``
    version it served (ID@VERSION) and the ``traffic_split`` after."""

    endpoint: str
    undeployed: str
    model: str
    traffic_split: dict[str, int]


@dataclass
class _Deployed:
    model_id: str
    version_id: str
    display_name: str


@dataclass
class _EndpointState:
    name: str
    display_name: str
    labels: dict[str, str]
    deployed: dict[str, _Deployed]  # deployed model id -> what it serves
    traffic: dict[str, int]

    def deployment_of(self, model_id: str, version_id: str) -> str | None:
        """The id of the deployed model serving ``model_id`` version ``version_id``, or None."""
        return next(
            (
                deployed_id
                for deployed_id, d in self.deployed.items()
                if (d.model_id, d.version_id) == (model_id, version_id)
            ),
            None,
        )

    def serving(self) -> dict[str, int]:
        return {deployed_id: share for deployed_id, share in self.traffic.items() if share > 0}


def _read(client: Any, name: str) -> _EndpointState:
    endpoint = client.get_endpoint(name=name)
    deployed = {}
    for model in endpoint.deployed_models:
        resource, _, version = model.model.partition("@")
        deployed[model.id] = _Deployed(
            resource.rsplit("/", 1)[1], model.model_version_id or version, model.display_name
        )
    return _EndpointState(
        name=endpoint.name,
        display_name=endpoint.display_name,
        labels=dict(endpoint.labels),
        deployed=deployed,
        traffic={deployed_id: int(share) for deployed_id, share in endpoint.traffic_split.items()},
    )


def _endpoint_name(endpoint: str) -> re.Match[str] | None:
    """The parts of ``endpoint`` when it is a resource name, None for a display name. Anything that starts
    with ``projects/`` is taken as a resource name, never as a display name: one that is not well formed,
    or whose ID Vertex would not accept, is a DeployError instead of a new endpoint of that display name."""
    if not endpoint.startswith("projects/"):
        return None
    named = _ENDPOINT_NAME.match(endpoint)
    if named is None or not ENDPOINT_ID.match(named["id"]):
        raise DeployError(
            f"--endpoint {endpoint} is not an endpoint resource name: projects/P/locations/R/endpoints/ID, "
            "ID a number or a lowercase letter followed by up to 62 of [a-z0-9-] (ending in a letter or digit)"
        )
    return named


def _place(endpoint: str, place: vertex.VertexPlace) -> vertex.VertexPlace:
    """``place``, checked against an endpoint given by resource name (it must be in the same region)."""
    named = _endpoint_name(endpoint)
    if named and named["location"] != place.location:
        raise DeployError(
            f"--endpoint {endpoint} is in {named['location']}, the model in {place.location}: "
            "deploy to an endpoint in the model's region"
        )
    return place


def _find_endpoint(
    client: Any, place: vertex.VertexPlace, endpoint: str, *, create: bool, dedicated: bool = False
) -> tuple[str, bool]:
    """The endpoint's resource name, and whether this call created it (by display name, when absent)."""
    from google.api_core import exceptions

    if not endpoint or len(endpoint) > 128:
        raise DeployError(
            f"--endpoint {endpoint!r}: give a display name (1-128 characters) or a resource name"
        )
    if _endpoint_name(endpoint):
        try:
            client.get_endpoint(name=endpoint)
        except exceptions.NotFound as exc:
            raise DeployError(
                f"--endpoint {endpoint} does not exist: check the resource name, or give a display name "
                "(deploy creates the endpoint when none has it)"
            ) from exc
        return endpoint, False
    parent = f"projects/{place.project}/locations/{place.location}"
    found = list(client.list_endpoints(request={"parent": parent, "filter": f'display_name="{endpoint}"'}))
    if len(found) > 1:
        names = ", ".join(e.name for e in found)
        raise DeployError(f"{len(found)} endpoints are named {endpoint!r} ({names}): give a resource name")
    if found:
        return str(found[0].name), False
    if not create:
        raise DeployError(f"no endpoint is named {endpoint!r} in {parent}: check --endpoint and --region")
    log.info("creating %s endpoint %r in %s", "a dedicated" if dedicated else "a shared", endpoint, parent)
    spec: dict[str, Any] = {"display_name": endpoint, "description": "created by tpustream deploy"}
    if dedicated:  # Endpoint.dedicated_endpoint_enabled: its own DNS name, isolated traffic, larger requests
        spec["dedicated_endpoint_enabled"] = True
    operation = client.create_endpoint(parent=parent, endpoint=spec)
    created = operation.result(timeout=None)
    log.info("created endpoint %s", created.name)
    return str(created.name), True


_CHANGES = (
    "DeployModelOperationMetadata",
    "UndeployModelOperationMetadata",
    "MutateDeployedModelOperationMetadata",
)


def _await_running_changes(
    client: Any, name: str, *, first_poll: float = 0.05, max_poll: float = 15.0
) -> None:
    """Wait for the DeployModel / UndeployModel operations still running on endpoint ``name``.

    A retried deploy task (the pipeline retries a failed one) can start while its first attempt's
    DeployModel still runs: the endpoint does not list the model until that operation is done, so deciding
    now would deploy it a second time (billed replicas) with a split computed from stale shares. The
    endpoint's operations (google.longrunning ListOperations on it, every page) say what is in flight; once they are
    done, the endpoint's state is read and the deployed version is found, as for any repeated deploy.
    """
    from google.api_core.operations_v1.pagers import ListOperationsPager
    from google.longrunning import operations_pb2

    # ListOperations answers a page at a time (google/longrunning/operations_proto.proto: page_token,
    # next_page_token), and an endpoint with a long history has more than one: the running DeployModel may be on
    # any page. The v1 EndpointServiceClient.list_operations (aiplatform_v1/services/endpoint_service/client.py)
    # returns one raw ListOperationsResponse, no pager; google/api_core/operations_v1/pagers.py's
    # ListOperationsPager follows next_page_token, calling the same method again with page_token set.
    request = operations_pb2.ListOperationsRequest(name=name)
    listed = ListOperationsPager(client.list_operations, request, client.list_operations(request=request))
    running = [op.name for op in listed if not op.done and op.metadata.type_url.endswith(_CHANGES)]
    for operation in running:
        log.info(
            "waiting for %s, a change of %s still running (a retried deploy's first attempt?)",
            operation,
            name,
        )
        delay = first_poll
        while not client.get_operation(request=operations_pb2.GetOperationRequest(name=operation)).done:
            time.sleep(delay)
            delay = min(delay * 2, max_poll)
        log.info("%s is done", operation)


def _set_labels(client: Any, state: _EndpointState, labels: dict[str, str]) -> None:
    if labels != state.labels:
        client.update_endpoint(
            endpoint={"name": state.name, "labels": labels}, update_mask={"paths": ["labels"]}
        )


def deploy(
    model: str,
    endpoint: str,
    *,
    traffic_percent: int = 10,
    machine_type: str = "n1-standard-4",
    min_replicas: int = 1,
    max_replicas: int = 1,
    registry: str | None = None,
    project: str | None = None,
    region: str | None = None,
    dedicated_endpoint: bool = False,
    undeploy_idle: bool = True,
) -> DeployOutcome:
    """Serve a Model Registry version on ``endpoint`` with ``traffic_percent`` of its traffic.

    Args:
        model: a model resource name (``projects/P/locations/L/models/ID``, optionally ``@VERSION`` or
            ``@ALIAS``; its project and region are used) or display name; without a version, its
            ``champion``.
        endpoint: an endpoint display name (created if absent) or resource name.
        traffic_percent: the deployed version's share, 0-100; the models serving now keep the rest in
            their proportions. An endpoint that serves nothing yet gives it 100.
        machine_type, min_replicas, max_replicas: the dedicated machines it runs on.
        registry: a tpustream registry: deploy the version uploaded from its champion (an error when
            Vertex does not have it) instead of the ``champion`` alias.
        project, region: where ``model`` (a display name) and the endpoint are; default the environment's.
        dedicated_endpoint: an endpoint this call creates is a dedicated public endpoint
            (``dedicated_endpoint_enabled``: its own DNS name; requests up to 10 MB) instead of a shared one
            (requests up to 1.5 MB: "Get online predictions from a custom trained model"). Ignored for an
            endpoint that exists (Vertex cannot switch one).
        undeploy_idle: once the version has 100% of the traffic, undeploy the models left at 0% (billed
            replicas that serve nothing); False keeps them deployed, for ``rollback`` or a ramp back down.

    Returns:
        What it did (``DeployOutcome``).
    """
    if not 0 <= traffic_percent <= 100:
        raise ConfigError(
            f"--traffic {traffic_percent}: a share of the endpoint's traffic in percent, 0 to 100"
        )
    resources = vertex.MachineResources(
        machine_type=machine_type, min_replicas=min_replicas, max_replicas=max_replicas
    )
    place = _place(endpoint, vertex.place_of_model(model, project, region))
    aiplatform = vertex.init(place)
    version = vertex.find_model_version(aiplatform, model, registry=registry)
    client = vertex.v1_client("endpoint")
    name, created = _find_endpoint(client, place, endpoint, create=True, dedicated=dedicated_endpoint)
    _await_running_changes(client, name)
    state = _read(client, name)
    existing = state.deployment_of(version.model_id, version.version_id)
    previous = state.serving()
    if existing is not None:
        _set_share(client, state, existing, traffic_percent, version)
        deployed_id = existing
    else:
        deployed_id = _deploy_new(client, state, version, traffic_percent, resources)
    undeployed = _undeploy_idle(client, name, deployed_id) if undeploy_idle else {}
    after = _read(client, name)
    log.info(
        "%s %s as %s on %s: traffic %s",
        "deployed" if existing is None else "serving",
        version.versioned_name,
        deployed_id,
        name,
        _describe(after.traffic, after),
    )
    return DeployOutcome(
        endpoint=name,
        created_endpoint=created,
        model=version.versioned_name,
        deployed_model_id=deployed_id,
        deployed=existing is None,
        traffic_split=after.traffic,
        previous_split=previous,
        undeployed=undeployed,
    )


def _deploy_new(
    client: Any,
    state: _EndpointState,
    version: vertex.ModelVersion,
    traffic_percent: int,
    resources: vertex.MachineResources,
) -> str:
    """Deploy ``version`` to the endpoint with ``traffic_percent`` of its traffic (100 when nothing serves),
    recording the canary first when it joins serving models. Returns its deployed model id."""
    name = state.name
    serving = state.serving()
    percent = traffic_percent
    if not serving and percent != 100:
        log.warning(
            "%s serves no traffic yet: %s takes 100%% of it, not %d%%", name, version.versioned_name, percent
        )
        percent = 100
    split = canary_split(serving, percent)
    record = CanaryRecord(version.model_id, version.version_id, serving) if serving else None
    # recorded before the deployment: a deploy that fails after it leaves a record rollback refuses to act on
    # (the canary is not deployed), and a retried one records the same split again
    _set_labels(client, state, {**_without_record(state.labels), **(record.labels() if record else {})})
    log.info(
        "deploying %s to %s on %s x%d-%d with %d%% of the traffic%s; this takes several minutes",
        version.versioned_name,
        name,
        resources.machine_type,
        resources.min_replicas,
        resources.max_replicas,
        percent,
        f", the rest as {_describe(split, state)}" if serving else "",
    )
    operation = client.deploy_model(
        endpoint=name,
        deployed_model={
            "model": version.versioned_name,
            "display_name": f"{version.display_name}-v{version.version_id}"[:128],
            "dedicated_resources": resources.dedicated_resources(),
        },
        traffic_split=split,
    )
    return str(operation.result(timeout=None).deployed_model.id)


def _undeploy_idle(client: Any, name: str, deployed_id: str) -> dict[str, str]:
    """When ``deployed_id`` has all of endpoint ``name``'s traffic, undeploy every other deployed model (each
    at 0%, its replicas billed) and remove the canary record, whose previous split is gone with them. Returns
    deployed model id -> the version it served (ID@VERSION), {} when the version has less than 100%.

    One UndeployModel each, through the v1 EndpointServiceClient.undeploy_model
    (aiplatform_v1/services/endpoint_service/client.py; REST "Method: projects.locations.endpoints.undeployModel"),
    with ``traffic_split`` {deployed_id: 100}: "If this field is provided, then the Endpoint's traffic_split will
    be overwritten with it ... A DeployedModel will be successfully undeployed only if it doesn't have any
    traffic assigned to it" (UndeployModelRequest, aiplatform_v1/types/endpoint_service.py), so the split
    stated is the one Vertex keeps, whatever changed it since it was read. A retried deploy that meets a
    cleanup cut short finishes it.
    """
    state = _read(client, name)
    if state.traffic.get(deployed_id, 0) != 100:
        return {}
    idle = {
        key: f"{model.model_id}@{model.version_id}"
        for key, model in state.deployed.items()
        if key != deployed_id
    }
    for key, model in idle.items():
        log.info(
            "undeploying %s (model %s) from %s: it serves 0%% of the traffic and its replicas are billed "
            "(--keep-idle keeps it)",
            key,
            model,
            name,
        )
        client.undeploy_model(endpoint=name, deployed_model_id=key, traffic_split={deployed_id: 100}).result(
            timeout=None
        )
    if idle:
        _set_labels(client, _read(client, name), _without_record(state.labels))
    return idle


def _set_share(
    client: Any, state: _EndpointState, deployed_id: str, percent: int, version: vertex.ModelVersion
) -> None:
    """Give the already deployed ``deployed_id`` ``percent`` of the traffic (the others keep their
    proportions: the current ones, or the recorded ones when the others serve nothing now)."""
    serving = state.serving()
    if state.traffic.get(deployed_id, 0) == percent:
        log.info(
            "%s is deployed on %s already (%s) with %d%% of the traffic: nothing to change",
            version.versioned_name,
            state.name,
            deployed_id,
            percent,
        )
        return
    others = {key: share for key, share in serving.items() if key != deployed_id}
    record = CanaryRecord.from_labels(state.labels)
    if (
        not others
        and record
        and (record.model_id, record.version_id) == (version.model_id, version.version_id)
    ):
        others = {key: share for key, share in record.previous.items() if key in state.deployed}
    if not others and percent != 100:
        raise DeployError(
            f"{version.versioned_name} serves all of {state.name}'s traffic and no other deployed model has a share "
            f"to give the other {100 - percent}% to: deploy another model, or use `tpustream rollback`"
        )
    split = {
        (deployed_id if key == NEW_MODEL else key): share
        for key, share in canary_split(others, percent).items()
    }
    log.info(
        "%s is deployed on %s already (%s): setting its share to %d%% (traffic %s)",
        version.versioned_name,
        state.name,
        deployed_id,
        percent,
        _describe(split, state),
    )
    client.update_endpoint(
        endpoint={"name": state.name, "traffic_split": split}, update_mask={"paths": ["traffic_split"]}
    )


def _describe(split: Mapping[str, int], state: _EndpointState) -> str:
    """``{id}: N%`` pairs, each with the model version it serves when known."""

    def name(key: str) -> str:
        if key == NEW_MODEL:
            return "new"
        deployed = state.deployed.get(key)
        return f"{key} ({deployed.model_id}@{deployed.version_id})" if deployed else key

    return ", ".join(f"{name(key)}: {share}%" for key, share in split.items()) or "none"


def rollback(endpoint: str, *, project: str | None = None, region: str | None = None) -> RollbackOutcome:
    """Undo the latest ``deploy`` on ``endpoint``: the models that served before the canary get their
    recorded shares back and the canary is undeployed (see the module docstring for "previous").

    Args:
        endpoint: the endpoint's display name or resource name (its project and region are used).
        project, region: where the endpoint is; default the environment's.

    Returns:
        What it did (``RollbackOutcome``).
    """
    named = _endpoint_name(endpoint)
    place = vertex.place_from_env(
        named["project"] if named else project, named["location"] if named else region
    )
    vertex.init(place)
    client = vertex.v1_client("endpoint")
    name, _ = _find_endpoint(client, place, endpoint, create=False)
    state = _read(client, name)
    record = CanaryRecord.from_labels(state.labels)
    if record is None:
        raise DeployError(
            f"--endpoint {endpoint}: no canary to roll back (no {_CANARY_MODEL} label: `tpustream deploy` records one "
            "when it deploys next to serving models). To move traffic by hand: gcloud ai endpoints update "
            f"{name} --traffic-split=ID=PERCENT,..."
        )
    canary = state.deployment_of(record.model_id, record.version_id)
    if canary is None:
        raise DeployError(
            f"the canary recorded on {name} (model {record.model_id} version {record.version_id}) is not deployed "
            "there: it was rolled back or undeployed already, or its deployment failed; nothing to roll back"
        )
    previous = {
        key: share for key, share in record.previous.items() if key in state.deployed and key != canary
    }
    if not previous:
        raise DeployError(
            f"none of the models that served {name} before the canary ({', '.join(record.previous) or 'none'}) "
            "is deployed any more: deploy one with `tpustream deploy --traffic 100`, then undeploy the canary"
        )
    gone = sorted(set(record.previous) - set(previous))
    if gone:
        log.warning(
            "%s served before the canary but is undeployed since: its share goes to the others",
            ", ".join(gone),
        )
    split = _scale(previous, 100)
    model = f"{record.model_id}@{record.version_id}"
    log.info(
        "rolling back %s: undeploying the canary %s (model %s, %d%% of the traffic); traffic back to %s",
        name,
        canary,
        model,
        state.traffic.get(canary, 0),
        _describe(split, state),
    )
    client.undeploy_model(endpoint=name, deployed_model_id=canary, traffic_split=split).result(timeout=None)
    _set_labels(client, _read(client, name), _without_record(state.labels))
    after = _read(client, name)
    log.info("rolled back %s: traffic %s", name, _describe(after.traffic, after))
    return RollbackOutcome(endpoint=name, undeployed=canary, model=model, traffic_split=after.traffic)
