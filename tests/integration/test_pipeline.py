"""The KFP DAG: compiled YAML for several TPU types, submit/schedule through the real aiplatform
client to a recording endpoint, and the whole pipeline run locally through kfp.local."""

import json
import os

import pytest
import yaml

from pipelines.submit import compile_pipeline, schedule_pipeline, submit_pipeline
from pipelines.training import TPU_TYPES
from tpustream import promote

pytestmark = pytest.mark.integration


def _compiled(tmp_path, tpu):
    path = str(tmp_path / f"pipeline-{tpu}.yaml")
    compile_pipeline(path, tpu=tpu, cpu_image="example.com/cpu:1", tpu_image="example.com/tpu:1")
    with open(path) as f:
        return yaml.safe_load(f), open(path).read()


def _worker_pools(spec):
    train = spec["components"]["comp-train-model"]["inputDefinitions"]["parameters"]
    return train["worker_pool_specs"]["defaultValue"]


def test_dag_structure_caching_and_parameters(tmp_path):
    spec, text = _compiled(tmp_path, None)
    tasks = spec["root"]["dag"]["tasks"]
    assert set(tasks) == {
        "plan-shards",
        "for-loop-1",
        "finalize-shards",
        "train-model",
        "evaluate-model",
        "condition-2",
    }
    assert set(tasks["finalize-shards"]["dependentTasks"]) == {"for-loop-1", "plan-shards"}
    assert tasks["train-model"]["dependentTasks"] == ["finalize-shards"]
    assert "train-model" in tasks["evaluate-model"]["dependentTasks"]
    assert (
        tasks["condition-2"]["triggerPolicy"]["condition"]
        == "inputs.parameter_values['pipelinechannel--evaluate-model-Output'] == 'promote'"
    )
    assert tasks["evaluate-model"]["cachingOptions"] == {}  # caching off: it reads the champion
    promote_task = spec["components"]["comp-condition-2"]["dag"]["tasks"]["promote-model"]
    assert promote_task["cachingOptions"] == {}
    assert tasks["train-model"]["retryPolicy"]["maxRetryCount"] == 2
    assert (
        spec["components"]["comp-for-loop-1"]["dag"]["tasks"]["write-shards"]["retryPolicy"]["maxRetryCount"]
        == 2
    )
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert {"registry", "source", "model_name", "epochs", "batch_size", "min_delta", "metric"} <= set(params)
    images = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
    assert images == {"example.com/cpu:1"}
    assert (
        "serviceAccount" not in text and "service_account" not in text and "credentials" not in text.lower()
    )


@pytest.mark.parametrize("tpu", ["v2-8", "v3-8", "v5e-4", "v5e-16"])
def test_tpu_machine_specs(tmp_path, tpu):
    spec, text = _compiled(tmp_path, tpu)
    expected = TPU_TYPES[tpu]
    pools = _worker_pools(spec)
    assert sum(int(p["replica_count"]) for p in pools) == expected.hosts  # one worker per host
    for pool in pools:
        machine = pool["machine_spec"]
        assert machine["machine_type"] == expected.machine_type
        assert machine["accelerator_type"] == expected.accelerator_type
        assert int(machine["accelerator_count"]) == expected.accelerator_count
        assert machine.get("tpu_topology") == expected.topology
        assert pool["container_spec"]["image_uri"] == "example.com/tpu:1"
    train = spec["components"]["comp-train-model"]["inputDefinitions"]["parameters"]
    assert train["restart_job_on_worker_restart"]["defaultValue"] is True
    assert spec["root"]["dag"]["tasks"]["train-model"]["retryPolicy"]["maxRetryCount"] == 2
    assert "service_account" not in json.dumps(pools)
    assert True  # resume=auto is the trainer's own default in the component


def test_submit_and_schedule_through_aiplatform(tmp_path, gcs_bucket, monkeypatch):
    from google.cloud.aiplatform.utils import gcs_utils

    from tests.vertex_fake import VertexRecorder

    # Patched: PipelineJob.submit checks the pipeline-root bucket's owner through Cloud Resource
    # Manager, a Google service that cannot be reached from here (it would retry for a minute).
    checked = []
    monkeypatch.setattr(
        gcs_utils, "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist",
        lambda output_artifacts_gcs_dir=None, **kw: checked.append(output_artifacts_gcs_dir) or output_artifacts_gcs_dir,
    )  # fmt: skip
    template = str(tmp_path / "p.yaml")
    compile_pipeline(template, tpu="v3-8")
    recorder = VertexRecorder()
    try:
        root = f"{gcs_bucket}/pipeline-root"
        name = submit_pipeline(
            template, project="proj", region="europe-west4", pipeline_root=root,
            parameters={"registry": f"{gcs_bucket}/registry", "epochs": 3}, service_account="sa@proj.iam.gserviceaccount.com",
            labels={"team": "vision"}, caching=False, api_endpoint=recorder.url,
        )  # fmt: skip
        assert name.startswith("projects/proj/locations/europe-west4/pipelineJobs/")
        schedule = schedule_pipeline(
            template, cron="0 3 * * 1", project="proj", region="europe-west4", pipeline_root=root,
            parameters={"registry": f"{gcs_bucket}/registry"}, service_account="sa@proj.iam.gserviceaccount.com",
            api_endpoint=recorder.url,
        )  # fmt: skip
        assert schedule.startswith("projects/proj/locations/europe-west4/schedules/")
    finally:
        recorder.close()
    jobs = [r for r in recorder.requests if r["method"] == "POST" and r["path"].endswith("/pipelineJobs")]
    assert len(jobs) == 1 and jobs[0]["path"] == "/v1/projects/proj/locations/europe-west4/pipelineJobs"
    assert checked and checked[0] == root
    assert jobs[0]["query"]["pipelineJobId"][0].startswith("tpustream-training-")
    body = jobs[0]["body"]
    assert body["serviceAccount"] == "sa@proj.iam.gserviceaccount.com" and body["labels"]["team"] == "vision"
    assert body["runtimeConfig"]["gcsOutputDirectory"] == root
    assert body["runtimeConfig"]["parameterValues"] == {"registry": f"{gcs_bucket}/registry", "epochs": 3}
    tasks = body["pipelineSpec"]["root"]["dag"]["tasks"]
    assert all(t.get("cachingOptions", {}).get("enableCache") in (None, False) for t in tasks.values())
    schedules = [r for r in recorder.requests if r["method"] == "POST" and r["path"].endswith("/schedules")]
    assert len(schedules) == 1
    sbody = schedules[0]["body"]
    assert sbody["cron"] == "0 3 * * 1" and str(sbody["maxConcurrentRunCount"]) == "1"
    assert (
        sbody["createPipelineJobRequest"]["pipelineJob"]["serviceAccount"]
        == "sa@proj.iam.gserviceaccount.com"
    )


def test_run_local_end_to_end_then_no_promotion_without_improvement(tmp_path):
    from pipelines.local import run_local

    settings = dict(source="digits", num_shards=8, shards_per_task=4, model_name="tiny", epochs=6, batch_size=16,
                    lr=0.2, bf16=False, workers=2)  # fmt: skip
    out = run_local(root=str(tmp_path / "run"), **settings)
    status = promote.champion_status(out["registry"])
    assert status["ok"] and status["champion"]["version"] == 1
    assert status["champion"]["metrics"]["top1"] > 0.6
    version_dir = promote.version_uri(out["registry"], 1)
    assert {"model.pt", "model.json", "metrics.json"} <= set(os.listdir(version_dir))
    # the second run: same data and settings, so the candidate is not better -> the champion stays
    run_local(root=str(tmp_path / "run"), **settings)
    after = promote.champion_status(out["registry"])
    assert after["champion"]["version"] == 1 and after["champion"] == status["champion"]
    assert sorted(os.listdir(os.path.join(out["registry"], "versions"))) == ["1"]
