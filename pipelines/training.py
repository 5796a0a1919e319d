"""The training DAG: check source -> If(new data): shards (fanned out) -> check data -> train (a TPU custom
job on Vertex) -> evaluate -> If(candidate wins): promote.

``build_pipeline(tpu=..., cpu_image=..., tpu_image=...)`` fixes the TPU type and images at compile
time; everything a scheduled run varies (source, model, epochs, thresholds) is a pipeline parameter.
No credential or service account is compiled in: the TPU job runs as the pipeline run's own service
account and network (GCPC placeholders, resolved by Vertex when the task runs).

Caching is off on every task: the first step reads a live source whose URI never changes, and the
decision "is there anything new" is made by its fingerprint, not by KFP's cache (tpustream/fingerprint.py).
"""

import re
from typing import Any

from kfp import dsl

import components
from pipelines.tpu import (
    PIPELINE_WORKERS,
    TPU_TYPES,
    Capacity,
    fresh_job_command,
    min_train_shards,
    tpu_spec,
    worker_pool_spec,
)

__all__ = ["TPU_TYPES", "build_components", "build_pipeline", "check_image", "LOCAL_IMAGE"]

LOCAL_IMAGE = "local"  # kfp.local's SubprocessRunner runs in this Python: no image is pulled
_PLACEHOLDER_IMAGE = re.compile(r"(^|/)(PROJECT|CHANGE-ME|YOUR[-_]PROJECT)(/|$)|\$", re.IGNORECASE)


def check_image(image: str, flag: str) -> str:
    """Refuse a missing or placeholder image reference (naming ``flag``); return it unchanged."""
    if not image or "/" not in image or _PLACEHOLDER_IMAGE.search(image):
        raise ValueError(
            f"{flag} {image!r} is not a pushed image: give the reference Cloud Build pushed, best by digest "
            f"(REGION-docker.pkg.dev/PROJECT_ID/REPO/NAME@sha256:...); containers/cloudbuild.yaml builds, "
            "pushes and compiles against the digests"
        )
    return image


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
    cpu_image: str, tpu_image: str, tpu: str | None, capacity: Capacity | None = None
) -> dict[str, Any]:
    """The step components with their images; the train step becomes a Vertex custom job when ``tpu``.

    ``install_kfp_package=False``: the images carry the one pinned kfp (pyproject.toml), so no step
    pip-installs anything at run time (kfp/dsl/component_decorator.py installs kfp by default).
    """

    def component(func: Any, image: str) -> Any:
        return dsl.component(func, base_image=image, install_kfp_package=False)

    ops = {
        name: component(func, cpu_image)
        for name, func in (
            ("check", components.check_source), ("plan", components.plan_shards),
            ("write", components.write_shards), ("finalize", components.finalize_shards),
            ("check_data", components.check_data),
            ("evaluate", components.evaluate_model), ("promote", components.promote_model),
        )
    }  # fmt: skip
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
    *, tpu: str | None = None, cpu_image: str = LOCAL_IMAGE, tpu_image: str = LOCAL_IMAGE,
    capacity: Capacity | None = None,
) -> Any:  # fmt: skip
    """The pipeline function, for kfp's compiler or kfp.local (``tpu=None``: every step runs as is)."""
    ops = build_components(cpu_image, tpu_image, tpu, capacity)
    train_extra = {"worker_pool_specs": ops["train_pools"]} if tpu else {}
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
        name="tpustream-training",
        description="Image source -> (new data?) shards -> TPU ResNet -> evaluate -> promote",
    )
    def tpustream_training(
        registry: str,
        source: str = "digits",
        datasets_root: str = "",
        num_shards: int = 0,  # train shards; 0 = auto: ~2,000 samples each, at least one per loader worker of the slice
        val_fraction: float = -1.0,
        upsample: int = 1,
        seed: int = 0,
        max_side: int = 0,  # downsize images whose longer side exceeds this at write time (0: keep sizes)
        strict: bool = False,  # fail on the first unreadable image instead of skipping and counting it
        shards_per_task: int = 4,
        model_name: str = "resnet50",
        epochs: int = 10,
        batch_size: int = 128,
        lr: float = 0.0,
        bf16: bool = True,
        workers: int = PIPELINE_WORKERS,
        metric: str = "top1",
        min_delta: float = 0.0,
        max_class_drop: float = -1.0,  # refuse a candidate if a class's accuracy drops more (< 0: no check)
        retrain: bool = False,
        data_check: str = "fail",  # an anomaly in the new dataset stops the run before train; "warn": log it; "off"
        max_duplicate_fraction: float = 0.01,  # the data check's limits: tpustream/datacheck.py says why each
        max_leaked_images: int = 0,
        max_skipped_rate: float = 0.05,
        max_class_share_shift: float = 0.10,
        max_skipped_rate_increase: float = 0.02,
        vertex_model: str = "",  # also upload a promoted model to this Vertex AI Model Registry model
        serving_image: str = "",  # ... with this serving image (containers/serve; Cloud Build's serve.ref)
    ) -> str:
        shard_args = dict(
            source=source, num_shards=num_shards, val_fraction=val_fraction, upsample=upsample, seed=seed,
            max_side=max_side, strict=strict, min_train_shards=min_train_shards(tpu),
        )  # fmt: skip
        check = ops["check"](
            datasets_root=datasets_root, registry=registry, model_name=model_name, epochs=epochs,
            batch_size=batch_size, lr=lr, bf16=bf16, retrain=retrain, **shard_args,
        ).set_display_name("check source for new data")  # fmt: skip
        check.set_caching_options(False)
        with dsl.If(check.outputs["Output"] == "train", name="new-data"):
            plan = ops["plan"](
                shards_per_task=shards_per_task, dataset=check.outputs["dataset"], **shard_args
            )
            plan.set_display_name("plan shards").set_caching_options(False)
            with dsl.ParallelFor(plan.outputs["Output"], name="shard-ranges") as shard_range:
                write = ops["write"](shard_range=shard_range, dataset=check.outputs["dataset"], **shard_args)
                write.set_display_name("write shards").set_retry(num_retries=2).set_caching_options(False)
            finalize = ops["finalize"](
                planned=check.outputs["dataset"], written=dsl.Collected(write.output), **shard_args
            ).set_display_name("finalize manifest")
            finalize.set_caching_options(False)
            check_data = ops["check_data"](
                dataset=finalize.outputs["dataset"],
                registry=registry,
                data_check=data_check,
                max_duplicate_fraction=max_duplicate_fraction,
                max_leaked_images=max_leaked_images,
                max_skipped_rate=max_skipped_rate,
                max_class_share_shift=max_class_share_shift,
                max_skipped_rate_increase=max_skipped_rate_increase,
            ).set_display_name("check data")
            check_data.set_caching_options(False)
            train = ops["train"](
                dataset=finalize.outputs["dataset"], model_name=model_name, epochs=epochs, batch_size=batch_size,
                lr=lr, bf16=bf16, workers=workers, **train_extra,
            ).set_display_name("train")  # fmt: skip
            train.after(check_data)  # no TPU time on data the check refused (data_check=fail)
            # A retried task resumes from `last` in its own output (resume=auto): it continues, not restarts.
            train.set_retry(num_retries=2, backoff_duration="60s").set_caching_options(False)
            evaluate = ops["evaluate"](
                model=train.outputs["model"], dataset=finalize.outputs["dataset"], registry=registry,
                metric=metric, min_delta=min_delta, max_class_drop=max_class_drop,
            ).set_display_name("evaluate vs champion")  # fmt: skip
            evaluate.set_caching_options(False)
            with dsl.If(evaluate.outputs["Output"] == "promote", name="candidate-wins"):
                promote = ops["promote"](
                    model=train.outputs["model"], evaluation=evaluate.outputs["evaluation"], registry=registry,
                    metric=metric, min_delta=min_delta, max_class_drop=max_class_drop, vertex_model_name=vertex_model, serving_image=serving_image,
                    **promote_extra,
                ).set_display_name("promote")  # fmt: skip
                # A retry repairs a failed Model Registry upload: promote finds its champion and uploads it then.
                promote.set_caching_options(False).set_retry(num_retries=2, backoff_duration="60s")
        return check.outputs["Output"]  # "train" or "skip" (no new data): what this run did

    return tpustream_training
