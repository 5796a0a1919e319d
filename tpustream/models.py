"""Model zoo: one ``ModelSpec`` per model, so adding a model is one entry in ``MODEL_SPECS``.

A spec says everything the trainer, the evaluator, the server and the CLI need to know about a model: how
to build it with random weights, how to adapt it to small inputs, which input side to train at when the run
does not say, and how to build its optimizer. torch and torchvision are imported inside the functions:
``tpustream --help`` reads ``MODEL_NAMES`` without them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast

from tpustream.dataset.input_size import InputSizeRule
from tpustream.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from tpustream.artifacts import ModelCard

__all__ = [
    "MODEL_NAMES",
    "MODEL_SPECS",
    "RESNET_FINE_TUNE_LR_FACTOR",
    "EFFICIENTNET_FINE_TUNE_LR_FACTOR",
    "CONVNEXT_FINE_TUNE_HEAD_LR_SCALE",
    "SGD_FINE_TUNE_LR_FACTOR",
    "SMALL_INPUT_MAX",
    "Builder",
    "InputSizeRule",
    "LayerDepths",
    "ModelSpec",
    "OptimizerRecipe",
    "SmallInputStem",
    "adamw",
    "build_model",
    "build_network",
    "card_small_input_stem",
    "default_small_input_stem",
    "network_for_card",
    "count_parameters",
    "model_spec",
    "parameter_groups",
    "sgd_momentum",
    "small_input",
]

SMALL_INPUT_MAX = 96


def small_input(input_size: int) -> bool:
    """Whether ``input_size`` is a small input (CIFAR, digits): one a spec's ``small_input`` stem is for."""
    return input_size < SMALL_INPUT_MAX


class Builder(Protocol):
    """Builds a model with random weights for ``input_size`` px inputs of ``in_channels`` channels."""

    def __call__(self, *, num_classes: int, in_channels: int, input_size: int) -> nn.Module: ...


class SmallInputStem(Protocol):
    """Adapts a model built for 3 channels to small inputs of ``in_channels`` channels; returns it."""

    def __call__(self, model: nn.Module, *, in_channels: int) -> nn.Module: ...


class OptimizerRecipe(Protocol):
    """Builds the optimizer of ``model``'s parameters with the run's peak LR, momentum and weight decay."""

    def __call__(
        self, model: nn.Module, *, lr: float, momentum: float, weight_decay: float
    ) -> torch.optim.Optimizer: ...


class LayerDepths(Protocol):
    """Layer-wise LR decay's depth of each parameter of ``model`` by name (0: the input's embedding, the
    deepest: the head), and the deepest depth."""

    def __call__(self, model: nn.Module) -> tuple[dict[str, int], int]: ...


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One model: its builder, small-input stem, default input size and optimizer recipe.

    ``small_input`` is applied to inputs under ``SMALL_INPUT_MAX`` px (None: the model takes them as built).
    ``head`` is the dotted path of the final ``nn.Linear`` (the classifier a fine-tuning run re-initialises for
    the user's classes); ``torchvision_arch`` the name of the torchvision builder whose weights enum
    (``torchvision.models.get_model_weights``) lists the model's pretrained weights (None: no published
    weights, e.g. the tiny test model).
    """

    name: str
    builder: Builder
    small_input: SmallInputStem | None
    optimizer: OptimizerRecipe
    head: str
    torchvision_arch: str | None = None
    input_size: InputSizeRule = field(default_factory=InputSizeRule)
    base_lr: float = 0.1
    """The optimizer recipe's peak LR at a global batch of 256 (the trainer scales it with the batch)."""
    weight_decay: float = 1e-4
    """The optimizer recipe's weight decay when the run gives none."""
    fine_tune_lr_factor: float = 0.1
    """A fine-tuning run's (--pretrained, --init-from) default peak LR as a factor of the from-scratch one
    (``train.optimizer.fine_tune_peak_lr``)."""
    fine_tune_head_lr_scale: float = 1.0
    """A fine-tuning run from --pretrained weights: its new head's LR as a multiple of the scheduled one, when
    the run gives no --head-lr-scale (``train.optimizer.head_lr_scale``)."""
    layer_depths: LayerDepths | None = None
    """A transformer's blocks by depth, for layer-wise LR decay (``--layer-decay``); None: not a ViT."""

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ConfigError(f"a model name is one word of letters, digits and _, got {self.name!r}")

    def build(
        self, *, num_classes: int, input_size: int, in_channels: int = 3, small_input_stem: bool | None = None
    ) -> nn.Module:
        """The model with random weights. A small-input stem replaces the stem that reads the image, so the
        builder makes its stock RGB stem and the small-input stem the one for ``in_channels``.
        ``small_input_stem``: which stem (None: the spec's rule for ``input_size``)."""
        if small_input_stem is None:
            small_input_stem = self.small_input_stem(input_size)
        elif small_input_stem and self.small_input is None:
            raise ConfigError(f"{self.name} has no small-input stem, but the network is said to have one")
        if not small_input_stem:
            return self.builder(num_classes=num_classes, in_channels=in_channels, input_size=input_size)
        model = self.builder(num_classes=num_classes, in_channels=3, input_size=input_size)
        return cast("SmallInputStem", self.small_input)(model, in_channels=in_channels)

    def small_input_stem(self, input_size: int) -> bool:
        """Whether a model for ``input_size`` px inputs has this spec's small-input stem."""
        return self.small_input is not None and small_input(input_size)


# ------------------------------------------------------------------------------------------- optimizers


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


def sgd_momentum(
    model: nn.Module, *, lr: float, momentum: float, weight_decay: float
) -> torch.optim.Optimizer:
    """SGD with heavy-ball momentum (not Nesterov), weight decay on weights only (``parameter_groups``).
    Its state is one momentum buffer per parameter: no step counter, nothing the host reads in a step."""
    import torch

    return torch.optim.SGD(parameter_groups(model, weight_decay), lr=lr, momentum=momentum)


def adamw(
    model: nn.Module, *, lr: float, momentum: float, weight_decay: float, capturable: bool = True
) -> torch.optim.Optimizer:
    """AdamW (decoupled weight decay) with ``momentum`` as beta1 (0.9 in both the run's default and torch's),
    beta2 0.999, weight decay on weights only (``parameter_groups``, torchvision's ``--norm-weight-decay 0.0``).
    Its per-parameter step counts stay on the device (``capturable``): the host reads nothing in a step.
    ``capturable`` False: for eager CPU tensors (the bench's plain pretraining), which torch refuses it for."""
    import torch

    return torch.optim.AdamW(
        parameter_groups(model, weight_decay),
        lr=lr,
        betas=(momentum, 0.999),
        capturable=capturable,
    )


# ---------------------------------------------------------------------------------------------- models


def _tiny(*, num_classes: int, in_channels: int, input_size: int) -> nn.Module:
    """Three conv blocks and a linear head: compiles in seconds on XLA CPU, learns digits well. It pools
    adaptively, so one network takes any input size."""
    from torch import nn

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


def _resnet(arch: str) -> Builder:
    """torchvision's ``arch`` (resnet18, ...); other channel counts get an ImageNet stem of their own."""

    def build(*, num_classes: int, in_channels: int, input_size: int) -> nn.Module:
        from torch import nn
        from torchvision import models

        model = cast("nn.Module", getattr(models, arch)(weights=None, num_classes=num_classes))
        if in_channels != 3:
            model.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        return model

    return build


def _resnet_small_input(model: nn.Module, *, in_channels: int) -> nn.Module:
    """The usual small-image ResNet stem: a 3x3 stride-1 first convolution and no max-pool, so a 32 px image
    is not reduced to 1 px before the last stage (total stride 8 instead of 32)."""
    from torch import nn

    model.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def _efficientnet_b0(*, num_classes: int, in_channels: int, input_size: int) -> nn.Module:
    """torchvision's EfficientNet-B0 (Tan & Le 2019): stem conv of stride 2, total stride 32."""
    from torchvision.models import efficientnet_b0

    return _efficientnet_stem(efficientnet_b0(weights=None, num_classes=num_classes), in_channels, stride=2)


def _efficientnet_small_input(model: nn.Module, *, in_channels: int) -> nn.Module:
    """Stride 1 in the stem, the other strides kept, as the CIFAR EfficientNet-B0 of kuangliu/pytorch-cifar
    (``models/efficientnet.py``): total stride 16, so a 32 px image still has 2x2 features in the last stage
    (with the stock stem: 1x1 from the sixth stage on). No max-pool to drop, and the same parameters: a
    checkpoint at any input size loads into any other."""
    return _efficientnet_stem(model, in_channels, stride=1)


def _efficientnet_stem(model: nn.Module, in_channels: int, *, stride: int) -> nn.Module:
    from torch import nn

    conv = cast(
        "nn.Conv2d", model.get_submodule("features.0.0")
    )  # 3x3 conv of the first Conv2dNormActivation
    if conv.in_channels != in_channels:
        conv = nn.Conv2d(in_channels, conv.out_channels, 3, stride=stride, padding=1, bias=False)
        nn.init.kaiming_normal_(conv.weight, mode="fan_out")  # torchvision's EfficientNet initialises so
        model.set_submodule("features.0.0", conv)
    conv.stride = (stride, stride)
    return model


def _vit_b_16(*, num_classes: int, in_channels: int, input_size: int) -> nn.Module:
    """torchvision's ViT-B/16 (Dosovitskiy et al. 2021) for ``input_size`` px: its position embeddings are one
    per 16 px patch, so the side must be a multiple of 16 (the spec's input-size rule fixes it at 224)."""
    from torch import nn
    from torchvision.models import vit_b_16

    if input_size % 16:
        raise ConfigError(f"--input-size {input_size}: vit_b_16 takes a multiple of 16 px (224 is its own)")
    model = vit_b_16(weights=None, num_classes=num_classes, image_size=input_size)
    if in_channels != 3:
        stem = cast("nn.Conv2d", model.conv_proj)
        model.conv_proj = nn.Conv2d(in_channels, stem.out_channels, 16, stride=16)
    return cast("nn.Module", model)


def _vit_layer_depths(model: nn.Module) -> tuple[dict[str, int], int]:
    """torchvision's ViT: the patch embedding, class token and position embedding at 0, encoder block i at
    i + 1, the final norm and the head above the last block (BEiT's and MAE's ``param_groups_lrd``)."""
    blocks = len(list(model.get_submodule("encoder.layers").children()))
    depths = {}
    for name, _ in model.named_parameters():
        if name.startswith("encoder.layers."):
            depths[name] = int(name.split(".")[2].rsplit("_", 1)[1]) + 1  # encoder.layers.encoder_layer_3.
        elif name.startswith(("conv_proj.", "class_token", "encoder.pos_embedding")):
            depths[name] = 0
        else:
            depths[name] = blocks + 1
    return depths, blocks + 1


def _convnext_tiny(*, num_classes: int, in_channels: int, input_size: int) -> nn.Module:
    """torchvision's ConvNeXt-T (Liu et al. 2022): a 4x4 stride-4 patchify stem, total stride 32."""
    from torch import nn
    from torchvision.models import convnext_tiny

    model = cast("nn.Module", convnext_tiny(weights=None, num_classes=num_classes))
    if in_channels != 3:
        model.set_submodule("features.0.0", nn.Conv2d(in_channels, 96, 4, stride=4))
    return model


def _convnext_small_input(model: nn.Module, *, in_channels: int) -> nn.Module:
    """The patchify stem at stride 2 (padding 1) instead of 4, the same 4x4 kernel: total stride 16, so a
    32 px image keeps 2x2 features in the last stage (stride 4 leaves 1x1), and the same parameters, so
    pretrained or any-size checkpoints load. Stride 1 would quadruple the first stage's cost for little."""
    from torch import nn

    stem = cast("nn.Conv2d", model.get_submodule("features.0.0"))
    if stem.in_channels != in_channels:
        stem = nn.Conv2d(in_channels, stem.out_channels, 4, stride=2, padding=1)
        model.set_submodule("features.0.0", stem)
    stem.stride, stem.padding = (2, 2), (1, 1)
    return model


def _efficientnet_v2_s(*, num_classes: int, in_channels: int, input_size: int) -> nn.Module:
    """torchvision's EfficientNetV2-S (Tan & Le 2021): stem conv of stride 2, total stride 32."""
    from torchvision.models import efficientnet_v2_s

    return _efficientnet_stem(efficientnet_v2_s(weights=None, num_classes=num_classes), in_channels, stride=2)


# A family's fine-tuning LR (a --pretrained run without --lr): a factor times its from-scratch default
# (below 1 but for ConvNeXt, whose AdamW scratch default is 400x below the SGD families' at a batch).
# The ResNets': chosen from `tpustream bench finetune --lr-factors 2,3,4` (resnet18, the procedural transfer
# task, batch 16, seed 0; README, "Fine-tune on your own images"): final top-1 over the plain
# torchvision-reference fine-tune of the same weights at 0.1 / 0.2 / 0.3 / 0.4 of the scratch default: 10
# images a class 0.641 / 0.846 / 0.942 / 0.974, 30 a class 0.894 / 0.950 / 0.957 / 0.901, 100 a class
# 0.920 / - / 0.933 / -. 0.3 is the best at 30 and near it at 10; at batch 32 it is 0.0106, near the
# reference's 0.01. That sweep ran with the small-data recipe's TrivialAugmentWide, since dropped (recipe.py);
# the README gives the default's top-1 against the reference without it.
RESNET_FINE_TUNE_LR_FACTOR = 0.3
# The tiny test model keeps a tenth, as vit_b_16 does: not measured (ViT-B/16 is fixed at 224 px: pretraining
# it on the task is hours of a CPU).
SGD_FINE_TUNE_LR_FACTOR = 0.1
# The EfficientNets' (SGD): `bench finetune --model efficientnet_b0 --pretrain-epochs 60 --pretrain-lr 0.003
# --lr-factors ...` (AdamW-pretrained on the same task, source top-1 0.2182; 10 images a class, 30 steps at batch
# 16, seed 0, 800 test images; README): final top-1 at 0.01 / 0.02 / 0.03 / 0.06 / 0.1 (the old default) / 0.15 /
# 0.3 / 1 of the scratch default 0.2975 / 0.305 / 0.305 / 0.2662 / 0.245 / 0.25 / 0.14 / 0.1375 against the plain
# reference's 0.26 (random init 0.1212): a plateau at 0.02-0.03, a cliff above 0.15. 0.03 (7.5e-4 at batch 16)
# is the higher end of the plateau; at it, 10 a class seeds 1 and 2, and 30 and 100 a class seed 0: see the README.
# Measured on efficientnet_b0; efficientnet_v2_s, the same torchvision recipe, takes it unmeasured.
EFFICIENTNET_FINE_TUNE_LR_FACTOR = 0.03
# ConvNeXt's (AdamW): `bench finetune --model convnext_tiny --lr-factors ...` (AdamW-pretrained on the same task,
# source top-1 0.1795; 10 images a class, 30 steps at batch 16, seed 0, 800 test images; README): the old tenth,
# 6.25e-6, left the new head near its random start: final top-1 at 0.1 / 1 / 3 / 10 / 30 of the scratch default
# 0.155 / 0.1512 / 0.2412 / 0.2213 / 0.1212 against the plain reference's 0.2725 (random init 0.1013). 3x is the best
# measured; at it, 10 a class seed 1: 0.2662 (the tenth 0.2275, the reference 0.2512), seed 2: 0.2787 (the
# reference 0.2712); 30 and 100 a class, seed 0:
# 1.155x and 1.11x the reference. Few seeds, so a step, not the last word.
CONVNEXT_FINE_TUNE_LR_FACTOR = 3.0
# ConvNeXt's new head at 10x that (AdamW): at 3x alone the head underfit in 30 steps (top-1 0.13 after the
# first epoch, still rising at the last). `bench finetune --model convnext_tiny --pretrain-lr 0.00025
# --no-random-arm --test-per-class 100 --images-per-class 10 --epochs 6 --no-default-arm --recipe-args "--lr
# 0.001875 --backbone-lr-scale 0.1"` (the backbone at the default 1.875e-4, the head at 10x), seeds 0-5: 0.315 /
# 0.3225 / 0.2988 / 0.2938 / 0.305 / 0.3187 against the plain reference's 0.2725 / 0.2512 / 0.2712 / 0.2762 /
# 0.26 / 0.285 (mean 1.147x; the head at 3x: 0.89x); 30 and 100 a class: README. With the device's RNG seeded
# by --seed (762a0a4; before, the same stochastic-depth masks at every seed), the default itself: mean 1.133x over
# seeds 0-5 at 10 a class (each seed above the reference), 1.222x at 30 and 1.124x at 100 (seed 0).
CONVNEXT_FINE_TUNE_HEAD_LR_SCALE = 10.0

MODEL_SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="tiny",
            builder=_tiny,
            small_input=None,
            optimizer=sgd_momentum,
            head="13",
            fine_tune_lr_factor=SGD_FINE_TUNE_LR_FACTOR,
        ),
        *(
            ModelSpec(
                name=name,
                builder=_resnet(name),
                small_input=_resnet_small_input,
                optimizer=sgd_momentum,
                head="fc",
                torchvision_arch=name,
                fine_tune_lr_factor=RESNET_FINE_TUNE_LR_FACTOR,
            )
            for name in ("resnet18", "resnet34", "resnet50", "resnet101")
        ),
        # The optimizer is torchvision's for its EfficientNets (references/classification/README.md,
        # EfficientNet-V2: train.py's default --opt sgd, --momentum 0.9, no Nesterov, --norm-weight-decay 0.0 as
        # parameter_groups does; B0's own weights were ported, not trained there). Its --weight-decay 2e-5 and
        # --lr 0.5 at batch 1024 (0.125 per 256) are this run's --weight-decay and --lr. Not the paper's
        # TF-style RMSprop, whose epsilon torch's RMSprop places differently.
        # Input size: 224 px is B0's ImageNet side; at least 32 px, which the stride-1 stem leaves 2x2 in the
        # last stage, as 16 px leaves ResNet's small-input stem (digits' 8 px images are upscaled to 32).
        ModelSpec(
            name="efficientnet_b0",
            builder=_efficientnet_b0,
            small_input=_efficientnet_small_input,
            optimizer=sgd_momentum,
            head="classifier.1",
            torchvision_arch="efficientnet_b0",
            fine_tune_lr_factor=EFFICIENTNET_FINE_TUNE_LR_FACTOR,
            input_size=InputSizeRule(smallest=32, largest=224),
        ),
        # As B0: torchvision's SGD recipe for its EfficientNet-V2 weights, the same stride-1 small-input stem.
        # 384 px is the side its IMAGENET1K_V1 weights are evaluated at (weights.transforms()).
        ModelSpec(
            name="efficientnet_v2_s",
            builder=_efficientnet_v2_s,
            small_input=_efficientnet_small_input,
            optimizer=sgd_momentum,
            head="classifier.1",
            torchvision_arch="efficientnet_v2_s",
            fine_tune_lr_factor=EFFICIENTNET_FINE_TUNE_LR_FACTOR,
            input_size=InputSizeRule(smallest=32, largest=384),
        ),
        # torchvision's references/classification/README.md, vit_b_16: --opt adamw --lr 0.003 --wd 0.3
        # --label-smoothing 0.11 --clip-grad-norm 1 at --batch-size 512 x 8 processes = 4096: 1.875e-4 per 256.
        # Input size fixed at 224 (smaller images are upscaled, larger ones cropped down): the side its
        # weights' position embeddings are for, so nothing is interpolated; no small-input stem (a smaller
        # patch would make a 224-px sequence 4x longer and the weights' patch embedding not fit). The
        # builder takes any multiple of 16 for an explicit --input-size.
        ModelSpec(
            name="vit_b_16",
            builder=_vit_b_16,
            small_input=None,
            optimizer=adamw,
            head="heads.head",
            torchvision_arch="vit_b_16",
            input_size=InputSizeRule(smallest=224, largest=224),
            base_lr=0.003 * 256 / 4096,
            weight_decay=0.3,
            layer_depths=_vit_layer_depths,
        ),
        # torchvision's references/classification/README.md, ConvNeXt: --opt adamw --lr 1e-3 --wd 0.05
        # --norm-weight-decay 0.0 at --batch-size 128 x 8 processes = 1024: 2.5e-4 per 256.
        ModelSpec(
            name="convnext_tiny",
            builder=_convnext_tiny,
            small_input=_convnext_small_input,
            optimizer=adamw,
            head="classifier.2",
            torchvision_arch="convnext_tiny",
            input_size=InputSizeRule(smallest=32, largest=224),
            base_lr=1e-3 * 256 / 1024,
            weight_decay=0.05,
            fine_tune_lr_factor=CONVNEXT_FINE_TUNE_LR_FACTOR,
            fine_tune_head_lr_scale=CONVNEXT_FINE_TUNE_HEAD_LR_SCALE,
        ),
    )
}
MODEL_NAMES = tuple(MODEL_SPECS)


def model_spec(name: str) -> ModelSpec:
    """The spec of model ``name``; ValueError naming the choices for any other name."""
    try:
        return MODEL_SPECS[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)}") from None


def build_model(
    name: str,
    *,
    num_classes: int,
    input_size: int,
    in_channels: int = 3,
    small_input_stem: bool | None = None,
) -> nn.Module:
    """Build ``name`` with random weights (nothing is downloaded); ``small_input_stem`` None: the spec's rule."""
    spec = model_spec(name)
    if num_classes < 2:
        raise ConfigError(f"a classifier needs at least 2 classes, the dataset has {num_classes}")
    return spec.build(
        num_classes=num_classes,
        input_size=input_size,
        in_channels=in_channels,
        small_input_stem=small_input_stem,
    )


def default_small_input_stem(arch: str, input_size: int, *, pretrained: bool) -> bool:
    """The stem a new run's network gets: pretrained weights keep their stock stem at every input size (its
    first convolution's weights are the pretrained ones); random weights get the spec's small-input stem
    under ``SMALL_INPUT_MAX`` px. A warm start or a resumed run keeps the stem its weights were trained with."""
    return not pretrained and model_spec(arch).small_input_stem(input_size)


def build_network(
    arch: str, *, num_classes: int, input_size: int, small_input_stem: bool, in_channels: int = 3
) -> nn.Module:
    """The network of a run or a model card, with the stem it records: the spec's small-input stem, or the
    builder's stock stem (at any input size)."""
    return build_model(
        arch,
        num_classes=num_classes,
        input_size=input_size,
        in_channels=in_channels,
        small_input_stem=small_input_stem,
    )


def card_small_input_stem(card: ModelCard) -> bool:
    """Whether the network of ``card`` has its spec's small-input stem: what model.json records. A card
    without the key (written before it was recorded) had it exactly when its weights began random."""
    if "small_input_stem" not in card.absent:
        return card.small_input_stem
    return default_small_input_stem(card.arch, card.input_size, pretrained=card.pretrained is not None)


def network_for_card(card: ModelCard) -> nn.Module:
    """The network ``card`` (model.json) describes, with random weights: its architecture, classes, input
    size, channels and stem, whatever its weights began from (pretrained, warm-started or random)."""
    return build_network(
        card.arch,
        num_classes=len(card.classes),
        input_size=card.input_size,
        small_input_stem=card_small_input_stem(card),
        in_channels=card.in_channels,
    )


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
