"""Infra validation before promotion: `tpustream validate-serving` starts aiplatform's real model server
(`python -m google.cloud.aiplatform.prediction.model_server`, FastAPI + uvicorn, in a subprocess) on the
candidate as the serving image does, and `promote --validation` moves the champion only for a candidate
that passed. Real parts throughout: a model trained here, real HTTP, `tpustream evaluate`'s own code path
for the expected answers; nothing is stood in for."""

import json
import shutil
from unittest.mock import ANY

import pytest
from typer.testing import CliRunner

from tests.common.models import make_model
from tpustream.cli.main import app
from tpustream.dataset import write as shards
from tpustream.dataset.plan import ShardConfig
from tpustream.serve.validate import (
    ServingValidationError,
    ValidationReport,
    require_validated,
    start_model_server,
    validate_serving,
)
from tpustream.train import evaluate

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("validate")
    digits = str(tmp / "digits")
    shards.create_shards(ShardConfig(source="digits", output=digits, num_shards=2), progress=False)
    model = make_model(tmp / "model", digits, seed=2, steps=40)
    return tmp, digits, model


def test_a_good_candidate_answers_as_evaluation_did_and_refuses_malformed_requests(world, tmp_path):
    _, digits, model = world
    report = validate_serving(model, data=digits, samples=40, output=str(tmp_path / "check"))
    assert report.passed and report.failures == []
    assert report.samples == 40 and report.agreed == 40
    assert report.max_probability_diff <= 1e-3
    assert report.automl_agreed == 16  # a request of AutoML's format too (serving_automl)
    assert {case.case: case.status for case in report.malformed} == dict.fromkeys(
        ("not-json", "not-an-object", "no-instances", "not-base64", "not-an-image", "automl-mixed-formats"),
        400,
    )
    written = json.loads((tmp_path / "check" / "validation.json").read_text())
    assert written == report.to_json()
    assert list(written) == [  # the file's keys, in the order they had before the report was a type
        "format",
        "model",
        "model_sha256",
        "data",
        "passed",
        "samples",
        "agreed",
        "max_probability_diff",
        "latency_ms_p50",
        "latency_ms_max",
        "automl_agreed",
        "startup_s",
        "malformed",
        "failures",
        "server_log",
    ]
    assert written["malformed"][0] == {"case": "not-json", "status": 400, "response_bytes": ANY}
    # What promotion checks: a pass, for this very model.pt
    assert require_validated(str(tmp_path / "check"), model) == report


def test_a_candidate_the_server_reads_differently_fails_and_cannot_be_promoted(world, tmp_path):
    """model.json's normalization is what the server applies; evaluation's loader normalizes as training did.
    A card that disagrees (here a changed mean) answers differently when served: caught before promotion."""
    tmp, digits, model = world
    skewed = tmp_path / "skewed"
    shutil.copytree(model, skewed)
    card = json.loads((skewed / "model.json").read_text())
    card["normalization"] = {"mean": [0.9, 0.9, 0.9], "std": [0.2, 0.2, 0.2], "scale": 255}
    (skewed / "model.json").write_text(json.dumps(card))
    with pytest.raises(ServingValidationError, match="failed validation in the serving container"):
        validate_serving(str(skewed), data=digits, samples=32, output=str(tmp_path / "check"))
    report = json.loads((tmp_path / "check" / "validation.json").read_text())
    assert not report["passed"] and report["agreed"] < 32 and "evaluation's top-1" in report["failures"][0]
    evaluate.evaluate(str(skewed), digits, str(tmp_path / "eval"), workers=0)
    result = CliRunner().invoke(app, [
        "promote", "--candidate", str(skewed), "--metrics", str(tmp_path / "eval"),
        "--registry", str(tmp_path / "registry"), "--validation", str(tmp_path / "check"),
    ])  # fmt: skip
    assert result.exit_code == 2 and "failed validation in the serving container" in result.output
    assert not (tmp_path / "registry" / "champion.json").exists()


def test_a_candidate_the_server_cannot_load_is_named_with_the_server_log(world, tmp_path):
    _, digits, model = world
    broken = tmp_path / "broken"
    shutil.copytree(model, broken)
    (broken / "model.pt").write_bytes(b"not a torch file")
    with (
        pytest.raises(
            ServingValidationError, match="exited with .* before answering its health route"
        ) as err,
        start_model_server(str(broken), timeout=120),
    ):
        pass
    assert "model.pt" in str(err.value)  # the server's own log names what it could not load


def test_cli_validates_then_promote_takes_only_this_candidates_pass(world, tmp_path):
    tmp, digits, model = world
    runner = CliRunner()
    result = runner.invoke(app, [
        "validate-serving", model, "--data", digits, "--samples", "16", "--output", str(tmp_path / "check"),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "16/16 val images answered as evaluation did" in result.output and "not-json 400" in result.output
    evaluate.evaluate(model, digits, str(tmp_path / "eval"), workers=0)
    other = make_model(tmp_path / "other", digits, seed=5, steps=5)
    refused = runner.invoke(app, [
        "promote", "--candidate", other, "--metrics", str(tmp_path / "eval"),
        "--registry", str(tmp_path / "registry"), "--validation", str(tmp_path / "check"),
    ])  # fmt: skip
    assert refused.exit_code == 2 and "validate this candidate" in refused.output
    promoted = runner.invoke(app, [
        "promote", "--candidate", model, "--metrics", str(tmp_path / "eval"),
        "--registry", str(tmp_path / "registry"), "--validation", str(tmp_path / "check"),
    ])  # fmt: skip
    assert promoted.exit_code == 0, promoted.output
    assert "promoted: version 1" in promoted.output


# validation.json as validate-serving wrote it before the report was a type (every key, in its order)
OLD_REPORT = {
    "format": "tpustream.serving-validation/v1",
    "model": "gs://b/run/model",
    "model_sha256": "ab" * 32,
    "data": "gs://b/data",
    "passed": True,
    "samples": 8,
    "agreed": 8,
    "max_probability_diff": 2e-7,
    "latency_ms_p50": 12.5,
    "latency_ms_max": 30.1,
    "automl_agreed": 8,
    "startup_s": 4.2,
    "malformed": [{"case": "not-json", "status": 400, "response_bytes": 97}],
    "failures": [],
    "server_log": "/tmp/server.log",
}


def test_a_report_written_before_it_was_a_type_reads_and_writes_back_unchanged():
    report = ValidationReport.from_json(json.loads(json.dumps(OLD_REPORT)), "validation.json")
    assert report.passed and report.malformed[0].status == 400
    assert json.dumps(report.to_json(), indent=2) == json.dumps(OLD_REPORT, indent=2)
    with pytest.raises(ServingValidationError, match="validation.json is not a serving validation report"):
        ValidationReport.from_json({**OLD_REPORT, "format": "other/v1"}, "validation.json")
    with pytest.raises(ServingValidationError, match="KeyError: 'agreed'"):
        ValidationReport.from_json({k: v for k, v in OLD_REPORT.items() if k != "agreed"}, "validation.json")
