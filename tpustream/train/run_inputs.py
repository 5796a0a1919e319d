"""A training run's inputs, decided from its config and its dataset before its first step: the manifest
(both splits present), the batch per device, ``--pretrained`` resolved to a file, the input size and
preprocessing, the class weights of the loss, and this process's loaders. Each raises ``TrainError`` naming
the option to change.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpustream.dataset.manifest import Manifest, ShardError, load_manifest
from tpustream.models import model_spec
from tpustream.train.config import TrainConfig, TrainError
from tpustream.train.optimizer import inverse_frequency_weights
from tpustream.train.pretrained import Preprocessing, ResolvedWeights
from tpustream.xla_runtime import Runtime

if TYPE_CHECKING:
    from tpustream.loader.shard_loader import ShardLoader
    from tpustream.train.recipe import Recipe

__all__ = [
    "Loaders",
    "training_manifest",
    "per_device_batch",
    "resolve_pretrained",
    "resolve_input_size",
    "choose_input",
    "class_weights",
    "make_loaders",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loaders:
    """This process's loaders: its slice of the train split, and of the val split."""

    train: ShardLoader
    val: ShardLoader


def training_manifest(dataset: str) -> Manifest:
    """The dataset's manifest, which must have a train and a val split."""
    try:
        manifest = load_manifest(dataset)
    except ShardError as exc:
        raise TrainError(f"--data {dataset}: {exc}") from exc
    for split in ("train", "val"):
        found = manifest.split(split)
        if found is None or not found.shards:
            raise TrainError(
                f"--data {dataset} has no {split!r} split: re-create it with a validation fraction"
            )
    return manifest


def per_device_batch(config: TrainConfig, rt: Runtime) -> int:
    """--batch-size, or --global-batch-size over the job's devices."""
    wanted, devices = config.global_batch_size, rt.num_devices
    if wanted is None:
        return config.batch_size
    if wanted % devices:
        raise TrainError(
            f"--global-batch-size {wanted} does not divide over {devices} devices: "
            f"use a multiple of {devices}, e.g. {devices * max(1, wanted // devices)}"
        )
    return wanted // devices


def resolve_pretrained(config: TrainConfig, output: str, rt: Runtime) -> ResolvedWeights | None:
    """--pretrained resolved to the file this run reads (a named set: the cached, hash-checked copy)."""
    if not config.pretrained:
        return None
    from tpustream.train.pretrained import PretrainedError, default_weights_cache, resolve

    try:
        # A named set is fetched by process 0 alone; the other hosts of a slice read its cached copy.
        return resolve(
            config.pretrained,
            model=config.model,
            cache=config.weights_cache or default_weights_cache(output),
            input_size=config.input_size,
            fetch=rt.is_master,
            wait_seconds=config.commit_timeout_minutes * 60,
        )
    except PretrainedError as exc:
        raise TrainError(str(exc)) from exc


def resolve_input_size(config: TrainConfig, dataset: str, manifest: Manifest) -> tuple[int, str]:
    """--input-size, else the model's rule (``ModelSpec.input_size``) applied to the dataset's median shorter
    side; and how it was chosen."""
    if config.input_size:
        return config.input_size, f"--input-size {config.input_size}"
    from tpustream.dataset.input_size import default_input_size

    return default_input_size(dataset, manifest, model_spec(config.model).input_size)


def choose_input(
    config: TrainConfig, dataset: str, manifest: Manifest, pretrained: ResolvedWeights | None
) -> tuple[int, str, Preprocessing]:
    """The input size, how it was chosen, and the preprocessing at it: the --pretrained weights' crop size and
    preprocessing (unless --input-size), else ``resolve_input_size`` and ImageNet's default preprocessing."""
    if pretrained is not None and not config.input_size:
        size = pretrained.preprocessing.crop_size
        reason = f"the crop size of the --pretrained weights ({pretrained.name or pretrained.uri})"
    else:
        size, reason = resolve_input_size(config, dataset, manifest)
    preprocessing = (
        pretrained.preprocessing.at(size) if pretrained is not None else Preprocessing.default(size)
    )
    return size, reason, preprocessing


def class_weights(config: TrainConfig, manifest: Manifest) -> Any:
    """--class-weights auto: the train split's inverse class frequencies (a host tensor); else None."""
    import torch

    if config.class_weights == "none":
        return None
    counts = list(manifest.split("train").class_counts)  # type: ignore[union-attr]
    weights = inverse_frequency_weights(counts)
    log.info(
        "class weights (--class-weights auto, inverse train frequency, max/min %.1fx): %s",
        max(weights) / min(weights),
        ", ".join(f"{name} {weight:.3g}" for name, weight in zip(manifest.classes, weights, strict=True)),
    )
    return torch.tensor(weights, dtype=torch.float32)


def make_loaders(
    config: TrainConfig,
    dataset: str,
    manifest: Manifest,
    rt: Runtime,
    *,
    per_device: int,
    input_size: int,
    preprocessing: Preprocessing,
    recipe: Recipe | None = None,
) -> Loaders:
    """This process's train and val loaders (its replica's slice; SPMD: the host's devices' batch); the train
    loader's workers apply ``recipe``'s augmentation policy and random erasing."""
    from tpustream.loader.config import LoaderConfig
    from tpustream.loader.epoch_plan import LoaderError
    from tpustream.loader.shard_loader import ShardLoader

    try:
        train, val = (
            ShardLoader(
                LoaderConfig(
                    data=dataset,
                    split=split,
                    batch_size=rt.host_batch(per_device),
                    input_size=input_size,
                    num_replicas=rt.num_replicas,
                    replica_index=rt.replica_index,
                    workers=config.workers,
                    seed=config.seed,
                    val_crop_fraction=preprocessing.crop_fraction,
                    augment_policy=recipe.augment if recipe and split == "train" else "none",
                    random_erasing=recipe.random_erasing if recipe and split == "train" else 0.0,
                ),
                manifest=manifest,
            )
            for split in ("train", "val")
        )
    except LoaderError as exc:
        raise TrainError(str(exc)) from exc
    return Loaders(train=train, val=val)
