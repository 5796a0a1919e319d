"""A run's result: process 0 writes the model artifact (``model.pt``, the best epoch's weights, then
``model.json``, last) from the best checkpoint; every other host of a slice waits until it is committed, so
all leave together and only process 0 wrote anything (docs/ARCHITECTURE.md, "Training output and model
artifact").
"""

from __future__ import annotations

import hashlib
import io
import logging
import time

from tpustream.artifacts import ArtifactError, DatasetRef, ModelCard
from tpustream.image.transforms import IMAGENET_MEAN, IMAGENET_STD
from tpustream.storage import io as storage
from tpustream.train.checkpoint import CheckpointError, latest_checkpoint_uri, load_checkpoint
from tpustream.train.config import TrainConfig, TrainError
from tpustream.train.preemption import Preempted, StopAgreement
from tpustream.train.records import RunMeta, RunState, ema_won, epoch_score
from tpustream.xla_runtime import Runtime

__all__ = ["write_model_artifact", "wait_for_primary"]

log = logging.getLogger(__name__)


def write_model_artifact(output: str, meta: RunMeta, state: RunState) -> ModelCard:
    """model.pt (the best epoch's weights, weights_only-loadable) and model.json, model.json last."""
    import torch

    best_uri = latest_checkpoint_uri(output, "best")
    if best_uri is None:
        raise CheckpointError(f"no best checkpoint under {output}")
    best = load_checkpoint(best_uri)
    best_epoch = max(state.history, key=epoch_score) if state.history else None
    # The EMA's weights are the model when they were the better on val top-1 in the best epoch
    averaged = best_epoch is not None and ema_won(best_epoch) and "ema" in best
    buffer = io.BytesIO()  # a file object: the archive name is fixed, so equal weights hash equal
    torch.save(best["ema"] if averaged else best["model"], buffer)
    storage.write_bytes(storage.join(output, "model.pt"), buffer.getvalue())
    model_digest = hashlib.sha256(buffer.getbuffer()).hexdigest()
    metric = "ema_val_" if averaged else "val_"
    recipe = meta.get("recipe")
    preprocessing = meta.get("preprocessing")
    pretrained = meta.get("pretrained")  # the weights the backbone began from (None: not pretrained)
    init = meta.get("init")  # warm start: where the weights began (None: random)
    compile_cache = meta.get("compile_cache")  # its lookups in this process (None: no cache)
    card = ModelCard(
        arch=meta["model"],
        num_classes=len(meta["classes"]),
        classes=meta["classes"],
        input_size=meta["input_size"],
        input_size_reason=meta.get("input_size_reason", ""),  # checkpoints written before it lack it
        in_channels=3,
        small_input_stem=meta[
            "small_input_stem"
        ],  # the run's own meta: Trainer.fit sets it and the two below
        normalization={
            "mean": list(preprocessing["mean"] if preprocessing else IMAGENET_MEAN),
            "std": list(preprocessing["std"] if preprocessing else IMAGENET_STD),
            "scale": 255,
        },
        preprocessing=dict(preprocessing) if preprocessing else {},
        pretrained=dict(pretrained) if pretrained else None,
        metrics={
            "epoch": best_epoch["epoch"] if best_epoch else None,
            "val_top1": best_epoch[metric + "top1"] if best_epoch else None,  # type: ignore[literal-required]
            "val_top5": best_epoch[metric + "top5"] if best_epoch else None,  # type: ignore[literal-required]
            "val_loss": best_epoch[metric + "loss"] if best_epoch else None,  # type: ignore[literal-required]
            "val_samples": best_epoch["val_samples"] if best_epoch else None,
        },
        history=[dict(record) for record in state.history],
        dataset=DatasetRef(uri=meta["dataset"], manifest_digest=meta["dataset_digest"]),
        model_sha256=model_digest,
        steps=state.global_step,
        training=meta["config"],
        peak_lr=meta["peak_lr"],
        global_batch=meta["global_batch"],
        recipe={**recipe, "model_weights": "ema" if averaged else "raw"} if recipe else None,
        init=dict(init) if init else None,
        compile_cache=dict(compile_cache) if compile_cache else None,
        stopped_early=state.stopped_early,
        # --class-weights auto: the loss weight of each class (the training config says auto); the head's
        # multiple of the scheduled LR (--head-lr-scale, or the model's for a new head)
        extra={
            **({"class_weights": meta["class_weights"]} if meta.get("class_weights") else {}),
            **({"head_lr_scale": meta["head_lr_scale"]} if "head_lr_scale" in meta else {}),
        },
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    card.write(storage.join(output, ModelCard.NAME))
    log.info(
        "model artifact: %s (best epoch %s, val top-1 %.4f)",
        output,
        card.metrics["epoch"],
        card.best_top1 or 0,
    )
    return card


def wait_for_primary(
    output: str, digest: str, steps: int, config: TrainConfig, rt: Runtime, stop: StopAgreement
) -> ModelCard:
    """Hosts other than process 0 return once it has committed this run's model.json (same dataset, same
    final step), so every host of a slice leaves together and only process 0 wrote anything."""
    uri = storage.join(output, "model.json")
    deadline = time.monotonic() + config.commit_timeout_minutes * 60
    log.info("host %d: waiting for process 0 to commit %s", rt.replica_index, uri)
    while True:
        try:
            card = ModelCard.read(uri)
            if card.dataset is not None and card.dataset.manifest_digest == digest and card.steps == steps:
                return card
        except (storage.NotFound, ArtifactError):  # not written yet, or half-written by another version
            pass
        # Told (SIGTERM) or seeing another host's notice: nothing of ours to save; report our final step so
        # process 0 stops there too, rather than time out waiting for us and leave us waiting for it.
        if stop.requested:
            stop.stop_step(steps)
            raise Preempted(f"host {rt.replica_index}: preempted while waiting for process 0 to commit {uri}")
        if time.monotonic() > deadline:
            raise TrainError(
                f"host {rt.replica_index}: process 0 did not commit {uri} (step {steps}) within "
                f"{config.commit_timeout_minutes:g} min; see process 0's log. A re-run resumes from `last`"
            )
        time.sleep(1.0)
