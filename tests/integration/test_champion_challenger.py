"""Evaluation and promotion for real: models trained here (eager CPU), registries on disk and on
the GCS test server, a forced promotion race, a crash between the copy and the pointer swap."""

import json
import logging
import math
import random
import shutil
import threading

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from tests.common.models import DIGITS, make_model
from tpustream.cli.main import app
from tpustream.dataset import write as shards
from tpustream.dataset.manifest import read_manifest
from tpustream.dataset.plan import ShardConfig
from tpustream.dataset.tario import iter_tar_samples
from tpustream.image.codec import decode_ppm
from tpustream.image.transforms import Augment, decode_image, normalize
from tpustream.models import build_model
from tpustream.registry.policy import PromotionPolicy, RegistryError
from tpustream.release import promote
from tpustream.release.promote import PromotionOutcome
from tpustream.sources.builtin import digits_source
from tpustream.storage import io as storage
from tpustream.train import evaluate

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("data") / "digits")
    shards.create_shards(ShardConfig(source="digits", output=out, num_shards=4), progress=False)
    return out


@pytest.fixture(scope="module")
def models(digits, tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    return {
        # random weights: every answer the same class, no better than always answering the largest one
        "untrained": make_model(base / "untrained", digits, seed=1, steps=0),
        # weak, but better than that trivial answer: a registry's first champion must beat it
        "weak": make_model(base / "weak", digits, seed=1, steps=8),
        "good": make_model(base / "good", digits, seed=2, steps=30),
        "better": make_model(base / "better", digits, seed=3, steps=120),
    }


def test_evaluation_is_exact(digits, models, tmp_path):
    result = evaluate.evaluate(models["good"], digits, str(tmp_path / "eval"))
    candidate = result.candidate
    manifest = read_manifest(digits)
    assert candidate.num_samples == manifest["splits"]["val"]["num_samples"] and candidate.complete
    # independent count: every val sample through the model one at a time
    model = build_model("tiny", num_classes=10, input_size=16)
    model.load_state_dict(torch.load(f"{models['good']}/model.pt", weights_only=True))
    model.eval()
    confusion = np.zeros((10, 10), int)
    augment = Augment(output_size=16, train=False)
    for shard in manifest["splits"]["val"]["shards"]:
        with open(f"{digits}/{shard['path']}", "rb") as f:
            for _, fields in iter_tar_samples(f):
                image = decode_image(fields["ppm"], "ppm", augment, random.Random(0))
                x = normalize(torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))[None])
                predicted = int(model(x).argmax())
                confusion[int(fields["cls"]), predicted] += 1
    assert candidate.confusion_matrix == confusion.tolist()
    assert candidate.top1 == pytest.approx(np.trace(confusion) / confusion.sum())
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["candidate"]["top1"] == candidate.top1
    assert decode_ppm  # the test reads shards with the project's own PPM decoder via decode_image


def _evaluate(models, name, digits, tmp_path, registry=None):
    out = str(tmp_path / f"eval-{name}")
    evaluate.evaluate(models[name], digits, out, registry=registry)
    return f"{out}/metrics.json"


@pytest.fixture(params=["local", "gcs"])
def registry(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "registry")
    return f"{request.getfixturevalue('gcs_bucket')}/registry"


def test_champion_challenger_flow(digits, models, registry, tmp_path):
    untrained = _evaluate(models, "untrained", digits, tmp_path, registry)
    trivial = promote.promote(models["untrained"], untrained, registry)  # not even into an empty registry
    assert not trivial.promoted and "does not beat the majority-class baseline" in trivial.reason
    assert trivial.code == "below-baseline"
    assert promote.read_champion(registry) is None
    weak = _evaluate(models, "weak", digits, tmp_path, registry)
    assert promote.promote(models["weak"], weak, registry) == PromotionOutcome(
        promoted=True, version=1, reason="no champion yet", code="no-champion", previous_version=None
    )
    again = promote.promote(models["weak"], weak, registry)  # idempotent
    assert again.promoted is False and again.code == "already-champion"
    better = _evaluate(models, "better", digits, tmp_path, registry)
    metrics = json.loads(storage.read_bytes(better))
    assert metrics["champion"]["version"] == 1  # the champion was evaluated on the same shards, same run
    assert promote.promote(models["better"], better, registry).version == 2
    good = _evaluate(models, "good", digits, tmp_path, registry)
    outcome = promote.promote(models["good"], good, registry)
    assert outcome.promoted is False and outcome.code == "no-improvement" and "not above 0" in outcome.reason
    assert promote.read_champion(registry).version == 2
    versions = sorted(
        o.uri.rsplit("/", 2)[1]
        for o in storage.list_objects(f"{registry}/versions")
        if o.uri.endswith("version.json")
    )
    assert versions == ["1", "2"]
    events = [
        json.loads(storage.read_bytes(o.uri))["event"] for o in storage.list_objects(f"{registry}/events")
    ]
    assert sorted(events) == ["already-champion", "promoted", "promoted", "refused", "refused"]
    assert promote.champion_status(registry).ok


def test_racing_promotions_end_with_one_consistent_champion(
    digits, models, gcs_bucket, tmp_path, monkeypatch
):
    registry = f"{gcs_bucket}/race"
    promote.promote(models["weak"], _evaluate(models, "weak", digits, tmp_path, registry), registry)
    good = _evaluate(models, "good", digits, tmp_path, registry)
    better = _evaluate(models, "better", digits, tmp_path, registry)
    # Both read the pointer, both fill their version, then both try the swap: one must lose.
    barrier = threading.Barrier(2, timeout=60)
    real_fill = promote.fill_version  # promote's own name for tpustream.registry.store.fill_version
    calls = {"n": 0}

    def fill_then_wait(*args, **kwargs):
        real_fill(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] <= 2:
            barrier.wait()

    monkeypatch.setattr(promote, "fill_version", fill_then_wait)
    outcomes = {}

    def run(name, metrics):
        outcomes[name] = promote.promote(models[name], metrics, registry)

    threads = [threading.Thread(target=run, args=a) for a in (("good", good), ("better", better))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    champion = promote.read_champion(registry)
    better_sha = json.loads(storage.read_bytes(better))["candidate"]["model_sha256"]
    assert (
        champion is not None and champion.model_sha256 == better_sha
    )  # the better model wins whatever the order
    assert promote.champion_status(registry).ok  # the pointer names a complete version
    # the loser re-read the pointer and decided again against the winner
    assert outcomes["better"].promoted is True
    if outcomes["good"].promoted:  # good swapped first, then better beat it on re-decision
        assert outcomes["better"].previous_version == outcomes["good"].version
    else:
        assert "not above 0" in outcomes["good"].reason


def test_crash_between_copy_and_swap_then_retry(digits, models, gcs_bucket, tmp_path, monkeypatch):
    registry = f"{gcs_bucket}/crash"
    promote.promote(models["weak"], _evaluate(models, "weak", digits, tmp_path, registry), registry)
    better = _evaluate(models, "better", digits, tmp_path, registry)
    real_swap = storage.replace_if_generation

    def crash(*args, **kwargs):
        raise RuntimeError("machine lost power")

    monkeypatch.setattr(storage, "replace_if_generation", crash)
    with pytest.raises(RuntimeError, match="power"):
        promote.promote(models["better"], better, registry)
    assert promote.read_champion(registry).version == 1  # pointer untouched
    assert promote.champion_status(registry).ok
    monkeypatch.setattr(storage, "replace_if_generation", real_swap)
    outcome = promote.promote(models["better"], better, registry)
    assert outcome.promoted and outcome.version == 2  # the claimed version is reused, not duplicated
    assert (
        len([o for o in storage.list_objects(f"{registry}/versions") if o.uri.endswith("version.json")]) == 2
    )


def test_bad_inputs(digits, models, tmp_path):
    registry = str(tmp_path / "reg")
    weak = _evaluate(models, "weak", digits, tmp_path, registry)
    promote.promote(models["weak"], weak, registry)
    # metrics measured on another dataset than the champion's: refused, not compared
    other = str(tmp_path / "other")
    shards.create_shards(ShardConfig(source="digits", output=other, num_shards=4, seed=7), progress=False)
    out = str(tmp_path / "eval-other")
    evaluate.evaluate(models["better"], other, out)  # no --registry: no same-shards champion numbers
    outcome = promote.promote(models["better"], f"{out}/metrics.json", registry)
    assert not outcome.promoted and "same shards" in outcome.reason
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(RegistryError, match="not a tpustream metrics.json"):
        promote.promote(models["better"], str(tmp_path / "bad.json"), registry)
    with pytest.raises(RegistryError, match="does not exist: run tpustream evaluate"):
        promote.promote(models["better"], str(tmp_path / "none.json"), registry)
    with pytest.raises(RegistryError, match="unknown metric"):
        promote.promote(models["better"], weak, registry, PromotionPolicy.from_options(metric="auc"))
    with pytest.raises(evaluate.EvaluationError, match="model.json does not exist"):
        evaluate.evaluate(str(tmp_path / "nomodel"), digits, str(tmp_path / "e"))
    storage.delete(f"{registry}/versions/1/model.pt")
    status = promote.champion_status(registry)
    assert not status.ok and "lacks model.pt" in status.message and "Repair" in status.message


def test_vertex_model_registry_mirrors_promotions(digits, models, gcs_bucket, tmp_path):
    """The real google-cloud-aiplatform client against a recording REST endpoint on loopback
    (Vertex AI itself cannot be reached from here). Only promoted models are uploaded, from their
    immutable registry version, with the serving image (tests/integration/test_serving.py serves one)."""
    from tests.fakes.vertex import VertexRecorder
    from tpustream.vertex.evaluation import EVALUATION_SCHEMA
    from tpustream.vertex.model_registry import VertexTarget

    image = "europe-west4-docker.pkg.dev/proj/tpustream/serve@sha256:" + "d" * 64
    recorder = VertexRecorder()
    try:
        target = VertexTarget(model_name="digits-classifier", project="proj", location="europe-west4",
                              api_endpoint=recorder.url, serving_image=image)  # fmt: skip
        registry = f"{gcs_bucket}/vreg"
        on_gcs = {}
        for name in ("weak", "better", "good"):
            on_gcs[name] = f"{gcs_bucket}/models/{name}"
            for filename in ("model.pt", "model.json"):
                storage.copy(f"{models[name]}/{filename}", f"{on_gcs[name]}/{filename}")
        outcomes = []
        for name in ("weak", "better", "good"):
            out = f"{gcs_bucket}/eval/{name}"
            evaluate.evaluate(on_gcs[name], digits, out, registry=registry)
            outcomes.append(promote.promote(on_gcs[name], f"{out}/metrics.json", registry, vertex=target))
        assert [o.promoted for o in outcomes] == [True, True, False]
        assert [bool(o.vertex) for o in outcomes] == [True, True, False]  # the refused one: not uploaded
        parent = "projects/proj/locations/europe-west4"
        assert [o.vertex.versioned_name for o in outcomes[:2]] == [
            f"{parent}/models/4200@1", f"{parent}/models/4200@2"]  # fmt: skip
        uploads = [
            r
            for r in recorder.requests
            if r["method"] == "POST" and r["path"] == f"/v1/{parent}/models:upload"
        ]
        assert [u["body"]["model"]["artifactUri"] for u in uploads] == [
            f"{registry}/versions/1", f"{registry}/versions/2"]  # fmt: skip
        assert "parentModel" not in uploads[0]["body"]
        assert uploads[1]["body"]["parentModel"] == f"{parent}/models/4200"
        assert all(u["body"]["model"]["containerSpec"]["imageUri"] == image for u in uploads)
        assert uploads[0]["body"]["model"]["labels"]["tpustream_version"] == "1"
        merges = [r for r in recorder.requests if r["path"].endswith(":mergeVersionAliases")]
        assert [(m["path"].rsplit("/", 1)[1], m["body"]) for m in merges] == [
            ("4200@1:mergeVersionAliases", {"versionAliases": ["champion"]}),
            ("4200@2:mergeVersionAliases", {"versionAliases": ["champion"]}),
        ]
        versions = recorder.models["4200"]["versions"]
        assert "champion" in versions["2"]["aliases"] and "champion" not in versions["1"]["aliases"]
        # each promoted version got its own evaluation, in Vertex's classification schema (the recorder
        # parsed the body as an ImportModelEvaluationRequest and checked the metrics against the schema)
        imports = [r for r in recorder.requests if r["path"].endswith("/evaluations:import")]
        assert [i["path"].split("/models/")[1] for i in imports] == [
            "4200@1/evaluations:import",
            "4200@2/evaluations:import",
        ]
        for request, name in zip(imports, ("weak", "better"), strict=True):
            measured = json.loads(storage.read_bytes(f"{gcs_bucket}/eval/{name}/metrics.json"))
            evaluation = request["body"]["modelEvaluation"]
            assert evaluation["metricsSchemaUri"] == EVALUATION_SCHEMA
            metrics = evaluation["metrics"]
            assert metrics["confusionMatrix"]["rows"] == measured["candidate"]["confusion_matrix"]
            assert [s["displayName"] for s in metrics["confusionMatrix"]["annotationSpecs"]] == DIGITS
            assert metrics["logLoss"] == pytest.approx(measured["candidate"]["loss"])
            at1 = metrics["confidenceMetrics"][0]
            assert at1["recallAt1"] == at1["precisionAt1"] == pytest.approx(measured["candidate"]["top1"])
            top5 = metrics["confidenceMetrics"][-1]  # after the threshold curve (one point per threshold)
            assert top5["maxPredictions"] == 5 and top5["recall"] == pytest.approx(
                measured["candidate"]["top5"]
            )
            assert metrics["auPrc"] == measured["candidate"]["auprc"]
            assert len(metrics["confidenceMetrics"]) == len(measured["candidate"]["thresholds"]) + 1
            assert evaluation["metadata"]["evaluation_dataset_path"] == [measured["dataset"]["uri"]]
        assert outcomes[1].vertex.evaluation == recorder.evaluations["4200@2"][0]["name"]
        assert recorder.rejected == []
        with pytest.raises(RegistryError, match="needs a gs:// registry"):
            promote.promote(models["better"], f"{gcs_bucket}/eval/better/metrics.json", str(tmp_path / "r"),
                            vertex=target)  # fmt: skip
        assert not (tmp_path / "r").exists()  # refused before anything was promoted
        with pytest.raises(ValueError, match="--serving-image"):
            VertexTarget(model_name="m", project="proj", serving_image="")
    finally:
        recorder.close()


def test_a_failed_vertex_upload_keeps_the_registry_and_a_rerun_of_promote_repairs_it(
    digits, models, gcs_bucket
):
    """Promotion moves champion.json first; when the Model Registry upload then fails (here a 403, as
    without IAM), the step fails loudly, the registry keeps its champion, and promote run again uploads the
    champion Vertex lacks (found missing by its labels), once: a third run uploads nothing."""
    from tests.fakes.vertex import VertexRecorder
    from tpustream.vertex.model_registry import VertexTarget

    image = "europe-west4-docker.pkg.dev/proj/tpustream/serve@sha256:" + "e" * 64
    recorder = VertexRecorder()
    recorder.fail_uploads = 1
    registry = f"{gcs_bucket}/reg"
    candidate = f"{gcs_bucket}/models/good"
    for filename in ("model.pt", "model.json"):
        storage.copy(f"{models['good']}/{filename}", f"{candidate}/{filename}")
    evaluate.evaluate(candidate, digits, f"{gcs_bucket}/eval", registry=registry)
    metrics = f"{gcs_bucket}/eval/metrics.json"
    try:
        target = VertexTarget(model_name="digits", project="proj", location="europe-west4",
                              api_endpoint=recorder.url, serving_image=image)  # fmt: skip
        with pytest.raises(
            RegistryError, match=r"version 1 is the champion .* publishing it to the Vertex AI"
        ):
            promote.promote(candidate, metrics, registry, vertex=target)
        assert promote.read_champion(registry).version == 1  # the registry state is kept
        events = [json.loads(storage.read_bytes(o.uri)) for o in storage.list_objects(f"{registry}/events")]
        assert sorted(e["event"] for e in events) == ["promoted", "vertex-upload-failed"]
        repaired = promote.promote(candidate, metrics, registry, vertex=target)
        again = promote.promote(candidate, metrics, registry, vertex=target)
    finally:
        recorder.close()
    assert repaired.reason == "already the champion" and repaired.vertex.uploaded is True
    assert again.vertex.uploaded is False
    assert again.vertex.versioned_name == repaired.vertex.versioned_name
    uploads = [r for r in recorder.requests if r["path"].endswith("/models:upload")]
    assert len(uploads) == 2  # the refused one and the repair; none from the third run
    assert uploads[1]["body"]["model"]["artifactUri"] == f"{registry}/versions/1"
    assert uploads[1]["body"]["model"]["labels"]["tpustream_version"] == "1"
    (version,) = recorder.models["4200"]["versions"].values()
    assert "champion" in version["aliases"]
    merges = [r for r in recorder.requests if r["path"].endswith(":mergeVersionAliases")]
    assert len(merges) == 1  # the third run found the alias in place
    imports = [r for r in recorder.requests if r["path"].endswith("/evaluations:import")]
    assert len(imports) == 1 and len(recorder.evaluations["4200@1"]) == 1  # the third run found it there
    assert again.vertex.evaluation == repaired.vertex.evaluation
    assert recorder.rejected == []


def _strict_json(raw):
    """Parse as JSON proper: the bare NaN/Infinity that json.dumps writes by default is refused."""

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(raw, parse_constant=refuse)


def make_nan_model(root, trained):
    """A copy of ``trained`` whose output layer is NaN: a diverged model (loss nan, top-1 still a number)."""
    state = torch.load(f"{trained}/model.pt", weights_only=True)
    last = [key for key, value in state.items() if value.is_floating_point()][-1]
    state[last].fill_(float("nan"))
    root = str(root)
    with open(f"{root}.pt", "wb") as f:
        torch.save(state, f)
    storage.upload_file(f"{root}.pt", storage.join(root, "model.pt"))
    storage.copy(f"{trained}/model.json", storage.join(root, "model.json"))
    return root


def test_a_nan_model_is_never_promoted_and_every_file_stays_json(digits, models, tmp_path):
    registry = str(tmp_path / "registry")
    promote.promote(models["weak"], _evaluate(models, "weak", digits, tmp_path, registry), registry)
    diverged = make_nan_model(tmp_path / "nan", models["good"])
    out = str(tmp_path / "eval-nan")
    result = evaluate.evaluate(diverged, digits, out, registry=registry)
    assert math.isnan(result.candidate.loss)
    written = _strict_json(storage.read_bytes(f"{out}/metrics.json"))
    assert written["candidate"]["loss"] is None and written["candidate"]["complete"]
    for metric in ("loss", "top1"):
        outcome = promote.promote(diverged, f"{out}/metrics.json", registry, PromotionPolicy(metric=metric))
        assert not outcome.promoted and "loss null is not a finite number" in outcome.reason
        assert not promote.preview_decision(result, registry, PromotionPolicy(metric=metric)).promote
    empty = str(tmp_path / "empty-registry")  # not even as the first champion
    assert not promote.promote(diverged, f"{out}/metrics.json", empty).promoted
    assert promote.read_champion(empty) is None
    assert promote.read_champion(registry).version == 1
    for obj in storage.list_objects(registry) + storage.list_objects(empty):
        if obj.uri.endswith(".json"):
            _strict_json(storage.read_bytes(obj.uri))


def test_a_champion_recorded_with_nan_is_read_back_and_kept_on_that_metric(digits, models, tmp_path):
    registry = str(tmp_path / "registry")
    promote.promote(models["weak"], _evaluate(models, "weak", digits, tmp_path, registry), registry)
    pointer_file = tmp_path / "registry" / "champion.json"
    pointer = json.loads(pointer_file.read_text())
    pointer["metrics"]["loss"] = float("nan")
    pointer_file.write_text(json.dumps(pointer))  # as registries were written before null replaced NaN
    assert "NaN" in pointer_file.read_text() and promote.champion_status(registry).ok
    out = str(tmp_path / "eval-better")
    evaluate.evaluate(models["better"], digits, out)  # no --registry: only the recorded numbers to go by
    outcome = promote.promote(
        models["better"], f"{out}/metrics.json", registry, PromotionPolicy(metric="loss")
    )
    assert not outcome.promoted and "champion loss nan" in outcome.reason
    assert promote.promote(models["better"], f"{out}/metrics.json", registry).promoted  # top1 compares
    assert _strict_json(pointer_file.read_bytes())["previous_version"] == 1


def test_a_partial_evaluation_is_never_promoted(digits, models, tmp_path, caplog):
    damaged = tmp_path / "damaged"
    shutil.copytree(digits, damaged)
    shard = damaged / "val" / "val-000000.tar"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size * 3 // 4])
    registry = str(tmp_path / "registry")
    out = str(tmp_path / "eval-partial")
    with caplog.at_level(logging.WARNING):
        result = evaluate.evaluate(models["better"], str(damaged), out, registry=registry)
    counted = result.candidate.num_samples
    assert 0 < counted < 179 and not result.candidate.complete
    assert "cannot be promoted" in caplog.text and "tpustream shards verify" in caplog.text
    assert json.loads(storage.read_bytes(f"{out}/metrics.json"))["candidate"]["complete"] is False  # evidence
    preview = promote.preview_decision(result, registry)
    outcome = promote.promote(models["better"], f"{out}/metrics.json", registry)
    assert not preview.promote and not outcome.promoted
    for reason in (preview.reason, outcome.reason):
        assert f"{counted} of the dataset's 179 val samples ({179 - counted} missing)" in reason
        assert f"tpustream shards verify {damaged}" in reason
    assert promote.read_champion(registry) is None and not storage.list_objects(f"{registry}/versions")


def test_a_champion_with_other_classes_is_noted_and_kept(digits, models, tmp_path):
    registry = str(tmp_path / "registry")
    promote.promote(models["weak"], _evaluate(models, "weak", digits, tmp_path, registry), registry)
    letters = [chr(ord("a") + k) for k in range(10)]
    source = digits_source()
    source.classes = letters  # the same images under a new class set: a new manifest digest
    renamed = str(tmp_path / "letters")
    shards.create_shards(
        ShardConfig(source="digits", output=renamed, num_shards=4), progress=False, source=source
    )
    candidate = make_model(tmp_path / "letters-model", renamed, seed=4, steps=8, classes=letters)
    out = str(tmp_path / "eval-letters")
    result = evaluate.evaluate(candidate, renamed, out, registry=registry)
    written = json.loads(storage.read_bytes(f"{out}/metrics.json"))
    assert written["candidate"]["complete"] and written["champion"] is None
    assert "version 1" in written["champion_note"] and "classes" in written["champion_note"]
    preview = promote.preview_decision(result, registry)
    outcome = promote.promote(candidate, f"{out}/metrics.json", registry)
    assert not preview.promote and not outcome.promoted
    for reason in (preview.reason, outcome.reason):
        assert "classes" in reason and "new registry" in reason
    assert promote.read_champion(registry).version == 1
    fresh = str(tmp_path / "registry-letters")  # the way forward the reason names
    assert promote.promote(candidate, f"{out}/metrics.json", fresh).reason == "no champion yet"


def test_promote_checks_the_candidate_before_claiming_a_version(digits, models, registry, tmp_path):
    good = _evaluate(models, "good", digits, tmp_path)
    with pytest.raises(RegistryError, match="belong to a different model.*re-run tpustream evaluate"):
        promote.promote(models["better"], good, registry)
    with pytest.raises(RegistryError, match="lacks model.pt"):
        promote.promote(str(tmp_path / "missing"), good, registry)
    half = tmp_path / "half"
    half.mkdir()
    shutil.copy(f"{models['good']}/model.pt", half / "model.pt")
    with pytest.raises(RegistryError, match="lacks model.json"):
        promote.promote(str(half), good, registry)
    assert storage.list_objects(f"{registry}/versions") == []  # no version claimed, no number used up
    assert promote.promote(models["good"], good, registry).version == 1
    assert promote.champion_status(registry).ok


def test_champion_show_tells_a_missing_registry_from_an_empty_one(tmp_path, gcs_bucket):
    for registry in (str(tmp_path / "no-such-registry"), "gs://no-such-bucket/registry"):
        status = promote.champion_status(registry)
        assert not status.ok and status.champion is None and "does not exist" in status.message
    (tmp_path / "empty").mkdir()
    for registry in (str(tmp_path / "empty"), f"{gcs_bucket}/registry"):
        assert promote.champion_status(registry).to_json() == {
            "registry": registry, "champion": None, "ok": True, "message": "no champion yet"}  # fmt: skip
    result = CliRunner().invoke(app, ["champion", "show", "--registry", str(tmp_path / "no-such-registry")])
    assert result.exit_code == 1 and '"ok": false' in result.output


def test_promote_reports_what_happened_when_write_answers_are_lost(digits, models, gcs_server, gcs_bucket, tmp_path,
                                                                    monkeypatch):  # fmt: skip
    """Every conditional write (version claim, champion compare-and-swap, event) is applied by the server
    and its answer cut on the way back, so the client retries it with its condition: the retry collides
    with its own success. Promotion must still say "promoted", exit cleanly, and log one event."""
    from tests.fakes.gcs import FaultProxy

    registry = f"{gcs_bucket}/lossy"
    weak = _evaluate(models, "weak", digits, tmp_path, registry)
    better = _evaluate(models, "better", digits, tmp_path, registry)
    proxy = FaultProxy(gcs_server.url, fault_rate=0.0)
    attempts = {"n": 0}

    def first_conditional_upload(method, path):  # every first attempt is cut; its retry goes through
        if method == "POST" and "ifGenerationMatch" in path:
            attempts["n"] += 1
            return attempts["n"] % 2 == 1
        return False

    proxy.lose_answer = first_conditional_upload
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    try:
        first = promote.promote(models["weak"], weak, registry)
        second = promote.promote(models["better"], better, registry)
        result = CliRunner().invoke(app, ["champion", "show", "--registry", registry])
    finally:
        proxy.close()
    assert proxy.write_answers_lost >= 6  # version.json, champion.json and an event, for each promotion
    assert first == PromotionOutcome(
        promoted=True, version=1, reason="no champion yet", code="no-champion", previous_version=None
    )
    assert second.promoted is True and second.version == 2 and second.previous_version == 1
    events = [json.loads(storage.read_bytes(o.uri)) for o in storage.list_objects(f"{registry}/events")]
    assert sorted(e["event"] for e in events) == ["promoted", "promoted"]  # each written exactly once
    assert result.exit_code == 0 and json.loads(result.output)["champion"]["version"] == 2


def test_a_class_without_val_samples_is_not_measured_and_metrics_name_the_dataset_absolutely(
    tmp_path, monkeypatch, caplog
):
    from PIL import Image

    rng = np.random.default_rng(0)
    for name, count in (("a", 6), ("b", 6), ("c", 1)):  # c's one image cannot be in both splits
        (tmp_path / "photos" / name).mkdir(parents=True)
        for i in range(count):
            pixels = rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "photos" / name / f"{i}.png")
    monkeypatch.chdir(tmp_path)
    shards.create_shards(
        ShardConfig(source="photos", output="data", num_shards=2, val_fraction=0.5), progress=False
    )
    assert read_manifest("data")["splits"]["val"]["class_counts"] == [3, 3, 0]
    model = make_model(tmp_path / "model", "data", seed=0, steps=0, classes=["a", "b", "c"])
    with caplog.at_level(logging.WARNING):
        result = evaluate.evaluate_model(model, "data", workers=0)
    assert result.per_class_accuracy[2] is None and result.unmeasured_classes == ["c"]
    assert all(isinstance(v, float) for v in result.per_class_accuracy[:2])
    assert "not measured: c" in caplog.text
    evaluate.evaluate(model, "data", "eval")
    written = json.loads(storage.read_bytes(str(tmp_path / "eval" / "metrics.json")))
    assert written["dataset"]["uri"] == str(tmp_path / "data")  # readable from any directory


def test_a_model_below_the_quality_floor_is_refused_with_no_champion(digits, models, tmp_path):
    """The first model of a registry is not promoted whatever it scores: ``--min-metric`` (and
    ``--min-class-recall``) apply with no champion too, and the refusal is recorded, with no version made."""
    registry = str(tmp_path / "registry")
    weak = _evaluate(models, "weak", digits, tmp_path)  # a few SGD steps: ~23% top-1
    runner = CliRunner()
    base = ["promote", "--candidate", models["weak"], "--metrics", weak, "--registry", registry]
    refused = runner.invoke(app, [*base, "--min-metric", "0.5"])
    assert refused.exit_code == 0, refused.output
    assert "not promoted: candidate top1 0." in refused.output and "--min-metric 0.5" in refused.output
    assert promote.read_champion(registry) is None and not storage.exists(f"{registry}/versions")
    events = [json.loads(storage.read_bytes(o.uri)) for o in storage.list_objects(f"{registry}/events")]
    assert [e["event"] for e in events] == ["refused"] and "quality floor" in events[0]["reason"]
    by_class = runner.invoke(app, [*base, "--min-class-recall", "0.5"])
    assert "not promoted: class " in by_class.output and "--min-class-recall 0.5" in by_class.output
    good = _evaluate(models, "better", digits, tmp_path)
    top1 = json.loads(storage.read_bytes(good))["candidate"]["top1"]
    passed = runner.invoke(
        app,
        ["promote", "--candidate", models["better"], "--metrics", good, "--registry", registry]
        + ["--min-metric", str(round(top1 - 0.01, 4))],
    )
    assert (
        "promoted: version 1 is the champion (no champion yet; the candidate reaches the quality floor"
        in (passed.output)
    )


def test_promote_refuses_a_model_no_better_than_the_majority_class_unless_told(digits, models, tmp_path):
    untrained = _evaluate(models, "untrained", digits, tmp_path)
    baseline = json.loads(storage.read_bytes(untrained))["baseline"]
    trivial = ["promote", "--candidate", models["untrained"], "--metrics", untrained]
    trivial += ["--registry", str(tmp_path / "registry")]
    refused = CliRunner().invoke(app, trivial)
    assert refused.exit_code == 0, refused.output
    assert f"does not beat the majority-class baseline {baseline['top1']:.4f}" in refused.output
    assert f"(always answering '{baseline['answer']}'" in refused.output
    allowed = CliRunner().invoke(app, [*trivial, "--no-beat-majority-baseline"])
    assert "promoted: version 1 is the champion (no champion yet)" in allowed.output


def test_a_dataset_with_a_test_split_is_decided_on_test_and_reports_val_too(models, gcs_bucket, tmp_path):
    """evaluate measures candidate and champion on test (the candidate also on val); promotion decides on test
    and says so. The models trained on another split of digits: only which split is read matters here."""
    data = f"{gcs_bucket}/digits-with-test"
    shards.create_shards(
        ShardConfig(source="digits", output=data, num_shards=4, test_fraction=0.15), progress=False
    )
    manifest = read_manifest(data)
    num_val, num_test = (manifest["splits"][split]["num_samples"] for split in ("val", "test"))
    registry = f"{gcs_bucket}/registry-test-split"
    first = evaluate.evaluate(models["good"], data, str(tmp_path / "good"), registry=registry)
    assert first.split == "test" and first.candidate.split == "test"
    assert first.candidate.num_samples == num_test and first.candidate.complete
    assert first.val is not None and first.val.split == "val" and first.val.num_samples == num_val
    direct = evaluate.evaluate_model(models["good"], data, split="test")
    assert first.candidate.confusion_matrix == direct.confusion_matrix
    assert first.val.confusion_matrix == evaluate.evaluate_model(models["good"], data).confusion_matrix
    document = json.loads((tmp_path / "good" / "metrics.json").read_text())
    assert document["split"] == "test" and document["dataset"]["test_samples"] == num_test
    assert document["val"]["num_samples"] == num_val
    outcome = promote.promote(models["good"], str(tmp_path / "good"), registry)
    assert outcome.reason == "no champion yet (on the held-out test split)"
    assert promote.read_champion(registry).metrics["split"] == "test"

    second = evaluate.evaluate(models["better"], data, str(tmp_path / "better"), registry=registry)
    assert second.champion is not None and second.champion.version == 1
    assert second.champion.split == "test" and second.champion.num_samples == num_test
    assert second.champion.confusion_matrix == direct.confusion_matrix  # the champion, on test again
    outcome = promote.promote(models["better"], str(tmp_path / "better"), registry)
    assert outcome.reason.endswith("(on the held-out test split)")
    events = [json.loads(storage.read_bytes(o.uri)) for o in storage.list_objects(f"{registry}/events")]
    assert {event["split"] for event in events} == {"test"}
