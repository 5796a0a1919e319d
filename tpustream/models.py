"""Model zoo: torchvision ResNets (random init) and a tiny CNN for tests.

Inputs under 96 px (CIFAR, digits) get the usual small-image ResNet stem: a 3x3 stride-1 first
convolution and no max-pool, so a 32 px image is not reduced to 1 px before the last stage.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

__all__ = ["MODEL_NAMES", "build_model", "small_input", "parameter_groups", "count_parameters"]

SMALL_INPUT_MAX = 96


def small_input(input_size: int) -> bool:
    return input_size < SMALL_INPUT_MAX


def _tiny(num_classes: int, in_channels: int) -> nn.Module:
    """Three conv blocks and a linear head: compiles in seconds on XLA CPU, learns digits well."""

    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    return nn.Sequential(
        *block(in_channels, 32),
        nn.MaxPool2d(2),
        *block(32, 64),
        nn.MaxPool2d(2),
        *block(64, 128),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, num_classes),
    )


def _resnet(factory: Callable[..., nn.Module]) -> Callable[[int, int, int], nn.Module]:
    def build(num_classes: int, in_channels: int, input_size: int) -> nn.Module:
        model = factory(weights=None, num_classes=num_classes)
        if small_input(input_size) or in_channels != 3:
            stride = 1 if small_input(input_size) else 2
            kernel = 3 if small_input(input_size) else 7
            model.conv1 = nn.Conv2d(in_channels, 64, kernel, stride=stride, padding=kernel // 2, bias=False)
        if small_input(input_size):
            model.maxpool = nn.Identity()
        return model

    return build


def _registry() -> dict[str, Callable[[int, int, int], nn.Module]]:
    from torchvision import models

    return {
        "tiny": lambda classes, channels, _size: _tiny(classes, channels),
        "resnet18": _resnet(models.resnet18),
        "resnet34": _resnet(models.resnet34),
        "resnet50": _resnet(models.resnet50),
        "resnet101": _resnet(models.resnet101),
    }


MODEL_NAMES = ("tiny", "resnet18", "resnet34", "resnet50", "resnet101")


def build_model(name: str, *, num_classes: int, input_size: int, in_channels: int = 3) -> nn.Module:
    """Build ``name`` with random weights (nothing is downloaded)."""
    registry = _registry()
    if name not in registry:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)}")
    if num_classes < 2:
        raise ValueError(f"a classifier needs at least 2 classes, the dataset has {num_classes}")
    return registry[name](num_classes, in_channels, input_size)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on weights only: norms' scales and all biases (1-D parameters) get none."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for parameter in model.parameters():
        if parameter.requires_grad:
            (no_decay if parameter.ndim <= 1 else decay).append(parameter)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
