"""The fine-tuning recipe on XLA CPU (issue 33, item 4): --freeze-epochs (the head alone, then everything, at
most one more compiled graph than a run without it), --backbone-lr-scale and --head-lr-scale (the backbone's
param groups at a fraction of the scheduled LR, the head's at a multiple) and --class-weights auto (the loss weighted by inverse class frequency).

The trainer's step and the fine-tuning pieces run in a subprocess each (XLA's compile counter is
process-global), on the tiny model on one device; the whole `tpustream train` story (the weights from the
manifest, resuming mid-freeze) is the slow test below."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from tests.common.train import ENV, train_command
from tests.common.train import run_train as _run
from tpustream.dataset import write as shards
from tpustream.dataset.manifest import load_manifest
from tpustream.dataset.plan import ShardConfig
from tpustream.models import build_model
from tpustream.train.optimizer import inverse_frequency_weights

pytestmark = pytest.mark.integration

ONE_DEVICE = {**ENV, "CPU_NUM_DEVICES": "1"}
TRAIN_COUNTS = [60, 20, 10, 10]  # an imbalanced train split: 6x between the largest and smallest class
SCALE = 0.25  # --backbone-lr-scale of both runs: only --freeze-epochs differs between them
HEAD = 4.0  # the head's LR multiple of both runs (set_head_lr_scale, --head-lr-scale)

# Three "epochs" of two steps at the schedule's LRs; the first ``freeze`` epochs train the head alone, as
# Trainer._fine_tuning_phase does at each epoch's start. Prints one JSON line.
STEPS = """
import json, sys, torch, torch_xla, torch_xla.debug.metrics as met
from tpustream import models
from tpustream.train.config import TrainConfig
from tpustream.train.optimizer import (
    backbone_groups, fill_optimizer_state, freeze_backbone, inverse_frequency_weights, set_head_lr_scale,
)
from tpustream.train.step import compile_count, train_step
from tpustream.xla_runtime import Runtime

freeze, recipe, scale = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
counts, head_scale = json.loads(sys.argv[4]), float(sys.argv[5])
device = torch_xla.device()
torch.manual_seed(0)
model = models.build_model("tiny", num_classes=4, input_size=16).to(device).train()
optimizer = getattr(models, recipe)(model, lr=1e-3, momentum=0.9, weight_decay=1e-4)
head = set(model.get_submodule(models.model_spec("tiny").head).parameters())
optimizer = backbone_groups(optimizer, head)
set_head_lr_scale(optimizer, head_scale)
rt = Runtime(
    device=device, strategy="spmd", num_devices=1, local_devices=1, replica_index=0, num_replicas=1, is_master=True
)
config = TrainConfig(data="-", output="-", model="tiny", backbone_lr_scale=scale, label_smoothing=0.0)
weights = torch.tensor(inverse_frequency_weights(counts)).to(device)
images = torch.randint(0, 255, (8, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
batch = {"image": images.to(device), "label": torch.tensor([0, 1, 2, 3, 0, 0, 1, 0]).to(device),
         "mask": torch.ones(8, dtype=torch.bool).to(device)}

def backbone():  # weights and BatchNorm statistics of everything but the head ("13"); not the step counters
    return {k: v.cpu().clone() for k, v in model.state_dict().items()
            if not k.startswith("13.") and not k.endswith("num_batches_tracked")}

start = backbone()
out = {"compiles": [], "backbone_unchanged": []}
for epoch in range(3):
    if freeze:
        freeze_backbone(model, head, epoch < freeze)
        if epoch >= freeze:
            fill_optimizer_state(optimizer, [p for p in model.parameters() if p not in head])
    for step in range(2):
        lr = 0.1 * (0.9 + 0.03 * (2 * epoch + step))
        train_step(model, optimizer, batch, lr, config, rt, weights)
    out["compiles"].append(compile_count(met))
    out["backbone_unchanged"].append(all(torch.equal(start[k], v) for k, v in backbone().items()))
out["lr"] = lr
out["group_lrs"] = [[group["backbone"], group["lr"]] for group in optimizer.param_groups]
if not freeze:
    # The loss of a batch of one class, weighted and not (LR 0: the weights do not move between the two)
    one_class = {"image": batch["image"], "label": torch.full((8,), 3).to(device), "mask": batch["mask"]}
    out["weighted"] = float(train_step(model, optimizer, one_class, 0.0, config, rt, weights).cpu())
    out["unweighted"] = float(train_step(model, optimizer, one_class, 0.0, config, rt).cpu())
print(json.dumps(out))
"""


def _steps(*freezes, recipe):
    """STEPS' output for each of ``freezes``, the processes run side by side (each compiles on its own)."""
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                STEPS,
                str(freeze),
                recipe,
                str(SCALE),
                json.dumps(TRAIN_COUNTS),
                str(HEAD),
            ],
            env=ONE_DEVICE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for freeze in freezes
    ]
    outputs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        outputs.append(json.loads(stdout.strip().splitlines()[-1]))
    return outputs


@pytest.mark.parametrize("recipe", ["sgd_momentum", pytest.param("adamw", marks=pytest.mark.slow)])
def test_freezing_trains_the_head_alone_and_compiles_at_most_one_more_graph(recipe):
    plain, frozen = _steps(0, 2, recipe=recipe)
    # The frozen phase's step is the one more graph: thawed, the backbone's optimizer state is there before
    # the first step (fill_optimizer_state), so the steps compile to what the run without freezing compiled
    assert frozen["compiles"][-1] <= plain["compiles"][-1] + 1, (frozen, plain)
    assert frozen["compiles"][0] == frozen["compiles"][1]  # nothing new in the second frozen epoch
    assert frozen["compiles"][2] - frozen["compiles"][1] <= 1  # thawing: at most the whole-model step
    assert plain["compiles"][1] == plain["compiles"][2]
    # Frozen: the backbone's weights and BatchNorm statistics stay; thawed, they train
    assert frozen["backbone_unchanged"] == [True, True, False]
    assert plain["backbone_unchanged"] == [False, False, False]
    # --backbone-lr-scale and --head-lr-scale: the schedule's LR reaches every group, the backbone's at SCALE
    # of it, the head's at HEAD times it
    for run in (plain, frozen):
        assert {backbone for backbone, _ in run["group_lrs"]} == {True, False}
        for backbone, lr in run["group_lrs"]:
            assert lr == pytest.approx(run["lr"] * (SCALE if backbone else HEAD))
    # --class-weights: a batch of the smallest class costs its weight times the unweighted loss
    weight = inverse_frequency_weights(TRAIN_COUNTS)[3]
    assert weight == pytest.approx(2.5)  # 100 samples / (4 classes x 10)
    assert plain["weighted"] == pytest.approx(weight * plain["unweighted"], rel=1e-5)


# ------------------------------------------------------------------ the whole story: `tpustream train`


def _imbalanced(root, counts, seed=0):
    """An ImageFolder with its own split, ``counts`` = {class: (train, val)}: a bright or dark square per
    class so that a tiny model learns something."""
    rng = np.random.default_rng(seed)
    for index, (name, per_split) in enumerate(counts.items()):
        for split, count in zip(("train", "val"), per_split, strict=True):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = rng.integers(0, 60, (16, 16, 3), dtype=np.uint8) + np.uint8(60 * index)
                Image.fromarray(pixels).save(root / split / name / f"{i:03d}.png")
    return root


def _backbone(state):
    """The backbone's weights and BatchNorm statistics (not ``num_batches_tracked``, which counts the steps
    frozen or not: tpustream.train.optimizer.freeze_backbone)."""
    return {
        k: v for k, v in state.items() if not k.startswith("13.") and not k.endswith("num_batches_tracked")
    }


def _shards_and_weights(tmp_path, counts):
    """``counts``' ImageFolder (``_imbalanced``) as shards, and a tiny model's random weights saved as a .pth
    (7 classes: its head never fits the run's), which stands in for weights trained elsewhere."""
    images = _imbalanced(tmp_path / "images", counts)
    data = str(tmp_path / "data")
    shards.create_shards(ShardConfig(source=str(images), output=data, num_shards=2), progress=False)
    torch.manual_seed(0)
    staged = tmp_path / "tiny-pretrained.pth"
    torch.save(build_model("tiny", num_classes=7, input_size=16).state_dict(), staged)
    return data, staged


def _checkpoint(output, epoch):
    (path,) = (output / "checkpoints").glob(f"ckpt-e{epoch:04d}-b000000.pt")
    return torch.load(path, weights_only=True)["model"]


@pytest.mark.slow  # three `tpustream train` processes' startup and compiles: about a minute here
def test_train_freezes_resumes_mid_freeze_and_weights_classes_from_the_manifest(tmp_path):
    data, staged = _shards_and_weights(tmp_path, {"a": (48, 6), "b": (12, 6), "c": (8, 6)})
    pretrained = _backbone(torch.load(staged, weights_only=True))
    output = tmp_path / "run"
    recipe = ("--pretrained", str(staged), "--class-weights", "auto", "--backbone-lr-scale", "0.5")
    common = ("--input-size", "16", "--batch-size", "8", "--keep-checkpoints", "5", *recipe)

    first = _run(data, output, "--epochs", "1", "--freeze-epochs", "1", *common, env=ONE_DEVICE)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "epoch 1: the backbone is frozen (--freeze-epochs 1): training the head only" in first.stderr
    card = json.loads((output / "model.json").read_text())
    counts = load_manifest(data).split("train").class_counts
    assert list(counts) == [48, 12, 8]
    expected = inverse_frequency_weights(list(counts))
    assert card["class_weights"] == pytest.approx(dict(zip(["a", "b", "c"], expected, strict=True)))
    assert sum(c * w for c, w in zip(counts, expected, strict=True)) / sum(counts) == pytest.approx(1.0)
    assert card["training"]["class_weights"] == "auto" and card["training"]["freeze_epochs"] == 1
    assert _backbone(_checkpoint(output, 1)).keys() == pretrained.keys()
    assert all(torch.equal(_checkpoint(output, 1)[k], v) for k, v in pretrained.items())

    # Resumed mid-freeze (epoch 2 of 2 frozen): the phase comes from the epoch, not from the process
    again = _run(data, output, "--epochs", "3", "--freeze-epochs", "2", *common, env=ONE_DEVICE)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stderr
    assert "epoch 2: the backbone is frozen" in again.stderr
    assert "epoch 3: the backbone is thawed: training every layer" in again.stderr
    assert all(torch.equal(_checkpoint(output, 2)[k], v) for k, v in pretrained.items())
    thawed = _checkpoint(output, 3)
    assert not all(torch.equal(thawed[k], v) for k, v in pretrained.items() if k.endswith(".weight"))

    # A resumed run's parameter groups are its checkpoint's: another grouping is a one-line error
    regrouped = _run(data, output, "--epochs", "4", *common[:-2], env=ONE_DEVICE)
    assert regrouped.returncode != 0
    assert "its optimizer does not fit this run's" in regrouped.stderr
    assert "--backbone-lr-scale" in regrouped.stderr and "Traceback" not in regrouped.stderr


@pytest.mark.slow  # two 3-epoch `tpustream train` processes: about a minute here
def test_a_whole_run_with_freeze_epochs_compiles_at_most_one_more_graph(tmp_path):
    """Through the whole trainer (the loss sum, validation, checkpoints), not the step alone: freezing adds
    the head-only step graph and nothing else (a thawed first step compiled like the steady one)."""
    data, staged = _shards_and_weights(tmp_path, {"a": (48, 6), "b": (12, 6), "c": (8, 6)})
    common = ("--epochs", "3", "--input-size", "16", "--batch-size", "8", "--pretrained", str(staged))
    compiles = {}
    for freeze in ("0", "1"):
        result = _run(data, tmp_path / f"run{freeze}", *common, "--freeze-epochs", freeze, env=ONE_DEVICE)
        assert result.returncode == 0, result.stderr[-3000:]
        card = json.loads((tmp_path / f"run{freeze}" / "model.json").read_text())
        compiles[freeze] = [epoch["compiles"] for epoch in card["history"]]
    plain, frozen = compiles["0"], compiles["1"]
    assert plain[0] == plain[-1], plain  # nothing after the first epoch without freezing
    assert frozen[1] == frozen[2] and frozen[-1] <= plain[-1] + 1, compiles  # the thaw: one graph, then none


# `tpustream train` with the tiny model given a new head's LR multiple (as ConvNeXt's spec has one: a ConvNeXt
# run is minutes here), the spec patched in the process that runs the command
HEAD_RULE = """
import dataclasses
from tpustream import models
models.MODEL_SPECS["tiny"] = dataclasses.replace(models.MODEL_SPECS["tiny"], fine_tune_head_lr_scale=5.0)
from tpustream.cli.main import app
app()
"""


def _run_with_head_rule(data, output, *args):
    command = train_command(data, output, *args)
    assert command[1:3] == ["-m", "tpustream.cli"]
    command[1:3] = ["-c", HEAD_RULE]
    return subprocess.run(command, env=ONE_DEVICE, capture_output=True, text=True, timeout=400)


@pytest.mark.slow  # three `tpustream train` processes: about a minute and a half here
def test_a_new_head_trains_at_the_models_multiple_and_a_warm_started_head_at_the_scheduled_lr(tmp_path):
    """The crossing of the model's head rule with a warm start: --pretrained's new head at the model's
    multiple of the LR; a challenger warm-started from that model (--init-from wins over --pretrained, the
    pipeline's default pair) has a trained head, which trains at the scheduled LR, and keeps that when it is
    resumed (the rule would say the multiple again: the checkpoint's optimizer groups say what it trained at)."""
    data, staged = _shards_and_weights(tmp_path, {"a": (24, 6), "b": (24, 6), "c": (24, 6)})
    common = ("--input-size", "16", "--batch-size", "8", "--pretrained", str(staged))

    first = _run_with_head_rule(data, tmp_path / "first", "--epochs", "1", *common)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "the new head's 5x it" in first.stderr
    card = json.loads((tmp_path / "first" / "model.json").read_text())
    assert card["head_lr_scale"] == 5.0 and card["training"]["head_lr_scale"] is None
    assert card["peak_lr"] == 0.2  # FAST's --lr: the multiple applies to the head over a given LR too

    challenger = tmp_path / "challenger"
    warm = ("--init-from", str(tmp_path / "first"), *common)
    second = _run_with_head_rule(data, challenger, "--epochs", "1", *warm)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "(same classes), not --pretrained" in second.stderr
    assert json.loads((challenger / "model.json").read_text())["head_lr_scale"] == 1.0

    resumed = _run_with_head_rule(data, challenger, "--epochs", "2", *warm)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr
    assert json.loads((challenger / "model.json").read_text())["head_lr_scale"] == 1.0

    # Given, it holds over the warm start's head too
    given = _run_with_head_rule(data, tmp_path / "given", "--epochs", "1", *warm, "--head-lr-scale", "3")
    assert given.returncode == 0, given.stderr[-3000:]
    assert json.loads((tmp_path / "given" / "model.json").read_text())["head_lr_scale"] == 3.0
