"""tpustream/train/model_artifact.py: model.pt is the best epoch's weights, its EMA's when they beat the raw
weights on val top-1 in that epoch (model.json's metrics are then the EMA's, and ``recipe.model_weights``
says "ema"), the raw weights' otherwise."""

import torch

from tpustream.artifacts import ModelCard
from tpustream.train.checkpoint import Checkpoint, Position, save_checkpoint
from tpustream.train.model_artifact import write_model_artifact
from tpustream.train.records import RunMeta, RunState

RECIPE = {"name": "finetune", "why": "test", "augment": "trivial", "random_erasing": 0.1, "mixup_alpha": 0.2,
          "cutmix_alpha": 1.0, "ema_decay": 0.999, "layer_decay": 1.0, "overridden": []}  # fmt: skip


def _epoch(epoch, top1, ema_top1):
    return {"epoch": epoch, "train_loss": 1.0, "val_loss": 1.0, "val_top1": top1, "val_top5": 1.0,
            "val_samples": 10, "ema_val_top1": ema_top1, "ema_val_top5": 1.0, "ema_val_loss": 0.5}  # fmt: skip


def _write(tmp_path, history):
    output = str(tmp_path / "run")
    raw, averaged = {"w": torch.zeros(2)}, {"w": torch.ones(2)}
    meta = RunMeta(model="tiny", classes=["a", "b"], input_size=16, dataset="/d", dataset_digest="x",
                   config={}, peak_lr=0.1, global_batch=8, small_input_stem=True, recipe=RECIPE)  # fmt: skip
    state = RunState(epoch=len(history), global_step=10, best_top1=0.9, history=history)
    checkpoint = Checkpoint(
        model=raw, optimizer={}, state={}, meta=meta, rng={"xla": "0", "torch": torch.zeros(1)}
    )
    checkpoint["ema"] = averaged
    save_checkpoint(output, Position(len(history), 0, 10), checkpoint, best=True, keep=2)
    card = write_model_artifact(output, meta, state)
    return card, torch.load(tmp_path / "run" / "model.pt", weights_only=True)["w"]


def test_the_ema_weights_are_the_model_when_their_val_top1_is_better(tmp_path):
    card, weights = _write(tmp_path, [_epoch(1, 0.5, 0.4), _epoch(2, 0.8, 0.9)])
    assert torch.equal(weights, torch.ones(2))  # the EMA's
    assert card.recipe == {**RECIPE, "model_weights": "ema"}
    assert (card.metrics["epoch"], card.metrics["val_top1"], card.metrics["val_loss"]) == (2, 0.9, 0.5)
    assert ModelCard.read(str(tmp_path / "run")).recipe == card.recipe  # in model.json


def test_the_raw_weights_are_the_model_when_the_ema_is_not_better(tmp_path):
    card, weights = _write(tmp_path, [_epoch(1, 0.5, 0.4), _epoch(2, 0.9, 0.9)])
    assert torch.equal(weights, torch.zeros(2))
    assert card.recipe["model_weights"] == "raw" and card.metrics["val_top1"] == 0.9
