"""The plain PyTorch side of ``tpustream bench finetune`` (bench/finetune.py): the pretraining on the source
task that makes the weights every arm starts from, and the plain torchvision-reference fine-tune those weights
are compared against. Eager CPU, no XLA, no tpustream loader: what a user would write by hand."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tpustream.bench.transfer_task import SOURCE_CLASSES

if TYPE_CHECKING:
    from tpustream.bench.finetune import FinetuneSize

__all__ = [
    "PRETRAIN_ADAMW_LR",
    "EFFICIENTNET_PRETRAIN",
    "pretrain_defaults",
    "pretrain_optimizer_name",
    "plain_finetune",
    "plain_pretrain",
]

PRETRAIN_BATCH = 64
"""The plain pretraining's batch."""
PRETRAIN_ADAMW_LR = 1e-3
"""The plain pretraining's peak LR where it runs AdamW (``pretrain_optimizer_name``), at batch 64."""
EFFICIENTNET_PRETRAIN = (60, 3e-3)
"""The EfficientNets' pretraining (epochs, AdamW peak LR) when not given: at the bench's 24 epochs and 1e-3,
efficientnet_b0 reached source top-1 0.1341 and the task was uninformative for it (the plain fine-tune 0.12
against 0.1212 from random init, 10 a class); at 60 and 3e-3 (2,040 steps) 0.2182, the plain fine-tune 0.26
against 0.1212 (README, the EfficientNets' factor)."""
SOURCE_VAL_PER_CLASS = 20
"""Held-out source images per class that the pretraining's top-1 is measured on."""
TEST_INDEX_START = 100_000
"""Test images are drawn from this index on: never one of the train images (indices 0 to N-1)."""


def plain_finetune(
    start: str,
    data: str,
    *,
    model: str,
    epochs: int,
    steps_per_epoch: int,
    batch_size: int,
    lr: float,
    input_size: int,
    seed: int,
    augment: str = "none",
) -> dict[str, Any]:
    """Plain PyTorch on the CPU, torchvision's reference way: ``start``'s weights but the head, ``data``'s
    train/ for ``epochs`` x ``steps_per_epoch`` steps, then top-1 on its val/. ``augment`` "trivial": torchvision's
    TrivialAugmentWide after the crop and flip (the reference's ``--auto-augment ta_wide``)."""
    import torch
    from torchvision import datasets, transforms

    from tpustream.image.transforms import IMAGENET_MEAN, IMAGENET_STD, default_min_crop_scale
    from tpustream.models import model_spec

    torch.manual_seed(seed)
    spec = model_spec(model)
    normalize = [transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    scale = (default_min_crop_scale(input_size), 1.0)
    train_set = datasets.ImageFolder(
        os.path.join(data, "train"),
        transforms.Compose(
            [
                transforms.RandomResizedCrop(input_size, scale=scale),
                transforms.RandomHorizontalFlip(),
                *([transforms.TrivialAugmentWide()] if augment == "trivial" else []),
                *normalize,
            ]
        ),
    )
    test_set = datasets.ImageFolder(
        os.path.join(data, "val"), transforms.Compose([transforms.CenterCrop(input_size), *normalize])
    )
    network = spec.build(num_classes=len(train_set.classes), input_size=input_size, small_input_stem=False)
    state = torch.load(start, map_location="cpu", weights_only=True)
    head = spec.head + "."
    missing, unexpected = network.load_state_dict(
        {key: value for key, value in state.items() if not key.startswith(head)}, strict=False
    )
    if unexpected or any(not key.startswith(head) for key in missing):
        raise RuntimeError(f"{start} does not fit {model}: missing {missing}, unexpected {unexpected}")
    optimizer = torch.optim.SGD(network.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    total = epochs * steps_per_epoch
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
    # the same steps as ours: a partial last batch only where ours trains on one too
    drop_last = len(train_set) // batch_size == steps_per_epoch
    loader = torch.utils.data.DataLoader(
        train_set, batch_size=batch_size, shuffle=True, drop_last=drop_last, num_workers=0
    )
    steps = 0
    network.train()
    for _ in range(epochs):
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(network(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            steps += 1
    network.eval()
    correct = 0
    with torch.no_grad():
        for images, labels in torch.utils.data.DataLoader(test_set, batch_size=100):
            correct += int((network(images).argmax(1) == labels).sum())
    return {"steps": steps, "final_top1": round(correct / len(test_set), 4)}


def _drawn_tensors(classes: Sequence[Any], seed: int, indices: Sequence[int]) -> tuple[Any, Any]:
    """The task's images of ``classes`` (image ``i`` of each for ``i`` in ``indices``), normalised as the
    trainer feeds them (ImageNet mean/std), and their labels: an in-memory batch for the plain runs."""
    import numpy as np
    import torch

    from tpustream.bench.transfer_task import draw_image
    from tpustream.image.transforms import IMAGENET_MEAN, IMAGENET_STD

    pixels = np.stack([draw_image(cls, seed, i) for cls in classes for i in indices])
    images = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    labels = torch.arange(len(classes)).repeat_interleave(len(indices))
    return (images - mean) / std, labels


def pretrain_defaults(model: str, epochs: int) -> tuple[int, float | None]:
    """The pretraining's (epochs, peak LR) for ``model`` where the user does not give them (the CLI takes each
    that is not given): ``EFFICIENTNET_PRETRAIN`` for the EfficientNets; for the others ``epochs`` (the bench
    size's) and None (``bench_finetune``'s default LR for the optimizer)."""
    if model.startswith("efficientnet_"):
        return EFFICIENTNET_PRETRAIN
    return epochs, None


def pretrain_optimizer_name(model: str) -> str:
    """The pretraining's optimizer for ``model``: SGD for the tiny model and the ResNets (as torchvision's
    ResNet recipe trains them from scratch), AdamW for the others: an AdamW family's from-scratch LR (about
    2e-4 at 256) leaves SGD standing still, and efficientnet_b0 under SGD (Nesterov, LR 0.1 or 0.03, batch 64)
    stayed at chance on the source task after 204 steps (source top-1 0.0455 and 0.0273), where AdamW at 1e-3
    took its batch top-1 from 0.17 to 0.42 in 80 steps (SGD at 0.03: 0.05 and 0.05). A whole AdamW pretraining
    of efficientnet_b0 (24 epochs at 1e-3) reaches 0.1341, 60 epochs at 3e-3 0.2182 (``EFFICIENTNET_PRETRAIN``);
    convnext_tiny's at 2.5e-4 reaches 0.1795 (README)."""
    return "sgd" if model == "tiny" or model.startswith("resnet") else "adamw"


def _pretrain_optimizer(network: Any, model: str, lr: float) -> Any:
    """SGD momentum 0.9, Nesterov, weight decay 5e-5 on every parameter; or AdamW, weight decay on weights only:
    an AdamW family's own (convnext_tiny 0.05, vit_b_16 0.3), 0.05 for the SGD families it pretrains (their
    spec's is SGD's)."""
    import torch

    from tpustream.models import adamw, model_spec

    if pretrain_optimizer_name(model) == "adamw":
        # the weight decay is the spec's for an AdamW family; an SGD one's (1e-4 or 2e-5) is SGD's, so 0.05
        spec = model_spec(model)
        decay = spec.weight_decay if spec.optimizer is adamw else 0.05
        return adamw(network, lr=lr, momentum=0.9, weight_decay=decay, capturable=False)
    return torch.optim.SGD(network.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-5)


def plain_pretrain(
    size: FinetuneSize, random_file: str, *, input_size: int, seed: int, lr: float
) -> dict[str, Any]:
    """The source task's weights: plain PyTorch on the CPU from ``random_file`` (``_pretrain_optimizer``,
    one-cycle LR to ``lr``, random flips and 4 px shifts), ``size.source_per_class`` images of each
    source class for ``size.pretrain_epochs`` epochs, then top-1 on held-out source images. Eager CPU runs
    this several times faster than XLA's CPU backend, and the weights are the user's, not under test."""
    import torch

    from tpustream.models import model_spec

    started = time.perf_counter()
    torch.manual_seed(seed)
    network = model_spec(size.model).build(
        num_classes=len(SOURCE_CLASSES), input_size=input_size, small_input_stem=False
    )
    network.load_state_dict(torch.load(random_file, map_location="cpu", weights_only=True))
    images, labels = _drawn_tensors(SOURCE_CLASSES, seed, range(size.source_per_class))
    held_out = range(TEST_INDEX_START, TEST_INDEX_START + SOURCE_VAL_PER_CLASS)
    val_images, val_labels = _drawn_tensors(SOURCE_CLASSES, seed, held_out)
    batch = PRETRAIN_BATCH
    steps_per_epoch = len(images) // batch
    optimizer = _pretrain_optimizer(network, size.model, lr)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer,
        lr,
        total_steps=size.pretrain_epochs * steps_per_epoch,
        pct_start=0.2,
        cycle_momentum=isinstance(optimizer, torch.optim.SGD),
    )
    generator = torch.Generator().manual_seed(seed)
    network.train()
    for _ in range(size.pretrain_epochs):
        order = torch.randperm(len(images), generator=generator)
        for step in range(steps_per_epoch):
            chosen = order[step * batch : (step + 1) * batch]
            x = images[chosen]
            flip = torch.rand(len(chosen), 1, 1, 1, generator=generator) < 0.5
            x = torch.where(flip, x.flip(3), x)
            dx, dy = (int(v) for v in torch.randint(-4, 5, (2,), generator=generator))
            x = torch.roll(x, shifts=(dy, dx), dims=(2, 3))
            loss = torch.nn.functional.cross_entropy(network(x), labels[chosen])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
    network.eval()
    with torch.no_grad():
        predicted = torch.cat(
            [network(val_images[i : i + 200]).argmax(1) for i in range(0, len(val_images), 200)]
        )
    return {
        "steps": size.pretrain_epochs * steps_per_epoch,
        "batch_size": batch,
        "lr": round(lr, 6),
        "source_val_top1": round(float((predicted == val_labels).float().mean()), 4),
        "source_val_images": len(val_labels),
        "seconds": round(time.perf_counter() - started, 1),
        "state": network.state_dict(),
    }
