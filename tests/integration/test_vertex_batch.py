"""Vertex AI batch prediction on the champion (tpustream/vertex/batch_prediction.py): the request the real aiplatform
client sends, and what the batch job then sends to the real model server, answered as evaluation measured.

Real parts: a model trained here, evaluated and promoted into a gs:// registry (the GCS-API test server),
the real aiplatform client, aiplatform's own model server started from the recorded upload as in
tests/integration/test_serving.py. Stood in for: Vertex AI's REST API (tests/fakes/vertex/, which parses
the job as a v1 BatchPredictionJob) and its batch workers, which the fake emulates as the v1 docs describe
them: each JSONL line an instance, the key field kept out of it, ``batchSize`` instances per request.
"""

from __future__ import annotations

import base64
import json
import os
import types

import numpy as np
import pytest

from tests.common.models import make_model
from tests.common.serving import AUTOML_INSTANCE, AUTOML_PREDICTION, parse_schema
from tests.common.serving import free_port as _free_port
from tests.common.serving import start_server as _start_server
from tests.fakes.gcs import make_bucket
from tpustream.dataset import write as shards
from tpustream.dataset.plan import ShardConfig
from tpustream.release import promote
from tpustream.serve.predict.inputs import iter_items
from tpustream.storage import io as storage
from tpustream.train import evaluate
from tpustream.vertex import batch_prediction as vertex_batch
from tpustream.vertex import model_registry as vertex
from tpustream.vertex.batch_prediction import JobCompletion

pytestmark = pytest.mark.integration

IMAGE = "europe-west4-docker.pkg.dev/proj/tpustream/serve@sha256:" + "b" * 64
PARENT = "projects/proj/locations/europe-west4"


@pytest.fixture(scope="module")
def served(gcs_server, tmp_path_factory):
    """A champion uploaded to the recording Vertex endpoint, and its model server running."""
    from tests.fakes.vertex import VertexRecorder

    tmp = tmp_path_factory.mktemp("batch")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
        make_bucket(gcs_server.url, "batch")
        digits = str(tmp / "digits")
        shards.create_shards(ShardConfig(source="digits", output=digits, num_shards=2), progress=False)
        local = make_model(tmp / "model", digits, seed=4, steps=10)
        model, registry = "gs://batch/runs/r1", "gs://batch/registry"
        for name in ("model.pt", "model.json"):
            storage.copy(f"{local}/{name}", f"{model}/{name}")
        metrics = evaluate.evaluate(model, digits, "gs://batch/eval", workers=0)
        recorder = VertexRecorder()
        mp.setenv("TPUSTREAM_VERTEX_ENDPOINT", recorder.url)
        mp.setenv("GOOGLE_CLOUD_PROJECT", "proj")
        mp.setenv("GOOGLE_CLOUD_REGION", "europe-west4")
        target = vertex.VertexTarget(
            model_name="digits-classifier",
            project="proj",
            location="europe-west4",
            api_endpoint=recorder.url,
            serving_image=IMAGE,
        )
        promote.promote(model, "gs://batch/eval/metrics.json", registry, vertex=target)
        (upload,) = [r for r in recorder.requests if r["path"].endswith("/models:upload")]
        spec = upload["body"]["model"]["containerSpec"]
        port = _free_port()  # started as Vertex starts a custom container (see test_serving.world)
        env = {**os.environ, **{e["name"]: e["value"] for e in spec["env"]}}
        env.update(
            AIP_HTTP_PORT=str(port),
            AIP_HEALTH_ROUTE=spec["healthRoute"],
            AIP_PREDICT_ROUTE=spec["predictRoute"],
            AIP_STORAGE_URI=upload["body"]["model"]["artifactUri"],
            VERTEX_CPR_WEB_CONCURRENCY="1",
        )
        env.pop("PJRT_DEVICE", None)
        server = _start_server(env, port, tmp / "server.log")
        recorder.batch_server = f"http://127.0.0.1:{port}"  # where the fake's batch workers send requests
        try:
            yield types.SimpleNamespace(
                recorder=recorder,
                digits=digits,
                metrics=metrics,
                log=tmp / "server.log",
                predict_url=f"{recorder.batch_server}{spec['predictRoute']}",
            )
        finally:
            server.terminate()
            server.wait(timeout=20)
            recorder.close()


def test_batch_prediction_sends_the_servers_own_requests_and_gets_evaluations_answers(served):
    written = vertex_batch.write_instances([served.digits], "gs://batch/in/val.jsonl")
    assert written.instances == served.metrics.candidate.num_samples == 179
    job = vertex_batch.submit_batch_prediction(
        "digits-classifier",
        [written.uri],
        "gs://batch/out",
        machine_type="n1-standard-2",
        replicas=2,  # batch prediction does not autoscale: both counts are 2
        wait=True,
        poll_seconds=0.05,
    )
    assert job.state == "JOB_STATE_SUCCEEDED", served.log.read_text()[-2000:]
    assert job.completion == JobCompletion(successful=179, failed=0, incomplete=0)
    assert job.model == f"{PARENT}/models/4200@1"  # the champion alias, resolved
    (create,) = [r for r in served.recorder.requests if r["path"].endswith("/batchPredictionJobs")]
    assert served.recorder.rejected == []  # it parsed as a v1 BatchPredictionJob
    assert create["body"] == {
        "displayName": "digits-classifier-v1-batch",
        "model": f"{PARENT}/models/4200@1",
        "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": ["gs://batch/in/val.jsonl"]}},
        "instanceConfig": {"keyField": "key"},
        "outputConfig": {
            "predictionsFormat": "jsonl",
            "gcsDestination": {"outputUriPrefix": "gs://batch/out"},
        },
        "dedicatedResources": {
            "machineSpec": {"machineType": "n1-standard-2"},
            "startingReplicaCount": 2,
            "maxReplicaCount": 2,
        },
        "manualBatchTuningParameters": {"batchSize": 64},
    }
    # What reached the model server: {"instances": [one per JSONL line, the key taken out]}
    calls = served.recorder.batch_calls
    assert [len(call["body"]["instances"]) for call in calls] == [64, 64, 51]
    assert all(set(call["body"]) == {"instances"} for call in calls)
    assert all(set(instance) == {"b64"} for call in calls for instance in call["body"]["instances"])
    # ... and its answers, keyed by the image they belong to, are what evaluation measured
    truth = {item.name: item.true_index for item in iter_items([served.digits])}
    confusion = np.zeros((10, 10), int)
    results = list(vertex_batch.iter_results(job.output_directory))
    assert sorted(r["key"] for r in results) == sorted(truth) and all("instance" not in r for r in results)
    for result in results:
        assert len(result["prediction"]["classes"]) == 5  # the server's default top-k
        confusion[truth[result["key"]], result["prediction"]["class_indices"][0]] += 1
    assert confusion.tolist() == served.metrics.candidate.confusion_matrix


def test_top_k_travels_as_model_parameters(served):
    written = vertex_batch.write_instances([served.digits], "gs://batch/in/eight.jsonl", limit=8)
    job = vertex_batch.submit_batch_prediction(
        "digits-classifier", [written.uri], "gs://batch/top3", top_k=3, wait=True, poll_seconds=0.05
    )
    create = [r for r in served.recorder.requests if r["path"].endswith("/batchPredictionJobs")][-1]
    assert create["body"]["modelParameters"] == {"top_k": 3}
    assert served.recorder.batch_calls[-1]["body"]["parameters"] == {"top_k": 3}
    results = list(vertex_batch.iter_results(job.output_directory))
    assert len(results) == 8 and all(len(r["prediction"]["classes"]) == 3 for r in results)


def test_a_bad_image_fails_its_own_instance_and_the_job_writes_its_error(served):
    good = [item for _, item in zip(range(2), iter_items([served.digits]), strict=False)]
    lines = [
        {"key": good[0].name, "b64": base64.b64encode(good[0].data).decode()},
        {"key": "broken.jpg", "b64": base64.b64encode(b"\xff\xd8\xff not a jpeg").decode()},
        {"key": good[1].name, "b64": base64.b64encode(good[1].data).decode()},
    ]
    storage.write_bytes(
        "gs://batch/in/mixed.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode()
    )
    job = vertex_batch.submit_batch_prediction(
        f"{PARENT}/models/4200@1",
        ["gs://batch/in/mixed.jsonl"],
        "gs://batch/mixed",
        batch_size=2,
        wait=True,
        poll_seconds=0.05,
    )
    # the server answers the request 200, the bad image's slot an error (serving.py): Vertex writes each slot
    # as that instance's prediction, so the good image sharing its request is answered
    assert job.completion == JobCompletion(successful=3, failed=0, incomplete=0)
    assert job.instance_errors == 1  # what Vertex counted successful was the server's error for it
    results = {r["key"]: r["prediction"] for r in vertex_batch.iter_results(job.output_directory)}
    assert all("classes" in results[item.name] for item in good)
    assert list(results["broken.jpg"]) == ["error"]
    assert results["broken.jpg"]["error"].startswith("instance 1: undecodable JPEG")


def test_file_list_input_and_bad_arguments(served):
    storage.write_bytes("gs://batch/in/images.txt", b"gs://batch/in/images/0.png\n")
    storage.write_bytes("gs://batch/in/images/0.png", next(iter_items([served.digits])).data)
    job = vertex_batch.submit_batch_prediction(
        "digits-classifier", ["gs://batch/in/images.txt"], "gs://batch/files", instances_format="file-list"
    )
    body = [r for r in served.recorder.requests if r["path"].endswith("/batchPredictionJobs")][-1]["body"]
    assert body["inputConfig"]["instancesFormat"] == "file-list" and "instanceConfig" not in body
    assert job.name.startswith(f"{PARENT}/batchPredictionJobs/") and served.recorder.rejected == []
    cases = [
        (dict(input_uris=["/tmp/val.jsonl"]), "give gs:// files"),
        (dict(output_prefix="out"), "--vertex-batch out: give a gs:// prefix"),
        (dict(batch_size=65), "--instances-per-request 65: 1 to 64"),
        (dict(instances_format="csv"), "--instances-format 'csv'"),
        (dict(top_k=0), "--top-k 0"),
    ]
    instances = vertex_batch.write_instances([served.digits], "gs://batch/in/cases.jsonl", limit=3).uri
    for overrides, message in cases:
        kwargs = {"input_uris": [instances], "output_prefix": "gs://batch/out", **overrides}
        with pytest.raises(ValueError, match=message):
            vertex_batch.submit_batch_prediction("digits-classifier", **kwargs)
    # `tpustream predict --vertex-batch`: images are written as instances under the prefix first
    auto = vertex_batch.predict_on_vertex(
        [served.digits], "digits-classifier", "gs://batch/auto", limit=5, wait=True, poll_seconds=0.05
    )
    assert (
        auto.instances is not None
        and auto.instances.instances == 5
        and auto.instances.uri.startswith("gs://batch/auto/instances-")
    )
    assert auto.completion == JobCompletion(successful=5, failed=0, incomplete=0)
    with pytest.raises(ValueError, match="no images to predict|no such file"):
        vertex_batch.predict_on_vertex(
            [str(served.log.parent / "nothing")], "digits-classifier", "gs://batch/x"
        )
    # the CLI: --replicas N starts N machines and allows no more (batch jobs do not autoscale); --max-replicas,
    # its earlier name, means the same
    from typer.testing import CliRunner

    from tpustream.cli.main import app

    for flag, count in (("--replicas", "3"), ("--max-replicas", "2")):
        args = ["predict", served.digits, "--vertex-batch", f"gs://batch/cli{count}"]
        args += ["--vertex-model", "digits-classifier", "--limit", "2", flag, count]  # no --wait: 30 s polls
        said = CliRunner().invoke(app, args)
        assert said.exit_code == 0, said.output
        create = [r for r in served.recorder.requests if r["path"].endswith("/batchPredictionJobs")][-1]
        resources = create["body"]["dedicatedResources"]
        assert resources["startingReplicaCount"] == resources["maxReplicaCount"] == int(count)


def _photos(folder, count: int, size=(2048, 1536)) -> list[int]:
    """``count`` JPEG 'photos' of 3 MP whose noise keeps them at ~2-4 MB each, as a camera's would be; their
    sizes in bytes."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    sizes = []
    for index in range(count):
        pixels = rng.integers(0, 256, (size[1], size[0], 3), np.uint8)
        path = folder / f"photo-{index:02d}.jpg"
        Image.fromarray(pixels).save(path, "JPEG", quality=92)
        sizes.append(path.stat().st_size)
    return sizes


def test_a_batch_job_on_multi_megapixel_photos_completes_with_no_errors(served, tmp_path):
    """Vertex sends ``batchSize`` consecutive instances per request: 64 of these photos would be a 200 MB
    request, refused whole by the server's budgets. The batch size is chosen to fit them, so every photo is
    answered; a batch size that cannot fit is refused before any job is submitted."""
    sizes = _photos(tmp_path / "photos", 9)
    limits = vertex_batch._limits()
    assert sum(sizes) > limits.max_request_bytes  # all in one request (what 64 would do) is refused
    jobs_before = len(served.recorder.batch_jobs)
    with pytest.raises(ValueError, match=r"--instances-per-request 64: requests of 64 .* over the serving"):
        vertex_batch.predict_on_vertex(
            [str(tmp_path / "photos")], "digits-classifier", "gs://batch/photos", batch_size=64
        )
    assert len(served.recorder.batch_jobs) == jobs_before  # nothing was submitted
    calls_before = len(served.recorder.batch_calls)
    job = vertex_batch.predict_on_vertex(
        [str(tmp_path / "photos")], "digits-classifier", "gs://batch/photos", wait=True, poll_seconds=0.05
    )
    assert job.completion == JobCompletion(successful=9, failed=0, incomplete=0), served.log.read_text()[
        -2000:
    ]
    calls = served.recorder.batch_calls[calls_before:]
    per_request = [len(call["body"]["instances"]) for call in calls]
    assert sum(per_request) == 9 and max(per_request) == limits.max_request_bytes // max(sizes)
    for call in calls:  # each request within the server's byte budget
        total = sum(len(base64.b64decode(instance["b64"])) for instance in call["body"]["instances"])
        assert total <= limits.max_request_bytes


def test_instances_no_request_can_hold_are_named_before_submitting(served, tmp_path, monkeypatch):
    """An instances file (not written by tpustream) with an image over the server's pixel limit: named up
    front, instead of a job whose request containing it fails."""
    from PIL import Image

    monkeypatch.setenv("TPUSTREAM_MAX_PIXELS", str(1 << 20))
    big = tmp_path / "big.png"
    Image.new("RGB", (2000, 1000)).save(big)
    lines = [json.dumps({"key": "big.png", "b64": base64.b64encode(big.read_bytes()).decode()})]
    storage.write_bytes("gs://batch/given/big.jsonl", ("\n".join(lines) + "\n").encode())
    jobs_before = len(served.recorder.batch_jobs)
    with pytest.raises(
        ValueError, match=r"1 instances fit no request .* big.png \(2000000 px, over TPUSTREAM_MAX_PIXELS"
    ):
        vertex_batch.submit_batch_prediction(
            "digits-classifier", ["gs://batch/given/big.jsonl"], "gs://batch/o"
        )
    assert len(served.recorder.batch_jobs) == jobs_before


def _automl_lines(served, folder: str, count: int) -> tuple[list[dict], list[bytes]]:
    """``count`` digits written as gs:// objects under ``folder``, and an AutoML batch file's lines naming them
    (``content`` a Cloud Storage URI, ``mimeType``, no key), each checked against AutoML's instance schema."""
    images = [item.data for _, item in zip(range(count), iter_items([served.digits]), strict=False)]
    lines = []
    for index, image in enumerate(images):
        storage.write_bytes(f"{folder}/{index}.png", image)
        lines.append({"content": f"{folder}/{index}.png", "mimeType": "image/png"})
        parse_schema(lines[-1], AUTOML_INSTANCE)
    return lines, images


def _post(served, body: dict) -> dict:
    """One online request to the model server, answered 200."""
    import urllib.request

    request = urllib.request.Request(
        served.predict_url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def _jsonl(uri: str, lines: list[dict]) -> str:
    storage.write_bytes(uri, "".join(json.dumps(line) + "\n" for line in lines).encode())
    return uri


def test_an_automl_batch_file_of_cloud_storage_uris_is_answered_in_automls_schema(served):
    """An AutoML user's batch file, ``{"content": "gs://...", "mimeType": "image/png"}`` per line: Vertex passes
    each line unchanged, the model server reads each object, and every instance is answered in AutoML's
    prediction schema, as the same image's bytes are. Sized from the objects' metadata before submitting:
    their pixels unknown, each counted at TPUSTREAM_MAX_PIXELS, so 4 per request at the default budgets."""
    lines, images = _automl_lines(served, "gs://batch/automl/images", 10)
    uri = _jsonl("gs://batch/automl/batch.jsonl", lines)
    calls_before = len(served.recorder.batch_calls)
    job = vertex_batch.submit_batch_prediction(
        "digits-classifier", [uri], "gs://batch/automl/out", wait=True, poll_seconds=0.05
    )
    assert job.completion == JobCompletion(successful=10, failed=0, incomplete=0), served.log.read_text()[
        -2000:
    ]
    assert job.instance_errors == 0
    create = [r for r in served.recorder.requests if r["path"].endswith("/batchPredictionJobs")][-1]
    assert "instanceConfig" not in create["body"]  # the lines have no key: each output line has its instance
    limits = vertex_batch._limits()
    assert create["body"]["manualBatchTuningParameters"] == {
        "batchSize": limits.max_request_pixels // limits.max_pixels
    }
    calls = served.recorder.batch_calls[calls_before:]
    assert [call["body"]["instances"] for call in calls] == [lines[0:4], lines[4:8], lines[8:10]]
    results = {
        r["instance"]["content"]: r["prediction"] for r in vertex_batch.iter_results(job.output_directory)
    }
    assert sorted(results) == sorted(line["content"] for line in lines)
    for prediction in results.values():
        parse_schema(prediction, AUTOML_PREDICTION)
    # the same answers as the images' bytes inline, in one online request
    inline = {"instances": [{"content": base64.b64encode(image).decode()} for image in images]}
    answer = _post(served, inline)
    assert [results[line["content"]]["ids"] for line in lines] == [p["ids"] for p in answer["predictions"]]


def test_automl_objects_no_request_can_hold_are_refused_before_submitting(served, monkeypatch):
    """Sized from the objects' metadata (no download): an object over the image budget, or one that does not
    exist, is named before any job is submitted; a batch size the bytes cannot fit is refused, one only the
    unknown pixels might not fit is accepted with a warning."""
    lines, _ = _automl_lines(served, "gs://batch/automl/refused", 3)
    missing = {"content": "gs://batch/automl/refused/nothing.png", "mimeType": "image/png"}
    jobs_before = len(served.recorder.batch_jobs)
    with pytest.raises(
        ValueError, match=r"1 instances fit no request .*nothing.png \(no such Cloud Storage object\)"
    ):
        vertex_batch.predict_on_vertex(  # `tpustream predict --vertex-batch` on it
            [_jsonl("gs://batch/automl/missing.jsonl", [*lines, missing])],
            "digits-classifier",
            "gs://batch/o",
        )
    sizes = [storage.stat(line["content"]).size for line in lines]
    monkeypatch.setenv("TPUSTREAM_MAX_IMAGE_BYTES", str(max(sizes) - 1))
    with pytest.raises(
        ValueError, match=rf"fit no request .* \({max(sizes)} bytes, over TPUSTREAM_MAX_IMAGE"
    ):
        vertex_batch.submit_batch_prediction(
            "digits-classifier", [_jsonl("gs://batch/automl/three.jsonl", lines)], "gs://batch/o"
        )
    monkeypatch.delenv("TPUSTREAM_MAX_IMAGE_BYTES")
    monkeypatch.setenv("TPUSTREAM_MAX_REQUEST_BYTES", str(2 * max(sizes)))
    with pytest.raises(ValueError, match=r"--instances-per-request 3: .* TPUSTREAM_MAX_REQUEST_BYTES"):
        vertex_batch.submit_batch_prediction(
            "digits-classifier", ["gs://batch/automl/three.jsonl"], "gs://batch/o", batch_size=3
        )
    assert len(served.recorder.batch_jobs) == jobs_before
    monkeypatch.delenv("TPUSTREAM_MAX_REQUEST_BYTES")
    job = vertex_batch.submit_batch_prediction(
        "digits-classifier", ["gs://batch/automl/three.jsonl"], "gs://batch/o", batch_size=8
    )
    assert job.name in served.recorder.batch_jobs
    create = [r for r in served.recorder.requests if r["path"].endswith("/batchPredictionJobs")][-1]
    assert create["body"]["manualBatchTuningParameters"] == {"batchSize": 8}


def test_a_file_list_batch_is_sized_from_its_listed_files(served, monkeypatch):
    """A ``file-list`` input (gs:// image URIs, one a line; Vertex sends each file's base64) is sized from the
    listed objects' metadata like a JSONL one, not sent 64 to a request: a missing file is named before
    submitting, and the byte budgets bound the batch size."""
    lines, _ = _automl_lines(served, "gs://batch/list/images", 3)
    listed = [line["content"] for line in lines]
    storage.write_bytes("gs://batch/list/images.txt", "".join(f"{uri}\n" for uri in listed).encode())
    sizes = [storage.stat(uri).size for uri in listed]
    monkeypatch.setenv("TPUSTREAM_MAX_REQUEST_BYTES", str(2 * max(sizes)))
    monkeypatch.setenv("TPUSTREAM_MAX_PIXELS", str(1 << 20))  # unknown pixels: each counted at 1 Mi px
    job = vertex_batch.submit_batch_prediction(
        "digits-classifier",
        ["gs://batch/list/images.txt"],
        "gs://batch/list/out",
        instances_format="file-list",
    )
    create = [r for r in served.recorder.requests if r["path"].endswith("/batchPredictionJobs")][-1]
    assert create["body"]["inputConfig"]["instancesFormat"] == "file-list" and job.name
    assert create["body"]["manualBatchTuningParameters"] == {"batchSize": 2}  # 2 x the largest file
    monkeypatch.delenv("TPUSTREAM_MAX_REQUEST_BYTES")
    assert vertex_batch.measure_instances(["gs://batch/list/images.txt"], "file-list").count == 3
    assert vertex_batch.fitting_batch_size(
        vertex_batch.measure_instances(["gs://batch/list/images.txt"], "file-list")
    ) == (64, "TPUSTREAM_MAX_INSTANCES")  # 64 Mi px of request budget / 1 Mi px
    storage.write_bytes(
        "gs://batch/list/gone.txt", f"{listed[0]}\ngs://batch/list/images/gone.png\n".encode()
    )
    jobs_before = len(served.recorder.batch_jobs)
    with pytest.raises(ValueError, match=r"1 instances .* gs://batch/list/images/gone.png \(no such Cloud"):
        vertex_batch.submit_batch_prediction(
            "digits-classifier", ["gs://batch/list/gone.txt"], "gs://batch/o", instances_format="file-list"
        )
    assert len(served.recorder.batch_jobs) == jobs_before
