"""The KFP DAG: compiled YAML for several TPU types, submit/schedule through the real aiplatform
client to a recording endpoint, and the whole pipeline run locally through kfp.local."""

import json
import logging
import os
from pathlib import Path

import pytest
import yaml
from tpustream.pipelines.compile import compile_pipeline
from tpustream.pipelines.submit import schedule_pipeline, submit_pipeline
from tpustream.pipelines.tpu import TPU_TYPES

from tests.common.sources import digit_images
from tests.fakes.webhook_receiver import WebhookReceiver
from tpustream import components
from tpustream.release import promote

pytestmark = pytest.mark.integration


DIGEST = "@sha256:" + "b" * 64
CPU_IMAGE = "europe-docker.pkg.dev/proj/tpustream/cpu" + DIGEST
TPU_IMAGE = "europe-docker.pkg.dev/proj/tpustream/tpu" + DIGEST


def _compiled(tmp_path, tpu):
    path = str(tmp_path / f"pipeline-{tpu}.yaml")
    compile_pipeline(path, tpu=tpu, cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE)
    with open(path) as f:
        return yaml.safe_load(f), open(path).read()


def _all_tasks(spec):
    tasks = dict(spec["root"]["dag"]["tasks"])
    for component in spec["components"].values():
        tasks.update(component.get("dag", {}).get("tasks", {}))
    return tasks


def _join_step_inputs(job, resource_name):
    """The join-experiment task's inputs in the run ``job`` (a PipelineJob body), resolved as Vertex does:
    pipeline parameters and the placeholders GCPC and kfp document (tests/fakes/vertex/emulation.py)."""
    tasks = _all_tasks(job["pipelineSpec"])
    task = tasks["join-experiment"]
    # only a run with an experiment gets the step ("" joins nothing)
    gate = next(t for t in tasks.values() if t.get("taskInfo", {}).get("name") == "experiment-requested")
    assert (
        gate["triggerPolicy"]["condition"] == "inputs.parameter_values['pipelinechannel--experiment'] != ''"
    )
    _, project, _, location, _, job_id = resource_name.split("/")
    placeholders = {
        "{{$.pipeline_google_cloud_project_id}}": project,
        "{{$.pipeline_google_cloud_location}}": location,
        "{{$.pipeline_job_uuid}}": job_id,
    }
    values = {}
    for name, value in task["inputs"]["parameters"].items():
        if "componentInputParameter" in value:  # the experiment-requested condition passes it through
            values[name] = job["runtimeConfig"]["parameterValues"][
                value["componentInputParameter"].removeprefix("pipelinechannel--")
            ]
        else:
            values[name] = placeholders.get(
                value["runtimeValue"]["constant"], value["runtimeValue"]["constant"]
            )
    return values


def _worker_pools(spec):
    train = _all_tasks(spec)["train-model"]
    return train["inputs"]["parameters"]["worker_pool_specs"]["runtimeValue"]["constant"]


def test_dag_structure_no_caching_no_installs_and_parameters(tmp_path):
    spec, text = _compiled(tmp_path, None)
    # the whole DAG runs inside the exit handler whose exit task is the webhook step (issue 35, item 5)
    assert set(spec["root"]["dag"]["tasks"]) == {"exit-handler-1", "notify-webhook"}
    root_tasks = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    (experiment,) = set(root_tasks) - {"check-source", "condition-2"}  # and nothing else at the top
    assert root_tasks[experiment]["taskInfo"]["name"] == "experiment-requested"
    assert "dependentTasks" not in root_tasks[experiment]  # joins at the run's start
    tasks = _all_tasks(spec)
    assert tasks["join-experiment"]["inputs"]["parameters"]["pipeline_job_id"]["runtimeValue"] == {
        "constant": "{{$.pipeline_job_uuid}}"
    }
    assert {"plan-shards", "for-loop-3", "finalize-shards", "check-data", "train-model", "evaluate-model",
            "promote-model", "write-shards", "condition-4"} <= set(tasks)  # fmt: skip
    assert (
        root_tasks["condition-2"]["triggerPolicy"]["condition"]
        == "inputs.parameter_values['pipelinechannel--check-source-Output'] == 'train'"
    )
    assert set(tasks["finalize-shards"]["dependentTasks"]) == {"for-loop-3"}
    assert tasks["check-data"]["dependentTasks"] == ["finalize-shards"]
    assert sorted(tasks["train-model"]["dependentTasks"]) == [
        "check-data",
        "finalize-shards",
        "resolve-weights",
    ]
    # --pretrained's named weights are fetched once, by a CPU step, and the TPU job gets that step's SPEC
    assert tasks["train-model"]["inputs"]["parameters"]["pretrained"]["taskOutputParameter"] == {
        "outputParameterKey": "Output", "producerTask": "resolve-weights"}  # fmt: skip
    assert "dependentTasks" not in tasks["resolve-weights"]  # beside the shard writers, not after them
    assert "train-model" in tasks["evaluate-model"]["dependentTasks"]
    # Promotion waits for the candidate's validation in the serving container, and takes its report
    assert "validate-serving" in tasks["promote-model"]["dependentTasks"]
    assert tasks["promote-model"]["inputs"]["artifacts"]["validation"]["taskOutputArtifact"] == {
        "outputArtifactKey": "validation", "producerTask": "validate-serving"}  # fmt: skip
    # No task is ever served from KFP's cache: the source URI never changes between scheduled runs,
    # and whether there is new data is the check step's fingerprint's decision (tpustream/run/new_data.py).
    assert all(t.get("cachingOptions", {}).get("enableCache") is not True for t in tasks.values())
    assert all(t["cachingOptions"] == {} for t in tasks.values() if "componentRef" in t and
               not t["componentRef"]["name"].startswith(("comp-condition", "comp-for-loop", "comp-exit-handler")))  # fmt: skip
    assert tasks["train-model"]["retryPolicy"]["maxRetryCount"] == 2
    assert tasks["write-shards"]["retryPolicy"]["maxRetryCount"] == 2
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["pretrained"]["defaultValue"] == "DEFAULT"  # a pipeline run fine-tunes (issue 33, item 6)
    assert {"registry", "source", "datasets_root", "model_name", "epochs", "retrain", "metric"} <= set(params)
    executors = spec["deploymentSpec"]["executors"].values()
    assert {e["container"]["image"] for e in executors} == {CPU_IMAGE}
    # No step installs anything at run time: the images carry kfp (install_kfp_package=False).
    assert "pip install" not in text and "ensurepip" not in text
    assert "serviceAccount" not in text and "credentials" not in text.lower()
    promote_inputs = tasks["promote-model"]["inputs"]["parameters"]  # the run's own project and region
    assert promote_inputs["project"]["runtimeValue"]["constant"] == "{{$.pipeline_google_cloud_project_id}}"
    assert promote_inputs["location"]["runtimeValue"]["constant"] == "{{$.pipeline_google_cloud_location}}"


def test_the_validate_step_runs_in_the_serving_image(tmp_path):
    serve = "europe-west4-docker.pkg.dev/proj/tpustream/serve@sha256:" + "d" * 64
    path = str(tmp_path / "pipeline.yaml")
    compile_pipeline(path, tpu="v5e-4", cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE, serve_image=serve)
    with open(path) as f:
        spec = yaml.safe_load(f)
    images = {name: e["container"]["image"] for name, e in spec["deploymentSpec"]["executors"].items()}
    assert images["exec-validate-serving"] == serve
    others = {image for name, image in images.items() if name != "exec-validate-serving"}
    assert serve not in others and CPU_IMAGE in others
    with pytest.raises(ValueError, match="--serving-image"):
        compile_pipeline(path, tpu=None, cpu_image=CPU_IMAGE, serve_image="PROJECT/serve:latest")


@pytest.mark.parametrize("tpu", ["v2-8", "v3-8", "v5e-4", "v5e-16", "v6e-8", "v6e-32"])
def test_tpu_job_is_one_pool_per_slice_as_the_pipeline_identity(tmp_path, tpu):
    from google.cloud import aiplatform_v1

    from tests.fakes.vertex import tpu_job_hosts

    spec, text = _compiled(tmp_path, tpu)
    expected = TPU_TYPES[tpu]
    (pool,) = _worker_pools(spec)  # one pool, whatever the number of hosts
    assert pool["replica_count"] == 1
    assert pool["machine_spec"] == expected.machine_spec()
    assert pool["container_spec"]["image_uri"] == TPU_IMAGE
    assert pool["container_spec"]["command"] == [
        "python3",
        "-m",
        "kfp.dsl.executor_main",
    ]  # Python gets SIGTERM
    # What Vertex will receive parses as a CustomJob and passes its TPU rules, on as many hosts as the table says.
    from tests.fakes.vertex.emulation import protojson as _protojson

    body = {"display_name": "t", "job_spec": {"worker_pool_specs": [_protojson(pool)]}}
    job = aiplatform_v1.CustomJob(body)
    assert tpu_job_hosts(json.loads(aiplatform_v1.CustomJob.to_json(job))) == expected.hosts
    inputs = spec["components"]["comp-train-model"]["inputDefinitions"]["parameters"]
    assert inputs["service_account"]["defaultValue"] == "{{$.pipeline_service_account}}"
    assert inputs["network"]["defaultValue"] == "{{$.pipeline_network}}"
    assert inputs["restart_job_on_worker_restart"]["defaultValue"] is True
    assert "pip install" not in text


def _resources(spec, task):
    """The compiled ``container.resources`` of ``task``'s executor (None: none set)."""
    from tests.fakes.vertex.emulation import find_task

    component = spec["components"][find_task(spec, task)["componentRef"]["name"]]
    return spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"].get("resources")


def _limits(cpu, memory_gb, cpu_text, memory_text):
    # kfp 2.17 compiles a constant limit twice: the numeric field Vertex documents (CPUs, GB) and the string
    return {"cpuLimit": cpu, "memoryLimit": memory_gb, "resourceCpuLimit": cpu_text,
            "resourceMemoryLimit": memory_text}  # fmt: skip


@pytest.mark.parametrize("tpu", [None, "v5e-16"])
def test_every_cpu_step_compiles_explicit_cpu_and_memory_limits(tmp_path, tpu):
    """Issue "Evaluation sized for real data": no CPU step is left to Vertex's default machine, evaluate
    gets its own larger size, and the train task (GCPC's launcher of the TPU job) gets none."""
    from tpustream.pipelines.resources import CPU_STEPS

    spec, _ = _compiled(tmp_path, tpu)
    tasks = _all_tasks(spec)
    containers = {name for name, t in tasks.items() if not t["componentRef"]["name"].startswith(
        ("comp-condition", "comp-for-loop", "comp-exit-handler"))}  # fmt: skip
    assert containers - {"train-model"} == set(CPU_STEPS)  # a new CPU step must be sized here too
    for task in CPU_STEPS:
        expected = (
            _limits(16.0, 64.0, "16", "64G") if task == "evaluate-model" else _limits(4.0, 16.0, "4", "16G")
        )
        assert _resources(spec, task) == expected, task
    assert _resources(spec, "train-model") is None


def test_step_sizes_flow_from_the_compile_command_into_the_yaml(tmp_path):
    from tpustream.pipelines.resources import CPU_STEPS
    from typer.testing import CliRunner

    from tpustream.cli.main import app

    path = tmp_path / "p.yaml"
    result = CliRunner().invoke(app, [
        "pipeline", "compile", "--output", str(path), "--tpu", "v5e-8", "--image", CPU_IMAGE,
        "--tpu-image", TPU_IMAGE, "--step-cpu", "2", "--step-memory", "8G", "--eval-cpu", "32",
        "--eval-memory", "128G",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "evaluate 32 CPU 128G" in result.output
    spec = yaml.safe_load(path.read_text())
    assert _resources(spec, "evaluate-model") == _limits(32.0, 128.0, "32", "128G")
    for task in set(CPU_STEPS) - {"evaluate-model"}:
        assert _resources(spec, task) == _limits(2.0, 8.0, "2", "8G"), task
    # Millicores and megabytes compile as kfp converts them (CPUs, decimal GB)
    from tpustream.pipelines.resources import StepResources

    sizes = StepResources(cpu="500m", memory="512M", eval_cpu="8", eval_memory="30G")
    compile_pipeline(str(path), tpu=None, cpu_image=CPU_IMAGE, resources=sizes)
    spec = yaml.safe_load(path.read_text())
    assert _resources(spec, "check-source") == _limits(0.5, 0.512, "500m", "512M")
    assert _resources(spec, "evaluate-model") == _limits(8.0, 30.0, "8", "30G")


@pytest.mark.parametrize(
    ("sizes", "flag"),
    [
        ({"eval_cpu": "97"}, "--eval-cpu"),  # Vertex gives a step at most 96 CPUs
        ({"cpu": "four"}, "--step-cpu"),
        ({"cpu": "0"}, "--step-cpu"),
        ({"eval_memory": "625G"}, "--eval-memory"),  # ... and at most 624 GB
        ({"memory": "16Gi"}, "--step-memory"),  # Vertex documents K, M and G only
        ({"memory": "16GB"}, "--step-memory"),
    ],
)
def test_step_sizes_vertex_would_not_give_are_refused_before_compiling(tmp_path, sizes, flag):
    from tpustream.pipelines.resources import StepResources

    with pytest.raises(ValueError, match=flag):
        compile_pipeline(
            str(tmp_path / "p.yaml"), tpu=None, cpu_image=CPU_IMAGE, resources=StepResources(**sizes)
        )
    assert not (tmp_path / "p.yaml").exists()


def test_compile_refuses_placeholder_images(tmp_path):
    with pytest.raises(ValueError, match="--image"):
        compile_pipeline(str(tmp_path / "p.yaml"), tpu=None, cpu_image="")
    with pytest.raises(ValueError, match="--tpu-image"):
        compile_pipeline(str(tmp_path / "p.yaml"), tpu="v3-8", cpu_image=CPU_IMAGE,
                         tpu_image="us-docker.pkg.dev/PROJECT/tpustream/tpu:latest")  # fmt: skip
    assert not (tmp_path / "p.yaml").exists()


TENSORBOARD = "projects/proj/locations/europe-west4/tensorboards/4242"
EXPERIMENT = "tpustream-resnet50"


def _calls(requests):
    """(method, path under the location) of each recorded request."""
    return [
        (r["method"], r["path"].removeprefix("/v1/projects/proj/locations/europe-west4")) for r in requests
    ]


def test_submit_and_schedule_through_aiplatform(tmp_path, gcs_bucket, monkeypatch):
    """Also issue 26: --tensorboard as the run's parameter, --experiment through aiplatform's own
    submit(experiment=...) for a run, and for a schedule the parameter its runs join with
    (tpustream/vertex/experiments.py), proved by a run Vertex's scheduler makes from the schedule's body."""
    from google.cloud import aiplatform, aiplatform_v1
    from google.cloud.aiplatform.utils import gcs_utils

    from tests.fakes.vertex import VertexRecorder, schedule_tick, validate_body
    from tpustream.vertex.experiments import join_experiment

    # Patched: PipelineJob.submit checks the pipeline-root bucket's owner through Cloud Resource
    # Manager, a Google service that cannot be reached from here (it would retry for a minute).
    checked = []
    monkeypatch.setattr(
        gcs_utils, "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist",
        lambda output_artifacts_gcs_dir=None, **kw: checked.append(output_artifacts_gcs_dir) or output_artifacts_gcs_dir,
    )  # fmt: skip
    template = str(tmp_path / "p.yaml")
    compile_pipeline(template, tpu="v3-8", cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE)
    recorder = VertexRecorder()
    source = f"{gcs_bucket}/images"
    try:
        root = f"{gcs_bucket}/pipeline-root"
        name = submit_pipeline(
            template, project="proj", region="europe-west4", pipeline_root=root,
            parameters={"registry": f"{gcs_bucket}/registry", "source": source, "epochs": 3},
            service_account="sa@proj.iam.gserviceaccount.com", labels={"team": "vision"}, no_cache=True,
            api_endpoint=recorder.url, skip_preflight=True,  # preflight: test_preflight.py
            tensorboard=TENSORBOARD, experiment=EXPERIMENT,
        )  # fmt: skip
        assert name.startswith("projects/proj/locations/europe-west4/pipelineJobs/")
        submitted = len(recorder.requests)
        schedule = schedule_pipeline(
            template, cron="0 3 * * 1", project="proj", region="europe-west4", pipeline_root=root,
            parameters={"registry": f"{gcs_bucket}/registry", "source": source},
            service_account="sa@proj.iam.gserviceaccount.com", api_endpoint=recorder.url, skip_preflight=True,
            tensorboard=TENSORBOARD, experiment=EXPERIMENT,
        )  # fmt: skip
        assert schedule.startswith("projects/proj/locations/europe-west4/schedules/")
        # A tick of the schedule: Vertex creates the run from the schedule's body; a step of it joins the
        # experiment its `experiment` parameter names, with what the placeholders resolve to on Vertex.
        run = recorder.scheduled_run(schedule)
        scheduled_at = len(recorder.requests)
        # the compiled join-experiment step, its inputs resolved as Vertex resolves them for this run
        monkeypatch.setenv("TPUSTREAM_VERTEX_ENDPOINT", recorder.url)
        joined = components.join_experiment(**_join_step_inputs(recorder.pipeline_jobs[run], run))
        step = dict(project="proj", location="europe-west4", api_endpoint=recorder.url)
        # the submitted run is in it already
        again = join_experiment(EXPERIMENT, pipeline_job_id=name.rsplit("/", 1)[1], **step)
        assert join_experiment("", pipeline_job_id="x", **step) is None
    finally:
        recorder.close()
        aiplatform.initializer.global_config.__init__()  # join_experiment's aiplatform.init: not for later tests
    assert recorder.rejected == []  # every body parsed as the aiplatform v1 proto Vertex would parse it
    jobs = [r for r in recorder.requests if r["method"] == "POST" and r["path"].endswith("/pipelineJobs")]
    assert len(jobs) == 1 and jobs[0]["path"] == "/v1/projects/proj/locations/europe-west4/pipelineJobs"
    assert checked and checked[0] == root
    assert jobs[0]["query"]["pipelineJobId"][0].startswith("tpustream-training-")
    body = jobs[0]["body"]
    assert body["serviceAccount"] == "sa@proj.iam.gserviceaccount.com" and body["labels"]["team"] == "vision"
    assert body["runtimeConfig"]["gcsOutputDirectory"] == root
    assert body["runtimeConfig"]["parameterValues"]["source"] == source
    schedules = [r for r in recorder.requests if r["method"] == "POST" and r["path"].endswith("/schedules")]
    assert len(schedules) == 1
    sbody = schedules[0]["body"]
    assert sbody["cron"] == "0 3 * * 1" and str(sbody["maxConcurrentRunCount"]) == "1"
    # A run still training at the next tick: the tick is skipped, not started beside it (nor queued).
    assert schedule_tick(sbody, active_runs=0) == "start"
    assert schedule_tick(sbody, active_runs=1) == "skip"
    started_only = {k: v for k, v in sbody.items() if k != "maxConcurrentActiveRunCount"}
    assert schedule_tick(started_only, active_runs=1) == "start"  # what max_concurrent_run_count alone did
    scheduled = sbody["createPipelineJobRequest"]["pipelineJob"]
    assert scheduled["serviceAccount"] == "sa@proj.iam.gserviceaccount.com"
    assert scheduled["runtimeConfig"]["parameterValues"]["source"] == source
    # Issue 26: the TensorBoard instance is the run's parameter, for the run and every scheduled run
    assert body["runtimeConfig"]["parameterValues"]["tensorboard"] == TENSORBOARD
    assert scheduled["runtimeConfig"]["parameterValues"]["tensorboard"] == TENSORBOARD
    # The experiment: got or created before the run, the run's context added to it after (aiplatform's
    # PipelineJob.submit(experiment=...)); every metadata body parsed as the v1 proto (the recorder's check)
    store = "projects/proj/locations/europe-west4/metadataStores/default"
    experiment = f"{store}/contexts/{EXPERIMENT}"
    calls = _calls(recorder.requests[:submitted])
    created = calls.index(("POST", "/metadataStores/default/contexts"))
    assert (
        created
        < calls.index(("POST", "/pipelineJobs"))
        < calls.index(("POST", f"/metadataStores/default/contexts/{EXPERIMENT}:addContextChildren"))
    )
    context = recorder.requests[created]
    assert context["query"]["contextId"] == [EXPERIMENT]
    validate_body(aiplatform_v1.Context, context["body"])
    assert context["body"]["schemaTitle"] == "system.Experiment"
    added = next(r for r in recorder.requests if r["path"].endswith(":addContextChildren"))
    validate_body(aiplatform_v1.AddContextChildrenRequest, added["body"])
    job_id = name.rsplit("/", 1)[1]
    assert added["body"] == {"childContexts": [f"{store}/contexts/{job_id}"]}  # the run's PipelineRun context
    # A schedule carries no experiment of its own: the name is its runs' `experiment` parameter, and the
    # experiment already exists when the schedule is made
    assert scheduled["runtimeConfig"]["parameterValues"]["experiment"] == EXPERIMENT
    assert "experiment" not in body["runtimeConfig"]["parameterValues"]  # submit joined through aiplatform
    scheduling = _calls(recorder.requests[submitted:scheduled_at])
    assert ("GET", f"/metadataStores/default/contexts/{EXPERIMENT}") in scheduling
    # ... and the scheduled run joined it from inside, once; the submitted run, already in it, was left as it was
    assert joined == again == experiment
    adds = [r["body"] for r in recorder.requests if r["path"].endswith(":addContextChildren")]
    assert adds == [added["body"], {"childContexts": [f"{store}/contexts/{run.rsplit('/', 1)[1]}"]}]
    for job in (name, run):
        run_context = recorder.contexts[f"{store}/contexts/{job.rsplit('/', 1)[1]}"]
        assert run_context["schemaTitle"] == "system.PipelineRun"
        assert run_context["parentContexts"] == [experiment]
    # No task of a scheduled run can be a cache hit, the source-reading check step least of all.
    for sent in (body, scheduled):
        tasks = _all_tasks(sent["pipelineSpec"])
        assert tasks["check-source"].get("cachingOptions", {}).get("enableCache") is not True
        assert all(t.get("cachingOptions", {}).get("enableCache") is not True for t in tasks.values())


def test_a_run_that_cannot_join_its_experiment_is_named_with_why(tmp_path, gcs_bucket, monkeypatch):
    """The run exists once Vertex accepted it: when adding it to the experiment is then refused, the error
    names the submitted run and the API's reason (one line on the CLI: ExperimentError)."""
    from google.cloud.aiplatform.utils import gcs_utils

    from tests.fakes.vertex import VertexRecorder
    from tpustream.vertex.experiments import ExperimentError

    monkeypatch.setattr(  # as in the test above: Resource Manager cannot be reached from here
        gcs_utils, "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist", lambda **kw: None
    )
    template = str(tmp_path / "p.yaml")
    compile_pipeline(template, tpu="v5e-4", cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE)
    recorder = VertexRecorder()
    recorder.deny_add_children = 1
    message = (
        r"submitted projects/proj/locations/europe-west4/pipelineJobs/tpustream-training-\d+, but it could not "
        r"join experiment 'tpustream-resnet50': .*Permission 'aiplatform.metadataStores.contexts.addContextChildren'"
    )
    try:
        with pytest.raises(ExperimentError, match=message):
            submit_pipeline(
                template,
                project="proj",
                region="europe-west4",
                pipeline_root=f"{gcs_bucket}/root",
                parameters={"registry": f"{gcs_bucket}/registry", "source": f"{gcs_bucket}/images"},
                api_endpoint=recorder.url,
                skip_preflight=True,
                experiment=EXPERIMENT,
            )
    finally:
        recorder.close()
    assert [r["path"].rsplit("/", 1)[1] for r in recorder.rejected] == [f"{EXPERIMENT}:addContextChildren"]


def test_the_recording_endpoint_rejects_what_vertex_would(tmp_path):
    """The validation that guards every test above can fail: a misspelt field, a two-pool TPU job, and a
    TensorBoard instance of another region or without the service account Vertex needs for it."""
    import requests

    from tests.fakes.vertex import VertexRecorder

    recorder = VertexRecorder()
    try:
        base = f"{recorder.url}/v1/projects/p/locations/l"
        bad = requests.post(
            f"{base}/pipelineJobs", json={"displayName": "x", "serviceAcount": "typo"}, timeout=10
        )
        pool = {"machineSpec": {"machineType": "ct5lp-hightpu-4t", "tpuTopology": "4x4"}, "replicaCount": "1",
                "containerSpec": {"imageUri": "i"}}  # fmt: skip
        two_pools = {
            "displayName": "x",
            "jobSpec": {"workerPoolSpecs": [pool, {**pool, "replicaCount": "3"}]},
        }
        bad_job = requests.post(f"{base}/customJobs", json=two_pools, timeout=10)
        no_topology = {"displayName": "x", "jobSpec": {"workerPoolSpecs": [
            {**pool, "machineSpec": {"machineType": "ct6e-standard-4t"}}]}}  # fmt: skip
        bad_topology = requests.post(f"{base}/customJobs", json=no_topology, timeout=10)
        one_pool = {"displayName": "x", "jobSpec": {"workerPoolSpecs": [pool]}}
        elsewhere = {
            **one_pool["jobSpec"],
            "tensorboard": "projects/p/locations/us-east1/tensorboards/1",
            "serviceAccount": "sa@p.iam.gserviceaccount.com",
        }
        other_region = requests.post(
            f"{base}/customJobs", json={**one_pool, "jobSpec": elsewhere}, timeout=10
        )
        unattached = {**one_pool["jobSpec"], "tensorboard": "projects/p/locations/l/tensorboards/1"}
        no_account = requests.post(f"{base}/customJobs", json={**one_pool, "jobSpec": unattached}, timeout=10)
    finally:
        recorder.close()
    assert bad.status_code == 400 and "serviceAcount" in bad.json()["error"]["message"]
    assert bad_job.status_code == 400 and "one worker pool" in bad_job.json()["error"]["message"]
    assert bad_topology.status_code == 400 and "tpuTopology" in bad_topology.json()["error"]["message"]
    assert (
        other_region.status_code == 400
        and "not in the job's region" in other_region.json()["error"]["message"]
    )
    assert no_account.status_code == 400 and "serviceAccount" in no_account.json()["error"]["message"]
    assert len(recorder.rejected) == 5


@pytest.mark.slow  # two whole kfp.local runs
def test_run_local_retrains_only_on_new_data(tmp_path, capsys):
    """A schedule's runs through the real kfp.local DAG: the first trains; the second, on an unchanged
    source, skips shards and training; after images are added, the third trains on a new dataset."""
    from tpustream.pipelines.local import run_local

    source = tmp_path / "images"
    digit_images(source, 0, 900)
    settings = dict(source=str(source), num_shards=8, shards_per_task=4, model_name="tiny", epochs=3, batch_size=16,
                    lr=0.2, bf16=False, workers=2)  # fmt: skip
    root = str(tmp_path / "run")
    handlers_before = logging.getLogger().handlers[:]
    first = run_local(root=root, **settings)
    registry = first.registry
    assert first.data == "train"
    assert (first.outcome.decision, first.outcome.reason) == ("promoted", "version 1")
    status = promote.champion_status(registry)
    assert status.ok and status.champion is not None and status.champion.version == 1
    assert status.champion.metrics["top1"] > 0.5
    assert {"model.pt", "model.json", "metrics.json"} <= set(os.listdir(promote.version_uri(registry, 1)))
    (dataset,) = os.listdir(os.path.join(registry, "datasets"))
    # Issue 26: the run report, promote's (the final decision), copied beside the run as a page
    page = Path(first.report).read_text()
    assert first.report.endswith(".html") and "Promoted as version 1" in page
    # curves, the candidate's confusion matrix (no champion to show beside it), per-class, the threshold curve
    # (from evaluate's per-sample scores), history; and the mistakes gallery's thumbnails
    assert page.count("data:image/svg+xml;base64,") == 5 and '<figure id="plot-thresholds">' in page
    assert '<section id="mistakes">' in page
    assert "No anomalies." in page  # the check-data step's report, in the page
    summary = Path(first.report).parent.parent / "pipeline-root"
    (summary,) = summary.glob("tpustream-training-*/promote-model/summary")
    assert "Promoted as version 1" in summary.read_text()

    def trained_models():
        return sorted(p for p, _, files in os.walk(first.pipeline_root) if "model.json" in files)

    assert len(trained_models()) == 1
    capsys.readouterr()
    log_path = str(tmp_path / "logs" / "second.log")
    with WebhookReceiver() as hook:  # stands in for Slack or Google Chat
        second = run_local(
            root=root, log_path=log_path, notify_webhook=hook.url, **settings
        )  # quiet, as `make demo`
    assert second.data == "skip"  # no new data: no shards, no training, nothing promoted
    (told,) = hook.bodies  # the exit step ran, as on Vertex, and said what the run did
    assert (
        told["state"] == "SUCCEEDED"
        and told["decision"] == "skipped"
        and "no new data since" in told["reason"]
    )
    assert second.report is None  # nothing trained: no report (the first run's stays as it was)
    printed = capsys.readouterr().out
    assert "no new data since" in printed and "check-source: SUCCESS" in printed
    assert "  training skipped: no new data since the last run" in printed  # condition-1, by what it means
    assert "experiment" not in printed  # an If that only says an option was not given: no line
    assert len(printed.splitlines()) <= 4 and "KFP Executor" not in printed
    assert "KFP Executor" in Path(log_path).read_text()  # the full executor log is in the file
    assert logging.getLogger().handlers == handlers_before  # kfp.local's per-task swaps leave nothing behind
    assert len(trained_models()) == 1 and os.listdir(os.path.join(registry, "datasets")) == [dataset]
    assert promote.champion_status(registry).champion == status.champion

    digit_images(source, 900, 1300)  # new images land in the bucket
    third = run_local(root=root, **settings)
    assert third.data == "train"
    datasets = sorted(os.listdir(os.path.join(registry, "datasets")))
    assert len(datasets) == 2 and dataset in datasets
    (new_dataset,) = set(datasets) - {dataset}
    models = trained_models()
    assert len(models) == 2
    cards = [json.loads(Path(m, "model.json").read_text()) for m in models]
    assert {c["dataset"]["uri"].rsplit("/", 1)[1] for c in cards} == {dataset, new_dataset}
    new_card = next(c for c in cards if c["dataset"]["uri"].endswith(new_dataset))
    assert sum(r["val_samples"] for r in new_card["history"][-1:]) > 0
    # init_from=champion (the default): the first run had no champion, the retraining run starts from it
    old_card = next(c for c in cards if c is not new_card)
    assert old_card["init"] is None
    assert new_card["init"]["kind"] == "champion" and new_card["init"]["weights"] == "all"
    assert new_card["init"]["resolved"] == os.path.join(promote.version_uri(registry, 1), "model.pt")
    # compile_cache=auto: one cache under the run's pipeline root, which the second training run found filled
    cache = os.path.join(first.pipeline_root, "xla-cache")
    assert old_card["compile_cache"]["uri"] == new_card["compile_cache"]["uri"] == cache and os.listdir(cache)
    assert old_card["compile_cache"]["misses"] > 0 and new_card["compile_cache"]["misses"] == 0
    manifest = json.loads(Path(registry, "datasets", new_dataset, "manifest.json").read_text())
    assert sum(split["num_samples"] for split in manifest["splits"].values()) == 1300


@pytest.mark.slow  # a whole kfp.local run
def test_a_candidate_refused_inside_the_pipeline_is_in_the_history_the_report_and_the_webhook(tmp_path):
    """Issue 42, items 3 and 4: evaluate refuses (a quality floor of 0.99) and the DAG skips promote, yet the
    refusal is a `refused` event in the registry's history, with its reason and numbers, once; the run's
    report shows it in its history and the majority-class baseline beside the candidate; the webhook
    carries both numbers."""
    from tpustream.pipelines.local import run_local

    from tpustream.registry.history import champion_history

    source = tmp_path / "images"
    digit_images(source, 0, 300)
    root = str(tmp_path / "run")
    with WebhookReceiver() as hook:
        run = run_local(
            root=root, log_path=str(tmp_path / "run.log"), source=str(source), num_shards=4, shards_per_task=4,
            model_name="tiny", epochs=1, batch_size=16, bf16=False, workers=2, min_metric=0.99,
            notify_webhook=hook.url,
        )  # fmt: skip
    assert run.data == "train" and run.outcome is not None and run.outcome.decision == "kept"
    assert "below the quality floor (--min-metric 0.99" in run.outcome.reason
    assert promote.champion_status(run.registry).champion is None  # nothing was promoted
    (refused,) = champion_history(run.registry)
    assert refused["event"] == "refused" and refused["reason"] == run.outcome.reason
    assert refused["metric"] == "top1" and refused["value"] == run.outcome.candidate_value
    assert refused["candidate"].endswith("/model") and refused["champion_version"] is None
    (metrics_json,) = Path(run.pipeline_root).glob(
        "tpustream-training-*/evaluate-model/evaluation/metrics.json"
    )
    evaluation = json.loads(metrics_json.read_text())
    baseline = evaluation["baseline"]
    counts = [len(os.listdir(source / str(digit))) for digit in range(10)]
    assert baseline["answer"] in [str(digit) for digit in range(10)] and 0 < baseline["top1"] < 0.2
    assert max(counts) / sum(counts) < 0.2  # digits: ten classes of about the same size
    page = Path(run.report).read_text()
    assert '<tr class="refused">' in page and "below the quality floor" in page
    assert f"always answering “{baseline['answer']}”" in page
    (told,) = hook.bodies
    assert told["decision"] == "kept" and told["metric"] == "top1"
    assert told["baseline_value"] == baseline["top1"] and told["candidate_value"] == refused["value"]
    assert f"(majority-class baseline {baseline['top1']:.4f})" in told["text"]


def test_test_fraction_reaches_every_shard_step(tmp_path):
    spec, _ = _compiled(tmp_path, None)
    assert spec["root"]["inputDefinitions"]["parameters"]["test_fraction"]["defaultValue"] == 0.0
    tasks = _all_tasks(spec)
    for name in ("check-source", "plan-shards", "write-shards", "finalize-shards"):
        (task,) = [t for key, t in tasks.items() if key.startswith(name)]
        wired = task["inputs"]["parameters"]["test_fraction"]["componentInputParameter"]
        assert wired.removeprefix("pipelinechannel--") == "test_fraction", name


def test_the_automatic_shard_count_follows_the_runs_workers(tmp_path):
    """``num_shards`` 0 (auto) gives every loader worker of every host a train shard: the compiled slice's
    hosts x the run's ``workers``, not the default 8 (issue 43, item 6). Every shard step takes both, so the
    check step's fingerprint, the plan and the writers agree; the plan step's own function, given what Vertex
    resolves for it from the compiled YAML, plans the bundled digits into that many train shards."""
    from types import SimpleNamespace

    path = str(tmp_path / "p.yaml")
    compile_pipeline(path, tpu="v5e-16", cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE)
    spec = yaml.safe_load(Path(path).read_text())
    tasks = _all_tasks(spec)
    for name in ("check-source", "plan-shards", "write-shards", "finalize-shards"):
        inputs = tasks[name]["inputs"]["parameters"]
        assert (
            inputs["loader_workers"]["componentInputParameter"].removeprefix("pipelinechannel--") == "workers"
        )
        assert inputs["train_hosts"]["runtimeValue"]["constant"] == 4  # v5e-16's hosts

    def planned_shards(workers: int) -> int:
        """The plan step run on what Vertex gives it for a run with ``--param workers=WORKERS``: pipeline
        parameters (the template's defaults otherwise) and compiled constants, typed as it declares them."""
        task = tasks["plan-shards"]
        declared = spec["components"][task["componentRef"]["name"]]["inputDefinitions"]["parameters"]
        defaults = {
            k: v.get("defaultValue") for k, v in spec["root"]["inputDefinitions"]["parameters"].items()
        }
        run = {**defaults, "workers": workers}
        values = {}
        for name, source in task["inputs"]["parameters"].items():
            if "componentInputParameter" in source:
                value = run[source["componentInputParameter"].removeprefix("pipelinechannel--")]
            else:
                value = source["runtimeValue"]["constant"]
            values[name] = int(value) if declared[name]["parameterType"] == "NUMBER_INTEGER" else value
        values["shards_per_task"] = 1  # one range per shard: the ranges count the shards
        ranges = components.plan_shards(**values, dataset=SimpleNamespace(uri=str(tmp_path / f"d{workers}")))
        return len(ranges)

    # train shards 4 hosts x workers (digits' ~1,600 train samples: far fewer than 2,000 a shard) + val shards,
    # about the train shards' size
    assert planned_shards(8) == 32 + 4
    assert planned_shards(2) == 8 + 1
    assert planned_shards(0) == 4 + 1  # loading in the train process: one per host
