"""The training DAG: shards (fanned out) -> train (TPU custom job on Vertex) -> evaluate -> If(promote) -> promote.

``build_pipeline(tpu=..., cpu_image=..., tpu_image=...)`` fixes the TPU type and images at compile
time; everything a scheduled run varies (source, output, model, epochs, thresholds) is a pipeline
parameter. No credential or service account is compiled in: those are submit-time settings.
"""

import copy
from dataclasses import dataclass
from typing import Any

from kfp import dsl

import components

__all__ = [
    "TPU_TYPES",
    "TpuSpec",
    "tpu_spec",
    "build_components",
    "build_pipeline",
    "DEFAULT_CPU_IMAGE",
    "DEFAULT_TPU_IMAGE",
]

DEFAULT_CPU_IMAGE = "us-docker.pkg.dev/PROJECT/tpustream/cpu:latest"
DEFAULT_TPU_IMAGE = "us-docker.pkg.dev/PROJECT/tpustream/tpu:latest"
TRAIN_TIMEOUT = "86400s"


@dataclass(frozen=True)
class TpuSpec:
    """A Vertex AI machine spec for a TPU type: ``hosts`` workers of ``machine_type``."""

    machine_type: str
    accelerator_type: str
    accelerator_count: int
    hosts: int = 1
    topology: str | None = None


TPU_TYPES: dict[str, TpuSpec] = {
    "v2-8": TpuSpec("cloud-tpu", "TPU_V2", 8),
    "v3-8": TpuSpec("cloud-tpu", "TPU_V3", 8),
    "v5e-1": TpuSpec("ct5lp-hightpu-1t", "TPU_V5_LITEPOD", 1, topology="1x1"),
    "v5e-4": TpuSpec("ct5lp-hightpu-4t", "TPU_V5_LITEPOD", 4, topology="2x2"),
    "v5e-8": TpuSpec("ct5lp-hightpu-8t", "TPU_V5_LITEPOD", 8, topology="2x4"),
    "v5e-16": TpuSpec("ct5lp-hightpu-4t", "TPU_V5_LITEPOD", 4, hosts=4, topology="4x4"),
    "v5e-32": TpuSpec("ct5lp-hightpu-4t", "TPU_V5_LITEPOD", 4, hosts=8, topology="4x8"),
}


def tpu_spec(name: str) -> TpuSpec:
    if name not in TPU_TYPES:
        raise ValueError(f"unknown TPU type {name!r}: choose one of {', '.join(TPU_TYPES)}")
    return TPU_TYPES[name]


def build_components(cpu_image: str, tpu_image: str, tpu: str | None) -> dict[str, Any]:
    """The step components with their images; the train step becomes a Vertex custom job when ``tpu``."""
    ops = {
        name: dsl.component(func, base_image=cpu_image)
        for name, func in (
            ("plan", components.plan_shards), ("write", components.write_shards),
            ("finalize", components.finalize_shards), ("evaluate", components.evaluate_model),
            ("promote", components.promote_model),
        )
    }  # fmt: skip
    train_op = dsl.component(components.train_model, base_image=tpu_image if tpu else cpu_image)
    if tpu:
        from google_cloud_pipeline_components.v1.custom_job import create_custom_training_job_from_component

        spec = tpu_spec(tpu)
        train_op = create_custom_training_job_from_component(
            train_op,
            display_name="tpustream-train",
            machine_type=spec.machine_type,
            accelerator_type=spec.accelerator_type,
            accelerator_count=spec.accelerator_count,
            replica_count=spec.hosts,  # one worker per host of the slice
            timeout=TRAIN_TIMEOUT,
            restart_job_on_worker_restart=True,  # preempted workers restart and resume from `last`
        )
        if spec.topology:  # GCPC has no tpu_topology argument: add it to the worker pools it built
            inputs = train_op.component_spec.inputs
            pools = copy.deepcopy(inputs["worker_pool_specs"].default)
            for pool in pools:
                pool["machine_spec"]["tpu_topology"] = spec.topology
            inputs["worker_pool_specs"].default = pools
    ops["train"] = train_op
    return ops


def build_pipeline(
    *, tpu: str | None = None, cpu_image: str = DEFAULT_CPU_IMAGE, tpu_image: str = DEFAULT_TPU_IMAGE
) -> Any:
    """The pipeline function, for kfp's compiler or kfp.local (``tpu=None``: every step runs as is)."""
    ops = build_components(cpu_image, tpu_image, tpu)

    @dsl.pipeline(
        name="tpustream-training", description="Image dataset -> shards -> TPU ResNet -> evaluate -> promote"
    )
    def tpustream_training(
        registry: str,
        source: str = "digits",
        num_shards: int = 8,
        val_fraction: float = -1.0,
        upsample: int = 1,
        seed: int = 0,
        shards_per_task: int = 4,
        model_name: str = "resnet50",
        epochs: int = 10,
        batch_size: int = 128,
        lr: float = 0.0,
        bf16: bool = True,
        workers: int = 8,
        metric: str = "top1",
        min_delta: float = 0.0,
    ) -> None:
        shard_args = dict(
            source=source, num_shards=num_shards, val_fraction=val_fraction, upsample=upsample, seed=seed
        )
        plan = ops["plan"](shards_per_task=shards_per_task, **shard_args).set_display_name("plan shards")
        with dsl.ParallelFor(plan.outputs["Output"], name="shard-ranges") as shard_range:
            write = ops["write"](shard_range=shard_range, dataset=plan.outputs["dataset"], **shard_args)
            write.set_display_name("write shards").set_retry(num_retries=2)
        finalize = ops["finalize"](
            planned=plan.outputs["dataset"], written=dsl.Collected(write.output), **shard_args
        ).set_display_name("finalize manifest")
        train = ops["train"](
            dataset=finalize.outputs["dataset"], model_name=model_name, epochs=epochs, batch_size=batch_size,
            lr=lr, bf16=bf16, workers=workers,
        ).set_display_name("train")  # fmt: skip
        # A retried task resumes from `last` in its own output (resume=auto): it continues, not restarts.
        # On Vertex the custom job also restarts preempted workers within one attempt.
        train.set_retry(num_retries=2, backoff_duration="60s")
        evaluate = ops["evaluate"](
            model=train.outputs["model"], dataset=finalize.outputs["dataset"], registry=registry, metric=metric,
            min_delta=min_delta,
        ).set_display_name("evaluate vs champion")  # fmt: skip
        evaluate.set_caching_options(False)  # reads the champion: never reuse an old answer
        with dsl.If(evaluate.outputs["Output"] == "promote", name="candidate-wins"):
            promote = ops["promote"](
                model=train.outputs["model"], evaluation=evaluate.outputs["evaluation"], registry=registry,
                metric=metric, min_delta=min_delta,
            ).set_display_name("promote")  # fmt: skip
            promote.set_caching_options(False)

    return tpustream_training
