"""The pipeline's tune switch: compiled for Vertex (plan -> Vizier's HyperparameterTuningJob -> pick, its payload
proto-valid as GCPC's launcher parses it) and run through kfp.local (the optuna search inside the step)."""

import json
import re
from pathlib import Path

import pytest
import yaml
from google.cloud.aiplatform_v1.types import HyperparameterTuningJob
from google.protobuf import json_format
from tpustream.pipelines.compile import compile_pipeline

from tests.common.sources import digit_images

pytestmark = pytest.mark.integration

DIGEST = "@sha256:" + "b" * 64
CPU_IMAGE = "europe-docker.pkg.dev/proj/tpustream/cpu" + DIGEST
TPU_IMAGE = "europe-docker.pkg.dev/proj/tpustream/tpu" + DIGEST


def _tasks(spec):
    tasks = dict(spec["root"]["dag"]["tasks"])
    for component in spec["components"].values():
        tasks.update(component.get("dag", {}).get("tasks", {}))
    return tasks


def test_the_vertex_tune_switch_runs_a_proto_valid_tuning_job_on_the_slice_and_picks_its_best_trial(tmp_path):
    from tpustream.launchers.tune import plan_tuning_job

    path = tmp_path / "pipeline.yaml"
    compile_pipeline(str(path), tpu="v5e-16", cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE, tune=True)
    spec = yaml.safe_load(path.read_text())
    tasks = _tasks(spec)
    assert "train-model" not in tasks  # no retraining: the candidate is the best trial's model
    assert tasks["hyperparameter-tuning-job"]["dependentTasks"] == ["plan-tuning"]
    assert tasks["evaluate-model"]["inputs"]["artifacts"]["model"]["taskOutputArtifact"] == {
        "outputArtifactKey": "model",
        "producerTask": "pick-trial",
    }
    assert "check-data" in tasks["plan-tuning"]["dependentTasks"]  # no TPU time on refused data
    executors = spec["deploymentSpec"]["executors"]
    for step in ("plan-tuning", "pick-trial"):  # CPU steps, sized as the others (pipelines/steps.py)
        resources = executors[f"exec-{step}"]["container"]["resources"]
        assert (resources["resourceCpuLimit"], resources["resourceMemoryLimit"]) == ("4", "16G"), step
    assert "resources" not in executors["exec-hyperparameter-tuning-job"]["container"]  # GCPC's launcher
    plan_inputs = tasks["plan-tuning"]["inputs"]["parameters"]
    pool = plan_inputs["trial_pool"]["runtimeValue"]["constant"]
    assert pool["machine_spec"] == {"machine_type": "ct5lp-hightpu-4t", "tpu_topology": "4x4"}
    assert pool["replica_count"] == 1 and plan_inputs["trial_image"]["runtimeValue"]["constant"] == TPU_IMAGE
    # The payload GCPC's launcher parses, with the plan step's outputs for this run
    planned = plan_tuning_job(
        dataset="gs://bucket/data",
        space="",
        trial_pool=pool,
        image=TPU_IMAGE,
        run_outcome="",
        model_name="resnet18",
        epochs=10,
        batch_size=64,
        lr=0.0,
        bf16=True,
        workers=8,
        input_size=0,
        init_from="",
        pretrained="resnet18.DEFAULT",
        freeze_epochs=0,
        backbone_lr_scale=1.0,
        head_lr_scale=-1.0,
        class_weights="none",
        recipe="auto",
        augment="",
        random_erasing=-1.0,
        mixup_alpha=-1.0,
        cutmix_alpha=-1.0,
        ema_decay=-1.0,
        layer_decay=-1.0,
        registry="",
        patience=0,
        early_stop_min_delta=0.0,
        compile_cache="",
        pipeline_root="gs://bucket/root",
    )
    inputs = tasks["hyperparameter-tuning-job"]["inputs"]["parameters"]
    values = {
        **{name: spec_["runtimeValue"]["constant"] for name, spec_ in inputs.items() if "runtimeValue" in spec_},
        **{name: planned[spec_["taskOutputParameter"]["outputParameterKey"]] for name, spec_ in inputs.items()
           if "taskOutputParameter" in spec_},
        "study_spec_algorithm": "ALGORITHM_UNSPECIFIED",
        "study_spec_measurement_selection_type": "BEST_MEASUREMENT",
        "max_failed_trial_count": 0,
        "encryption_spec_key_name": "",
    }  # fmt: skip
    executor = spec["deploymentSpec"]["executors"]["exec-hyperparameter-tuning-job"]["container"]
    concat = json.loads(executor["args"][executor["args"].index("--payload") + 1])["Concat"]

    def value(part):
        name = re.fullmatch(r"\{\{\$\.inputs\.parameters\['(\w+)'\]\}\}", part)
        if not name:
            return part
        found = values[name.group(1)]
        return found if isinstance(found, str) else json.dumps(found)

    body = json.loads("".join(value(part) for part in concat))
    job = HyperparameterTuningJob.pb(HyperparameterTuningJob())
    json_format.ParseDict(body, job)
    assert job.study_spec.HasField("decay_curve_stopping_spec")  # automated early stopping
    assert {p.parameter_id for p in job.study_spec.parameters} == {
        "lr",
        "weight_decay",
        "epochs",
        "freeze_epochs",
        "mixup_alpha",  # a TrainConfig field (the recipe's); augment_strength is not one: left out
    }
    assert job.trial_job_spec.worker_pool_specs[0].container_spec.image_uri == TPU_IMAGE
    assert job.trial_job_spec.service_account == "{{$.pipeline_service_account}}"
    assert (job.max_trial_count, job.parallel_trial_count) == (8, 2)


def test_run_local_with_tune_picks_the_best_trial_and_evaluates_it(tmp_path):
    """One kfp.local run: the tune step searches 3 trials with optuna; the best trial's model (its model.json
    recording the trial) is the candidate evaluate and promote take; the report shows the trials."""
    from tpustream.pipelines.local import run_local

    from tpustream.release import promote

    source = tmp_path / "images"
    digit_images(source, 0, 300)
    space = tmp_path / "space.yaml"
    space.write_text(
        "max_trials: 3\nmin_trials: 2\nparameters:\n  lr: {min: 0.05, max: 0.3, scale: log}\n"
        "  weight_decay: {min: 1.0e-5, max: 1.0e-3, scale: log}\n"
    )
    run = run_local(
        root=str(tmp_path / "run"), log_path=str(tmp_path / "run.log"), tune=True, tune_space=str(space),
        source=str(source), num_shards=4, shards_per_task=4, model_name="tiny", epochs=2, batch_size=16,
        bf16=False, workers=2, pretrained="",
    )  # fmt: skip
    assert run.data == "train" and run.outcome is not None, Path(tmp_path / "run.log").read_text()[-3000:]
    (model,) = Path(run.pipeline_root).glob("tpustream-training-*/tune-model/model")
    tuning = json.loads((model / "tuning.json").read_text())
    finished = [t for t in tuning["trials"] if t["state"] == "complete"]
    assert len(tuning["trials"]) == 3 and tuning["best"] == max(finished, key=lambda t: t["metric"])["id"]
    card = json.loads((model / "model.json").read_text())
    assert card["tuning"]["trial"] == tuning["best"] and card["tuning"]["engine"] == "optuna"
    assert card["metrics"]["val_top1"] == max(t["metric"] for t in finished)
    assert not (model / "checkpoints").exists()  # the trial's model, not its training state
    if run.outcome.decision == "promoted":
        champion = promote.champion_status(run.registry).champion
        promoted = Path(promote.version_uri(run.registry, champion.version), "model.json")
        assert json.loads(promoted.read_text())["tuning"]["trial"] == tuning["best"]
    page = Path(run.report).read_text()
    assert '<section id="tuning">' in page and '<tr class="best">' in page


def test_pipeline_compile_tune_compiles_the_tuning_job_in_place_of_the_train_step(tmp_path):
    from typer.testing import CliRunner

    from tpustream.cli import app

    path = tmp_path / "tune.yaml"
    args = ["pipeline", "compile", "--output", str(path), "--tpu", "v5e-16", "--image", CPU_IMAGE]
    result = CliRunner().invoke(app, [*args, "--tpu-image", TPU_IMAGE, "--tune"])
    assert result.exit_code == 0, result.output
    assert "tuning job (Vizier) in place of the train step" in result.output
    tasks = _tasks(yaml.safe_load(path.read_text()))
    assert {"plan-tuning", "hyperparameter-tuning-job", "pick-trial"} <= set(
        tasks
    ) and "train-model" not in tasks
    plain = tmp_path / "plain.yaml"
    assert CliRunner().invoke(app, [*args, "--output", str(plain), "--tpu-image", TPU_IMAGE]).exit_code == 0
    assert "train-model" in _tasks(yaml.safe_load(plain.read_text()))  # off by default
