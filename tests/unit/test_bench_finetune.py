"""bench finetune's transfer task (deterministic per seed, disjoint classes sharing their primitives), its
transfer check, its summary, and the options it refuses before training anything."""

import dataclasses

import numpy as np
import pytest

from tpustream.bench.finetune import QUICK, bench_finetune, summarize_size, transfer_check
from tpustream.bench.transfer_task import (
    SHAPES,
    SOURCE_CLASSES,
    TARGET_CLASSES,
    TEXTURES,
    draw_image,
    write_folder,
)
from tpustream.errors import ConfigError


def test_the_source_and_target_classes_are_disjoint_and_share_every_target_primitive():
    assert len(SOURCE_CLASSES) >= 20 and len(TARGET_CLASSES) == 8
    assert not set(SOURCE_CLASSES) & set(TARGET_CLASSES)
    assert len({c.name for c in SOURCE_CLASSES + TARGET_CLASSES}) == len(SHAPES) * len(TEXTURES)
    for target in TARGET_CLASSES:  # each target shape and texture is learnt on the source, in other pairs
        assert sum(source.shape == target.shape for source in SOURCE_CLASSES) >= 2
        assert sum(source.texture == target.texture for source in SOURCE_CLASSES) >= 2


def test_an_image_is_a_pure_function_of_seed_class_and_index():
    cls = TARGET_CLASSES[3]
    first = draw_image(cls, 7, 11)
    assert first.shape == (64, 64, 3) and first.dtype == np.uint8
    assert np.array_equal(first, draw_image(cls, 7, 11))
    assert not np.array_equal(first, draw_image(cls, 8, 11))  # another seed
    assert not np.array_equal(first, draw_image(cls, 7, 12))  # another index
    assert not np.array_equal(first, draw_image(TARGET_CLASSES[4], 7, 11))  # another class


def test_the_folder_holds_the_drawn_pixels_losslessly(tmp_path):
    from PIL import Image

    root = write_folder(str(tmp_path), TARGET_CLASSES[:2], 3, [0, 5])
    for cls in TARGET_CLASSES[:2]:
        for index in (0, 5):
            path = tmp_path / cls.name / f"{index:05d}.png"
            assert np.array_equal(np.asarray(Image.open(path)), draw_image(cls, 3, index))
    assert root == str(tmp_path) and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        c.name for c in TARGET_CLASSES[:2]
    )


def test_the_transfer_check_needs_pretraining_to_help_the_plain_fine_tune():
    helps = transfer_check(0.9, 0.4)
    assert helps.code == "informative" and helps.gain == pytest.approx(0.5)
    barely = transfer_check(0.43, 0.4)
    assert barely.code == "uninformative" and barely.sentence.startswith("UNINFORMATIVE task")
    hurts = transfer_check(0.3, 0.4)
    assert hurts.code == "uninformative" and hurts.gain == pytest.approx(-0.1)
    assert transfer_check(0.45, 0.4, min_gain=0.05).code == "informative"  # the margin itself counts


def _line(arm, top1, lr=0.01):
    return {"arm": arm, "images_per_class": 10, "steps": 60, "final_top1": top1, "lr": lr}


def test_the_summary_gives_each_of_ours_over_the_plain_reference_and_the_check():
    lines = {
        arm: _line(arm, top1)
        for arm, top1 in (
            ("random", 0.2),
            ("ours_default", 0.8),
            ("ours_lr_x3", 0.9),
            ("plain_reference", 0.9),
            ("plain_random", 0.25),
        )
    }
    summary = summarize_size({0: lines})
    assert summary["summary"] is True and summary["images_per_class"] == 10 and summary["steps"] == 60
    assert summary["final_top1"]["plain_random"] == 0.25
    assert summary["ratio_vs_plain"] == {"random": 0.2222, "ours_default": 0.8889, "ours_lr_x3": 1.0}
    assert summary["transfer_check"] == "informative" and summary["transfer_gain"] == pytest.approx(0.65)
    assert "seeds" not in summary and "final_top1_by_seed" not in summary  # one seed: the plain summary


def test_several_seeds_summarise_as_the_mean_top1_and_each_seed_side_by_side():
    seeds = {
        3: {arm: _line(arm, top1) for arm, top1 in (("ours_default", 0.8), ("plain_reference", 0.8),
                                                   ("plain_random", 0.2))},
        5: {arm: _line(arm, top1) for arm, top1 in (("ours_default", 0.9), ("plain_reference", 0.7),
                                                   ("plain_random", 0.3))},
    }  # fmt: skip
    summary = summarize_size(seeds)
    assert summary["seeds"] == [3, 5]
    assert summary["final_top1"] == {"ours_default": 0.85, "plain_reference": 0.75, "plain_random": 0.25}
    assert summary["ratio_vs_plain"] == {"ours_default": 1.1333}  # the means' ratio
    assert summary["final_top1_by_seed"]["ours_default"] == [0.8, 0.9]
    assert summary["ratio_vs_plain_by_seed"] == {"ours_default": [1.0, 1.2857]}


def test_each_recipe_args_is_its_own_arm_named_by_number_when_there_are_several():
    from tpustream.bench.finetune import _arms

    def names(recipe_args, **kw):
        runs = _arms("w.pth", "r.pth", lr_factors=(), recipe_args=recipe_args, random_arm=False,
                     lrs=(0.0075, 0.025, 0.005), **kw)  # fmt: skip
        return {arm: (start, extra) for arm, start, extra, _, _ in runs}

    assert list(names([])) == ["ours_default", "plain_reference", "plain_random"]
    assert names([["--recipe", "plain"]])["ours_recipe"] == ("w.pth", ["--recipe", "plain"])
    several = names([["--warmup-epochs", "0"], ["--ema-decay", "0"]])
    assert several["ours_recipe_1"] == ("w.pth", ["--warmup-epochs", "0"])
    assert several["ours_recipe_2"] == ("w.pth", ["--ema-decay", "0"])
    assert several["plain_reference"][0] == "w.pth" and several["plain_random"][0] == "r.pth"
    trivial = names([], plain_trivial=True)
    assert list(trivial) == ["ours_default", "plain_reference", "plain_trivial", "plain_random"]
    assert trivial["plain_trivial"] == ("w.pth", ["--augment", "trivial"])
    plain_only = names([["--recipe", "plain"]], plain_trivial=True, ours=False)  # --no-ours
    assert list(plain_only) == ["plain_reference", "plain_trivial", "plain_random"]
    further = _arms("w.pth", "r.pth", lr_factors=(10.0,), recipe_args=(), random_arm=False,
                    lrs=(0.0075, 0.025, 0.005), default_arm=False)  # fmt: skip
    assert [(arm, extra) for arm, _, extra, _, _ in further][0] == ("ours_lr_x10", ["--lr", "0.075"])
    assert "ours_default" not in [arm for arm, *_ in further]  # --no-default-arm


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"images_per_class": (10, 20), "epochs": (1, 2, 3)}, "--epochs 1,2,3"),
        ({"images_per_class": (0,), "epochs": (1,)}, "--images-per-class 0"),
    ],
)
def test_sizes_out_of_range_are_one_line_errors_before_any_training(change, named):
    with pytest.raises(ConfigError, match=named):
        next(bench_finetune(dataclasses.replace(QUICK, **change)))


def test_a_non_positive_lr_factor_is_refused_before_any_training():
    with pytest.raises(ConfigError, match="--lr-factors"):
        next(bench_finetune(QUICK, lr_factors=(1.0, 0.0)))
    with pytest.raises(ConfigError, match="--pretrain-lr 0.0: give a positive LR"):
        next(bench_finetune(QUICK, pretrain_lr=0.0))
    with pytest.raises(ConfigError, match="--seeds 1,2,1: give each seed once"):
        next(bench_finetune(QUICK, seeds=(1, 2, 1)))


def test_kept_pretraining_weights_are_reused_only_for_the_same_pretraining(tmp_path):
    """--source-weights: the .pth and its .json (written last) come back for the same pretraining only."""
    import torch

    from tpustream.bench.finetune import _keep_pretraining, _kept_pretraining

    path = str(tmp_path / "kept" / "resnet18-source.pth")
    key = {"model": "resnet18", "source_per_class": 100, "pretrain_epochs": 24, "seed": 0, "input_size": 64,
           "task_version": 2}  # fmt: skip
    assert _kept_pretraining(path, key) is None  # nothing kept yet
    line = {"steps": 816, "source_val_top1": 0.66, "seconds": 2527.7}
    _keep_pretraining(path, {"w": torch.ones(2)}, key, line, kept=True)
    assert _kept_pretraining(path, key) == {**line, "reused": path}
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(2))
    assert _kept_pretraining(path, {**key, "seed": 1}) is None  # another pretraining's weights: made again
    assert _kept_pretraining(path, {**key, "task_version": 1}) is None
    torch.save({"w": torch.zeros(2)}, path)  # another file in its place: its record does not vouch for it
    assert _kept_pretraining(path, key) is None
    _keep_pretraining(path, {"w": torch.ones(2)}, key, line, kept=True)
    (tmp_path / "kept" / "resnet18-source.pth.json").unlink()  # a write cut short before its record
    assert _kept_pretraining(path, key) is None
    assert _kept_pretraining("", key) is None  # not asked to keep anything


def test_the_pretraining_takes_its_family_optimizer_and_steps_on_the_cpu():
    """The ResNets pretrain with SGD; the others with AdamW: an AdamW family's from-scratch LR (about 2e-4 at
    256) would leave SGD's weights where they started, and efficientnet_b0 stayed at chance under SGD."""
    import torch

    from tpustream.bench.finetune_plain import _pretrain_optimizer, pretrain_optimizer_name
    from tpustream.models import model_spec

    assert [pretrain_optimizer_name(m) for m in ("resnet18", "efficientnet_b0", "convnext_tiny", "vit_b_16")] == [
        "sgd", "adamw", "adamw", "adamw"]  # fmt: skip
    network = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    optimizer = _pretrain_optimizer(network, "convnext_tiny", 1e-3)
    assert isinstance(optimizer, torch.optim.AdamW)
    decays = {p.ndim: group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}
    assert decays == {2: model_spec("convnext_tiny").weight_decay, 1: 0.0}  # norms and biases undecayed
    before = network[0].weight.detach().clone()
    network(torch.ones(2, 4)).sum().backward()
    optimizer.step()  # eager CPU tensors: not the trainer's capturable AdamW, which needs a device
    assert not torch.equal(network[0].weight, before)
    assert isinstance(_pretrain_optimizer(network, "resnet18", 0.1), torch.optim.SGD)
    efficientnet = _pretrain_optimizer(network, "efficientnet_b0", 1e-3)  # an SGD family's decay is SGD's
    assert {group["weight_decay"] for group in efficientnet.param_groups} == {0.05, 0.0}


@pytest.mark.parametrize(
    ("args", "epochs", "lr"),
    [
        (
            ["--model", "efficientnet_b0"],
            60,
            3e-3,
        ),  # the family's: 24 epochs at 1e-3 made an uninformative task
        (["--model", "efficientnet_v2_s", "--pretrain-epochs", "30"], 30, 3e-3),
        (["--model", "efficientnet_b0", "--pretrain-lr", "0.001"], 60, 1e-3),
        (["--model", "convnext_tiny"], 24, None),  # the optimizer's default (PRETRAIN_ADAMW_LR)
        ([], 24, None),  # resnet18, SGD
        (["--quick", "--model", "efficientnet_b0"], 1, None),  # --quick keeps its own
    ],
)
def test_the_cli_gives_the_efficientnets_their_pretraining_unless_told(monkeypatch, args, epochs, lr):
    from typer.testing import CliRunner

    import tpustream.bench.finetune as finetune
    from tpustream.cli.main import app

    seen: dict = {}

    def capture(size, **kwargs):
        seen.update(size=size, **kwargs)
        yield "{}"

    monkeypatch.setattr(finetune, "bench_finetune", capture)  # the arguments only: no pretraining here
    result = CliRunner().invoke(app, ["bench", "finetune", *args])
    assert result.exit_code == 0, result.output
    assert seen["size"].pretrain_epochs == epochs
    assert seen["pretrain_lr"] == lr
