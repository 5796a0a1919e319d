"""The tune switch run the way Vertex AI runs it (tests/fakes/vertex/): the plan step, GCPC's real
HyperparameterTuningJob launcher posting the job to the recording endpoint (checked against the aiplatform v1
proto and Vertex's rules), the job's trials run as Vertex runs them (tests/fakes/vertex/tuning.py: each trial's
values appended to its container's args, its metric read back from the cloudml-hypertune file), the pick step
reading the trials from the endpoint and handing the best trial's model on, and the evaluate step after it."""

import json
import shutil
from pathlib import Path

import pytest
from google.cloud.aiplatform_v1.types import HyperparameterTuningJob
from google.protobuf import json_format
from tpustream.pipelines.compile import compile_pipeline

from tests.fakes.vertex.emulation import VertexEmulator, run_container_task, task_outputs_of
from tpustream.dataset.plan import ShardConfig
from tpustream.dataset.write import create_shards
from tpustream.storage import io as storage

pytestmark = pytest.mark.integration

DIGEST = "@sha256:" + "c" * 64
CPU_IMAGE = "us-central1-docker.pkg.dev/proj/tpustream/cpu" + DIGEST
TPU_IMAGE = "us-central1-docker.pkg.dev/proj/tpustream/tpu" + DIGEST
SERVICE_ACCOUNT = "pipelines@proj.iam.gserviceaccount.com"
JOB_ID = "tpustream-training-20261102030000"  # the run's ID: the emulation's {{$.pipeline_job_uuid}}
SPACE = """max_trials: 2
parallel_trials: 1
parameters:
  lr: {min: 0.02, max: 0.5, scale: log}
  weight_decay: {min: 1.0e-5, max: 1.0e-3, scale: log}
"""


@pytest.mark.slow  # two trials of one epoch on XLA CPU and the steps around them: about two minutes
def test_the_tune_switch_on_vertex_runs_its_trials_and_hands_the_best_trials_model_to_evaluate(
    tmp_path, gcs_bucket, gcs_server
):
    """Issue 46 item 3: plan -> GCPC's HyperparameterTuningJob launcher -> the trials on the (v3-8) slice -> pick
    -> evaluate, each as Vertex runs it; check-data's report is a stand-in (the step is not under test)."""
    dataset = f"{gcs_bucket}/datasets/digits"
    create_shards(ShardConfig(source="digits", output=dataset, num_shards=8), progress=False)
    storage.write_bytes(f"{gcs_bucket}/space.yaml", SPACE.encode())
    run_root = f"{gcs_bucket}/run"
    params = {"registry": f"{gcs_bucket}/registry", "model_name": "tiny", "epochs": 1, "batch_size": 16,
              "bf16": False, "workers": 0, "pretrained": "", "tune_space": f"{gcs_bucket}/space.yaml"}  # fmt: skip
    template = str(tmp_path / "tune.yaml")
    compile_pipeline(template, tpu="v3-8", cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE, tune=True)
    emulator = VertexEmulator(env={"STORAGE_EMULATOR_HOST": gcs_server.url})
    step_env = {"STORAGE_EMULATOR_HOST": gcs_server.url, "TPUSTREAM_VERTEX_ENDPOINT": emulator.recorder.url}

    def step(task, workdir, **inputs):
        (tmp_path / workdir).mkdir()
        done = run_container_task(template, task, pipeline_params=params, run_root=run_root,
                                  workdir=tmp_path / workdir, env=step_env, timeout=300, **inputs)  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]
        return task_outputs_of(tmp_path / workdir)

    try:
        plan = step("plan-tuning", "plan", artifacts={"dataset": dataset},
                    task_outputs={"resolve-weights": {"Output": ""}})  # fmt: skip
        job_run = emulator.start_task(
            template, "hyperparameter-tuning-job", pipeline_params=params, artifacts={}, run_root=run_root,
            workdir=tmp_path, service_account=SERVICE_ACCOUNT, task_outputs={"plan-tuning": plan}, job_id=JOB_ID,
        )  # fmt: skip
        assert job_run.wait(timeout=400) == 0, job_run.logs()
        tuning_job = job_run.outputs()
        picked = step("pick-trial", "pick",
                      task_outputs={"hyperparameter-tuning-job": tuning_job, "plan-tuning": plan})  # fmt: skip
        data_check = f"{run_root}/check-data/report"  # what the check-data step hands evaluate: its Markdown
        storage.write_bytes(data_check, b"# Data check\n\nNo problem found.\n")
        evaluated = step("evaluate-model", "evaluate", artifacts={
            "model": f"{run_root}/pick-trial/model", "dataset": dataset, "data_check": data_check})  # fmt: skip
        # the run report evaluate wrote through KFP's executor (the artifact's gcsfuse path, /gcs on Vertex)
        (report,) = Path(f"/gcs/{gcs_bucket[len('gs://') :]}/run/evaluate-model").glob("report*")
        page = report.read_text()
        recorder = emulator.recorder
    finally:
        emulator.close()
        shutil.rmtree(
            f"/gcs/{gcs_bucket[len('gs://') :]}", ignore_errors=True
        )  # KFP's executor's gcsfuse paths
    assert recorder.rejected == []
    # The job as Vertex received it: proto-valid (unknown fields refused), the space's parameters, early stopping
    (created,) = [
        r
        for r in recorder.requests
        if r["method"] == "POST" and r["path"].endswith("/hyperparameterTuningJobs")
    ]
    job = HyperparameterTuningJob.pb(HyperparameterTuningJob())
    json_format.ParseDict(created["body"], job, ignore_unknown_fields=False)
    assert {p.parameter_id for p in job.study_spec.parameters} == {"lr", "weight_decay"}
    assert job.study_spec.HasField("decay_curve_stopping_spec")
    assert (job.max_trial_count, job.parallel_trial_count) == (2, 1)
    assert job.trial_job_spec.service_account == SERVICE_ACCOUNT
    (pool,) = job.trial_job_spec.worker_pool_specs
    assert pool.machine_spec.machine_type == "cloud-tpu" and pool.container_spec.image_uri == TPU_IMAGE
    base = f"{run_root}/{JOB_ID}/tune-job"
    assert job.trial_job_spec.base_output_directory.output_uri_prefix == base
    # Its trials, as the pick step read them from the endpoint: each ran with its own values, reported its metric
    job_name = json.loads(tuning_job["gcp_resources"])["resources"][0]["resourceUri"].split("/v1/", 1)[1]
    trials = recorder._tuning_job_json(job_name)["trials"]
    assert recorder.tuning_jobs[job_name]["state"] == "JOB_STATE_SUCCEEDED"
    assert [t["state"] for t in trials] == ["SUCCEEDED", "SUCCEEDED"], trials
    values = [{p["parameterId"]: p["value"] for p in t["parameters"]} for t in trials]
    assert values[0] != values[1]
    metric = {}
    for trial, trial_values in zip(trials, values, strict=True):
        (measurement,) = trial["measurements"]  # one epoch: one report, its step the epoch
        assert trial["finalMeasurement"] == measurement and measurement["stepCount"] == "1"
        metric[trial["id"]] = measurement["metrics"][0]["value"]
        card = json.loads(storage.read_text(f"{base}/{trial['id']}/model/model.json"))
        assert card["training"]["lr"] == pytest.approx(trial_values["lr"])  # the flag reached the trainer
        assert card["training"]["weight_decay"] == pytest.approx(trial_values["weight_decay"])
        assert card["metrics"]["val_top1"] == metric[trial["id"]]  # what it reported is what it measured
        assert f"--lr={trial_values['lr']!r}" in " ".join(
            recorder.jobs[trial["customJob"]]["body"]["jobSpec"]["workerPoolSpecs"][0]["containerSpec"][
                "args"
            ]
        )
    # The pick step chose the best trial and handed its model on as it trained: no retraining
    best = max(metric, key=lambda trial_id: (metric[trial_id], -int(trial_id)))
    candidate = f"{run_root}/pick-trial/model"
    card = json.loads(storage.read_text(f"{candidate}/model.json"))
    assert card["tuning"]["trial"] == best and card["tuning"]["engine"] == "vertex-vizier"
    assert storage.read_bytes(f"{candidate}/model.pt") == storage.read_bytes(f"{base}/{best}/model/model.pt")
    assert not storage.list_objects(f"{candidate}/checkpoints")
    assert json.loads(storage.read_text(f"{candidate}/tuning.json"))["best"] == best
    assert picked == {}  # pick_trial returns nothing: its outputs are the model and metrics artifacts
    # evaluate took that model: its report shows the search with the chosen trial; with no champion in the
    # registry its decision sends the candidate down the promote branch
    assert f"The candidate is trial {best}&#x27;s model as it trained (no retraining)" in page
    assert f'<tr class="best"><td>{best}</td>' in page
    assert evaluated["Output"] == "promote"
