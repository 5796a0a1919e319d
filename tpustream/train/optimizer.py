"""The optimizer side of a run: the peak LR and its schedule, class weights for the loss, and fine-tuning's
parameter groups, backbone freezing and the optimizer state a thawed backbone needs before its first step.

Pure functions (``default_peak_lr``, ``lr_at``, ``inverse_frequency_weights``) and in-place changes to a model
or an optimizer before a step; nothing here runs a step (``tpustream/train/step.py`` does).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpustream.models import ModelSpec

__all__ = [
    "default_peak_lr",
    "fine_tune_peak_lr",
    "lr_at",
    "inverse_frequency_weights",
    "backbone_groups",
    "head_lr_scale",
    "set_head_lr_scale",
    "layer_decay_groups",
    "freeze_backbone",
    "fill_optimizer_state",
    "fine_tuning_phase",
]

log = logging.getLogger(__name__)


def default_peak_lr(global_batch: int, base: float = 0.1) -> float:
    """SGD's peak LR when the run gives none: 0.1 at a global batch of 256 (torchvision's ResNet recipe),
    scaled linearly above it (Goyal et al. 2017, "Accurate, Large Minibatch SGD") and by the square root
    below it (timm's ``--lr-base-scale sqrt``; Krizhevsky 2014, "One weird trick"): linear scaling gives a
    batch of 32 a tenth of the LR of 0.1 (0.0125), too little for the few hundred steps a small dataset
    offers; the square root gives it 0.035 (pure). ``base`` is the model's recipe's LR at 256
    (``ModelSpec.base_lr``: 0.1 for SGD, about 2e-4 for the AdamW recipes)."""
    ratio = global_batch / 256
    return base * (ratio if ratio >= 1 else math.sqrt(ratio))


def fine_tune_peak_lr(global_batch: int, spec: ModelSpec) -> float:
    """A --pretrained run's peak LR when the run gives none: the model's from-scratch default at this batch
    times its family's ``ModelSpec.fine_tune_lr_factor`` (pure). Fine-tuning's best LR is below training from
    scratch's (Kornblith, Shlens, Le, CVPR 2019, sec. 3/A.3); how far below is measured per family by
    ``tpustream bench finetune --lr-factors`` (models.py says what was measured)."""
    return default_peak_lr(global_batch, spec.base_lr) * spec.fine_tune_lr_factor


def lr_at(step: int, *, peak_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup to ``peak_lr``, then cosine decay to zero at ``total_steps`` (pure)."""
    if warmup_steps and step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return peak_lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def inverse_frequency_weights(class_counts: list[int]) -> list[float]:
    """``--class-weights auto``: one loss weight per class, inverse to its train samples and normalised so
    that the mean weight over the train samples is 1 (scikit-learn's ``class_weight="balanced"``:
    ``samples / (classes * count)``). A class without train samples gets 1.0: no sample of it is weighted."""
    present = [count for count in class_counts if count > 0]
    total = sum(present)
    return [total / (len(present) * count) if count > 0 else 1.0 for count in class_counts]


# --------------------------------------------------------------------------- fine-tuning


def backbone_groups(optimizer: Any, head: set[Any]) -> Any:
    """``optimizer`` with each parameter group split in two: the ``head`` parameters, and the rest, marked
    ``backbone`` (``train_step`` gives those ``--backbone-lr-scale`` of the scheduled LR). Regrouped in place
    before any step: the optimizer has no state to carry over."""
    groups = []
    for group in optimizer.param_groups:
        options = {key: value for key, value in group.items() if key != "params"}
        for is_backbone in (False, True):
            params = [p for p in group["params"] if (p not in head) == is_backbone]
            if params:
                groups.append({**options, "params": params, "backbone": is_backbone})
    optimizer.param_groups = []
    for group in groups:
        optimizer.add_param_group(group)
    return optimizer


def head_lr_scale(given: float | None, spec: ModelSpec, *, new_head: bool) -> float:
    """The head's LR as a multiple of the scheduled LR (pure): --head-lr-scale when ``given``; else the
    model's ``ModelSpec.fine_tune_head_lr_scale`` for a ``new_head`` (a run from --pretrained weights, whose
    head starts random: a layer that starts from random learns at a multiple of the trained layers' LR, as
    Caffe's fine-tuning example, models/finetune_flickr_style/train_val.prototxt, gives its new classifier
    ``lr_mult: 10``), and 1 for a head that is trained already (a warm start) or a run from random weights."""
    if given is not None:
        return given
    return spec.fine_tune_head_lr_scale if new_head else 1.0


def set_head_lr_scale(optimizer: Any, scale: float) -> None:
    """Give the head's parameter groups (``backbone_groups``' groups not marked ``backbone``) ``scale`` as
    their ``head_lr_scale``: ``train_step`` multiplies the scheduled LR by it. In place; a checkpoint's
    optimizer state keeps it, so a resumed run's head trains at what its run started with."""
    for group in optimizer.param_groups:
        if not group.get("backbone", True):
            group["head_lr_scale"] = scale


def layer_decay_groups(optimizer: Any, model: Any, depths: dict[str, int], deepest: int, decay: float) -> Any:
    """``optimizer`` with each parameter group split by depth (``ModelSpec.layer_depths``), each part's
    ``lr_scale`` ``decay ** (deepest - depth)``: layer-wise LR decay (Clark et al. 2020, ELECTRA; BEiT's and
    MAE's ViT fine-tuning), the head at the scheduled LR and each block below at ``decay`` of the one above.
    ``train_step`` multiplies the scheduled LR by it. Regrouped in place before any step, as ``backbone_groups``."""
    depth_of = {id(parameter): depths[name] for name, parameter in model.named_parameters()}
    groups = []
    for group in optimizer.param_groups:
        options = {key: value for key, value in group.items() if key != "params"}
        by_depth: dict[int, list[Any]] = {}
        for parameter in group["params"]:
            by_depth.setdefault(depth_of[id(parameter)], []).append(parameter)
        for depth in sorted(by_depth):
            groups.append({**options, "params": by_depth[depth], "lr_scale": decay ** (deepest - depth)})
    optimizer.param_groups = []
    for group in groups:
        optimizer.add_param_group(group)
    return optimizer


def freeze_backbone(model: Any, head: set[Any], frozen: bool) -> None:
    """Freeze (or thaw) every parameter but the ``head``'s: a frozen parameter gets no gradient, so the
    optimizer skips it (no update, no weight decay, no optimizer state) and the backward pass stops at the
    head. Frozen, the backbone's BatchNorm layers also run in inference mode: its running statistics stay
    the pretrained ones, as Keras's transfer-learning guide does (the model is otherwise in training mode).

    Their ``num_batches_tracked`` still counts each training forward while frozen (a hook; it is read only by
    a BatchNorm without momentum): on XLA a buffer no step has written yet enters the first step after the
    thaw unlike one a step has written, which compiles that step once more than the steps after it."""
    from torch import nn

    for parameter in model.parameters():
        if parameter not in head:
            parameter.requires_grad_(not frozen)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.train(not frozen)
            hook = module.__dict__.pop("_tpustream_frozen_count", None)
            if hook is not None:
                hook.remove()
            if frozen and module.num_batches_tracked is not None:
                module.__dict__["_tpustream_frozen_count"] = module.register_forward_hook(
                    _count_frozen_forward
                )


def _count_frozen_forward(module: Any, inputs: Any, output: Any) -> None:
    import torch

    if torch.is_grad_enabled():  # a training step's forward, not validation's (under no_grad)
        module.num_batches_tracked.add_(1)


def fill_optimizer_state(optimizer: Any, params: list[Any]) -> int:
    """Give ``params`` without optimizer state the state their optimizer's first step would create (zero
    momentum buffer; AdamW's zero step count and moments: the same update to the bit), copied from the host.
    A parameter thawed after ``--freeze-epochs`` has none; left to the optimizer, its first step would create
    it inside the step's graph: one more XLA compile of the whole step. Returns how many were filled (other
    optimizers are left to create their own)."""
    import torch
    import torch_xla.core.xla_model as xm

    wanted = set(params)
    filled = 0
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param not in wanted or optimizer.state.get(param):
                continue

            def zeros(shape: Any, dtype: Any, device: Any = param.device) -> Any:
                # device data from the host, no graph to compile (``.to(device)`` makes a 0-d tensor a
                # constant of the next step's graph instead)
                sent: Any = xm.send_cpu_data_to_device(torch.zeros(shape, dtype=dtype), device)
                return sent[0]

            if isinstance(optimizer, torch.optim.SGD) and group["momentum"]:
                state = {"momentum_buffer": zeros(param.shape, param.dtype)}
            elif isinstance(optimizer, torch.optim.Adam) and group["capturable"] and not group["fused"]:
                state = {
                    "step": zeros((), torch.get_default_dtype()),
                    "exp_avg": zeros(param.shape, param.dtype),
                    "exp_avg_sq": zeros(param.shape, param.dtype),
                }
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = zeros(param.shape, param.dtype)
            else:
                continue
            optimizer.state[param] = state
            filled += 1
    return filled


def fine_tuning_phase(model: Any, optimizer: Any, head: set[Any], *, epoch: int, freeze_epochs: int) -> None:
    """--freeze-epochs: the phase of ``epoch`` (so a resumed run is in the phase its epoch is): the head
    alone, or everything. Thawed, the backbone gets its optimizer state before the first step, so the steps
    compile to the graph a run without freezing compiles: the frozen phase's is the one extra."""
    if not freeze_epochs:
        return
    frozen = epoch < freeze_epochs
    freeze_backbone(model, head, frozen)
    if frozen:
        log.info(
            "epoch %d: the backbone is frozen (--freeze-epochs %d): training the head only",
            epoch + 1,
            freeze_epochs,
        )
        return
    if epoch == freeze_epochs:
        log.info("epoch %d: the backbone is thawed: training every layer", epoch + 1)
    fill_optimizer_state(optimizer, [p for p in model.parameters() if p not in head])
