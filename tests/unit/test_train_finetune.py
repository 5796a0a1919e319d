"""The fine-tuning options' pure parts (issue 33, item 4): their validation and CLI, the class weights, the
backbone/head split of the optimizer and the freezing of a model on CPU. The trainer's step with them runs on
XLA in tests/integration/test_train_finetune.py."""

import pytest
import torch
from typer.testing import CliRunner

from tpustream.cli.main import app
from tpustream.errors import ConfigError
from tpustream.models import build_model, model_spec, sgd_momentum
from tpustream.train.config import TrainConfig
from tpustream.train.optimizer import (
    backbone_groups,
    freeze_backbone,
    head_lr_scale,
    inverse_frequency_weights,
    set_head_lr_scale,
)


def _config(**options):
    return TrainConfig(data="d", output="o", model="tiny", **options)


def test_the_options_default_to_plain_training():
    config = _config()
    assert (config.freeze_epochs, config.backbone_lr_scale, config.class_weights) == (0, 1.0, "none")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"freeze_epochs": 1}, "--freeze-epochs 1 needs --pretrained or --init-from"),
        ({"freeze_epochs": 11, "pretrained": "w.pth"}, "--freeze-epochs must be in [0, --epochs 10], got 11"),
        ({"freeze_epochs": -1, "pretrained": "w.pth"}, "--freeze-epochs must be in [0, --epochs 10], got -1"),
        (
            {"backbone_lr_scale": 0.0},
            "--backbone-lr-scale must be in (0, 1], got 0.0 (to keep the backbone fixed",
        ),
        ({"backbone_lr_scale": 1.5}, "--backbone-lr-scale must be in (0, 1], got 1.5"),
        (
            {"head_lr_scale": 0.0},
            "--head-lr-scale must be positive, got 0.0 (1: the head at the scheduled LR)",
        ),
        ({"head_lr_scale": -2.0}, "--head-lr-scale must be positive, got -2.0"),
        ({"class_weights": "balanced"}, "--class-weights must be none or auto, got 'balanced'"),
    ],
)
def test_bad_values_are_one_line_errors(options, message):
    with pytest.raises(ConfigError) as raised:
        _config(**options)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_freezing_is_allowed_from_trained_weights_up_to_every_epoch():
    assert _config(freeze_epochs=10, pretrained="w.pth").freeze_epochs == 10  # a linear probe
    assert _config(freeze_epochs=2, init_from="gs://b/registry").freeze_epochs == 2


def test_the_cli_shows_and_checks_the_options():
    runner = CliRunner()
    shown = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "240", "TERMINAL_WIDTH": "240"})
    assert shown.exit_code == 0
    for option in ("--freeze-epochs", "--backbone-lr-scale", "--head-lr-scale", "--class-weights"):
        assert option in shown.output
    assert "none|auto" in shown.output
    refused = runner.invoke(app, ["train", "--data", "d", "--output", "o", "--freeze-epochs", "2"])
    assert refused.exit_code == 2
    assert "--freeze-epochs 2 needs --pretrained or --init-from" in refused.output
    assert "Traceback" not in refused.output
    choice = runner.invoke(app, ["train", "--data", "d", "--output", "o", "--class-weights", "balanced"])
    assert choice.exit_code == 2 and "'none', 'auto'" in choice.output


def test_inverse_frequency_weights_average_one_per_train_sample():
    counts = [80, 10, 10, 0]  # a class without train samples is weighted 1 (never used)
    weights = inverse_frequency_weights(counts)
    assert weights == pytest.approx([100 / (3 * 80), 100 / 30, 100 / 30, 1.0])
    assert sum(c * w for c, w in zip(counts, weights, strict=True)) / sum(counts) == pytest.approx(1.0)
    assert inverse_frequency_weights([5, 5]) == [1.0, 1.0]  # balanced: the plain loss


def _tiny():
    torch.manual_seed(0)
    model = build_model("tiny", num_classes=3, input_size=16)
    return model, set(model.get_submodule(model_spec("tiny").head).parameters())


def test_backbone_groups_split_each_group_and_keep_its_options():
    model, head = _tiny()
    optimizer = backbone_groups(sgd_momentum(model, lr=0.1, momentum=0.9, weight_decay=1e-4), head)
    assert type(optimizer) is torch.optim.SGD and optimizer.defaults["momentum"] == 0.9
    groups = [(g["backbone"], g["weight_decay"], len(g["params"])) for g in optimizer.param_groups]
    # weights (decayed) and norms/biases (not): each split into head and backbone
    assert sorted(groups) == sorted([(False, 1e-4, 1), (True, 1e-4, 3), (False, 0.0, 1), (True, 0.0, 6)])
    for group in optimizer.param_groups:
        assert all((p in head) != group["backbone"] for p in group["params"])
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))


def test_freeze_backbone_leaves_the_head_trainable_and_the_statistics_fixed():
    model, head = _tiny()
    model.train()
    freeze_backbone(model, head, True)
    assert all(p.requires_grad == (p in head) for p in model.parameters())
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and not any(m.training for m in norms)
    before = [m.running_mean.clone() for m in norms]
    loss = model(torch.rand(4, 3, 16, 16)).sum()
    loss.backward()
    assert all(p.grad is None for p in model.parameters() if p not in head)
    assert all(torch.equal(a, m.running_mean) for a, m in zip(before, norms, strict=True))
    freeze_backbone(model, head, False)
    assert all(p.requires_grad for p in model.parameters()) and all(m.training for m in norms)


def test_the_heads_lr_multiple_is_the_given_one_else_the_models_for_a_new_head():
    convnext, resnet = model_spec("convnext_tiny"), model_spec("resnet18")
    assert convnext.fine_tune_head_lr_scale == 10.0 and resnet.fine_tune_head_lr_scale == 1.0
    assert head_lr_scale(None, convnext, new_head=True) == 10.0  # --pretrained: the head starts random
    assert head_lr_scale(None, convnext, new_head=False) == 1.0  # a warm start's trained head, random init
    assert head_lr_scale(None, resnet, new_head=True) == 1.0
    assert head_lr_scale(3.0, convnext, new_head=False) == 3.0  # given: whatever the start
    assert head_lr_scale(0.5, resnet, new_head=True) == 0.5


def test_the_head_lr_multiple_goes_on_the_heads_groups_only():
    model = build_model("tiny", num_classes=3, input_size=16)
    head = set(model.get_submodule(model_spec("tiny").head).parameters())
    optimizer = backbone_groups(sgd_momentum(model, lr=0.1, momentum=0.9, weight_decay=1e-4), head)
    set_head_lr_scale(optimizer, 10.0)
    scales = {(group["backbone"], group.get("head_lr_scale")) for group in optimizer.param_groups}
    assert scales == {(True, None), (False, 10.0)}
    # kept in the optimizer's state: a resumed run reads back what its run trained the head at
    again = backbone_groups(sgd_momentum(model, lr=0.1, momentum=0.9, weight_decay=1e-4), head)
    again.load_state_dict(optimizer.state_dict())
    assert [group.get("head_lr_scale") for group in again.param_groups if not group["backbone"]] == [
        10.0,
        10.0,
    ]
