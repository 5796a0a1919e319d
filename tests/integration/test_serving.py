"""A promoted model you can deploy: the upload's container spec, the real CPR model server started from it
as Vertex AI would start it, and `tpustream predict`.

Real parts: aiplatform's own model server (`python -m google.cloud.aiplatform.prediction.model_server`,
FastAPI + uvicorn) in a subprocess, real HTTP, a model trained here, the registry on the GCS-API test
server (fake-gcs-server), the real aiplatform client. Stood in for, because they cannot be reached from
here: Vertex AI's REST API (tests/fakes/vertex/ records and proto-validates the requests) and Vertex's
container launcher (this test sets the AIP_* variables from the recorded upload the way Vertex documents
it; the artifact is read straight from the gs:// registry version instead of Vertex's copy of it).
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import types
import urllib.error
import urllib.request

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.common.models import DIGITS, make_model
from tests.common.serving import AUTOML_INSTANCE, AUTOML_PARAMS, AUTOML_PREDICTION, parse_schema
from tests.common.serving import free_port as _free_port
from tests.common.serving import start_server as _start_server
from tests.fakes.gcs import make_bucket
from tpustream.cli.main import app
from tpustream.dataset import write as shards
from tpustream.dataset.manifest import read_manifest
from tpustream.dataset.plan import ShardConfig
from tpustream.dataset.tario import iter_tar_samples
from tpustream.storage import io as storage
from tpustream.train import evaluate

pytestmark = pytest.mark.integration

SERVING_IMAGE = "europe-west4-docker.pkg.dev/proj/tpustream/serve@sha256:" + "c" * 64
PARENT = "projects/proj/locations/europe-west4"


def _jpeg_folder(root) -> str:
    """An ImageFolder of real JPEGs: scikit-learn's digits, 32x32 RGB, 10 per class."""
    from PIL import Image
    from sklearn.datasets import load_digits

    data = load_digits()
    counts = dict.fromkeys(range(10), 0)
    for image, label in zip(data.images, data.target, strict=True):
        if counts[int(label)] == 10:
            continue
        counts[int(label)] += 1
        pixels = np.kron((image * 255 / 16).astype(np.uint8), np.ones((4, 4), np.uint8))
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).convert("RGB").save(folder / f"{counts[int(label)]:02d}.jpg", quality=90)
    return str(root)


@pytest.fixture(scope="module")
def world(gcs_server, tmp_path_factory):
    """A model trained here, evaluated and promoted into a gs:// registry with `--vertex-model` (the
    recording Vertex endpoint), and the model server started from the recorded upload."""
    from tests.fakes.vertex import VertexRecorder

    tmp = tmp_path_factory.mktemp("serving")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
        make_bucket(gcs_server.url, "serving")
        digits = str(tmp / "digits")
        shards.create_shards(ShardConfig(source="digits", output=digits, num_shards=2), progress=False)
        folder = _jpeg_folder(tmp / "jpegs")
        jpegs = str(tmp / "jpeg-shards")
        shards.create_shards(
            ShardConfig(source=folder, output=jpegs, num_shards=1, val_fraction=0.5), progress=False
        )
        local_model = make_model(tmp / "model", digits, seed=2, steps=40)
        model = "gs://serving/runs/r1"
        for name in ("model.pt", "model.json"):
            storage.copy(f"{local_model}/{name}", f"{model}/{name}")
        registry = "gs://serving/registry"
        metrics = evaluate.evaluate(model, digits, "gs://serving/eval/r1", registry=registry, workers=0)
        recorder = VertexRecorder()
        mp.setenv("TPUSTREAM_VERTEX_ENDPOINT", recorder.url)
        mp.setenv("GOOGLE_CLOUD_PROJECT", "proj")
        promoted = CliRunner().invoke(app, [
            "promote", "--candidate", model, "--metrics", "gs://serving/eval/r1", "--registry", registry,
            "--vertex-model", "digits-classifier", "--vertex-region", "europe-west4",
            "--serving-image", SERVING_IMAGE,
        ])  # fmt: skip
        assert promoted.exit_code == 0, promoted.output
        (upload,) = [r for r in recorder.requests if r["path"].endswith("/models:upload")]
        spec = upload["body"]["model"]["containerSpec"]
        # As Vertex starts a custom container (custom-container-requirements): the spec's env, AIP_HTTP_PORT =
        # its first port (remapped to a free one here), its routes, AIP_STORAGE_URI = the model's artifacts.
        port = _free_port()
        env = {**os.environ, **{e["name"]: e["value"] for e in spec["env"]}}
        env.update(
            AIP_HTTP_PORT=str(port), AIP_HEALTH_ROUTE=spec["healthRoute"], AIP_PREDICT_ROUTE=spec["predictRoute"],
            AIP_STORAGE_URI=upload["body"]["model"]["artifactUri"],
            VERTEX_CPR_WEB_CONCURRENCY="1",  # one uvicorn worker on this 2-core machine (default: one per core)
            STORAGE_EMULATOR_HOST=gcs_server.url,
        )  # fmt: skip
        env.pop("PJRT_DEVICE", None)
        server = _start_server(env, port, tmp / "server.log")
        try:
            yield types.SimpleNamespace(
                url=f"http://127.0.0.1:{port}", env=env, server=server, spec=spec, upload=upload, recorder=recorder,
                promoted=promoted.output, registry=registry, model=model, metrics=metrics, digits=digits,
                jpegs=jpegs, folder=folder, log=tmp / "server.log",
            )  # fmt: skip
        finally:
            server.terminate()
            server.wait(timeout=20)
            recorder.close()


def _post(world, body, content_type="application/json"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        world.url + world.env["AIP_PREDICT_ROUTE"], data, {"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _healthy(world) -> bool:
    with urllib.request.urlopen(world.url + world.env["AIP_HEALTH_ROUTE"], timeout=5) as response:
        return response.status == 200


def _instances(images):
    return {"instances": [{"b64": base64.b64encode(image).decode()} for image in images]}


def _val_samples(dataset):
    manifest = read_manifest(dataset)
    out = []
    for shard in manifest["splits"]["val"]["shards"]:
        with open(f"{dataset}/{shard['path']}", "rb") as f:
            for _, fields in iter_tar_samples(f):
                ext = next(e for e in ("ppm", "jpg", "jpeg", "png") if e in fields)
                out.append((fields[ext], int(fields["cls"])))
    return out


def _served_confusion(world, samples):
    confusion = np.zeros((10, 10), int)
    for start in range(0, len(samples), 64):
        chunk = samples[start : start + 64]
        status, answer = _post(world, _instances([image for image, _ in chunk]))
        assert status == 200, answer
        for (_, label), prediction in zip(chunk, answer["predictions"], strict=True):
            assert prediction["classes"][0] == DIGITS[prediction["class_indices"][0]]
            assert len(prediction["classes"]) == 5 and prediction["probabilities"] == sorted(
                prediction["probabilities"], reverse=True)  # fmt: skip
            confusion[label, prediction["class_indices"][0]] += 1
    return confusion


def test_upload_is_the_servable_champion(world):
    """What reaches Vertex parses as an aiplatform v1 UploadModelRequest (the recorder validates every
    body against the protos) and names the serving container: image, port, routes, the predictor's env."""
    from tpustream.serve.contract import SERVING_ENV

    assert world.recorder.rejected == []
    model = world.upload["body"]["model"]
    assert model["artifactUri"] == f"{world.registry}/versions/1"  # the immutable version, not the run
    assert world.spec["imageUri"] == SERVING_IMAGE
    assert world.spec["ports"] == [{"containerPort": 8080}]
    assert (world.spec["predictRoute"], world.spec["healthRoute"]) == ("/predict", "/health")
    assert {e["name"]: e["value"] for e in world.spec["env"]} == SERVING_ENV
    assert model["labels"]["tpustream_version"] == "1"
    merges = [r for r in world.recorder.requests if r["path"].endswith(":mergeVersionAliases")]
    assert [(m["path"].rsplit("/", 1)[1], m["body"]) for m in merges] == [
        ("4200@1:mergeVersionAliases", {"versionAliases": ["champion"]})]  # fmt: skip
    assert f"vertex: {PARENT}/models/4200@1" in world.promoted
    # AutoML's schemata, declared so the console and AutoML clients know the format the server also speaks
    parse_schema(model["predictSchemata"], ("google.cloud.aiplatform_v1.types.model", "PredictSchemata"))
    assert model["predictSchemata"] == {
        "instanceSchemaUri": "gs://google-cloud-aiplatform/schema/predict/instance/image_classification_1.0.0.yaml",
        "parametersSchemaUri": "gs://google-cloud-aiplatform/schema/predict/params/image_classification_1.0.0.yaml",
        "predictionSchemaUri": "gs://google-cloud-aiplatform/schema/predict/prediction/classification_1.0.0.yaml",
    }


def test_served_answers_equal_evaluation_on_the_val_digits(world):
    assert _healthy(world)
    samples = _val_samples(world.digits)
    assert len(samples) == world.metrics.candidate.num_samples == 179
    confusion = _served_confusion(world, samples)
    assert confusion.tolist() == world.metrics.candidate.confusion_matrix
    assert np.trace(confusion) / len(samples) == pytest.approx(world.metrics.candidate.top1)
    assert _healthy(world)


def test_served_answers_on_jpegs_equal_tpustream_evaluate(world, tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "evaluate",
            "--model",
            world.model,
            "--data",
            world.jpegs,
            "--output",
            str(tmp_path),
            "--workers",
            "0",
        ],
    )
    assert result.exit_code == 0, result.output
    measured = json.loads((tmp_path / "metrics.json").read_text())["candidate"]
    samples = _val_samples(world.jpegs)
    assert (
        all(image[:3] == b"\xff\xd8\xff" for image, _ in samples) and len(samples) == measured["num_samples"]
    )
    assert _served_confusion(world, samples).tolist() == measured["confusion_matrix"]


def _png(width, height):
    from PIL import Image

    out = io.BytesIO()
    Image.new("L", (width, height)).save(out, format="PNG")
    return out.getvalue()


def test_a_bad_request_is_a_400_a_bad_instance_fails_alone_and_the_server_keeps_serving(world):
    (good, _), (other, _) = _val_samples(world.digits)[:2]
    status, alone = _post(world, _instances([good]))
    assert status == 200
    jpeg = _val_samples(world.jpegs)[0][0]
    bomb = _png(4200, 4100)  # 17.2 MP in a few KB: over the 16.8 MP budget, refused from its header
    # a bad instance next to a good one: its own error in its slot, the good one answered as alone
    bad_instances = [
        (_instances([good, jpeg[: len(jpeg) // 2]]), "instance 1: undecodable JPEG"),
        (
            _instances([good, b"%PDF-1.4 not ours"]),
            "instance 1: not a JPEG, PNG, PPM/PGM/PBM, BMP, GIF, WebP",
        ),
        (_instances([good, b"GIF89a not ours"]), "instance 1: undecodable GIF"),  # a format shards accept
        (
            {"instances": [{"b64": base64.b64encode(good).decode()}, {"b64": "%%%not base64"}]},
            "not valid base64",
        ),
        ({"instances": [{"b64": base64.b64encode(good).decode()}, "raw string"]}, 'expected {"b64"'),
        (_instances([good, bomb]), "exceeds the pixel budget of 16.8 MP"),
        (_instances([good, b"P6\n" + b"9" * (9 << 20)]), "instance 1: 12582916 base64 characters exceed"),
    ]
    for body, message in bad_instances:
        status, answer = _post(world, body)
        assert status == 200, (message, answer)
        kept, failed = answer["predictions"]
        assert kept == alone["predictions"][0] and list(failed) == ["error"], answer
        assert message in failed["error"], (message, failed)
        status, answer = _post(world, {"instances": body["instances"][1:]})  # alone: the request fails
        alone_message = message.replace("instance 1:", "instance 0:")
        assert status == 400 and alone_message in answer["detail"], (message, answer)
    bad_requests = [
        (_instances([good] * 65), "65 instances exceed the limit of 64"),
        ({"instances": []}, "no instances"),
        ({"inputs": [1]}, '{"instances"'),
        ({**_instances([good]), "parameters": {"top_k": "3"}}, "top_k must be a positive integer"),
        ({**_instances([good]), "parameters": {"top_k": 99}}, "exceeds the model's 10 classes"),
        # a misspelt parameter is refused, naming it, not answered with the default top-k (issue 42)
        ({**_instances([good]), "parameters": {"topk": 1}}, "parameters 'topk': not a parameter"),
        ({**_instances([good]), "parameters": {"top_k": 1, "x": 0}}, "parameters 'x': not a parameter"),
        ({**_instances([good]), "parameters": [1]}, "parameters must be a JSON object {top_k}"),
        (b"{not json", "JSON deserialization failed"),
    ]
    assert len(bomb) < 100_000
    for body, message in bad_requests:
        status, answer = _post(world, body)
        assert status == 400 and message in answer["detail"], (message, answer)
        assert _healthy(world)
    # still serving, and an image's answer does not depend on the others in its request
    status, batch = _post(world, {**_instances([other, good, jpeg]), "parameters": {"top_k": 2}})
    assert status == 200 and len(batch["predictions"]) == 3
    assert batch["predictions"][1]["classes"] == alone["predictions"][0]["classes"][:2]
    assert batch["predictions"][1]["probabilities"] == pytest.approx(
        alone["predictions"][0]["probabilities"][:2], abs=1e-5
    )
    assert world.server.poll() is None  # the same process served all of it


def _automl(images, parameters=None, mime_type=True):
    instances = [
        {"content": base64.b64encode(image).decode(), **({"mimeType": "image/jpeg"} if mime_type else {})}
        for image in images
    ]
    return {"instances": instances, **({"parameters": parameters} if parameters is not None else {})}


def _post_automl(world, body):
    """An AutoML-shaped request, checked against AutoML's schema messages before it is sent, and its answer's
    predictions checked against ClassificationPredictionResult."""
    for instance in body["instances"]:
        parse_schema(instance, AUTOML_INSTANCE)
    if "parameters" in body:
        parse_schema(body["parameters"], AUTOML_PARAMS)
    status, answer = _post(world, body)
    assert status == 200 and list(answer) == ["predictions"], answer
    for prediction in answer["predictions"]:
        parse_schema(prediction, AUTOML_PREDICTION)
    return answer["predictions"]


def test_an_automl_shaped_request_gets_automl_shaped_answers(world):
    """AutoML image classification's request ({"content"} instances, confidenceThreshold / maxPredictions)
    is answered in its shape (ids as strings, displayNames, confidences), with the b64 format's classes."""
    from google.cloud.aiplatform.v1.schema.predict.params import ImageClassificationPredictionParams
    from google.protobuf import json_format

    images = [image for image, _ in _val_samples(world.jpegs)[:3]] + [_val_samples(world.digits)[0][0]]
    status, reference = _post(world, {**_instances(images), "parameters": {"top_k": 10}})
    assert status == 200
    # the schema's defaults: threshold 0.0 and 10 predictions (all 10 classes here), in confidence order
    for prediction, expected in zip(
        _post_automl(world, _automl(images)), reference["predictions"], strict=True
    ):
        assert prediction == {
            "ids": [str(index) for index in expected["class_indices"]],
            "displayNames": expected["classes"],
            "confidences": expected["probabilities"],
        }
    assert _post_automl(world, _automl(images, mime_type=False)) == _post_automl(world, _automl(images))
    # maxPredictions honoured, and capped at the class count (the schema: "may return fewer")
    top3 = _post_automl(world, _automl(images, {"maxPredictions": 3}))
    assert [len(p["ids"]) for p in top3] == [3] * 4
    assert [p["displayNames"] for p in top3] == [e["classes"][:3] for e in reference["predictions"]]
    assert [len(p["ids"]) for p in _post_automl(world, _automl(images, {"maxPredictions": 99}))] == [10] * 4
    # confidenceThreshold honoured: only the classes of at least that confidence, maxPredictions still applies
    second = reference["predictions"][0]["probabilities"][1]
    kept = _post_automl(world, _automl(images, {"confidenceThreshold": second, "maxPredictions": 5}))
    for prediction, expected in zip(kept, reference["predictions"], strict=True):
        confident = [p for p in expected["probabilities"][:5] if p >= second]
        assert prediction["confidences"] == confident and len(prediction["ids"]) == len(confident)
    assert len(kept[0]["ids"]) == 2
    certain = _post_automl(world, _automl(images, {"confidenceThreshold": 1}))  # possibly no class at all
    assert [p["confidences"] for p in certain] == [
        [p for p in e["probabilities"] if p >= 1.0] for e in reference["predictions"]
    ]
    # the parameters as the SDK builds them (ImageClassificationPredictionParams(...).to_value(), a Value
    # whose numbers are doubles), as aiplatform's predict_image_classification sample sends them
    sdk = json_format.MessageToDict(ImageClassificationPredictionParams(max_predictions=2).to_value())
    assert sdk == {"maxPredictions": 2.0}
    assert [p["ids"] for p in _post_automl(world, _automl(images, sdk))] == [p["ids"][:2] for p in top3]


def test_automl_bad_shapes_are_clear_400s_and_a_bad_content_fails_alone(world):
    good = _val_samples(world.digits)[0][0]
    encoded = base64.b64encode(good).decode()
    bad_requests = [
        (
            {"instances": [{"b64": encoded}, {"content": encoded}]},
            'the instances mix {"b64": ...} and {"content": ...}',
        ),
        ({"instances": [{"b64": encoded, "content": encoded}]}, "the instances mix"),
        (_automl([good], {"top_k": 3}), 'parameters.top_k is for {"b64": ...} instances'),
        (
            {**_instances([good]), "parameters": {"maxPredictions": 3}},
            "confidenceThreshold / maxPredictions are AutoML's",
        ),
        (_automl([good], {"confidenceThreshold": 1.5}), "confidenceThreshold must be a number from 0 to 1"),
        (_automl([good], {"confidenceThreshold": "0.5"}), "got a JSON string"),
        (_automl([good], {"maxPredictions": -1}), "maxPredictions must be a positive integer"),
        (_automl([good], {"maxPredictions": 2.5}), "maxPredictions must be a positive integer"),
        (_automl([good], {"maxPrediction": 3}), "parameters 'maxPrediction': not a field of AutoML's"),
        (_automl([good], [3]), "parameters must be a JSON object"),
        (_automl([good] * 65), "65 instances exceed the limit of 64"),  # the same limits as {"b64"}
        (_automl([b"%PDF-1.4 not ours"]), "instance 0: not a JPEG, PNG"),
        ({"instances": [{"content": "gs://bucket/image.jpg"}]}, 'object its "content" names does not exist'),
        ({"instances": [{"content": "file:///etc/hostname"}]}, "a URI of a scheme this server does not read"),
        ({"instances": [{"content": "/etc/hostname"}]}, "a local path is never read"),
        ({"instances": [{"content": encoded, "mimeType": 3}]}, '"mimeType" must be a string'),
    ]
    for body, message in bad_requests:
        status, answer = _post(world, body)
        assert status == 400 and message in answer["detail"], (message, answer)
        assert "gs://bucket" not in answer["detail"]  # no value of the request is quoted
    # a bad instance of an AutoML request fails in its own slot, the other answered in AutoML's shape
    status, answer = _post(world, {"instances": [{"content": encoded}, {"content": "%%%not base64"}]})
    assert status == 200
    kept, failed = answer["predictions"]
    assert (
        list(kept) == ["ids", "displayNames", "confidences"]
        and "instance 1: not valid base64" in failed["error"]
    )
    assert world.server.poll() is None and _healthy(world)


def test_automl_content_may_name_a_cloud_storage_object(world):
    """AutoML's ``content`` is "the image bytes or Cloud Storage URI" (ImageClassificationPredictionInstance):
    a gs:// object is read with the server's credentials and answered as its bytes would be; a missing object,
    one over the image budget, another scheme or a local path fails its own instance, quoting no URI."""
    images = [image for image, _ in _val_samples(world.digits)[:2]]
    for index, image in enumerate(images):
        storage.write_bytes(f"gs://serving/automl/{index}.png", image)
    named = {
        "instances": [{"content": f"gs://serving/automl/{i}.png", "mimeType": "image/png"} for i in (0, 1)]
    }
    assert _post_automl(world, named) == _post_automl(world, _automl(images))
    storage.write_bytes("gs://serving/automl/huge.png", images[0] + b"\0" * (8 << 20))  # over 8 MiB
    status, answer = _post(world, {"instances": [
        {"content": "gs://serving/automl/0.png"},
        {"content": "gs://serving/automl/missing.png"},
        {"content": "gs://serving/automl/huge.png"},
        {"content": "gs://serving/automl/"},
        {"content": "file:///etc/hostname"},
        {"content": "/etc/hostname"},
    ]})  # fmt: skip
    assert status == 200, answer
    first, *failed = answer["predictions"]
    parse_schema(first, AUTOML_PREDICTION)
    assert [prediction["error"] for prediction in failed[:4]] == [
        'instance 1: the Cloud Storage object its "content" names does not exist: check the URI',
        'instance 2: the Cloud Storage object its "content" names exceeds the 8388608-byte image limit '
        "(TPUSTREAM_MAX_IMAGE_BYTES): send a smaller image",
        'instance 3: "content" is not the Cloud Storage URI of an object: give gs://BUCKET/OBJECT (a bucket '
        "name of 3-222 characters, an object name of at most 1024 bytes)",
        'instance 4: "content" is a URI of a scheme this server does not read: send the image bytes '
        "base64-encoded, or a gs://BUCKET/OBJECT URI",
    ]
    assert failed[4]["error"].startswith("instance 5: not valid base64 (") and failed[4]["error"].endswith(
        "(content: base64 image bytes or a gs:// URI; a local path is never read)"
    )
    assert not any(
        "automl/" in prediction["error"] or "hostname" in prediction["error"] for prediction in failed
    )
    assert world.server.poll() is None and _healthy(world)


def test_predict_cli_on_images_shards_and_prefixes(world, tmp_path, gcs_server, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
    runner = CliRunner()
    help_text = runner.invoke(app, ["predict", "--help"])
    assert help_text.exit_code == 0 and "--json" in help_text.output and "--sample-val" in help_text.output
    # the registry's champion, on an ImageFolder directory: JSON lines, true classes from the folders
    result = runner.invoke(
        app, ["predict", "--model", world.registry, world.folder, "--json", "--top-k", "5"]
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert len(lines) == 100 and all(line["true_class"] == line["input"].rsplit("/", 2)[1] for line in lines)
    # the same answers as the model server for the same bytes
    first = [storage.read_bytes(line["input"]) for line in lines[:20]]
    status, served = _post(world, _instances(first))
    assert status == 200
    for line, answer in zip(lines, served["predictions"], strict=False):
        assert line["classes"] == answer["classes"]
        assert line["probabilities"] == pytest.approx(answer["probabilities"], abs=1e-5)
    # a gs:// prefix of images, a shard, and a bad file among them: reported, the rest still predicted
    for line in lines[:3]:
        storage.upload_file(line["input"], f"gs://serving/images/{line['input'].rsplit('/', 1)[1]}")
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff broken")
    shard = f"{world.digits}/val/val-000000.tar"
    result = runner.invoke(app, ["predict", "--model", f"{world.registry}/versions/1", "gs://serving/images",
                                 str(tmp_path / "broken.jpg"), shard, "--limit", "10"])  # fmt: skip
    assert result.exit_code == 1
    out = result.output.splitlines()
    assert [o.split()[0] for o in out[:3]] == [
        f"gs://serving/images/{line['input'].rsplit('/', 1)[1]}" for line in lines[:3]
    ]
    assert "broken.jpg  error: " in out[3] and "undecodable JPEG" in out[3]
    assert all(" true " in o and " predicted " in o for o in out[4:10]) and out[4].startswith(
        "val-000000.tar:"
    )
    assert out[10].endswith(f"correct ({world.registry}/versions/1)")
    # a dataset's val samples name the file each came from (the sample index), so a WRONG line can be traced
    from_dataset = runner.invoke(app, ["predict", "--model", world.registry, world.jpegs, "--limit", "6"])
    assert from_dataset.exit_code == 0, from_dataset.output
    traced = [line for line in from_dataset.output.splitlines() if line.startswith("val-000000.tar:")]
    assert len(traced) == 6
    for line in traced:
        named = re.match(r"val-000000\.tar:\S+ \((\S+)\)  true (\S+) ", line)
        assert named and named.group(1).startswith(world.folder), line
        assert named.group(1).rsplit("/", 2)[1] == named.group(2)  # the file's class folder is the true class
    bad = runner.invoke(app, ["predict", "--model", world.registry, str(tmp_path / "nothing-here")])
    assert bad.exit_code == 2 and "no such file, directory or gs:// object/prefix" in bad.output
    nomodel = runner.invoke(app, ["predict", "--model", str(tmp_path), str(tmp_path / "broken.jpg")])
    assert nomodel.exit_code == 2 and "neither a model directory" in nomodel.output


def test_promote_component_exposes_a_vertex_model_for_model_deploy_op(
    world, gcs_server, monkeypatch, tmp_path
):
    """The KFP promote step (its plain function, as the executor calls it) fills GCPC's google.VertexModel
    output; the compiled pipeline takes `vertex_model` / `serving_image` (empty: no Vertex upload)."""
    from google_cloud_pipeline_components.types import artifact_types
    from kfp import compiler, dsl
    from tpustream.components.promote import promote_model
    from tpustream.pipelines.training import build_pipeline

    from tpustream.serve.validate import validate_serving

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
    monkeypatch.setenv("TPUSTREAM_VERTEX_ENDPOINT", world.recorder.url)
    output = artifact_types.VertexModel(name="vertex_model", uri=str(tmp_path / "out"), metadata={})
    checked = "gs://serving/validation/r1"  # the validate step's report, which promote requires
    validate_serving(world.model, data=world.digits, samples=8, output=checked)
    line = promote_model(
        validation=dsl.Metrics(uri=checked),
        model=dsl.Model(uri=world.model), evaluation=dsl.Metrics(uri="gs://serving/eval/r1/metrics.json"),
        registry="gs://serving/registry-component", metric="top1", min_delta=0.0, vertex_model=output,
        vertex_model_name="digits-classifier", serving_image=SERVING_IMAGE, project="proj",
        location="europe-west4", dataset=dsl.Dataset(uri=world.digits),
        data_check=dsl.Markdown(uri=str(tmp_path / "no-data-check.md")),
        report=dsl.HTML(uri=str(tmp_path / "report")), summary=dsl.Markdown(uri=str(tmp_path / "summary")),
    )  # fmt: skip
    name = output.metadata["resourceName"]
    assert line == f"promoted version 1, Vertex AI model {name}"
    # the run report, with the outcome
    assert "Promoted as version 1" in (tmp_path / "summary").read_text()
    assert "Promoted as version 1" in (tmp_path / "report").read_text()
    assert name == f"{PARENT}/models/4200@2"  # a second version of the same Vertex model
    versions = world.recorder.models["4200"]["versions"]
    assert "champion" in versions["2"]["aliases"] and "champion" not in versions["1"]["aliases"]  # moved
    assert versions["2"]["artifactUri"] == "gs://serving/registry-component/versions/1"
    assert output.uri == f"https://europe-west4-aiplatform.googleapis.com/v1/{name}"
    path = tmp_path / "pipeline.yaml"
    compiler.Compiler().compile(build_pipeline(tpu=None), str(path))
    spec = yaml_load(path)
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["vertex_model"]["defaultValue"] == "" and params["serving_image"]["defaultValue"] == ""
    component = spec["components"]["comp-promote-model"]
    assert (
        component["outputDefinitions"]["artifacts"]["vertex_model"]["artifactType"]["schemaTitle"]
        == "google.VertexModel"
    )
    assert component["inputDefinitions"]["parameters"]["project"]["defaultValue"] == ""  # kfp.local-safe
    tasks = {}
    for comp in spec["components"].values():
        tasks.update(comp.get("dag", {}).get("tasks", {}))
    inputs = tasks["promote-model"]["inputs"]["parameters"]
    assert inputs["vertex_model_name"]["componentInputParameter"].endswith("vertex_model")
    assert inputs["serving_image"]["componentInputParameter"].endswith("serving_image")


def yaml_load(path):
    import yaml

    with open(path) as f:
        return yaml.safe_load(f)
