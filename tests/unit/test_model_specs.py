"""One spec per model (tpustream/models.py): what each spec says its builder, small-input stem, input-size rule
and optimizer recipe do, they do; and the name list everything else reads is the specs'."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import typer.main
from torch import nn

from tpustream.artifacts import Manifest, SizeSummary, Split, SplitStats
from tpustream.cli.main import app
from tpustream.dataset.input_size import default_input_size, input_size_rule
from tpustream.models import (
    MODEL_NAMES,
    MODEL_SPECS,
    SMALL_INPUT_MAX,
    InputSizeRule,
    ModelSpec,
    build_model,
    model_spec,
    parameter_groups,
    sgd_momentum,
)
from tpustream.train.config import TrainConfig
from tpustream.train.run_inputs import resolve_input_size

SMALL, LARGE = 32, SMALL_INPUT_MAX  # the largest large input kept small: ResNet-101 on a CPU


def test_the_name_list_is_the_specs() -> None:
    assert tuple(MODEL_SPECS) == MODEL_NAMES
    assert all(spec.name == name for name, spec in MODEL_SPECS.items())
    assert {"tiny", "resnet50", "efficientnet_b0"} <= set(MODEL_NAMES)


def test_train_help_lists_every_model() -> None:
    (option,) = (p for p in typer.main.get_command(app).commands["train"].params if p.name == "model")  # type: ignore[attr-defined]
    assert option.help.endswith("One of: " + " | ".join(MODEL_NAMES) + ".")


@pytest.mark.parametrize(
    "make",
    [
        lambda: build_model("vgg16", num_classes=10, input_size=32),
        lambda: model_spec("vgg16"),
        lambda: TrainConfig(data="d", output="o", model="vgg16"),
    ],
)
def test_an_unknown_name_is_refused_with_the_choices(make) -> None:
    with pytest.raises(ValueError, match="unknown model 'vgg16'") as caught:
        make()
    assert all(name in str(caught.value) for name in MODEL_NAMES)


def test_importing_the_specs_imports_no_torch() -> None:
    code = "import sys, tpustream.models; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("in_channels", [3, 1])
def test_every_model_classifies_small_and_large_inputs(name: str, in_channels: int) -> None:
    for size in (MODEL_SPECS[name].input_size.smallest, LARGE):
        model = build_model(name, num_classes=7, input_size=size, in_channels=in_channels).eval()
        with torch.no_grad():
            logits = model(torch.zeros(2, in_channels, size, size))
        assert logits.shape == (2, 7), (name, size)


def test_resnet_small_input_stem_is_a_3x3_stride_1_conv_without_max_pool() -> None:
    small = build_model("resnet18", num_classes=10, input_size=SMALL)
    large = build_model("resnet18", num_classes=10, input_size=LARGE)
    assert (small.conv1.kernel_size, small.conv1.stride) == ((3, 3), (1, 1))
    assert isinstance(small.maxpool, nn.Identity)
    assert (large.conv1.kernel_size, large.conv1.stride) == ((7, 7), (2, 2))
    assert isinstance(large.maxpool, nn.MaxPool2d)
    assert MODEL_SPECS["resnet18"].small_input_stem(SMALL) and not MODEL_SPECS["resnet18"].small_input_stem(
        LARGE
    )


def test_resnets_are_built_as_before_the_specs() -> None:
    # the pre-spec code's order of random draws: torchvision's model, then the replacement stem
    from torchvision.models import resnet18

    torch.manual_seed(0)
    expected = resnet18(weights=None, num_classes=10)
    expected.conv1 = nn.Conv2d(1, 64, 3, stride=1, padding=1, bias=False)
    expected.maxpool = nn.Identity()
    torch.manual_seed(0)
    built = build_model("resnet18", num_classes=10, input_size=SMALL, in_channels=1)
    assert repr(built) == repr(expected)
    weights, expected_weights = built.state_dict(), expected.state_dict()
    assert weights.keys() == expected_weights.keys()
    assert all(torch.equal(weights[key], expected_weights[key]) for key in weights)


def test_efficientnet_small_input_stem_has_stride_1_and_the_same_parameters() -> None:
    small = build_model("efficientnet_b0", num_classes=10, input_size=SMALL).eval()
    large = build_model("efficientnet_b0", num_classes=10, input_size=LARGE).eval()
    assert small.features[0][0].stride == (1, 1) and large.features[0][0].stride == (2, 2)
    small_shapes = {k: v.shape for k, v in small.state_dict().items()}
    assert small_shapes == {k: v.shape for k, v in large.state_dict().items()}  # warm starts across sizes
    with torch.no_grad():
        assert small.features(torch.zeros(1, 3, SMALL, SMALL)).shape[-2:] == (2, 2)
        assert large.features(torch.zeros(1, 3, SMALL, SMALL)).shape[-2:] == (
            1,
            1,
        )  # 1x1 from the sixth stage


def test_efficientnet_in_channels_get_a_stem_of_their_own() -> None:
    for size, stride in ((SMALL, 1), (LARGE, 2)):
        conv = build_model("efficientnet_b0", num_classes=10, input_size=size, in_channels=1).features[0][0]
        assert (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride) == (
            1,
            32,
            (3, 3),
            (stride,) * 2,
        )


def test_tiny_has_no_small_input_stem() -> None:
    spec = MODEL_SPECS["tiny"]
    assert spec.small_input is None and not spec.small_input_stem(SMALL)
    assert repr(build_model("tiny", num_classes=10, input_size=SMALL)) == repr(
        build_model("tiny", num_classes=10, input_size=LARGE)
    )


ADAMW = ("vit_b_16", "convnext_tiny")  # torchvision's recipes for their weights; SGD for the others


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_optimizer_recipe_is_sgd_or_adamw_with_decay_on_weights_only(name: str) -> None:
    model = build_model(name, num_classes=10, input_size=MODEL_SPECS[name].input_size.smallest)
    optimizer = MODEL_SPECS[name].optimizer(model, lr=0.3, momentum=0.8, weight_decay=5e-5)
    decay, no_decay = optimizer.param_groups
    if name in ADAMW:
        assert type(optimizer) is torch.optim.AdamW
        for group in (decay, no_decay):  # momentum is beta1; step counts stay on the device
            assert (group["lr"], group["betas"], group["capturable"]) == (0.3, (0.8, 0.999), True)
    else:
        assert type(optimizer) is torch.optim.SGD
        for group in (decay, no_decay):
            assert (group["lr"], group["momentum"], group["nesterov"], group["dampening"]) == (
                0.3,
                0.8,
                False,
                0,
            )
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (5e-5, 0.0)
    assert all(p.ndim > 1 for p in decay["params"]) and all(p.ndim <= 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_the_sgd_recipe_is_the_one_the_trainer_built_before_the_specs() -> None:
    model = build_model("tiny", num_classes=10, input_size=16)
    before = torch.optim.SGD(parameter_groups(model, 1e-4), lr=0.1, momentum=0.9)
    now = sgd_momentum(model, lr=0.1, momentum=0.9, weight_decay=1e-4)
    assert now.state_dict()["param_groups"] == before.state_dict()["param_groups"]


@pytest.mark.parametrize("side", [1, 7, 8, 15, 16, 17, 31, 79, 120, 223, 224, 225, 3024])
def test_the_default_input_size_rule_is_the_datasets(side: int) -> None:
    assert InputSizeRule()(side) == input_size_rule(side)
    for name in ("tiny", "resnet18", "resnet34", "resnet50", "resnet101"):
        assert MODEL_SPECS[name].input_size(side) == input_size_rule(side)


@pytest.mark.parametrize("side, size", [(8, 32), (31, 32), (40, 40), (79, 72), (500, 224)])
def test_efficientnet_trains_at_32_px_or_more(side: int, size: int) -> None:
    assert MODEL_SPECS["efficientnet_b0"].input_size(side) == size


@pytest.mark.parametrize("model, size", [("tiny", 16), ("efficientnet_b0", 32)])
def test_the_trainer_takes_the_models_input_size_rule(model: str, size: int) -> None:
    stats = SplitStats(formats={}, short_side=SizeSummary(min=8, median=8, max=8))
    train = Split(num_samples=1617, num_bytes=0, class_counts=[], shards=[], stats=stats)
    manifest = Manifest(classes=[], splits={"train": train})
    config = TrainConfig(data="unused", output="unused", model=model)
    chosen, reason = resolve_input_size(config, "unused", manifest)
    rule = MODEL_SPECS[model].input_size
    assert chosen == size
    assert reason == (
        f"median shorter side 8 px over the 1617 train images (manifest statistics) -> {size} px "
        f"(multiple of 8 in [{rule.smallest}, 224])"
    )
    if model == "tiny":  # as the dataset's own rule says it, as before the specs
        assert (chosen, reason) == default_input_size("unused", manifest)


def test_specs_and_rules_refuse_bad_values() -> None:
    with pytest.raises(ValueError, match="smallest <= largest"):
        InputSizeRule(smallest=64, largest=32)
    with pytest.raises(ValueError, match="one word"):
        ModelSpec(
            name="res net",
            builder=MODEL_SPECS["tiny"].builder,
            small_input=None,
            optimizer=sgd_momentum,
            head="13",
        )


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_each_spec_names_its_classifier_head_and_weights_enum(name: str) -> None:
    """``head`` is the final Linear (what fine-tuning re-initialises) and ``torchvision_arch`` has weights."""
    from torch import nn
    from torchvision.models import get_model_weights

    spec = MODEL_SPECS[name]
    head = spec.build(num_classes=7, input_size=64).get_submodule(spec.head)
    assert isinstance(head, nn.Linear) and head.out_features == 7
    if spec.torchvision_arch is not None:
        assert len(list(get_model_weights(spec.torchvision_arch))) >= 1


def test_recipes_peak_lr_and_weight_decay_are_torchvisions_per_256() -> None:
    """references/classification/README.md: ViT-B/16 lr 0.003 wd 0.3 at 4096, ConvNeXt lr 1e-3 wd 0.05 at 1024."""
    from tpustream.train.optimizer import default_peak_lr

    vit, convnext = MODEL_SPECS["vit_b_16"], MODEL_SPECS["convnext_tiny"]
    assert default_peak_lr(4096, vit.base_lr) == pytest.approx(0.003) and vit.weight_decay == 0.3
    assert default_peak_lr(1024, convnext.base_lr) == pytest.approx(1e-3) and convnext.weight_decay == 0.05
    assert all(MODEL_SPECS[name].base_lr == 0.1 for name in MODEL_NAMES if name not in ADAMW)
    assert TrainConfig(data="d", output="o").weight_decay is None  # the model's recipe unless the run says


def test_vit_trains_at_its_weights_224_px_and_refuses_other_patch_grids() -> None:
    assert MODEL_SPECS["vit_b_16"].input_size(8) == MODEL_SPECS["vit_b_16"].input_size(3024) == 224
    assert MODEL_SPECS["vit_b_16"].small_input is None
    with pytest.raises(ValueError, match="--input-size 100: vit_b_16 takes a multiple of 16"):
        build_model("vit_b_16", num_classes=3, input_size=100)


def test_convnext_small_input_stem_has_stride_2_and_the_same_parameters() -> None:
    small = build_model("convnext_tiny", num_classes=10, input_size=SMALL)
    large = build_model("convnext_tiny", num_classes=10, input_size=LARGE)
    stem_small, stem_large = small.get_submodule("features.0.0"), large.get_submodule("features.0.0")
    assert (stem_small.stride, stem_small.padding, stem_small.kernel_size) == ((2, 2), (1, 1), (4, 4))
    assert (stem_large.stride, stem_large.padding) == ((4, 4), (0, 0))
    assert small.state_dict().keys() == large.state_dict().keys()
    assert all(v.shape == large.state_dict()[k].shape for k, v in small.state_dict().items())
    features = small.features(torch.zeros(1, 3, SMALL, SMALL))
    assert features.shape[-2:] == (2, 2)  # total stride 16


def test_efficientnet_v2_small_input_stem_has_stride_1() -> None:
    small = build_model("efficientnet_v2_s", num_classes=10, input_size=SMALL)
    assert small.get_submodule("features.0.0").stride == (1, 1)
    assert build_model("efficientnet_v2_s", num_classes=10, input_size=LARGE).get_submodule(
        "features.0.0"
    ).stride == (2, 2)
    assert MODEL_SPECS["efficientnet_v2_s"].input_size(3024) == 384


def test_layer_wise_lr_decay_scales_vits_groups_by_depth():
    """Issue 46: --layer-decay on ViT: the head and final norm at the scheduled LR, block i at decay^(13 - i)
    of it... down to the patch embedding's decay^13; the weight-decay split of the recipe kept."""
    from tpustream.train.optimizer import layer_decay_groups

    spec = model_spec("vit_b_16")
    model = build_model("vit_b_16", num_classes=4, input_size=16)
    depths, deepest = spec.layer_depths(model)
    assert deepest == 13 and depths["heads.head.weight"] == depths["encoder.ln.weight"] == 13
    assert depths["conv_proj.weight"] == depths["class_token"] == depths["encoder.pos_embedding"] == 0
    assert depths["encoder.layers.encoder_layer_0.mlp.0.weight"] == 1
    assert depths["encoder.layers.encoder_layer_11.ln_1.weight"] == 12
    optimizer = layer_decay_groups(spec.optimizer(model, lr=1.0, momentum=0.9, weight_decay=0.3), model, depths,
                                   deepest, 0.5)  # fmt: skip
    scale_of = {id(p): g["lr_scale"] for g in optimizer.param_groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert scale_of[id(named["heads.head.weight"])] == 1.0
    assert scale_of[id(named["encoder.layers.encoder_layer_11.mlp.0.weight"])] == 0.5
    assert scale_of[id(named["encoder.layers.encoder_layer_0.mlp.0.weight"])] == 0.5**12
    assert scale_of[id(named["conv_proj.weight"])] == 0.5**13
    by_depth = sorted({(depths[n], scale_of[id(p)]) for n, p in named.items()})
    assert [scale for _, scale in by_depth] == sorted(scale for _, scale in by_depth)  # deeper: larger LR
    assert len(scale_of) == len(named)  # every parameter in exactly one group
    decay = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    assert decay[id(named["heads.head.weight"])] == 0.3 and decay[id(named["heads.head.bias"])] == 0.0
    assert model_spec("resnet18").layer_depths is None  # ViT only
