"""The compiled work of a run: one optimizer step, the validation pass, and their accounting.

``train_step`` and ``evaluate`` issue device work only: nothing in them syncs with the host (the loss stays on
the device; validation's sums cross once per epoch). ``log_step`` is what a step closure runs once its step
has executed, and ``compile_count`` reads XLA's compile counter (``CompileTime``), which the epoch record and
the compile benchmarks report.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, TypedDict

from tpustream.loader.batch import Batch
from tpustream.metrics.masked import masked_mean, masked_sums, summarize
from tpustream.train.config import TrainConfig
from tpustream.train.mixing import mix_images, mixed_loss
from tpustream.xla_runtime import Runtime, device_loader

if TYPE_CHECKING:
    from tpustream.loader.shard_loader import ShardLoader
    from tpustream.train.ema import WeightAverage

__all__ = ["ValMetrics", "train_step", "evaluate", "compile_count", "log_step"]

log = logging.getLogger(__name__)


class ValMetrics(TypedDict):
    """One epoch's validation: exact over the val split (padding masked out), as the epoch record keeps it."""

    val_loss: float
    val_top1: float
    val_top5: float
    val_samples: int


def _normalize(images: Any) -> Any:
    """uint8 NCHW on the device -> normalised float32 (autocast lowers the convolutions to bf16)."""
    from tpustream.image.transforms import normalize

    return normalize(images)


def train_step(
    model: Any,
    optimizer: Any,
    batch: Batch,
    lr: float,
    config: TrainConfig,
    rt: Runtime,
    class_weights: Any = None,
    mix: Any = None,
    ema: WeightAverage | None = None,
    ema_decay: float = 0.0,
) -> Any:
    """One optimizer step on a device batch; returns the (device) loss. No host sync.

    ``lr`` is the schedule's: the backbone's groups (``backbone_groups``) take ``--backbone-lr-scale`` of it,
    the head's their ``head_lr_scale`` times it (``set_head_lr_scale``), and a group with an ``lr_scale``
    (``layer_decay_groups``) that fraction of it.
    ``class_weights`` (a device tensor, one weight per class; None: unweighted) weights each sample's loss;
    the samples with ``mask`` False (padding) weigh nothing.
    ``mix`` (a device tensor, ``tpustream.train.mixing.draw_mix``'s): MixUp or CutMix the batch, soft targets.
    ``ema``: the weights' average, updated after the optimizer step at ``ema_decay``, in the same graph."""
    import torch
    import torch.nn.functional as F
    import torch_xla
    import torch_xla.core.xla_model as xm

    for group in optimizer.param_groups:
        scale = config.backbone_lr_scale if group.get("backbone") else group.get("head_lr_scale", 1.0)
        group["lr"] = lr * scale * group.get("lr_scale", 1.0)
    images = _normalize(batch["image"])
    if mix is not None:
        images = mix_images(images, mix)
    with torch.autocast("xla", dtype=torch.bfloat16, enabled=config.bf16):
        logits = model(images)
    # Averaged over the batch's real samples (``mask``: the padded last batch of an epoch counts its real
    # samples only), not over the class weights (cross_entropy's own mean): with weights whose mean per
    # training sample is 1, the loss keeps its unweighted scale and the LR its meaning.
    if mix is not None:
        loss = mixed_loss(
            logits.float(),
            batch["label"],
            mix,
            label_smoothing=config.label_smoothing,
            class_weights=class_weights,
            mask=batch["mask"],
        )
    else:
        per_sample = F.cross_entropy(
            logits.float(),
            batch["label"],
            weight=class_weights,
            label_smoothing=config.label_smoothing,
            reduction="none",
        )
        loss = masked_mean(per_sample, batch["mask"])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if rt.strategy == "replicas":
        xm.optimizer_step(optimizer)  # all-reduces gradients across replicas, then steps
    else:
        optimizer.step()
    if ema is not None:
        ema.update(ema_decay)
    torch_xla.sync()
    return loss.detach()


def evaluate(model: Any, loader: ShardLoader, epoch: int, config: TrainConfig, rt: Runtime) -> ValMetrics:
    """Exact val metrics (tpustream/metrics/masked.py): masked sums on the device, one host transfer per epoch."""
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm

    model.eval()
    sums = torch.zeros(4, device=rt.device)  # loss, top1, top5, count
    with torch.no_grad():
        for batch in device_loader(loader.epoch(epoch), rt):
            with torch.autocast("xla", dtype=torch.bfloat16, enabled=config.bf16):
                logits = model(_normalize(batch["image"]))
            sums = sums + masked_sums(logits.float(), batch["label"], batch["mask"])[0]
            torch_xla.sync()
    if rt.strategy == "replicas" and rt.num_replicas > 1:
        sums = xm.all_reduce(xm.REDUCE_SUM, sums)  # type: ignore[assignment]
    model.train()
    metrics = summarize(sums)
    return ValMetrics(
        val_loss=metrics["loss"],
        val_top1=metrics["top1"],
        val_top5=metrics["top5"],
        val_samples=int(metrics["samples"]),
    )


def compile_count(met: Any) -> int:
    """XLA compiles in this process so far (``met``: ``torch_xla.debug.metrics``)."""
    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def log_step(
    loss: Any, step: int, epoch: int, lr: float, tracker: Any, rt: Runtime, wait_fraction: float, writer: Any
) -> None:
    """A step closure (``xm.add_step_closure``): log the step's loss and rates, and add them to TensorBoard."""
    loss_value = loss.item()  # inside a step closure: the step already ran, this is no extra sync
    log.info(
        "epoch %d step %d: loss %.4f lr %.4g Rate %.1f GlobalRate %.1f samples/s per device, data wait %.1f%%",
        epoch + 1,
        step,
        loss_value,
        lr,
        tracker.rate() / rt.local_devices,
        tracker.global_rate() / rt.local_devices,
        100 * wait_fraction,
    )
    if writer is not None:
        writer.add_scalar("train/loss", loss_value, step)
        writer.add_scalar("train/lr", lr, step)
