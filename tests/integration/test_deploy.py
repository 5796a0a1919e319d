"""Canary deployment and rollback (tpustream/release/deploy.py) through the real google-cloud-aiplatform client.

Vertex AI cannot be reached from here: tests/fakes/vertex/ stands in for its REST API on loopback, parses
every request body as the v1 protos (DeployModelRequest, UndeployModelRequest, Endpoint) and refuses what
Vertex documents it refuses (a split that does not sum to 100, undeploying a model that has traffic). The
Model Registry versions are published with ``tpustream.vertex.model_registry.publish`` (no model files are read for that).
"""

from __future__ import annotations

import json

import pytest

from tpustream.release import deploy
from tpustream.release.canary import canary_split
from tpustream.release.deploy import DeployError, RollbackOutcome
from tpustream.storage import io as storage
from tpustream.vertex import model_registry as vertex

pytestmark = pytest.mark.integration

IMAGE = "europe-west4-docker.pkg.dev/proj/tpustream/serve@sha256:" + "f" * 64
REGION = "europe-west4"
PARENT = f"projects/proj/locations/{REGION}"


@pytest.fixture
def recorder(monkeypatch):
    from tests.fakes.vertex import VertexRecorder

    fake = VertexRecorder()
    monkeypatch.setenv("TPUSTREAM_VERTEX_ENDPOINT", fake.url)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")
    monkeypatch.setenv("GOOGLE_CLOUD_REGION", REGION)
    yield fake
    fake.close()


def publish(recorder, version: int, registry: str = "gs://models/registry") -> vertex.PublishedModel:
    """Registry version ``version`` uploaded to the Vertex model ``digits-classifier``; it becomes the champion."""
    target = vertex.VertexTarget(
        model_name="digits-classifier",
        project="proj",
        location=REGION,
        api_endpoint=recorder.url,
        serving_image=IMAGE,
    )
    labels = {"tpustream_version": str(version), "model_sha256": f"{version:016x}"}
    return vertex.publish(target, artifact_uri=f"{registry}/versions/{version}", labels=labels)


def summary(request: dict) -> str:
    """One line of what the recorder saw: method, path after the location, query, and the body."""
    path = request["path"].split(f"/{PARENT}", 1)[-1] or "/"
    query = "&".join(f"{k}={v[0]}" for k, v in request["query"].items() if not k.startswith("$"))
    body = json.dumps(request["body"], sort_keys=True) if request["body"] else ""
    return f"{request['method']:5} {path}{'?' + query if query else ''}  {body}"


@pytest.mark.parametrize(
    "serving, percent, expected",
    [
        ({"a": 100}, 10, {"a": 90, "0": 10}),
        ({"a": 60, "b": 40}, 10, {"a": 54, "b": 36, "0": 10}),
        ({"a": 50, "b": 50}, 15, {"a": 43, "b": 42, "0": 15}),  # a tie: the first listed gets the unit
        ({"a": 34, "b": 33, "c": 33}, 10, {"a": 30, "b": 30, "c": 30, "0": 10}),  # remainders .6 .7 .7
        ({"a": 70, "b": 30, "z": 0}, 1, {"a": 69, "b": 30, "0": 1}),  # a 0% model stays out
        ({"a": 90, "b": 10}, 100, {"a": 0, "b": 0, "0": 100}),
        ({}, 100, {"0": 100}),
    ],
)
def test_canary_split_keeps_the_serving_proportions_in_whole_percents(serving, percent, expected):
    split = canary_split(serving, percent)
    assert split == expected and sum(split.values()) == 100


def test_canary_split_refuses_what_cannot_sum_to_100():
    with pytest.raises(ValueError, match="nothing else serves"):
        canary_split({}, 10)
    with pytest.raises(ValueError, match="--traffic 101"):
        canary_split({"a": 100}, 101)


def test_deploy_ramp_and_rollback_on_one_endpoint(recorder, capsys):
    publish(recorder, 1)
    first = deploy.deploy("digits-classifier", "digits", traffic_percent=10)  # nothing serves: it takes 100
    assert first.created_endpoint and first.previous_split == {}
    v1 = first.deployed_model_id
    assert first.traffic_split == {v1: 100} and first.model == f"{PARENT}/models/4200@1"
    endpoint = first.endpoint
    assert "tpustream-canary-model" not in recorder.endpoints[endpoint].get("labels", {})  # no canary yet

    publish(recorder, 2)  # the champion alias moves to version 2
    canary = deploy.deploy(
        "digits-classifier",
        "digits",
        traffic_percent=10,
        machine_type="n1-standard-8",
        min_replicas=1,
        max_replicas=3,
    )
    v2 = canary.deployed_model_id
    assert not canary.created_endpoint and canary.model == f"{PARENT}/models/4200@2"
    assert canary.traffic_split == {v1: 90, v2: 10} and canary.previous_split == {v1: 100}
    assert recorder.endpoints[endpoint]["labels"] == {
        "tpustream-canary-model": "4200",
        "tpustream-canary-version": "2",
        f"tpustream-previous-{v1}": "100",
    }
    (deploy_request,) = [r for r in recorder.requests if r["path"].endswith(":deployModel")][1:]
    assert deploy_request["body"] == {
        "deployedModel": {
            "model": f"{PARENT}/models/4200@2",
            "displayName": "digits-classifier-v2",
            "dedicatedResources": {
                "machineSpec": {"machineType": "n1-standard-8"},
                "minReplicaCount": 1,
                "maxReplicaCount": 3,
            },
        },
        "trafficSplit": {"0": 10, v1: 90},
    }

    again = deploy.deploy(
        "digits-classifier", "digits", traffic_percent=10
    )  # a retried task: nothing changes
    assert not again.deployed and again.traffic_split == {v1: 90, v2: 10}
    ramp = deploy.deploy("digits-classifier", "digits", traffic_percent=60)  # the canary's share, not a copy
    assert not ramp.deployed and ramp.traffic_split == {v1: 40, v2: 60}
    assert len(recorder.endpoints[endpoint]["deployedModels"]) == 2

    rolled = deploy.rollback("digits")
    assert rolled == RollbackOutcome(
        endpoint=endpoint, undeployed=v2, model="4200@2", traffic_split={v1: 100}
    )
    assert [d["id"] for d in recorder.endpoints[endpoint]["deployedModels"]] == [v1]
    assert "labels" not in recorder.endpoints[endpoint]  # the record is gone with the canary
    with pytest.raises(DeployError, match="no canary to roll back"):
        deploy.rollback(endpoint)
    assert recorder.rejected == []
    with capsys.disabled():  # the exchange, as the recorder saw it (-s shows it)
        print("\n" + "\n".join(summary(r) for r in recorder.requests if "/endpoints" in r["path"]))


def test_rollback_restores_the_recorded_split_of_several_models(recorder):
    publish(recorder, 1)
    v1 = deploy.deploy("digits-classifier", "shop", traffic_percent=100).deployed_model_id
    publish(recorder, 2)
    v2 = deploy.deploy("digits-classifier", "shop", traffic_percent=30).deployed_model_id
    publish(recorder, 3)
    third = deploy.deploy("digits-classifier", "shop", traffic_percent=10)
    assert third.traffic_split == {v1: 63, v2: 27, third.deployed_model_id: 10}
    # the others at 0%, kept deployed (undeploy_idle=False) to come back down to
    ramp = deploy.deploy("digits-classifier", "shop", traffic_percent=100, undeploy_idle=False)
    assert ramp.traffic_split == {v1: 0, v2: 0, third.deployed_model_id: 100} and ramp.undeployed == {}
    assert deploy.deploy("digits-classifier", "shop", traffic_percent=20).traffic_split == {
        v1: 56,
        v2: 24,
        third.deployed_model_id: 20,
    }  # back down: in the recorded proportions
    assert deploy.rollback("shop").traffic_split == {v1: 70, v2: 30}  # as before version 3 arrived
    assert recorder.rejected == []


def test_a_ramp_to_100_undeploys_the_versions_left_at_0_percent(recorder):
    """Once the canary has all the traffic, the versions left at 0% (their replicas billed) are undeployed:
    one UndeployModel each, its trafficSplit the one Vertex keeps; the outcome names them and the canary record
    goes with them (there is no split left to roll back to)."""
    publish(recorder, 1)
    v1 = deploy.deploy("digits-classifier", "shop", traffic_percent=100).deployed_model_id
    publish(recorder, 2)
    canary = deploy.deploy("digits-classifier", "shop", traffic_percent=10)
    v2, endpoint = canary.deployed_model_id, canary.endpoint
    assert canary.undeployed == {}  # v1 serves 90%: nothing idle
    assert deploy.deploy("digits-classifier", "shop", traffic_percent=50).undeployed == {}
    ramp = deploy.deploy("digits-classifier", "shop", traffic_percent=100)
    assert ramp.undeployed == {v1: "4200@1"} and ramp.traffic_split == {v2: 100}
    assert not ramp.deployed and ramp.previous_split == {v1: 50, v2: 50}
    (undeploy_request,) = [r for r in recorder.requests if r["path"].endswith(":undeployModel")]
    assert undeploy_request["body"] == {"deployedModelId": v1, "trafficSplit": {v2: 100}}
    assert [d["id"] for d in recorder.endpoints[endpoint]["deployedModels"]] == [v2]
    assert "labels" not in recorder.endpoints[endpoint]  # the canary record is gone with v1
    with pytest.raises(DeployError, match="no canary to roll back"):
        deploy.rollback("shop")
    again = deploy.deploy("digits-classifier", "shop", traffic_percent=100)  # a retried task: nothing left
    assert again.undeployed == {} and again.traffic_split == {v2: 100}
    assert recorder.rejected == []


def test_keep_idle_leaves_the_versions_at_0_percent_deployed_for_rollback(recorder):
    publish(recorder, 1)
    v1 = deploy.deploy("digits-classifier", "shop", traffic_percent=100).deployed_model_id
    publish(recorder, 2)
    v2 = deploy.deploy("digits-classifier", "shop", traffic_percent=10).deployed_model_id
    ramp = deploy.deploy("digits-classifier", "shop", traffic_percent=100, undeploy_idle=False)
    assert ramp.undeployed == {} and ramp.traffic_split == {v1: 0, v2: 100}
    assert not [r for r in recorder.requests if r["path"].endswith(":undeployModel")]
    assert deploy.rollback("shop").traffic_split == {v1: 100}  # the record still names v1's share
    assert recorder.rejected == []


def test_a_version_deployed_straight_to_100_undeploys_the_models_it_replaces(recorder):
    """The pipeline's deploy with canary_percent=100 deploys a new version at 100%: the models it replaces
    serve nothing from then on and are undeployed the same way."""
    publish(recorder, 1)
    v1 = deploy.deploy("digits-classifier", "shop", traffic_percent=100).deployed_model_id
    publish(recorder, 2)
    outcome = deploy.deploy("digits-classifier", "shop", traffic_percent=100)
    assert outcome.deployed and outcome.undeployed == {v1: "4200@1"}
    assert outcome.traffic_split == {outcome.deployed_model_id: 100}
    assert recorder.rejected == []


def test_deploy_the_registry_champion_or_say_vertex_lacks_it(recorder, gcs_bucket):
    registry = f"{gcs_bucket}/registry"
    for version in (1, 2):
        publish(recorder, version, registry)
    pointer = {"version": 1, "model_sha256": f"{1:016x}" + "0" * 48}
    storage.write_bytes(f"{registry}/champion.json", json.dumps(pointer).encode())
    # the Vertex alias is on version 2; the registry's champion is version 1: --registry deploys what it names
    outcome = deploy.deploy("digits-classifier", "reg", traffic_percent=100, registry=registry)
    assert outcome.model == f"{PARENT}/models/4200@1"
    pointer = {"version": 3, "model_sha256": f"{3:016x}" + "0" * 48}
    storage.write_bytes(f"{registry}/champion.json", json.dumps(pointer).encode())
    with pytest.raises(
        vertex.VertexError, match=r"champion of .*version 3.* is not a version of .*run `tpustream promote`"
    ):
        deploy.deploy("digits-classifier", "reg", registry=registry)


def test_bad_inputs_are_named_with_what_to_do(recorder):
    publish(recorder, 1)
    cases = [
        (dict(traffic_percent=101), ValueError, "--traffic 101"),
        (dict(min_replicas=0), ValueError, "--min-replicas 0"),
        (dict(min_replicas=2, max_replicas=1), ValueError, "--max-replicas 1 is below --min-replicas 2"),
        (dict(machine_type="big one"), ValueError, "--machine-type 'big one'"),
        (
            dict(region="europe-west1", model=f"{PARENT}/models/4200"),
            vertex.VertexError,
            "--region europe-west1 differs",
        ),
        (
            dict(model="no-such-model"),
            vertex.VertexError,
            "no Vertex AI model is named 'no-such-model'.*promote",
        ),
        (dict(model=f"{PARENT}/models/4200@7"), vertex.VertexError, "has no version or alias '7'"),
        (dict(endpoint=f"{PARENT}/endpoints/999"), DeployError, "does not exist"),
        (
            dict(endpoint="projects/proj/locations/us-east1/endpoints/5"),
            DeployError,
            "in us-east1, the model in europe-west4",
        ),
    ]
    for overrides, error, message in cases:
        kwargs = {"model": "digits-classifier", "endpoint": "digits", **overrides}
        with pytest.raises(error, match=message):
            deploy.deploy(kwargs.pop("model"), kwargs.pop("endpoint"), **kwargs)
    with pytest.raises(DeployError, match="no endpoint is named 'nowhere'"):
        deploy.rollback("nowhere")
    assert recorder.endpoints == {}  # nothing was created for a refused deploy


def test_an_endpoint_named_by_a_letter_id_gets_the_canary_and_its_rollback(recorder):
    """Vertex endpoint IDs may start with a letter (CreateEndpointRequest.endpoint_id, aiplatform_v1
    types/endpoint_service.py): a resource name with one is that endpoint, never a display name to create."""
    vertex.init(vertex.place_from_env())
    client = vertex.v1_client("endpoint")
    named = client.create_endpoint(
        parent=PARENT, endpoint={"display_name": "shop front"}, endpoint_id="my-canary-ep"
    ).result()
    assert named.name == f"{PARENT}/endpoints/my-canary-ep"
    publish(recorder, 1)
    first = deploy.deploy("digits-classifier", named.name, traffic_percent=100)
    publish(recorder, 2)
    canary = deploy.deploy("digits-classifier", named.name, traffic_percent=10)
    assert first.endpoint == canary.endpoint == named.name and not canary.created_endpoint
    assert list(recorder.endpoints) == [named.name]  # no endpoint was made of its name
    assert canary.traffic_split == {first.deployed_model_id: 90, canary.deployed_model_id: 10}
    assert deploy.rollback(named.name).traffic_split == {first.deployed_model_id: 100}


@pytest.mark.parametrize(
    "endpoint",
    [
        f"{PARENT}/endpoints/My_Endpoint",  # upper case and _: no endpoint ID
        f"{PARENT}/endpoints/ends-with-",
        f"{PARENT}/endpoints/0123",  # a leading zero
        f"{PARENT}/endpoints/{'a' * 64}",  # over 63
        f"{PARENT}/endpoints/5/extra",
        "projects/proj/endpoints/5",
    ],
)
def test_a_malformed_endpoint_resource_name_is_refused_not_created(recorder, endpoint):
    publish(recorder, 1)
    with pytest.raises(DeployError, match="is not an endpoint resource name"):
        deploy.deploy("digits-classifier", endpoint)
    with pytest.raises(DeployError, match="is not an endpoint resource name"):
        deploy.rollback(endpoint)
    assert recorder.endpoints == {}


def test_deploy_creates_a_dedicated_endpoint_when_asked(recorder):
    """A shared public endpoint takes requests up to 1.5 MB, a dedicated one up to 10 MB: --dedicated-endpoint
    creates the endpoint with Endpoint.dedicated_endpoint_enabled; without it, a shared one, as before."""
    from typer.testing import CliRunner

    from tpustream.cli.main import app

    publish(recorder, 1)
    said = CliRunner().invoke(
        app, ["deploy", "--endpoint", "big-photos", "--model", "digits-classifier", "--dedicated-endpoint"]
    )
    assert said.exit_code == 0, said.output
    deploy.deploy("digits-classifier", "small-photos")
    created = {e["displayName"]: e for e in recorder.endpoints.values()}
    assert (
        created["big-photos"]["dedicatedEndpointEnabled"] is True
        and created["big-photos"]["dedicatedEndpointDns"]
    )
    assert "dedicatedEndpointEnabled" not in created["small-photos"]
    help_text = " ".join(CliRunner().invoke(app, ["deploy", "--help"]).output.replace("│", "").split())
    assert "1.5 MB" in help_text and "10 MB" in help_text


def retry_while_the_first_attempt_deploys(recorder, model: str) -> tuple[str, deploy.DeployOutcome]:
    """A first attempt that sent the DeployModel of ``model`` (ID@VERSION) with 10% of the traffic and died
    (the pipeline retries a failed task; the operation runs on in Vertex, held by the recorder), and a retry
    of the deploy. Waits until the retry polls that running operation (it saw it: only the retry polls, the
    first attempt is gone) or sends a DeployModel of its own (it did not), then finishes the held deployment.
    Returns the deployed model id the first attempt's operation made and the retry's outcome."""
    import threading
    import time as clock

    recorder.hold_deploys = True
    client = vertex.v1_client("endpoint")
    (name,) = recorder.endpoints
    (serving,) = recorder.endpoints[name]["trafficSplit"]
    first_attempt = client.deploy_model(
        endpoint=name,
        deployed_model={
            "model": f"{PARENT}/models/{model}",
            "dedicated_resources": {
                "machine_spec": {"machine_type": "n1-standard-4"},
                "min_replica_count": 1,
            },
        },
        traffic_split={"0": 10, serving: 90},
    )
    ((operation, _),) = recorder._held
    sent = len(recorder.requests)
    retried: dict = {}
    retry = threading.Thread(
        target=lambda: retried.update(outcome=deploy.deploy("digits-classifier", "shop", traffic_percent=10)),
        daemon=True,
    )
    retry.start()

    def retry_decided() -> bool:
        return any(r["path"].endswith((operation, ":deployModel")) for r in list(recorder.requests)[sent:])

    deadline = clock.monotonic() + 60
    while not retry_decided() and clock.monotonic() < deadline:
        clock.sleep(0.01)
    waited = [r for r in recorder.requests[sent:] if r["path"].endswith(operation)]
    assert waited and retry.is_alive(), "the retry did not wait for the running deployment"
    assert recorder.finish_deploys() == 1
    retry.join(120)
    return str(first_attempt.result(timeout=60).deployed_model.id), retried["outcome"]


def test_a_retried_deploy_waits_for_the_first_attempts_deployment_instead_of_deploying_twice(recorder):
    """The pipeline retries a failed deploy task; the first attempt's DeployModel may still be running (it
    takes minutes, the model is not on the endpoint until it is done). The retry finds the running operation
    on the endpoint, waits for it, then finds the version deployed and sends nothing more."""
    publish(recorder, 1)
    serving = deploy.deploy("digits-classifier", "shop", traffic_percent=100)
    publish(recorder, 2)
    attempted, retried = retry_while_the_first_attempt_deploys(recorder, "4200@2")
    deploys = [r for r in recorder.requests if r["path"].endswith(":deployModel")]
    assert len(deploys) == 2  # version 1, then version 2 once: the retry sent none
    assert not retried.deployed and retried.deployed_model_id == attempted
    assert retried.traffic_split == {serving.deployed_model_id: 90, attempted: 10}
    assert recorder.rejected == []


def test_a_retried_deploy_sees_a_running_deployment_on_a_later_page_of_operations(recorder):
    """An endpoint with a long history: ListOperations answers a page at a time (pageSize, nextPageToken),
    oldest first, so the first attempt's running DeployModel is on the second page. The retry reads every page,
    finds it and waits, instead of deploying the version a second time."""
    recorder.operations_page_size = 3
    publish(recorder, 1)
    serving = deploy.deploy("digits-classifier", "shop", traffic_percent=100)  # CreateEndpoint, DeployModel
    publish(recorder, 2)
    deploy.deploy("digits-classifier", "shop", traffic_percent=10)  # DeployModel
    deploy.rollback("shop")  # UndeployModel: four operations, done, fill more than the first page
    attempted, retried = retry_while_the_first_attempt_deploys(recorder, "4200@2")
    assert [r["path"].endswith(":deployModel") for r in recorder.requests].count(True) == 3
    assert not retried.deployed and retried.deployed_model_id == attempted
    assert retried.traffic_split == {serving.deployed_model_id: 90, attempted: 10}
    pages = [r["query"].get("pageToken") for r in recorder.requests if r["path"].endswith("/operations")]
    assert pages[-2:] == [None, ["ops-after-3"]]  # the retry's listing: the first page, then the second
    assert recorder.rejected == []


def test_the_recorder_refuses_endpoint_ids_vertex_refuses(recorder):
    from google.api_core import exceptions

    vertex.init(vertex.place_from_env())
    client = vertex.v1_client("endpoint")
    for bad in ("Upper", "1abc", "0123", "1234567890", "a" * 64, "trailing-"):
        with pytest.raises(exceptions.BadRequest, match="Invalid endpoint_id"):
            client.create_endpoint(parent=PARENT, endpoint={"display_name": "x"}, endpoint_id=bad)
    for good in ("a", "123456789", "ep-" + "a" * 59 + "9"):
        assert client.create_endpoint(
            parent=PARENT, endpoint={"display_name": "x"}, endpoint_id=good
        ).result()
    assert len(recorder.endpoints) == 3


def test_the_recorder_refuses_what_vertex_refuses(recorder):
    """The fake's rules, through the v1 client: a split that does not sum to 100, a model with traffic
    undeployed without a new split, automatic resources for a custom model."""
    from google.api_core import exceptions

    publish(recorder, 1)
    name = deploy.deploy("digits-classifier", "rules", traffic_percent=100).endpoint
    client = vertex.v1_client("endpoint")
    model = {
        "model": f"{PARENT}/models/4200@1",
        "dedicated_resources": {"machine_spec": {"machine_type": "n1-standard-2"}, "min_replica_count": 1},
    }
    with pytest.raises(exceptions.BadRequest, match="add up to 100"):
        client.deploy_model(endpoint=name, deployed_model=model, traffic_split={"0": 50})
    with pytest.raises(exceptions.BadRequest, match="dedicatedResources"):
        automatic = {"model": model["model"], "automatic_resources": {"min_replica_count": 1}}
        client.deploy_model(endpoint=name, deployed_model=automatic, traffic_split={"0": 100})
    (serving,) = recorder.endpoints[name]["deployedModels"]
    with pytest.raises(exceptions.BadRequest, match="100% of the traffic"):
        client.undeploy_model(endpoint=name, deployed_model_id=serving["id"])
    assert len(recorder.rejected) == 3


def test_deploy_component_deploys_promotes_version_and_outputs_the_endpoint(recorder, tmp_path):
    """The KFP step as the executor calls it (its plain function), and compiled: a valid component."""
    from google_cloud_pipeline_components.types import artifact_types
    from kfp import compiler, dsl
    from tpustream.components.deploy import deploy_model

    publish(recorder, 1)
    model = artifact_types.VertexModel(
        name="vertex_model", uri="", metadata={"resourceName": f"{PARENT}/models/4200@1"}
    )
    output = artifact_types.VertexEndpoint(name="vertex_endpoint", uri=str(tmp_path / "out"), metadata={})
    # the run's outcome (tpustream/run/outcome.py) as promote left it: deploy keeps its version and report
    from tpustream.run.outcome import read_outcome, record_outcome

    outcome = str(tmp_path / "run-outcome.json")
    record_outcome(outcome, step="promote", decision="promoted", reason="version 1", report="gs://b/report")
    line = deploy_model(
        vertex_model=model,
        endpoint="component",
        vertex_endpoint=output,
        traffic_percent=100,
        run_outcome=outcome,
    )
    name = output.metadata["resourceName"]
    assert line.startswith(f"deployed {PARENT}/models/4200@1 to {name} as ")
    deployed = read_outcome(outcome)
    assert (deployed.decision, deployed.report) == ("deployed", "gs://b/report")
    assert deployed.reason == f"version 1; {line}"
    assert output.uri == f"https://{REGION}-aiplatform.googleapis.com/v1/{name}"
    (first,) = recorder.endpoints[name]["trafficSplit"]
    publish(recorder, 2)
    replacing = artifact_types.VertexModel(
        name="vertex_model", uri="", metadata={"resourceName": f"{PARENT}/models/4200@2"}
    )
    line = deploy_model(
        vertex_model=replacing, endpoint="component", vertex_endpoint=output, traffic_percent=100
    )
    assert line.endswith(f"; undeployed {first} (4200@1)")  # canary_percent=100: the replaced version goes
    unpublished = artifact_types.VertexModel(name="vertex_model", uri="", metadata={})
    assert deploy_model(vertex_model=unpublished, endpoint="component", vertex_endpoint=output) == (
        "not deployed: promote published no Vertex AI model"
    )
    compiled = tmp_path / "deploy.yaml"
    component = dsl.component(deploy_model, base_image="python:3.11", install_kfp_package=False)
    compiler.Compiler().compile(component, str(compiled))
    assert "google.VertexEndpoint" in compiled.read_text()


def test_cli_deploys_a_canary_and_rolls_it_back(recorder):
    """`tpustream deploy` / `tpustream rollback` as a user types them: the champion as a 20% canary next to the
    version serving, then back to 100% on the version that served before."""
    from typer.testing import CliRunner

    from tpustream.cli.main import app

    publish(recorder, 1)
    runner = CliRunner()
    first = runner.invoke(app, ["deploy", "--endpoint", "digits", "--model", "digits-classifier"])
    assert first.exit_code == 0, first.output
    (served,) = recorder.endpoints[next(iter(recorder.endpoints))]["trafficSplit"]
    publish(recorder, 2)
    canary = runner.invoke(
        app, ["deploy", "--endpoint", "digits", "--model", "digits-classifier", "--traffic", "20"]
    )
    assert canary.exit_code == 0, canary.output
    assert f"{served} 80%" in canary.output and "20%" in canary.output
    assert "undo: tpustream rollback --endpoint" in canary.output
    back = runner.invoke(app, ["rollback", "--endpoint", "digits"])
    assert back.exit_code == 0, back.output
    assert f"traffic: {served} 100%" in back.output
    assert recorder.rejected == []


def test_cli_ramp_to_100_undeploys_the_idle_version_unless_kept(recorder):
    """`tpustream deploy --traffic 100` after a canary says which version it undeployed and how to serve it
    again; with --keep-idle the old version stays at 0% and `rollback` returns to it."""
    from typer.testing import CliRunner

    from tpustream.cli.main import app

    runner = CliRunner()
    for endpoint, keep in (("ramped", []), ("kept", ["--keep-idle"])):
        publish(recorder, 1)
        first = deploy.deploy(f"{PARENT}/models/4200@1", endpoint, traffic_percent=100).deployed_model_id
        publish(recorder, 2)
        deploy.deploy("digits-classifier", endpoint, traffic_percent=10)
        said = runner.invoke(
            app,
            ["deploy", "--endpoint", endpoint, "--model", "digits-classifier", "--traffic", "100", *keep],
        )
        assert said.exit_code == 0, said.output
        (name,) = [n for n, e in recorder.endpoints.items() if e["displayName"] == endpoint]
        deployed = [d["id"] for d in recorder.endpoints[name]["deployedModels"]]
        if keep:
            assert first in deployed and "undeployed" not in said.output
            assert f"undo: tpustream rollback --endpoint {name}" in said.output
        else:
            assert first not in deployed and "undo:" not in said.output
            assert (
                f"undeployed {first} (model 4200@1): it served 0% of the traffic; to serve it again: "
                f"tpustream deploy --endpoint {name} --model {PARENT}/models/4200@1 --traffic 100"
            ) in " ".join(said.output.split())
    help_text = " ".join(runner.invoke(app, ["deploy", "--help"]).output.replace("│", "").split())
    assert "--keep-idle" in help_text
    assert recorder.rejected == []
