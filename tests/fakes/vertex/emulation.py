"""Run one task of a compiled pipeline YAML the way Vertex AI Pipelines runs it, here.

For a task compiled as a GCPC CustomJob (our TPU train step) that is:
1. resolve the task's inputs as the Vertex backend does: pipeline parameters, constants, the
   component's defaults, and the pipeline placeholders in them (``{{$.pipeline_service_account}}``,
   ``{{$.pipeline_network}}``, project, location: google_cloud_pipeline_components/_placeholders.py; kfp's
   ``{{$.pipeline_root}}`` and ``{{$.pipeline_job_uuid}}``), also inside a longer string (kfp documents
   ``dsl.PIPELINE_ROOT_PLACEHOLDER + '/tmp'`` as an input, kfp/dsl/__init__.py);
2. build the task's executor input (input and output artifacts with URIs under the run's root, the
   output file) and substitute it into the launcher container's arguments, JSON-escaped where the
   compiled YAML says ``{{$.json_escape[1]}}`` (google_cloud_pipeline_components/v1/custom_job/utils.py);
3. run GCPC's real launcher with those arguments (tests/fakes/vertex/gcpc_launcher_shim.py), with
   ``VERTEX_AI_PIPELINES_RUN_LABELS`` set as Vertex sets it for the launcher
   (container/v1/gcp_launcher/utils/gcp_labels_util.py), against the recording endpoint, which validates
   the CustomJob against the aiplatform v1 proto and Vertex's TPU rules;
4. run the CustomJob's one worker pool on every host of the slice: the pool's container command and
   args exactly as the launcher sent them, one process per host, each told it is host k of N through
   TPU_WORKER_ID / TPU_WORKER_HOSTNAMES (what a TPU VM host reads, torch_xla/_internal/tpu.py) plus the
   test-only TPUSTREAM_EMULATE_SLICE=1 (XLA CPU cannot span processes: tpustream/xla_runtime.py), and,
   for a job with a base output directory, the AIP_MODEL_DIR / AIP_CHECKPOINT_DIR / AIP_TENSORBOARD_LOG_DIR
   Vertex derives from it (aiplatform_v1 CustomJobSpec.base_output_directory).

What is not Vertex: the container image is this machine's venv (``python3`` on PATH is the venv's; the
images install the same package) and the repository root stands for the image's WORKDIR (it holds the
same kfp_config.ini and components/), and the hosts share one machine, so a slice is emulated in control
flow only (each host trains on its own data slice without a cross-host all-reduce).

For a plain container task (the CPU steps), ``step_machine`` reads what Vertex is asked for: the task's
CPU and memory limits from the compiled YAML, or Vertex's default machine without them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.fakes.vertex.recorder import VertexRecorder

ROOT = Path(__file__).resolve().parents[3]
_PARAM = re.compile(r"\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}")
_OUTPUT_PARAM_FILE = re.compile(r"\{\{\$\.outputs\.parameters\['([^']+)'\]\.output_file\}\}")


def find_task(spec: dict, task: str) -> dict:
    """The task named ``task`` anywhere in the DAG (inside conditions and loops too)."""
    for dag in [spec["root"]["dag"], *(c["dag"] for c in spec["components"].values() if "dag" in c)]:
        if task in dag["tasks"]:
            return dag["tasks"][task]
    raise KeyError(f"no task {task!r} in the compiled pipeline")


@dataclass(frozen=True)
class StepMachine:
    """What Vertex AI Pipelines is asked for when it runs a container task as a CustomJob ("Specify the
    machine configuration for a pipeline step"): ``cpu`` and ``memory_gb`` from the task's limits, or, with
    none, the documented default e2-standard-4 (4 vCPU, 16 GB). Which machine type Vertex then picks for
    explicit limits is its "closest match from the supported machine types", a rule it does not publish, so
    ``machine_type`` is named only for the default."""

    cpu: float
    memory_gb: float
    machine_type: str | None = None


VERTEX_DEFAULT_STEP_MACHINE = StepMachine(cpu=4.0, memory_gb=16.0, machine_type="e2-standard-4")
VERTEX_STEP_MAX_CPU, VERTEX_STEP_MAX_MEMORY_GB = 96, 624  # "at most 96 CPUs", "at most 624GB"


def step_machine(spec: dict, task: str) -> StepMachine:
    """The machine Vertex is asked for to run ``task`` of the compiled ``spec``, read from its executor's
    ``container.resources`` as Vertex reads them: the numeric ``cpuLimit`` / ``memoryLimit`` (CPUs, GB), the
    fields its documentation describes. A limit compiled from a pipeline parameter has only the
    ``resourceCpuLimit: '{{$.inputs.parameters[...]}}'`` form, which Vertex does not document resolving:
    refused here, as is a limit beyond what Vertex gives a step."""
    task_spec = find_task(spec, task)
    component = spec["components"][task_spec["componentRef"]["name"]]
    container = spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"]
    resources = container.get("resources")
    if not resources:
        return VERTEX_DEFAULT_STEP_MACHINE
    for numeric, text in (("cpuLimit", "resourceCpuLimit"), ("memoryLimit", "resourceMemoryLimit")):
        if numeric not in resources and "{{$" in str(resources.get(text, "")):
            raise ValueError(
                f"task {task}: {text} {resources[text]!r} comes from a pipeline parameter; Vertex AI "
                f"Pipelines documents only constant limits (the numeric {numeric})"
            )
    machine = StepMachine(
        cpu=float(resources.get("cpuLimit", VERTEX_DEFAULT_STEP_MACHINE.cpu)),
        memory_gb=float(resources.get("memoryLimit", VERTEX_DEFAULT_STEP_MACHINE.memory_gb)),
    )
    if not (0 < machine.cpu <= VERTEX_STEP_MAX_CPU and 0 < machine.memory_gb <= VERTEX_STEP_MAX_MEMORY_GB):
        raise ValueError(
            f"task {task}: {machine.cpu:g} CPU / {machine.memory_gb:g} GB is beyond what Vertex AI Pipelines "
            f"gives a step ({VERTEX_STEP_MAX_CPU} CPUs, {VERTEX_STEP_MAX_MEMORY_GB} GB)"
        )
    return machine


@dataclass
class Host:
    index: int
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@dataclass
class SliceRun:
    """One run of the task: the launcher's outcome and every host of the custom job it created."""

    workdir: Path
    hosts: list[Host] = field(default_factory=list)  # the job's first start
    hosts_started: threading.Event = field(default_factory=threading.Event)
    attempts: list[list[Host]] = field(default_factory=list)  # every start of the job (Vertex's job retries)
    restarts: list[list[Host]] = field(default_factory=list)  # hosts restarted in place after a non-zero exit
    launcher: subprocess.Popen | None = None
    launcher_log: Path | None = None
    executor_input: dict[str, Any] = field(default_factory=dict)
    trials: dict[str, list[Host]] = field(default_factory=dict)  # a tuning job's trials: id -> its hosts

    @property
    def exit_codes(self) -> list[int | None]:
        return [h.process.returncode for h in self.hosts]

    def wait(self, timeout: float) -> int:
        assert self.launcher is not None
        try:
            return self.launcher.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the task did not finish within {timeout:.0f} s:\n{self.logs()}") from None

    def kill(self) -> None:
        for proc in [h.process for h in self.hosts] + ([self.launcher] if self.launcher else []):
            if proc.poll() is None:
                proc.kill()

    def logs(self) -> str:
        parts = [f"--- launcher:\n{self.launcher_log.read_text()[-3000:]}" if self.launcher_log else ""]
        parts += [f"--- host {h.index} (exit {h.process.returncode}):\n{h.log()[-3000:]}" for h in self.hosts]
        parts += [
            f"--- trial {trial} host {h.index} (exit {h.process.returncode}):\n{h.log()[-3000:]}"
            for trial, hosts in self.trials.items()
            for h in hosts
        ]
        return "\n".join(parts)

    def outputs(self) -> dict[str, Any]:
        """The task's output parameters as the backend reads them: the executor output's ``parameterValues``
        (a lightweight component's) and the files named in ``outputs.parameters`` (a launcher's)."""
        found: dict[str, Any] = {}
        for name, spec in self.executor_input.get("outputs", {}).get("parameters", {}).items():
            if Path(spec["outputFile"]).exists():
                found[name] = Path(spec["outputFile"]).read_text()
        output = self.workdir / "executor_output.json"
        if output.exists():
            found.update(json.loads(output.read_text()).get("parameterValues", {}))
        return found


class VertexEmulator:
    """A recording Vertex endpoint whose CustomJobs run on emulated TPU hosts (see the module doc)."""

    def __init__(
        self, *, env: dict[str, str] | None = None, devices_per_host: int = 1, run_hosts: bool = True,
        worker_restarts: int = 5, job_retries: int = 3,
    ) -> None:  # fmt: skip
        self.env = env or {}
        self.devices_per_host = devices_per_host
        # What Vertex does with a worker that exits non-zero ("Understand the Vertex AI serverless training
        # service", Restart workers during the training job): restarts it at once on the same VM, up to 5
        # times, then retries the whole job up to 3 times before it fails.
        self.worker_restarts = worker_restarts
        self.job_retries = job_retries
        # run_hosts=False: the job succeeds as soon as Vertex accepted it (tests of the request alone)
        self.recorder = VertexRecorder(
            job_runner=self._run_hosts if run_hosts else None,
            trial_runner=self._run_trial if run_hosts else None,
        )
        self.current: SliceRun | None = None
        self.gcs_dirs: list[Path] = []

    def close(self) -> None:
        self.recorder.close()
        for path in self.gcs_dirs:  # what KFP's executor made under /gcs (gcsfuse's mount on Vertex)
            shutil.rmtree(path, ignore_errors=True)

    # -------------------------------------------------------------- the backend's part
    def start_task(
        self, template: str, task: str, *, pipeline_params: dict[str, Any], artifacts: dict[str, str],
        run_root: str, workdir: Path, project: str = "proj", location: str = "us-central1",
        service_account: str = "", network: str = "", run_labels: dict[str, str] | None = None,
        retry_of: SliceRun | None = None, job_id: str = "tpustream-training-20261102030000",
        task_outputs: dict[str, dict[str, Any]] | None = None,
    ) -> SliceRun:  # fmt: skip
        """Start ``task`` of the compiled ``template`` as Vertex would; returns at once (``.wait()``).
        ``retry_of``: a KFP retry of that run, whose output files (gcp_resources) it finds as they were.
        ``task_outputs``: the upstream tasks' output parameters, {task: ``SliceRun.outputs()``}."""
        spec = yaml.safe_load(Path(template).read_text())
        task_spec = find_task(spec, task)
        component = spec["components"][task_spec["componentRef"]["name"]]
        container = spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"]
        placeholders = {
            "{{$.pipeline_service_account}}": service_account, "{{$.pipeline_network}}": network,
            "{{$.pipeline_google_cloud_project_id}}": project, "{{$.pipeline_google_cloud_location}}": location,
            "{{$.pipeline_persistent_resource_id}}": "", "{{$.pipeline_encryption_key_name}}": "",
            "{{$.pipeline_root}}": run_root,  # kfp's dsl.PIPELINE_ROOT_PLACEHOLDER (train's compile cache)
            "{{$.pipeline_job_uuid}}": job_id,  # dsl.PIPELINE_JOB_ID_PLACEHOLDER: the run's ID on Vertex
        }  # fmt: skip
        params = self._parameters(spec, task_spec, component, pipeline_params, placeholders, task_outputs)
        workdir = (
            retry_of.workdir if retry_of else Path(tempfile.mkdtemp(prefix=f"vertex-{task}-", dir=workdir))
        )
        run = SliceRun(workdir=workdir)
        run.executor_input = self._executor_input(component, task, params, artifacts, run_root, workdir)
        args = [self._resolve(arg, params, run.executor_input) for arg in container["args"]]
        env = {**os.environ, "VERTEX_EMULATOR_URL": self.recorder.url, "PYTHONPATH": str(ROOT)}
        env["VERTEX_AI_PIPELINES_RUN_LABELS"] = json.dumps(
            {"vertex-ai-pipelines-run-billing-id": "1234567890", **(run_labels or {})}
        )
        # pipelines/tpu.py's FRESH_JOB_LAUNCHER or pipelines/steps.py's TUNING_JOB_LAUNCHER: GCPC's launcher
        assert container["command"][:3] == ["python3", "-u", "-c"], container["command"]
        run.launcher_log = workdir / ("launcher-retry.log" if retry_of else "launcher.log")
        self.current = run
        with open(run.launcher_log, "wb") as log:
            run.launcher = subprocess.Popen(
                [sys.executable, "-u", "-m", "tests.fakes.vertex.gcpc_launcher_shim", container["command"][3], *args],
                cwd=ROOT, env=env,
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        return run

    @staticmethod
    def _parameters(
        spec: dict, task_spec: dict, component: dict, pipeline_params: dict, placeholders: dict,
        task_outputs: dict[str, dict[str, Any]] | None = None,
    ) -> dict:  # fmt: skip
        root_params = spec["root"]["inputDefinitions"]["parameters"]
        upstream = task_outputs or {}  # a task whose outputs are not given: its input as if unconnected
        values: dict[str, Any] = {}
        for name, definition in component["inputDefinitions"].get("parameters", {}).items():
            source = task_spec.get("inputs", {}).get("parameters", {}).get(name)
            producer = (source or {}).get("taskOutputParameter", {})
            if producer.get("producerTask") in upstream:  # an upstream task's output, as it wrote it
                values[name] = upstream[producer["producerTask"]][producer["outputParameterKey"]]
            elif source and "componentInputParameter" in source:
                key = source["componentInputParameter"].removeprefix("pipelinechannel--")
                values[name] = pipeline_params.get(key, root_params.get(key, {}).get("defaultValue"))
            elif source and "runtimeValue" in source:
                values[name] = source["runtimeValue"]["constant"]
            elif "defaultValue" in definition:
                values[name] = definition["defaultValue"]
            elif definition.get("isOptional"):
                values[name] = {"STRUCT": {}, "LIST": []}.get(definition["parameterType"], "")
            if isinstance(values.get(name), str):
                for placeholder, value in placeholders.items():
                    values[name] = values[name].replace(placeholder, value)
        return values

    @staticmethod
    def _executor_input(component: dict, task: str, params: dict, artifacts: dict[str, str], run_root: str,
                        workdir: Path) -> dict:  # fmt: skip
        def artifact(name: str, definition: dict, uri: str) -> dict:
            schema = definition["artifactType"]["schemaTitle"]
            return {
                "artifacts": [{"name": name, "type": {"schemaTitle": schema}, "uri": uri, "metadata": {}}]
            }

        inputs = component["inputDefinitions"].get("artifacts", {})
        outputs = component.get("outputDefinitions", {}).get("artifacts", {})  # an exit task has none
        return {
            "inputs": {
                "parameterValues": params,
                "artifacts": {name: artifact(name, d, artifacts[name]) for name, d in inputs.items()},
            },
            "outputs": {
                "artifacts": {
                    name: artifact(name, d, f"{run_root}/{task}/{name}") for name, d in outputs.items()
                },
                "parameters": {
                    name: {"outputFile": str(workdir / "outputs" / name)}
                    for name in component.get("outputDefinitions", {}).get("parameters", {})
                },
                "outputFile": str(workdir / "executor_output.json"),
            },
        }

    @staticmethod
    def _resolve(arg: str, params: dict, executor_input: dict) -> str:
        def param(m: re.Match) -> str:
            value = params[m.group(1)]
            return value if isinstance(value, str) else json.dumps(protojson(value))

        def output_file(m: re.Match) -> str:
            return str(executor_input["outputs"]["parameters"][m.group(1)]["outputFile"])

        if arg.startswith('{"Concat": '):  # kfp's ConcatPlaceholder, JSON in the IR (kfp/dsl/placeholders.py)
            parts = json.loads(arg)["Concat"]
            return "".join(VertexEmulator._resolve(part, params, executor_input) for part in parts)
        arg = _OUTPUT_PARAM_FILE.sub(output_file, _PARAM.sub(param, arg))
        # the backend serialises the executor input as protojson: integral numbers without a fraction (protojson)
        serialised = json.dumps(protojson(executor_input))
        escaped = json.dumps(serialised)[1:-1]  # json_escape[1]: one level, inside a string
        return arg.replace("{{$.json_escape[1]}}", escaped).replace("{{$}}", serialised)

    # -------------------------------------------------------------- the custom job's hosts
    def _run_trial(self, job: dict, hosts: int, trial_env: dict[str, str]) -> tuple[bool, str]:
        """A tuning job's trial (tests/fakes/vertex/tuning.py): its CustomJob run as any other, on its hosts,
        with the trial's ``CLOUD_ML_TRIAL_ID`` and metric file; its hosts land in ``SliceRun.trials``."""
        return self._run_hosts(job, hosts, trial_env=trial_env)

    def _run_hosts(self, job: dict, hosts: int, trial_env: dict[str, str] | None = None) -> tuple[bool, str]:
        run = self.current
        assert run is not None
        trial = (trial_env or {}).get("CLOUD_ML_TRIAL_ID")
        pool = job["jobSpec"]["workerPoolSpecs"][0]
        container = pool["containerSpec"]
        env = host_environment()
        env.update({e["name"]: e.get("value", "") for e in container.get("env", [])})
        env.update(self.env)
        env.update(
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",  # python3 = the "image"
            **emulated_slice_vars(hosts, self.devices_per_host), CLOUD_ML_JOB_ID=job.get("displayName", "job"),
            **base_output_vars(job), **(trial_env or {}),
        )  # fmt: skip
        self._remember_gcs_dirs(run.executor_input)
        restart_all = bool(job["jobSpec"].get("scheduling", {}).get("restartJobOnWorkerRestart"))
        codes: list[int] = []
        for attempt in range(self.job_retries + 1):
            hosts_now = [self._start_host(run, container, env, index, attempt, 0) for index in range(hosts)]
            if trial is not None:  # a trial's hosts, kept apart from the task's own job
                run.trials[trial] = hosts_now
            else:
                run.attempts.append(hosts_now)
            if attempt == 0 and trial is None:
                run.hosts = list(hosts_now)  # the first start, as it ran (restarts replace entries below)
                run.hosts_started.set()
            for restart in range(self.worker_restarts + 1):
                codes = self._wait_hosts(hosts_now, restart_all)
                if all(code == 0 for code in codes):
                    return True, ""
                if restart == self.worker_restarts:
                    break
                # "Non-zero exits": restarted at once on the same VM; with restartJobOnWorkerRestart, all of them
                again = range(hosts) if restart_all else [i for i, code in enumerate(codes) if code != 0]
                for index in again:
                    hosts_now[index] = self._start_host(run, container, env, index, attempt, restart + 1)
                run.restarts.append([hosts_now[i] for i in again])
        return (
            False,
            f"hosts exited {codes} after {self.worker_restarts} restarts and {self.job_retries} job retries",
        )

    @staticmethod
    def _start_host(
        run: SliceRun, container: dict, env: dict, index: int, attempt: int, restart: int
    ) -> Host:
        suffix = "".join(f"-{k}{n}" for k, n in (("job", attempt), ("restart", restart)) if n)
        trial = f"trial-{env['CLOUD_ML_TRIAL_ID']}-" if "CLOUD_ML_TRIAL_ID" in env else ""
        log_path = run.workdir / f"{trial}host-{index}{suffix}.log"
        host_env = {**env, "TPU_WORKER_ID": str(index)}
        if trial and index:  # every host of a trial reports; the service reads the first host's file
            host_env["CLOUD_ML_HP_METRIC_FILE"] = f"{env['CLOUD_ML_HP_METRIC_FILE']}.host{index}"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [*container["command"], *container.get("args", [])], cwd=ROOT,  # the image's WORKDIR
                env=host_env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        return Host(index, process, log_path)

    @staticmethod
    def _wait_hosts(hosts: list[Host], restart_all: bool) -> list[int]:
        """Every host's exit code; with ``restart_all``, a host that failed has the others stopped (SIGTERM,
        as a restarting VM's container gets it) so that all restart together."""
        while any(h.process.poll() is None for h in hosts):
            if restart_all and any(h.process.poll() not in (None, 0) for h in hosts):
                for host in hosts:
                    if host.process.poll() is None:
                        host.process.send_signal(signal.SIGTERM)
                break
            time.sleep(0.2)
        return [h.process.wait() for h in hosts]

    def _remember_gcs_dirs(self, executor_input: dict) -> None:
        for outputs in executor_input["outputs"]["artifacts"].values():
            uri = outputs["artifacts"][0]["uri"]
            if uri.startswith("gs://"):
                self.gcs_dirs.append(Path("/gcs") / uri[len("gs://") :].split("/", 1)[0])


def run_container_task(
    template: str,
    task: str,
    *,
    pipeline_params: dict[str, Any],
    run_root: str,
    workdir: Path,
    job_id: str = "tpustream-training-20261102030000",
    display_name: str = "tpustream-training",
    project: str = "123",
    location: str = "us-central1",
    final_status: dict[str, Any] | None = None,
    timeout: float = 120,
    artifacts: dict[str, str] | None = None,
    task_outputs: dict[str, dict[str, Any]] | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run a plain container task (a lightweight component: ``sh -ec`` writing the function's source, then
    ``python3 -m kfp.dsl.executor_main``) of the compiled ``template`` as Vertex runs it: its inputs resolved
    as ``start_task`` resolves them (``job_id``: ``{{$.pipeline_job_uuid}}``, the last part of the run's resource
    name), ``{{$.pipeline_job_name}}`` the run's display name (kfp/dsl/__init__.py documents it so; ``pipeline
    submit`` gives every run the same one, pipelines/submit.py), and for an exit task
    the ``PipelineTaskFinalStatus`` that Vertex hands it (``final_status``: ``state``,
    ``pipeline_job_resource_name``, ``pipeline_task_name``, ``error`` {code, message}, the keys kfp's executor
    reads, kfp/dsl/executor.py). ``artifacts``: the input artifacts' URIs; ``task_outputs``: the upstream tasks'
    output parameters ({task: {name: value}}); ``env``: added to the step's environment. The executor output
    lands in ``workdir``/executor_output.json (``task_outputs_of`` reads it)."""
    spec = yaml.safe_load(Path(template).read_text())
    task_spec = find_task(spec, task)
    component = spec["components"][task_spec["componentRef"]["name"]]
    container = spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"]
    placeholders = {
        "{{$.pipeline_root}}": run_root, "{{$.pipeline_job_uuid}}": job_id, "{{$.pipeline_job_name}}": display_name,
        "{{$.pipeline_google_cloud_project_id}}": project, "{{$.pipeline_google_cloud_location}}": location,
    }  # fmt: skip
    params = VertexEmulator._parameters(
        spec, task_spec, component, pipeline_params, placeholders, task_outputs
    )
    for name, source in task_spec.get("inputs", {}).get("parameters", {}).items():
        if "taskFinalStatus" in source:
            params[name] = {
                "pipeline_job_resource_name": f"projects/{project}/locations/{location}/pipelineJobs/{job_id}",
                **(final_status or {}),
            }
    executor_input = VertexEmulator._executor_input(
        component, task, params, artifacts or {}, run_root, workdir
    )
    args = [VertexEmulator._resolve(arg, params, executor_input) for arg in container["args"]]
    assert container["command"][:2] == ["sh", "-ec"], container["command"]  # a lightweight component
    step_env = {**host_environment(), "PYTHONPATH": str(ROOT), **(env or {})}
    step_env["PATH"] = (
        f"{Path(sys.executable).parent}{os.pathsep}{step_env.get('PATH', '')}"  # the image's python3
    )
    return subprocess.run(
        [*container["command"], *args],
        cwd=ROOT,
        env=step_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def task_outputs_of(workdir: Path) -> dict[str, Any]:
    """The output parameters a lightweight task run by ``run_container_task`` in ``workdir`` wrote (its executor
    output's ``parameterValues``), as the backend hands them to the tasks downstream."""
    output = json.loads((workdir / "executor_output.json").read_text())
    return dict(output.get("parameterValues", {}))


def tasks_reached(spec: dict, failing: set[str]) -> dict[str, dict[str, Any]]:
    """Which tasks of the compiled pipeline ``spec`` Vertex starts when the tasks named in ``failing`` fail, as
    the PipelineSpec says it schedules them (pipeline_spec.proto, ``PipelineTaskSpec``: ``dependent_tasks``,
    ``trigger_policy``): a task starts once its dependent tasks are done, and only if they all succeeded unless
    its ``triggerPolicy.strategy`` is ``ALL_UPSTREAM_TASKS_COMPLETED``; a DAG task (a sub-DAG: an exit handler's
    group, a condition's, a loop's body) fails when a task inside it fails ("The DAG failed because some tasks
    failed."). Conditions are taken as true and a loop as one iteration: this is about failure, not data.

    Returns every task that starts, by its name inside its DAG, with the ``PipelineTaskFinalStatus`` Vertex hands
    it where it takes one (``state`` and ``pipeline_task_name`` of the ``taskFinalStatus`` producer)."""
    reached: dict[str, dict[str, Any]] = {}

    def run_dag(dag: dict) -> bool:
        tasks, state = dag.get("tasks", {}), {}
        while len(state) < len(tasks):
            ready = [
                name for name, task in tasks.items()
                if name not in state and all(d in state for d in task.get("dependentTasks", []))
            ]  # fmt: skip
            if not ready:
                raise AssertionError(f"a dependency cycle or a dependency on no task among {sorted(tasks)}")
            for name in ready:
                task = tasks[name]
                upstream = [state[d] for d in task.get("dependentTasks", [])]
                completed = task.get("triggerPolicy", {}).get("strategy") == "ALL_UPSTREAM_TASKS_COMPLETED"
                if not completed and not all(upstream):
                    state[name] = False  # never starts; its DAG fails with it
                    continue
                final = {}
                for source in task.get("inputs", {}).get("parameters", {}).values():
                    if "taskFinalStatus" in source:
                        producer = source["taskFinalStatus"]["producerTask"]
                        final = {
                            "state": "SUCCEEDED" if state[producer] else "FAILED",
                            "pipeline_task_name": producer,
                        }
                reached[name] = final
                component = spec["components"][task["componentRef"]["name"]]
                state[name] = run_dag(component["dag"]) if "dag" in component else name not in failing
        return all(state.values())

    run_dag(spec["root"]["dag"])
    return reached


def protojson(value: Any) -> Any:
    """Parameter values are protobuf Values (numbers are doubles: the YAML says ``replica_count: 1.0``);
    the backend serialises them as protojson does, integral doubles without a fraction (``1``), which
    the launcher's int64 fields accept. Python's json.dumps would write ``1.0`` and fail there."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: protojson(v) for k, v in value.items()}
    if isinstance(value, list):
        return [protojson(v) for v in value]
    return value


def base_output_vars(job: dict) -> dict[str, str]:
    """What Vertex sets in a CustomJob's containers when its ``jobSpec.baseOutputDirectory`` is set
    (aiplatform_v1 CustomJobSpec.base_output_directory): the model, checkpoint and TensorBoard log dirs
    under it; nothing without one."""
    base = job["jobSpec"].get("baseOutputDirectory", {}).get("outputUriPrefix", "").rstrip("/")
    if not base:
        return {}
    return {
        "AIP_MODEL_DIR": f"{base}/model/",
        "AIP_CHECKPOINT_DIR": f"{base}/checkpoints/",
        "AIP_TENSORBOARD_LOG_DIR": f"{base}/logs/",
    }


def host_environment() -> dict[str, str]:
    """This process's environment without the variables that say where a process sits in a job."""
    return {
        k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "CLOUD_ML", "CLUSTER_SPEC", "AIP_"))
    }


def emulated_slice_vars(hosts: int, devices_per_host: int = 1) -> dict[str, str]:
    """What makes a process a host of an emulated ``hosts``-host slice on XLA CPU (tpustream/xla_runtime.py);
    each host process adds its own ``TPU_WORKER_ID``."""
    return {
        "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(devices_per_host), "TF_CPP_MIN_LOG_LEVEL": "2",
        "TPU_WORKER_HOSTNAMES": ",".join(f"t1v-emulated-w-{i}" for i in range(hosts)),
        "TPU_SKIP_MDS_QUERY": "1", "TPUSTREAM_EMULATE_SLICE": "1",
    }  # fmt: skip


def signal_hosts(run: SliceRun, signum: int = signal.SIGTERM, only: list[int] | None = None) -> None:
    for host in run.hosts:
        if only is None or host.index in only:
            host.process.send_signal(signum)


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
