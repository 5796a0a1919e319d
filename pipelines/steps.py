"""The pipeline's steps as compiled: each KFP component with the image it runs in (``build_components``), and
the train step as a Vertex AI CustomJob on a TPU slice. pipelines/training.py wires them into the DAG and gives
each CPU step its limits (``StepResources``, pipelines/resources.py).

The TPU job always gets a base output directory under the run's pipeline root (``TRAIN_JOB_OUTPUT``), from
which Vertex sets ``AIP_TENSORBOARD_LOG_DIR`` (``<base>/logs/``, aiplatform_v1 CustomJobSpec.base_output_directory);
the trainer copies its event files there (tpustream/train/trainer.py), and with a TensorBoard instance (the
pipeline's ``tensorboard`` parameter, pipelines/training.py) Vertex uploads them.
"""

import re
from dataclasses import dataclass
from typing import Any

import tpustream.components as components
from kfp import dsl

from tpustream.errors import ConfigError

from .tpu import Capacity, WorkerPoolSpec, fresh_job_command, tpu_spec, worker_pool_spec

__all__ = [
    "build_components",
    "check_image",
    "LOCAL_IMAGE",
    "StepOps",
    "TRAIN_JOB_OUTPUT",
    "TUNE_JOB_OUTPUT",
]

# The TPU CustomJob's baseOutputDirectory: one per run, under the run's pipeline root. Vertex resolves the
# placeholders inside a longer constant (kfp's own example for PIPELINE_ROOT_PLACEHOLDER is
# ``dsl.PIPELINE_ROOT_PLACEHOLDER + '/tmp'``, kfp/dsl/__init__.py; GCPC builds Vertex paths from
# PIPELINE_JOB_ID_PLACEHOLDER the same way, v1/model/upload_model/component.py). A KFP retry of the train task
# creates a new CustomJob with the same directory: its event files land beside the first attempt's.
TRAIN_JOB_OUTPUT = f"{dsl.PIPELINE_ROOT_PLACEHOLDER}/{dsl.PIPELINE_JOB_ID_PLACEHOLDER}/train-job"
# The HyperparameterTuningJob's base output directory: trial N trains into TUNE_JOB_OUTPUT/N/model (AIP_MODEL_DIR).
TUNE_JOB_OUTPUT = f"{dsl.PIPELINE_ROOT_PLACEHOLDER}/{dsl.PIPELINE_JOB_ID_PLACEHOLDER}/tune-job"
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


@dataclass(frozen=True, kw_only=True)
class StepOps:
    """The pipeline's step components, each with its image (``build_components``); ``train_pools``: the TPU
    CustomJob's worker pool specs (empty when the train step runs in the pipeline's own CPU step)."""

    check: Any
    plan: Any
    write: Any
    finalize: Any
    check_data: Any
    weights: Any
    train: Any
    evaluate: Any
    validate: Any
    promote: Any
    deploy: Any
    experiment: Any
    notify: Any
    train_pools: list[WorkerPoolSpec]
    # the tune switch (pipelines/training.py): off Vertex one step searching with optuna; on Vertex plan ->
    # GCPC's HyperparameterTuningJobRunOp (early stopping spliced in) -> pick, trials on ``trial_pool``
    tune: Any = None
    tune_plan: Any = None
    tuning_job: Any = None
    tune_pick: Any = None
    trial_pool: dict[str, Any] | None = None
    trial_image: str = ""


def _tpu_training_op(train_op: Any, tpu: str, capacity: Capacity) -> tuple[Any, list[WorkerPoolSpec]]:
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


# The tuning job's launcher: GCPC's, except that the study spec's stopping spec survives. GCPC's launcher drops
# every falsy value from the payload before it creates the job (container/v1/gcp_launcher/job_remote_runner.py
# ``create_job`` -> utils/json_util.py ``recursive_remove_empty``), and STOPPING_SPEC is
# ``{"use_elapsed_duration": false}``: stripped to {} and then dropped, the job reached Vertex without early
# stopping (found by the Vertex emulation, tests/integration/test_tune_on_vertex.py).
TUNING_JOB_LAUNCHER = """\
import sys
from google_cloud_pipeline_components.container.v1.gcp_launcher.utils import json_util
from google_cloud_pipeline_components.container.v1.hyperparameter_tuning_job import launcher
strip = json_util.recursive_remove_empty
def keep_stopping_spec(job):
    stopping = {k: v for k, v in job.get("study_spec", {}).items() if k.endswith("_stopping_spec")}
    kept = strip(job)
    kept.setdefault("study_spec", {}).update(stopping)
    return kept
json_util.recursive_remove_empty = keep_stopping_spec
launcher.main(sys.argv[1:])
"""


def tuning_job_op() -> Any:
    """GCPC's ``HyperparameterTuningJobRunOp`` with Vizier's automated early stopping in its study spec.

    GCPC builds the job from one JSON payload whose ``study_spec`` has no slot for a stopping spec
    (v1/hyperparameter_tuning_job/component.py), so a copy of the op gets ``STOPPING_SPEC``
    (tpustream/tune/vertex.py) spliced into that payload right after ``measurement_selection_type``, and runs
    GCPC's launcher through ``TUNING_JOB_LAUNCHER``, which keeps that spec in the job it creates; the
    launcher parses the payload into aiplatform_v1 ``HyperparameterTuningJob`` as before."""
    import copy
    import json

    from google_cloud_pipeline_components.v1.hyperparameter_tuning_job import HyperparameterTuningJobRunOp

    from tpustream.tune.vertex import STOPPING_SPEC

    op = copy.deepcopy(HyperparameterTuningJobRunOp)
    payload = op.component_spec.implementation.container.args[3]
    items = payload.items
    key = ', "measurement_selection_type": "'
    if key not in items or items[items.index(key) + 2] != '"':
        raise RuntimeError(
            f"unexpected GCPC HyperparameterTuningJob payload {items}: re-check pipelines/steps.py"
        )
    at = items.index(key) + 3
    payload.items = [*items[:at], ", " + json.dumps(STOPPING_SPEC)[1:-1], *items[at:]]
    container = op.component_spec.implementation.container
    if (
        container.command[-1]
        != "google_cloud_pipeline_components.container.v1.hyperparameter_tuning_job.launcher"
    ):
        raise RuntimeError(
            f"unexpected GCPC HyperparameterTuningJob launcher {container.command}: re-check pipelines/steps.py"
        )
    container.command = ["python3", "-u", "-c", TUNING_JOB_LAUNCHER]
    return op


def build_components(
    cpu_image: str, tpu_image: str, tpu: str | None, capacity: Capacity | None = None, serve_image: str = ""
) -> StepOps:
    """The step components with their images; the train step becomes a Vertex custom job when ``tpu``.
    The validate step runs in ``serve_image`` (the serving container; default ``cpu_image``, which holds the
    same tpustream and model server).

    ``install_kfp_package=False``: the images carry the one pinned kfp (pyproject.toml), so no step
    pip-installs anything at run time (kfp/dsl/component_decorator.py installs kfp by default).
    """

    def component(func: Any, image: str) -> Any:
        return dsl.component(func, base_image=image, install_kfp_package=False)

    train_op = component(components.train_model, tpu_image if tpu else cpu_image)
    pools: list[WorkerPoolSpec] = []
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
    tuning: dict[str, Any] = {"tune": component(components.tune_model, cpu_image)}
    if tpu:
        pool = {key: value for key, value in pools[0].items() if key != "container_spec"}
        tuning = {
            "tune_plan": component(components.plan_tuning, cpu_image),
            "tuning_job": tuning_job_op(),
            "tune_pick": component(components.pick_trial, cpu_image),
            "trial_pool": pool,
            "trial_image": tpu_image,
        }
    return StepOps(
        check=component(components.check_source, cpu_image),
        plan=component(components.plan_shards, cpu_image),
        write=component(components.write_shards, cpu_image),
        finalize=component(components.finalize_shards, cpu_image),
        check_data=component(components.check_data, cpu_image),
        weights=component(components.resolve_weights, cpu_image),
        evaluate=component(components.evaluate_model, cpu_image),
        promote=component(components.promote_model, cpu_image),
        deploy=component(components.deploy_model, cpu_image),
        experiment=component(components.join_experiment, cpu_image),
        notify=component(components.notify_webhook, cpu_image),
        validate=component(components.validate_serving, serve_image or cpu_image),
        train=train_op,
        train_pools=pools,
        **tuning,
    )
