"""The training DAG: check source -> If(new data): shards (fanned out) -> check data -> train (a TPU custom
job on Vertex) -> evaluate -> If(candidate wins): validate in the serving container -> promote
-> If(endpoint): deploy as a canary.

``build_pipeline(tpu=..., cpu_image=..., tpu_image=..., resources=...)`` fixes the TPU type, images and
CPU steps' sizes at compile time; everything a scheduled run varies (source, model, epochs, thresholds)
is a pipeline parameter.
No credential or service account is compiled in: the TPU job runs as the pipeline run's own service
account and network (GCPC placeholders, resolved by Vertex when the task runs).

Vertex AI TensorBoard: the ``tensorboard`` parameter names an instance (``projects/P/locations/L/tensorboards/
ID``; "" none) that the TPU CustomJob streams its event files to. A parameter, not a compile-time constant, so
that ``pipeline submit`` and ``pipeline schedule`` set it without recompiling (``pipeline compile
--tensorboard`` only sets its default): GCPC's launcher drops an empty ``tensorboard`` from the CustomJob
(``json_util.recursive_remove_empty`` in container/v1/gcp_launcher/job_remote_runner.py), so "" is no instance.
The job always gets a base output directory under the run's pipeline root (``TRAIN_JOB_OUTPUT``), from which
Vertex sets ``AIP_TENSORBOARD_LOG_DIR`` (``<base>/logs/``, aiplatform_v1 CustomJobSpec.base_output_directory);
the trainer copies its event files there (tpustream/train/records.py), and with an instance Vertex uploads them.

Notifications: the whole DAG runs inside an exit handler whose exit task (``notify-webhook``, ours) POSTs the
run's state and outcome to the ``notify_webhook`` parameter's URL ("" none: the step only logs it). The outcome
is what the deciding steps (check source, check data, evaluate, promote, deploy) recorded at ``OUTCOME_PATH``
(tpustream/release/outcome.py): an exit task may take no other task's output. With ``notify_emails`` at compile
time, the pipeline is that DAG again, run as a sub-DAG inside a second exit handler whose exit task is GCPC's
``VertexNotificationEmailOp`` ("Configure email notifications",
https://cloud.google.com/vertex-ai/docs/pipelines/email-notifications): kfp 2.17 allows one exit task per
handler and no handler inside another within one pipeline function, and a sub-pipeline is its own function.
The email op runs only on Vertex (its executor raises elsewhere), so ``pipeline run-local`` compiles it out.

Caching is off on every task: the first step reads a live source whose URI never changes, and the
decision "is there anything new" is made by its fingerprint, not by KFP's cache (tpustream/dataset/fingerprint.py).

Every CPU step carries explicit CPU and memory limits (``StepResources``), from which Vertex AI Pipelines
picks the step's machine ("Specify the machine configuration for a pipeline step"; without them every step
runs on e2-standard-4). They are compile-time constants, not pipeline parameters: kfp 2.17 would compile a
parameter into ``resourceCpuLimit: '{{$.inputs.parameters[...]}}'`` alone, without the numeric ``cpuLimit``
that Vertex documents, and Vertex resolving that placeholder is undocumented (kubeflow/pipelines#6681, kfp
1.8 on Vertex: it did not; closed as stale). A constant is compiled into both fields.
"""

import contextlib
import inspect
import re
from dataclasses import dataclass
from typing import Any

from kfp import dsl

from tpustream import components
from tpustream.dataset.check import DataCheckThresholds
from tpustream.dataset.plan import ShardConfig
from tpustream.errors import ConfigError
from tpustream.pipelines.tpu import (
    PIPELINE_WORKERS,
    TPU_TYPES,
    Capacity,
    fresh_job_command,
    min_train_shards,
    tpu_spec,
    worker_pool_spec,
)
from tpustream.train.config import TrainConfig
from tpustream.train.pretrained import MODEL_DEFAULT

__all__ = [
    "TPU_TYPES",
    "build_components",
    "build_pipeline",
    "check_image",
    "LOCAL_IMAGE",
    "StepResources",
    "CPU_STEPS",
    "VERTEX_MAX_CPU",
    "VERTEX_MAX_MEMORY_GB",
    "TRAIN_JOB_OUTPUT",
    "Gate",
    "GATES",
    "OUTCOME_PATH",
    "PIPELINE_NAME",
]

# The TPU CustomJob's baseOutputDirectory: one per run, under the run's pipeline root. Vertex resolves the
# placeholders inside a longer constant (kfp's own example for PIPELINE_ROOT_PLACEHOLDER is
# ``dsl.PIPELINE_ROOT_PLACEHOLDER + '/tmp'``, kfp/dsl/__init__.py; GCPC builds Vertex paths from
# PIPELINE_JOB_ID_PLACEHOLDER the same way, v1/model/upload_model/component.py). A KFP retry of the train task
# creates a new CustomJob with the same directory: its event files land beside the first attempt's.
TRAIN_JOB_OUTPUT = f"{dsl.PIPELINE_ROOT_PLACEHOLDER}/{dsl.PIPELINE_JOB_ID_PLACEHOLDER}/train-job"
# Where the run's deciding steps record its outcome and the exit step reads it (tpustream/release/outcome.py):
# PIPELINE_JOB_NAME is the run's name on Vertex and kfp.local's run directory under the root there.
OUTCOME_PATH = f"{dsl.PIPELINE_ROOT_PLACEHOLDER}/{dsl.PIPELINE_JOB_NAME_PLACEHOLDER}/run-outcome.json"
PIPELINE_NAME = "tpustream-training"
LOCAL_IMAGE = "local"  # kfp.local's SubprocessRunner runs in this Python: no image is pulled
_PLACEHOLDER_IMAGE = re.compile(r"(^|/)(PROJECT|CHANGE-ME|YOUR[-_]PROJECT)(/|$)|\$", re.IGNORECASE)


def check_image(image: str, flag: str) -> str:
    """Refuse a missing or placeholder image reference (naming ``flag``); return it unchanged."""
    if not image or "/" not in image or _PLACEHOLDER_IMAGE.search(image):
        raise ConfigError(
            f"{flag} {image!r} is not a pushed image: give the reference Cloud Build pushed, best by digest "
            f"(REGION-docker.pkg.dev/PROJECT_ID/REPO/NAME@sha256:...); containers/cloudbuild.yaml builds, "
            "pushes and compiles against the digests"
        )
    return image


# What Vertex AI Pipelines accepts for a step ("Specify the machine configuration for a pipeline step"):
# CPU "a number ... or a number followed by m" (1/1000), at most 96; memory "a number, or a number followed by
# K, M or G", at most 624 GB. Vertex "automatically selects the closest match from the supported machine
# types" for the limits given; without them a step runs on e2-standard-4 (4 vCPU, 16 GB).
VERTEX_MAX_CPU = 96
VERTEX_MAX_MEMORY_GB = 624
_CPU = re.compile(r"^(\d+(\.\d+)?|\d+m)$")
_MEMORY = re.compile(r"^(\d+)([KMG]?)$")
_MEMORY_GB = {"": 1e-9, "K": 1e-6, "M": 1e-3, "G": 1.0}  # kfp's _memory_to_float: decimal units

# The pipeline's CPU steps (the compiled YAML's task names): every one gets explicit limits. The train task
# is not one of them: on Vertex it is GCPC's launcher, which only creates and polls the TPU CustomJob.
CPU_STEPS = (
    "check-source",
    "plan-shards",
    "write-shards",
    "finalize-shards",
    "check-data",
    "resolve-weights",
    "evaluate-model",
    "validate-serving",
    "promote-model",
    "deploy-model",
    "join-experiment",
    "notify-webhook",
)


@dataclass(frozen=True, kw_only=True)
class Gate:
    """A ``dsl.If`` of the DAG in the user's words, for ``pipeline run-local`` to name a skipped condition by
    what it means (``promotion skipped: candidate refused``) instead of its compiled name (``condition-3``).

    ``name`` is the If's name (the compiled condition task's display name); ``guards`` what runs inside it;
    ``when_false`` what a false condition means; ``opt_in``: false only says an option was not given (an
    endpoint, an experiment), not worth a line of run-local's summary."""

    name: str
    guards: str
    when_false: str
    opt_in: bool = False


# Every If of build_pipeline's DAG (tests/unit/test_pipeline_local.py checks that none lacks its Gate).
GATES = {
    gate.name: gate
    for gate in (
        Gate(name="new-data", guards="training", when_false="no new data since the last run"),
        Gate(name="candidate-wins", guards="promotion", when_false="candidate refused"),
        Gate(name="deploy-requested", guards="deploy", when_false="no endpoint given", opt_in=True),
        Gate(name="experiment-requested", guards="experiment", when_false="no experiment given", opt_in=True),
    )
}


def cpu_count(cpu: str) -> float:
    """CPUs of a limit string (``"16"``, ``"0.5"``, ``"500m"``)."""
    return int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)


def memory_gb(memory: str) -> float:
    """GB (decimal, as kfp compiles ``memoryLimit``) of a limit string (``"64G"``, ``"512M"``)."""
    number, unit = _MEMORY.match(memory).groups()  # type: ignore[union-attr]
    return int(number) * _MEMORY_GB[unit]


@dataclass(frozen=True, kw_only=True)
class StepResources:
    """CPU and memory limits of the CPU steps, fixed at compile time (the module doc says why).

    ``cpu``/``memory``: every CPU step but evaluate (check source, plan, write, finalize, check data,
    promote), e2-standard-4's size by default: each shard writer is one process, and the fan-out
    (``shards_per_task``) is what scales writing. ``eval_cpu``/``eval_memory``: evaluate, which runs the
    model over the whole val split twice (candidate, champion) on torch CPU. tools/measure_eval.py measured
    3 to 4 img/s per vCPU for resnet50 at 224 px, decoding included: 50,000 val images x 2 take about 1.75
    to 2.4 h on e2-standard-4, so evaluate defaults to 16 vCPU / 64 GB (e2-standard-16's size, so that
    Vertex's closest match is that type), about 26 to 35 min if it scales linearly (README, "Evaluation
    and promotion"). Each default is a machine type's exact size.
    """

    cpu: str = "4"
    memory: str = "16G"
    eval_cpu: str = "16"
    eval_memory: str = "64G"

    def __post_init__(self) -> None:
        for flag, cpu in (("--step-cpu", self.cpu), ("--eval-cpu", self.eval_cpu)):
            if not _CPU.match(cpu) or not 0 < cpu_count(cpu) <= VERTEX_MAX_CPU:
                raise ConfigError(
                    f"{flag} {cpu!r}: give a number of CPUs (4, 0.5) or millicores (500m), more than 0 and "
                    f"at most {VERTEX_MAX_CPU}, the most Vertex AI Pipelines gives a step"
                )
        for flag, memory in (("--step-memory", self.memory), ("--eval-memory", self.eval_memory)):
            if not _MEMORY.match(memory) or not 0 < memory_gb(memory) <= VERTEX_MAX_MEMORY_GB:
                raise ConfigError(
                    f"{flag} {memory!r}: give a size such as 16G or 512M (K, M, G: the units Vertex AI "
                    f"Pipelines documents), more than 0 and at most {VERTEX_MAX_MEMORY_GB}G, the most it gives "
                    "a step"
                )

    def limits(self, step: str) -> tuple[str, str]:
        """(cpu, memory) of the compiled step ``step`` (a CPU_STEPS name)."""
        if step not in CPU_STEPS:
            raise ConfigError(f"{step!r} is not a CPU step of the pipeline ({', '.join(CPU_STEPS)})")
        return (self.eval_cpu, self.eval_memory) if step == "evaluate-model" else (self.cpu, self.memory)


def _tpu_training_op(train_op: Any, tpu: str, capacity: Capacity) -> tuple[Any, list[dict[str, Any]]]:
    """The train component as a Vertex CustomJob on ``tpu``, and the job's worker pool specs.

    GCPC's ``create_custom_training_job_from_component`` carries the component's inputs, outputs and
    container command over into ``CustomTrainingJobOp`` (v1/custom_job/utils.py), but its worker pools
    cannot express a TPU slice: no ``tpu_topology``, and ``replica_count=N`` makes a second pool of N-1
    replicas. So the pools are built here from the TPU table (one pool, one replica) and passed as the
    task's ``worker_pool_specs`` input, with GCPC's own container spec for the component.
    """
    from google_cloud_pipeline_components import _placeholders
    from google_cloud_pipeline_components.v1.custom_job import create_custom_training_job_from_component

    spec = tpu_spec(tpu)
    job_op = create_custom_training_job_from_component(
        train_op,
        display_name="tpustream-train",
        machine_type=spec.machine_type,
        replica_count=1,
        **capacity.scheduling,  # strategy (on-demand or Spot: pipelines/tpu.py), timeout
        restart_job_on_worker_restart=True,  # a VM of the slice restarted: restart all, resume from `last`
        service_account=_placeholders.SERVICE_ACCOUNT_PLACEHOLDER,  # the pipeline run's service account
        network=_placeholders.NETWORK_PLACEHOLDER,  # and its VPC network, when it has one
        labels={"tpustream-step": "train", "tpustream-tpu": tpu},  # the launcher adds the run's labels
        base_output_directory=TRAIN_JOB_OUTPUT,  # -> AIP_TENSORBOARD_LOG_DIR (the module doc)
    )
    launcher = job_op.component_spec.implementation.container
    if not launcher.command[-1].endswith("custom_job.launcher"):  # GCPC's, wrapped as it is
        raise RuntimeError(
            f"unexpected GCPC CustomJob launcher command {launcher.command}: re-check pipelines/tpu.py"
        )
    launcher.command = fresh_job_command()  # a retried task never re-polls its failed job (pipelines/tpu.py)
    container = job_op.component_spec.inputs["worker_pool_specs"].default[0]["container_spec"]
    return job_op, [worker_pool_spec(spec, container)]


def build_components(
    cpu_image: str, tpu_image: str, tpu: str | None, capacity: Capacity | None = None, serve_image: str = ""
) -> dict[str, Any]:
    """The step components with their images; the train step becomes a Vertex custom job when ``tpu``.
    The validate step runs in ``serve_image`` (the serving container; default ``cpu_image``, which holds the
    same tpustream and model server).

    ``install_kfp_package=False``: the images carry the one pinned kfp (pyproject.toml), so no step
    pip-installs anything at run time (kfp/dsl/component_decorator.py installs kfp by default).
    """

    def component(func: Any, image: str) -> Any:
        return dsl.component(func, base_image=image, install_kfp_package=False)

    ops = {
        name: component(func, cpu_image)
        for name, func in (
            ("check", components.check_source),
            ("plan", components.plan_shards),
            ("write", components.write_shards),
            ("finalize", components.finalize_shards),
            ("check_data", components.check_data),
            ("weights", components.resolve_weights),
            ("evaluate", components.evaluate_model),
            ("promote", components.promote_model),
            ("deploy", components.deploy_model),
            ("experiment", components.join_experiment),
            ("notify", components.notify_webhook),
        )
    }
    ops["validate"] = component(components.validate_serving, serve_image or cpu_image)
    train_op = component(components.train_model, tpu_image if tpu else cpu_image)
    if tpu:
        # A containerized component (its code is in the image, found through kfp_config.ini): the command
        # is `python3 -m kfp.dsl.executor_main`, so on the TPU VM Python itself is the container's main
        # process and gets SIGTERM on preemption. A lightweight component's `sh -ec '...; python3 ...'`
        # leaves the signal to sh (PID 1 ignores it): no checkpoint, and the job's work since the last
        # one is lost.
        train_op = dsl.component(
            components.train_model, base_image=tpu_image, target_image=tpu_image, install_kfp_package=False
        )
        train_op, pools = _tpu_training_op(train_op, tpu, capacity or Capacity())
        ops["train_pools"] = pools
    ops["train"] = train_op
    return ops


def build_pipeline(
    *,
    tpu: str | None = None,
    cpu_image: str = LOCAL_IMAGE,
    tpu_image: str = LOCAL_IMAGE,
    capacity: Capacity | None = None,
    resources: StepResources | None = None,
    serve_image: str = "",
    tensorboard: str = "",
    notify_emails: list[str] | None = None,
    notify_webhook: str = "",
) -> Any:
    """The pipeline function, for kfp's compiler or kfp.local (``tpu=None``: every step runs as is).

    ``resources``: the CPU steps' limits (default ``StepResources()``); kfp.local's SubprocessRunner runs
    every step in this machine's processes and ignores them. ``tensorboard``: the default of the
    ``tensorboard`` parameter (a run may set another). ``notify_emails``: compile in Vertex's email
    notification (the module doc), these recipients the default of the ``notify_emails`` parameter; none: no
    email step. ``notify_webhook``: the default of the ``notify_webhook`` parameter."""
    ops = build_components(cpu_image, tpu_image, tpu, capacity, serve_image)
    sizes = resources or StepResources()
    default_tensorboard = tensorboard
    default_emails, default_webhook = list(notify_emails or []), notify_webhook

    def sized(task: Any, step: str) -> Any:
        cpu, memory = sizes.limits(step)
        return task.set_cpu_limit(cpu).set_memory_limit(memory)

    def train_extra(tensorboard: Any) -> dict[str, Any]:
        """The CustomJob's own inputs (GCPC): the slice's pools and the run's TensorBoard instance."""
        return {"worker_pool_specs": ops["train_pools"], "tensorboard": tensorboard} if tpu else {}

    promote_extra = {}
    if (
        cpu_image != LOCAL_IMAGE
    ):  # compiled for Vertex: the run's own project and region (kfp.local lacks them)
        from google_cloud_pipeline_components import _placeholders

        promote_extra = {
            "project": _placeholders.PROJECT_ID_PLACEHOLDER,
            "location": _placeholders.LOCATION_PLACEHOLDER,
        }

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description="Image source -> (new data?) shards -> TPU ResNet -> evaluate -> promote",
    )
    # A default that a config dataclass owns is read from it (TrainConfig.epochs): KFP compiles the value, a
    # literal in the YAML as any other. The rest are the pipeline's own: a stand-in for None, which a KFP
    # parameter cannot take (0, -1), or a value unlike the CLI's on purpose (tests/unit/test_option_layers.py
    # says which and why).
    def tpustream_training(
        registry: str,
        source: str = ShardConfig.source,
        datasets_root: str = "",
        num_shards: int = 0,  # train shards; 0 = auto: ~2,000 samples each, at least one per loader worker of the slice
        val_fraction: float = -1.0,
        test_fraction: float = ShardConfig.test_fraction,  # held out from training and model selection; 0: none
        upsample: int = ShardConfig.upsample,
        seed: int = ShardConfig.seed,
        max_side: int = 0,  # downsize images whose longer side exceeds this at write time (0: keep sizes)
        strict: bool = ShardConfig.strict,  # fail on the first unreadable image instead of skipping and counting it
        shards_per_task: int = 4,
        model_name: str = TrainConfig.model,
        epochs: int = TrainConfig.epochs,
        batch_size: int = TrainConfig.batch_size,
        lr: float = 0.0,
        bf16: bool = True,
        workers: int = PIPELINE_WORKERS,
        input_size: int = 0,  # training input side; 0 = the dataset's rule (median shorter side, within [16, 224])
        init_from: str = "champion",  # warm start: "champion" (none yet: random), "" random, or a model/registry URI
        pretrained: str = MODEL_DEFAULT,  # the model's torchvision DEFAULT weights; "" random init; a weights name (resnet50.IMAGENET1K_V2) or a staged .pth/.safetensors URI
        freeze_epochs: int = TrainConfig.freeze_epochs,  # fine-tuning: the head alone for N epochs, then everything
        backbone_lr_scale: float = TrainConfig.backbone_lr_scale,  # fine-tuning: the backbone's fraction of the LR
        class_weights: str = TrainConfig.class_weights,  # "auto": loss weighted by inverse class frequency
        patience: int = TrainConfig.patience,  # early stopping: epochs without a val top-1 gain of more than early_stop_min_delta
        early_stop_min_delta: float = TrainConfig.min_delta,
        compile_cache: str = "auto",  # persistent XLA compile cache: auto = PIPELINE_ROOT/xla-cache, "" off, or a URI
        metric: str = "top1",
        min_delta: float = 0.0,
        max_class_drop: float = -1.0,  # refuse a candidate if a class's accuracy drops more (< 0: no check)
        min_metric: float = -1.0,  # quality floor on `metric`, with or without a champion (< 0: none)
        min_class_recall: float = -1.0,  # quality floor on every class's recall (< 0: none)
        max_p_value: float = -1.0,  # a gain over the champion must have McNemar's p-value at most this (< 0: off)
        retrain: bool = False,
        data_check: str = "fail",  # an anomaly in the new dataset stops the run before train; "warn": log it; "off"
        max_duplicate_fraction: float = DataCheckThresholds.max_duplicate_fraction,  # why each: tpustream/dataset/check.py
        max_leaked_images: int = DataCheckThresholds.max_leaked_images,
        max_skipped_rate: float = DataCheckThresholds.max_skipped_rate,
        max_class_share_shift: float = DataCheckThresholds.max_class_share_shift,
        max_skipped_rate_increase: float = DataCheckThresholds.max_skipped_rate_increase,
        min_class_train_samples: int = DataCheckThresholds.min_class_train_samples,  # a warning, never a failure
        vertex_model: str = "",  # also upload a promoted model to this Vertex AI Model Registry model
        serving_image: str = "",  # ... with this serving image (containers/serve; Cloud Build's serve.ref)
        endpoint: str = "",  # then deploy it to this Vertex AI endpoint as a canary (display name or resource); "" none
        canary_percent: int = 10,  # the new version's share of the endpoint's traffic (`tpustream rollback` undoes)
        serving_machine_type: str = "n1-standard-4",
        serving_min_replicas: int = 1,
        serving_max_replicas: int = 1,
        tensorboard: str = default_tensorboard,  # a Vertex AI TensorBoard instance the TPU job streams to; "" none
        experiment: str = "",  # the Vertex AI Experiment a scheduled run joins (tpustream/vertex/experiments.py); "" none
        notify_emails: list = default_emails,  # who Vertex emails the run's final state (compiled in only with recipients)
        notify_webhook: str = default_webhook,  # a URL the exit step POSTs the run's state and outcome to (JSON); "" none
    ) -> None:
        # Every step below runs inside the exit handler (an ExitStack: the DAG's body keeps its indentation).
        on_exit = contextlib.ExitStack()
        notify = ops["notify"](webhook=notify_webhook, run_outcome=OUTCOME_PATH, pipeline=PIPELINE_NAME)
        sized(notify, "notify-webhook").set_display_name("notify webhook").set_caching_options(False)
        on_exit.enter_context(dsl.ExitHandler(notify, name="notify-on-exit"))
        shard_args = dict(
            source=source,
            num_shards=num_shards,
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            upsample=upsample,
            seed=seed,
            max_side=max_side,
            strict=strict,
            min_train_shards=min_train_shards(tpu),
        )
        check = ops["check"](
            datasets_root=datasets_root,
            registry=registry,
            model_name=model_name,
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            bf16=bf16,
            retrain=retrain,
            run_outcome=OUTCOME_PATH,
            **shard_args,
        ).set_display_name("check source for new data")
        sized(check, "check-source").set_caching_options(False)
        with dsl.If(check.outputs["Output"] == "train", name="new-data"):
            plan = ops["plan"](
                shards_per_task=shards_per_task, dataset=check.outputs["dataset"], **shard_args
            )
            sized(plan, "plan-shards").set_display_name("plan shards").set_caching_options(False)
            with dsl.ParallelFor(plan.outputs["Output"], name="shard-ranges") as shard_range:
                write = ops["write"](shard_range=shard_range, dataset=check.outputs["dataset"], **shard_args)
                sized(write, "write-shards").set_display_name("write shards").set_retry(num_retries=2)
                write.set_caching_options(False)
            finalize = ops["finalize"](
                planned=check.outputs["dataset"], written=dsl.Collected(write.output), **shard_args
            ).set_display_name("finalize manifest")
            sized(finalize, "finalize-shards").set_caching_options(False)
            check_data = ops["check_data"](
                dataset=finalize.outputs["dataset"],
                registry=registry,
                data_check=data_check,
                max_duplicate_fraction=max_duplicate_fraction,
                max_leaked_images=max_leaked_images,
                max_skipped_rate=max_skipped_rate,
                max_class_share_shift=max_class_share_shift,
                max_skipped_rate_increase=max_skipped_rate_increase,
                min_class_train_samples=min_class_train_samples,
                run_outcome=OUTCOME_PATH,
                class_weights=class_weights,
            ).set_display_name("check data")
            sized(check_data, "check-data").set_caching_options(False)
            # A named weight set is fetched here, once, on CPU: the TPU job's hosts read the cached copy.
            weights = ops["weights"](
                pretrained=pretrained, model_name=model_name, pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER
            ).set_display_name("resolve pretrained weights")
            sized(weights, "resolve-weights").set_caching_options(False)
            train = ops["train"](
                dataset=finalize.outputs["dataset"],
                model_name=model_name,
                epochs=epochs,
                batch_size=batch_size,
                lr=lr,
                bf16=bf16,
                workers=workers,
                input_size=input_size,
                init_from=init_from,
                pretrained=weights.output,
                freeze_epochs=freeze_epochs,
                backbone_lr_scale=backbone_lr_scale,
                class_weights=class_weights,
                registry=registry,
                patience=patience,
                early_stop_min_delta=early_stop_min_delta,
                compile_cache=compile_cache,
                pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
                **train_extra(tensorboard),
            ).set_display_name("train")
            train.after(check_data)  # no TPU time on data the check refused (data_check=fail)
            # A retried task resumes from `last` in its own output (resume=auto): it continues, not restarts.
            train.set_retry(num_retries=2, backoff_duration="60s").set_caching_options(False)
            evaluate = ops["evaluate"](
                model=train.outputs["model"],
                dataset=finalize.outputs["dataset"],
                registry=registry,
                metric=metric,
                min_delta=min_delta,
                max_class_drop=max_class_drop,
                min_metric=min_metric,
                min_class_recall=min_class_recall,
                max_p_value=max_p_value,
                data_check=check_data.outputs["report"],  # into the run report
                run_outcome=OUTCOME_PATH,
            ).set_display_name("evaluate vs champion")
            sized(evaluate, "evaluate-model").set_caching_options(False)
            with dsl.If(evaluate.outputs["Output"] == "promote", name="candidate-wins"):
                # In the serving container, as Vertex would start it: answers as evaluate's, 400 on bad input.
                validate = ops["validate"](model=train.outputs["model"], dataset=finalize.outputs["dataset"])
                sized(validate, "validate-serving").set_display_name("validate in serving container")
                validate.set_caching_options(False)
                promote = ops["promote"](
                    validation=validate.outputs["validation"],
                    model=train.outputs["model"],
                    evaluation=evaluate.outputs["evaluation"],
                    registry=registry,
                    dataset=finalize.outputs["dataset"],
                    data_check=check_data.outputs["report"],
                    metric=metric,
                    min_delta=min_delta,
                    max_class_drop=max_class_drop,
                    min_metric=min_metric,
                    min_class_recall=min_class_recall,
                    max_p_value=max_p_value,
                    vertex_model_name=vertex_model,
                    serving_image=serving_image,
                    run_outcome=OUTCOME_PATH,
                    **promote_extra,
                ).set_display_name("promote")
                # A retry repairs a failed Model Registry upload: promote finds its champion and uploads it then.
                sized(promote, "promote-model").set_caching_options(False)
                promote.set_retry(num_retries=2, backoff_duration="60s")
                with dsl.If(endpoint != "", name="deploy-requested"):
                    deploy = ops["deploy"](
                        vertex_model=promote.outputs["vertex_model"],
                        endpoint=endpoint,
                        traffic_percent=canary_percent,
                        machine_type=serving_machine_type,
                        min_replicas=serving_min_replicas,
                        max_replicas=serving_max_replicas,
                        run_outcome=OUTCOME_PATH,
                    ).set_display_name("deploy canary")
                    # a retry is safe: the deployed version is found and its share set, nothing is duplicated
                    sized(deploy, "deploy-model").set_caching_options(False)
                    deploy.set_retry(num_retries=2, backoff_duration="120s")
        with dsl.If(experiment != "", name="experiment-requested"):
            # A scheduled run joins its experiment itself (a Schedule cannot carry one: components/experiment.py),
            # at its start (it waits for no other task); every run, skip runs too, as `pipeline submit
            # --experiment` adds every run it submits.
            join = ops["experiment"](
                experiment=experiment,
                pipeline_job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER if promote_extra else "",
                **promote_extra,
            ).set_display_name("join experiment")
            sized(join, "join-experiment").set_caching_options(False)
        on_exit.close()  # what this run did is its outcome (OUTCOME_PATH): no output leaves an exit handler

    return _with_email(tpustream_training) if default_emails else tpustream_training


def _with_email(pipeline: Any) -> Any:
    """``pipeline`` as one sub-DAG inside an exit handler whose exit task is GCPC's ``VertexNotificationEmailOp``
    (Vertex only; the module doc says why a sub-DAG), with the same parameters: ``notify_emails`` are the
    recipients."""
    from google_cloud_pipeline_components.v1.vertex_notification_email import VertexNotificationEmailOp

    signature = inspect.signature(pipeline.pipeline_func)
    names = list(signature.parameters)

    def tpustream_training(*values: Any) -> None:  # kfp calls it with the parameters' channels, in order
        parameters = dict(zip(names, values, strict=True))
        email = VertexNotificationEmailOp(recipients=parameters["notify_emails"])
        email.set_display_name("email the run's final state")
        with dsl.ExitHandler(email, name="email-on-exit"):
            pipeline(**parameters).set_display_name("training")

    tpustream_training.__signature__ = signature  # type: ignore[attr-defined]
    return dsl.pipeline(name=PIPELINE_NAME, description=pipeline.description)(tpustream_training)
