"""The compiled pipeline's TPU train task, run the way Vertex AI runs it (tests/fakes/vertex/emulation.py):
GCPC's real launcher posts the CustomJob to the recording endpoint (validated against the aiplatform v1
proto and Vertex's TPU rules), and the job's one worker pool runs on every host of the slice, each host
a process on XLA CPU. Mocked: nothing but what tests/fakes/vertex/emulation.py says cannot run here (the
image is this venv; the hosts share one machine; the API host and polling interval in the launcher)."""

import io
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from google.cloud import aiplatform_v1
from google.protobuf import json_format
from tpustream.pipelines.compile import compile_pipeline
from tpustream.pipelines.submit import submit_pipeline
from tpustream.pipelines.tpu import TPU_TYPES, Capacity, capacity_kind

from tests.fakes.vertex.emulation import (
    VERTEX_DEFAULT_STEP_MACHINE,
    StepMachine,
    VertexEmulator,
    emulated_slice_vars,
    find_task,
    host_environment,
    signal_hosts,
    step_machine,
    wait_for,
)
from tpustream.dataset.plan import ShardConfig
from tpustream.dataset.write import create_shards
from tpustream.storage import io as storage

pytestmark = pytest.mark.integration

DIGEST = "@sha256:" + "a" * 64
CPU_IMAGE = "us-central1-docker.pkg.dev/proj/tpustream/cpu" + DIGEST
TPU_IMAGE = "us-central1-docker.pkg.dev/proj/tpustream/tpu" + DIGEST
SERVICE_ACCOUNT = "pipelines@proj.iam.gserviceaccount.com"
NETWORK = "projects/123/global/networks/training-vpc"
PARAMS = {"registry": "gs://unused/registry", "model_name": "tiny", "epochs": 2, "batch_size": 16, "lr": 0.2,
          "bf16": False, "workers": 0}  # fmt: skip
TENSORBOARD = "projects/proj/locations/us-central1/tensorboards/4242"
JOB_ID = "tpustream-training-20261102030000"  # the run's ID: VertexEmulator's {{$.pipeline_job_uuid}}


@pytest.fixture
def digits(gcs_bucket):
    dataset = f"{gcs_bucket}/datasets/digits"
    create_shards(ShardConfig(source="digits", output=dataset, num_shards=8), progress=False)
    return dataset


def _start(tmp_path, gcs_bucket, gcs_server, digits, tpu, **params):
    template = str(tmp_path / f"{tpu}.yaml")
    compile_pipeline(template, tpu=tpu, cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE)
    emulator = VertexEmulator(env={"STORAGE_EMULATOR_HOST": gcs_server.url})
    run = emulator.start_task(
        template, "train-model", pipeline_params={**PARAMS, **params}, artifacts={"dataset": digits},
        run_root=f"{gcs_bucket}/run", workdir=tmp_path, service_account=SERVICE_ACCOUNT, network=NETWORK,
        run_labels={"team": "vision"},
    )  # fmt: skip
    return template, emulator, run


def _event_files(prefix, local_dir):
    """The event files under ``prefix`` (copied into ``local_dir``): {file name: its scalars by tag}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = {}
    for obj in storage.list_objects(prefix):
        name = obj.uri.rsplit("/", 1)[1]
        if name.startswith("events.out.tfevents."):
            local = local_dir / name
            local.write_bytes(storage.read_bytes(obj.uri))
            events = EventAccumulator(str(local))
            events.Reload()
            found[name] = {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    return found


@pytest.mark.parametrize("tpu", ["v3-8", pytest.param("v5e-16", marks=pytest.mark.slow)])
def test_train_task_runs_on_every_host_of_the_slice_as_vertex_runs_it(
    tmp_path, gcs_bucket, gcs_server, digits, tpu
):
    hosts = TPU_TYPES[tpu].hosts
    # Issue 26: the slice's run names a TensorBoard instance; the single host's names none
    params = {"tensorboard": TENSORBOARD} if hosts > 1 else {}
    template, emulator, run = _start(tmp_path, gcs_bucket, gcs_server, digits, tpu, **params)
    try:
        assert run.wait(timeout=480) == 0, run.logs()
        recorder = emulator.recorder
    finally:
        emulator.close()
    assert run.exit_codes == [0] * hosts, run.logs()
    assert recorder.rejected == []
    # The CustomJob as Vertex received it: one pool, one replica, the slice's machine and topology,
    # run as the pipeline's service account in its network, with the run's labels.
    (created,) = [
        r["body"] for r in recorder.requests if r["method"] == "POST" and r["path"].endswith("/customJobs")
    ]
    (pool,) = created["jobSpec"]["workerPoolSpecs"]
    assert int(pool["replicaCount"]) == 1
    machine = pool["machineSpec"]
    assert machine["machineType"] == TPU_TYPES[tpu].machine_type
    assert machine.get("tpuTopology") == TPU_TYPES[tpu].topology
    assert pool["containerSpec"]["imageUri"] == TPU_IMAGE
    assert not any("pip install" in part for part in pool["containerSpec"]["command"])
    assert created["jobSpec"]["serviceAccount"] == SERVICE_ACCOUNT
    assert created["jobSpec"]["network"] == NETWORK
    assert created["labels"]["team"] == "vision" and created["labels"]["tpustream-step"] == "train"
    assert "vertex-ai-pipelines-run-billing-id" in created["labels"]
    # The job's TensorBoard instance (none when the run names none: GCPC's launcher drops the empty field),
    # and its base output directory under the run's pipeline root, from which Vertex sets
    # AIP_TENSORBOARD_LOG_DIR; the body parses as the v1 CustomJob
    job = aiplatform_v1.CustomJob.from_json(json.dumps(created))
    base = f"{gcs_bucket}/run/{JOB_ID}/train-job"
    assert job.job_spec.base_output_directory.output_uri_prefix == base
    assert job.job_spec.tensorboard == params.get("tensorboard", "")
    assert ("tensorboard" in created["jobSpec"]) == bool(params)
    # Only process 0 wrote event files there, with every epoch's scalars
    (events,) = _event_files(f"{base}/logs", tmp_path).items()
    name, scalars = events
    assert int(name.split(".")[-2]) == run.hosts[0].process.pid  # events.out.tfevents.TIME.HOST.PID.N
    assert len(scalars["epoch/val_top1"]) == PARAMS["epochs"] and scalars["epoch/train_loss"]
    # Only host 0 wrote: KFP's executor output (with the metrics), the model, the checkpoints.
    output = json.loads((run.workdir / "executor_output.json").read_text())
    assert output["artifacts"]["metrics"]["artifacts"][0]["metadata"]["val_top1"] > 0.3
    model_dir = f"{gcs_bucket}/run/train-model/model"
    names = {o.uri[len(model_dir) + 1 :] for o in storage.list_objects(model_dir)}
    assert {"model.pt", "model.json"} <= names and any(n.startswith("checkpoints/") for n in names)
    for host in run.hosts[1:]:
        log = host.log()
        assert "waiting for process 0" in log and not re.search(r"checkpoint gs://\S+ committed", log)
        assert "Wrote executor output file" not in log
    assert "Wrote executor output file" in run.hosts[0].log()
    assert re.search(r"checkpoint gs://\S+ committed", run.hosts[0].log())
    # compile_cache=auto: {{$.pipeline_root}}/xla-cache, resolved by Vertex; host 0 fills it, the others read it
    cache = f"{gcs_bucket}/run/xla-cache"
    assert storage.list_objects(cache)
    assert f"XLA compile cache {cache}: 0 entries, read-write" in run.hosts[0].log()
    assert all(f"XLA compile cache {cache}: 0 entries, read-only" in h.log() for h in run.hosts[1:])


@pytest.mark.slow
def test_the_readme_v5e_16_example_trains_with_the_pipelines_own_shard_and_worker_defaults(
    tmp_path, gcs_bucket, gcs_server
):
    """The shards the compiled pipeline writes by default (num_shards 0 = auto, with the slice's floor compiled
    into its shard steps) and its default 8 loader workers on each of v5e-16's 4 hosts: the job trains."""
    import yaml

    from tpustream.dataset.fanout import config_from_pipeline

    template = str(tmp_path / "p.yaml")
    compile_pipeline(template, tpu="v5e-16", cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE)
    spec = yaml.safe_load(Path(template).read_text())
    defaults = {k: v.get("defaultValue") for k, v in spec["root"]["inputDefinitions"]["parameters"].items()}
    assert defaults["num_shards"] == 0 and defaults["workers"] == 8
    hosts = find_task(spec, "check-source")["inputs"]["parameters"]["train_hosts"]["runtimeValue"]
    assert hosts["constant"] == 4  # x the run's 8 workers: 32 train shards
    dataset = f"{gcs_bucket}/datasets/auto"
    config = config_from_pipeline(source="digits", output=dataset, num_shards=int(defaults["num_shards"]),
                                  val_fraction=defaults["val_fraction"], upsample=1, seed=0,
                                  train_hosts=int(hosts["constant"]), loader_workers=int(defaults["workers"]))  # fmt: skip
    manifest, _ = create_shards(config, progress=False)
    assert len(manifest.splits["train"].shards) == 32
    emulator = VertexEmulator(env={"STORAGE_EMULATOR_HOST": gcs_server.url})
    params = {"registry": "gs://unused/registry", "model_name": "tiny", "epochs": 1, "bf16": False, "lr": 0.2}
    try:
        run = emulator.start_task(
            template, "train-model", pipeline_params=params, artifacts={"dataset": dataset},
            run_root=f"{gcs_bucket}/run", workdir=tmp_path, service_account=SERVICE_ACCOUNT,
        )  # fmt: skip
        assert run.wait(timeout=540) == 0, run.logs()
    finally:
        emulator.close()
    assert run.exit_codes == [0] * 4 and not run.restarts, run.logs()
    assert "no shard and stay idle" not in "".join(h.log() for h in run.hosts)


def test_submit_refuses_parameters_the_compiled_slice_cannot_train_on(tmp_path, gcs_bucket):
    """Before any credential, bucket or Vertex call: 2 train shards cannot feed v5e-16's 4 hosts."""
    from tests.fakes.vertex import VertexRecorder

    template = str(tmp_path / "p.yaml")
    compile_pipeline(template, tpu="v5e-16", cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE)
    recorder = VertexRecorder()
    try:
        with pytest.raises(
            ValueError, match=r"num_shards=2 cannot train on v5e-16 \(4 hosts\).*at least 4, 32"
        ):
            submit_pipeline(
                template, project="proj", region="us-central1", pipeline_root=f"{gcs_bucket}/root",
                parameters={"registry": f"{gcs_bucket}/r", "num_shards": 2}, api_endpoint=recorder.url,
            )  # fmt: skip
    finally:
        recorder.close()
    assert recorder.requests == []


def _host_env(gcs_server, *, hosts, index):
    """Host ``index`` of an emulated slice started by hand (not through a CustomJob), on the GCS server."""
    return {**host_environment(), **emulated_slice_vars(hosts), "STORAGE_EMULATOR_HOST": gcs_server.url,
            "TPU_WORKER_ID": str(index)}  # fmt: skip


def _train_cmd(digits, output, epochs, *extra):
    """`tpustream train` with the train task's PARAMS."""
    return [sys.executable, "-m", "tpustream.cli", "train", "--data", digits, "--output", output, "--model", "tiny",
            "--epochs", str(epochs), "--batch-size", "16", "--lr", "0.2", "--workers", "0", *extra]  # fmt: skip


def _reference_host0(tmp_path, gcs_server, digits, output, epochs):
    """Host 0 of the same 4-host slice trained without interruption: emulated hosts share no arrays, so
    its weights depend only on its own data slice and the seed (tpustream/xla_runtime.py)."""
    env = _host_env(gcs_server, hosts=4, index=0)
    done = subprocess.run(_train_cmd(digits, output, epochs), env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def _state_dict(uri):
    return torch.load(io.BytesIO(storage.read_bytes(uri)), map_location="cpu", weights_only=True)


@pytest.mark.slow  # minutes of XLA CPU across emulated hosts
def test_sigterm_to_one_host_stops_every_host_at_the_same_step_and_vertex_restarts_them_in_place(
    tmp_path, gcs_bucket, gcs_server, digits
):
    """Issue 12: a preemption notice on ONE host of four stops all four at the same step; process 0
    commits `last` there once. Then what Vertex does with a non-zero exit: it restarts the worker in place
    (restartJobOnWorkerRestart: every host), the restarted hosts resume from `last`, the job succeeds, and
    the weights are those of an uninterrupted run."""
    tpu, epochs = "v5e-16", 12
    _, emulator, run = _start(tmp_path, gcs_bucket, gcs_server, digits, tpu, epochs=epochs)
    model_dir = f"{gcs_bucket}/run/train-model/model"
    try:
        wait_for(run.hosts_started.is_set, 120, "the custom job's hosts")
        # mid-training on every host (emulated hosts are not in lockstep: under load one may lag)
        wait_for(
            lambda: all(f"epoch 1/{epochs}:" in h.log() for h in run.hosts), 300, "every host's first epoch"
        )
        signal_hosts(run, signal.SIGTERM, only=[2])
        wait_for(lambda: all(h.process.poll() is not None for h in run.hosts), 180, "the hosts to stop")
        assert [h.process.returncode for h in run.hosts] == [75] * 4, run.logs()
        logs = [h.log() for h in run.hosts]
        agreed = [re.findall(r"every host stops at step (\d+)", log) for log in logs]
        assert all(len(a) == 1 for a in agreed) and len({a[0] for a in agreed}) == 1, run.logs()
        stop = int(agreed[0][0])
        assert all(f"(step {stop}), stopping with every host: `last` written" in log for log in logs), (
            run.logs()
        )
        assert "SIGTERM: finishing the current step" in logs[2]
        assert all("another host was preempted" in logs[k] for k in (0, 1, 3)), run.logs()
        commits = re.findall(r"checkpoint (gs://\S+) committed", logs[0])
        assert not any(re.search(r"checkpoint gs://\S+ committed", log) for log in logs[1:])
        assert run.wait(timeout=480) == 0, run.logs()  # restarted in place: the job itself succeeds
    finally:
        emulator.close()
    (restarted,) = run.restarts
    assert [h.index for h in restarted] == [0, 1, 2, 3]  # every host, not only the one preempted
    assert [h.process.returncode for h in restarted] == [0] * 4
    resumed = restarted[0].log()
    assert f"resumed from {model_dir}/checkpoints/" in resumed, resumed
    assert len(commits) == len(set(commits))  # each checkpoint committed once, the stop's `last` included
    jobs = [
        r for r in emulator.recorder.requests if r["method"] == "POST" and r["path"].endswith("/customJobs")
    ]
    assert len(jobs) == 1  # no second job, no KFP retry: Vertex's own restart resumed it
    card = json.loads(storage.read_bytes(f"{model_dir}/model.json"))
    assert len(card["history"]) == epochs
    reference = f"{gcs_bucket}/reference-host0"
    _reference_host0(tmp_path, gcs_server, digits, reference, epochs)
    expected, got = _state_dict(f"{reference}/model.pt"), _state_dict(f"{model_dir}/model.pt")
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected), (
        "resumed weights differ from uninterrupted"
    )
    ref_card = json.loads(storage.read_bytes(f"{reference}/model.json"))
    assert [h["val_loss"] for h in ref_card["history"]] == [h["val_loss"] for h in card["history"]]


@pytest.mark.slow  # minutes of XLA CPU across emulated hosts
def test_a_kfp_retry_of_a_task_whose_job_failed_runs_a_new_job_that_resumes(
    tmp_path, gcs_bucket, gcs_server, digits
):
    """GCPC's launcher continues polling the job its gcp_resources output names (remote_runner.py), so a KFP
    retry that finds the failed job there would fail again at once. The compiled launcher forgets a job that
    ended without success: the retry creates a new CustomJob, which resumes from `last`."""
    tpu, epochs = "v5e-8", 6
    template = str(tmp_path / "p.yaml")
    compile_pipeline(template, tpu=tpu, cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE)
    # No in-place restarts or job retries left: the first job fails on the preemption (Vertex's limits spent)
    emulator = VertexEmulator(env={"STORAGE_EMULATOR_HOST": gcs_server.url}, worker_restarts=0, job_retries=0)
    task = dict(
        pipeline_params={**PARAMS, "epochs": epochs}, artifacts={"dataset": digits}, run_root=f"{gcs_bucket}/run",
        workdir=tmp_path, service_account=SERVICE_ACCOUNT,
    )  # fmt: skip
    model_dir = f"{gcs_bucket}/run/train-model/model"
    try:
        run = emulator.start_task(template, "train-model", **task)
        wait_for(run.hosts_started.is_set, 120, "the custom job's host")
        wait_for(lambda: f"epoch 2/{epochs}:" in run.hosts[0].log(), 300, "the second epoch")
        signal_hosts(run, signal.SIGTERM)
        assert run.wait(timeout=180) != 0, run.logs()  # the job failed, and with it the task
        assert run.exit_codes == [75]
        gcp_resources = run.workdir / "outputs" / "gcp_resources"
        failed_job = json.loads(gcp_resources.read_text())["resources"][0]["resourceUri"]
        retry = emulator.start_task(template, "train-model", retry_of=run, **task)
        assert retry.wait(timeout=480) == 0, retry.logs()
    finally:
        emulator.close()
    jobs = [
        r for r in emulator.recorder.requests if r["method"] == "POST" and r["path"].endswith("/customJobs")
    ]
    assert len(jobs) == 2  # a new job, not the failed one polled again
    assert "ended JOB_STATE_FAILED: this attempt creates a new CustomJob" in retry.launcher_log.read_text()
    assert json.loads(gcp_resources.read_text())["resources"][0]["resourceUri"] != failed_job
    assert "resumed from" in retry.hosts[0].log()
    assert len(json.loads(storage.read_bytes(f"{model_dir}/model.json"))["history"]) == epochs


def test_a_host_that_never_gets_the_agreement_times_out_with_a_clear_message(tmp_path, gcs_server, digits):
    """Hosts 0 and 1 of a 3-host slice run; host 2 never starts (a host lost with its VM). SIGTERM to
    host 1: both wait --preemption-sync-seconds for host 2's step, say so, and exit 75; process 0 commits
    `last` at its own step, so the retry resumes from there."""
    output = f"{digits.rsplit('/', 2)[0]}/lonely"
    cmd = _train_cmd(digits, output, 30, "--preemption-sync-seconds", "4")
    hosts = []
    for index in range(2):
        log = open(tmp_path / f"host-{index}.log", "wb")  # noqa: SIM115 (closed below)
        hosts.append((subprocess.Popen(cmd, env=_host_env(gcs_server, hosts=3, index=index), stdout=log,
                                       stderr=subprocess.STDOUT, cwd=tmp_path), log))  # fmt: skip
    try:
        wait_for(lambda: any("ckpt-e0001" in o.uri for o in storage.list_objects(f"{output}/checkpoints")),
                 300, "the first epoch's checkpoint")  # fmt: skip
        hosts[1][0].send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=120) for proc, _ in hosts]
    finally:
        for proc, log in hosts:
            if proc.poll() is None:
                proc.kill()
            log.close()
    logs = [(tmp_path / f"host-{i}.log").read_text() for i in range(2)]
    assert codes == [75, 75], logs
    for index, log in enumerate(logs):
        assert "host(s) 2 did not report their step within 4 s" in log, log
        assert f"host {index} stops at its own step" in log
        assert "without the slice's agreement" in log and "exit 75 (run again to resume)" in log
    own_step = int(re.search(r"host 0 stops at its own step (\d+)", logs[0]).group(1))
    assert json.loads(storage.read_bytes(f"{output}/checkpoints/last.json"))["global_step"] == own_step


def test_spot_on_a_single_host_tpu_reaches_the_custom_job_as_vertex_documents_it(tmp_path):
    """Spot, through GCPC's real launcher into a CustomJob the aiplatform v1 proto and Vertex's rules accept."""
    template = str(tmp_path / "p.yaml")
    capacity = Capacity(kind="spot", timeout="2d")
    compile_pipeline(template, tpu="v6e-8", cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE, capacity=capacity)
    emulator = VertexEmulator(run_hosts=False)
    try:
        run = emulator.start_task(
            template, "train-model", pipeline_params=PARAMS, artifacts={"dataset": "gs://b/datasets/d"},
            run_root="gs://b/run", workdir=tmp_path, service_account=SERVICE_ACCOUNT,
        )  # fmt: skip
        assert run.wait(timeout=120) == 0, run.logs()
    finally:
        emulator.close()
    assert emulator.recorder.rejected == []
    (job,) = [r["body"] for r in emulator.recorder.requests if r["path"].endswith("/customJobs")]
    parsed = aiplatform_v1.CustomJob.from_json(json.dumps(job))  # enums travel as numbers over REST
    scheduling = parsed.job_spec.scheduling
    assert scheduling.strategy.name == "SPOT"
    assert scheduling.timeout.total_seconds() == 172800
    assert scheduling.restart_job_on_worker_restart is True
    (pool,) = parsed.job_spec.worker_pool_specs
    assert (pool.machine_spec.machine_type, pool.machine_spec.tpu_topology) == ("ct6e-standard-8t", "2x4")


@pytest.mark.parametrize(
    ("tpu", "capacity", "rule"),
    [
        ("v6e-32", "spot", "Spot VMs with TPU Pods"),
        ("v5e-16", "spot", "Spot VMs with TPU Pods"),
        ("v5e-8", "flex-start", "requires GPUs"),
        ("v3-8", "flex-start", "requires GPUs"),
    ],
)
def test_capacity_vertex_does_not_offer_for_the_tpu_is_refused_at_compile_and_by_the_endpoint(
    tmp_path, tpu, capacity, rule
):
    """Refused before anything is written (naming the rule and its doc); and the recording endpoint refuses
    the same CustomJob, so these tests cannot drift from Vertex's rules again."""
    import requests
    from tpustream.pipelines.tpu import worker_pool_spec

    from tests.fakes.vertex import VertexRecorder

    template = tmp_path / "p.yaml"
    with pytest.raises(ValueError, match=rf"{rule}.*https://cloud.google.com/vertex-ai/docs/training/"):
        compile_pipeline(
            str(template), tpu=tpu, cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE, capacity=Capacity(kind=capacity)
        )
    assert not template.exists()
    pool = worker_pool_spec(TPU_TYPES[tpu], {"image_uri": TPU_IMAGE})
    body = {
        "displayName": "t",
        "jobSpec": {
            "workerPoolSpecs": [json_format.MessageToDict(aiplatform_v1.WorkerPoolSpec(**pool)._pb)],
            "scheduling": {"strategy": {"spot": "SPOT", "flex-start": "FLEX_START"}[capacity]},
        },
    }
    recorder = VertexRecorder()
    try:
        answer = requests.post(f"{recorder.url}/v1/projects/p/locations/us-central1/customJobs", json=body)
    finally:
        recorder.close()
    assert answer.status_code == 400 and rule.split()[0] in answer.text


def test_the_evaluate_step_asks_vertex_for_its_own_machine_and_no_cpu_step_for_the_default(tmp_path):
    """The compiled YAML read as Vertex reads a container task's limits (tests/fakes/vertex/emulation.py): evaluate
    asks for the evaluation size, every other CPU step for the step size, and none is left to Vertex's
    default e2-standard-4; a compile-time override reaches the machine."""
    import yaml
    from tpustream.pipelines.resources import CPU_STEPS, StepResources

    template = tmp_path / "p.yaml"
    compile_pipeline(str(template), tpu="v5e-16", cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE)
    spec = yaml.safe_load(template.read_text())
    assert step_machine(spec, "evaluate-model") == StepMachine(cpu=16.0, memory_gb=64.0)
    for task in set(CPU_STEPS) - {"evaluate-model"}:
        assert step_machine(spec, task) == StepMachine(cpu=4.0, memory_gb=16.0), task
        assert step_machine(spec, task) != VERTEX_DEFAULT_STEP_MACHINE  # explicit, not the default
    sizes = StepResources(cpu="2", memory="8G", eval_cpu="48", eval_memory="192G")
    compile_pipeline(str(template), tpu="v5e-16", cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE, resources=sizes)
    spec = yaml.safe_load(template.read_text())
    assert step_machine(spec, "evaluate-model") == StepMachine(cpu=48.0, memory_gb=192.0)
    assert step_machine(spec, "write-shards") == StepMachine(cpu=2.0, memory_gb=8.0)


def test_the_emulation_reads_the_default_machine_and_refuses_what_vertex_does_not_document(tmp_path):
    """What the check above relies on can fail: no limits is Vertex's default machine; a limit from a
    pipeline parameter (kfp compiles only the placeholder string) and one beyond 96 CPUs are refused."""
    import yaml
    from kfp import compiler, dsl

    @dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
    def step() -> None:
        pass

    @dsl.pipeline(name="sized")
    def sized(cpu: str = "8"):
        step().set_display_name("default")
        step().set_cpu_limit(cpu)
        step().set_cpu_limit("128").set_memory_limit("16G")

    template = tmp_path / "sized.yaml"
    compiler.Compiler().compile(sized, str(template))
    spec = yaml.safe_load(template.read_text())
    assert step_machine(spec, "step") == VERTEX_DEFAULT_STEP_MACHINE
    assert find_task(spec, "step-2")  # kfp names the second and third tasks step-2, step-3
    with pytest.raises(ValueError, match="pipeline parameter"):
        step_machine(spec, "step-2")
    with pytest.raises(ValueError, match="96 CPUs"):
        step_machine(spec, "step-3")


def test_capacity_options_are_checked_before_compiling():
    with pytest.raises(ValueError, match="--capacity"):
        Capacity(kind="preemptible")  # a kind from outside the type checker's sight (a config, a test)
    # the CLI's text becomes the Literal through one check, with the choices in its error
    assert capacity_kind("spot") == "spot"
    with pytest.raises(
        ValueError, match="--capacity 'preemptible': choose one of on-demand, spot, flex-start"
    ):
        capacity_kind("preemptible")
    with pytest.raises(ValueError, match="--timeout"):
        Capacity(timeout="tomorrow")
