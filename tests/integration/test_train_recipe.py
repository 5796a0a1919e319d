"""The training recipe in a real `tpustream train` on PJRT CPU (issue 46, item 2): MixUp/CutMix in the compiled
step and the EMA of the weights beside it, with a transforms.v2 policy and random erasing in the loader's
workers, compile nothing after the first epoch; the EMA is evaluated each epoch and checkpointed apart from the
raw weights; the recipe chosen (and why) is logged and recorded in model.json."""

import json

import pytest
import torch

from tests.common.train import run_train
from tpustream.dataset import write as shards
from tpustream.dataset.plan import ShardConfig

pytestmark = pytest.mark.integration

RECIPE = ("--mixup-alpha", "0.2", "--cutmix-alpha", "1.0", "--ema-decay", "0.99", "--augment", "trivial",
          "--random-erasing", "0.25")  # fmt: skip


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("data") / "digits")
    shards.create_shards(ShardConfig(source="digits", output=out, num_shards=8), progress=False)
    return out


def test_mixing_and_ema_compile_nothing_after_the_first_epoch_and_the_recipe_is_recorded(digits, tmp_path):
    output = tmp_path / "run"
    result = run_train(digits, output, "--epochs", "3", *RECIPE)
    assert result.returncode == 0, result.stderr[-3000:]
    card = json.loads((output / "model.json").read_text())
    history = card["history"]
    # 0 recompiles after epoch 1: the count at the end of every later epoch is epoch 1's (train, EMA and eval)
    assert [h["compiles"] for h in history] == [history[0]["compiles"]] * 3, [h["compiles"] for h in history]
    assert all("ema_val_top1" in h and "ema_val_loss" in h for h in history)
    # the recipe: auto chose plain for the tiny model, and the run's own values override it, logged and recorded
    assert "recipe plain (the tiny test model" in result.stderr
    recipe = card["recipe"]
    assert recipe["name"] == "plain" and recipe["why"].startswith("the tiny test model")
    assert (recipe["augment"], recipe["random_erasing"], recipe["mixup_alpha"], recipe["cutmix_alpha"]) == (
        "trivial",
        0.25,
        0.2,
        1.0,
    )
    assert recipe["ema_decay"] == 0.99 and recipe["layer_decay"] == 1.0
    assert sorted(recipe["overridden"]) == [
        "augment",
        "cutmix_alpha",
        "ema_decay",
        "mixup_alpha",
        "random_erasing",
    ]
    assert card["training"]["mixup_alpha"] == 0.2 and card["training"]["recipe"] == "auto"
    # the EMA differs from the raw weights, and model.pt is whichever the best epoch's val top-1 chose
    pointer = json.loads((output / "checkpoints" / "best.json").read_text())
    best = torch.load(output / "checkpoints" / pointer["checkpoint"], weights_only=True)
    assert best["ema"].keys() == best["model"].keys()
    assert any(not torch.equal(best["ema"][k], best["model"][k]) for k in best["model"] if "weight" in k)
    model = torch.load(output / "model.pt", weights_only=True)
    chosen = best["ema"] if recipe["model_weights"] == "ema" else best["model"]
    assert all(torch.equal(model[k], chosen[k]) for k in model)
    top = max(history, key=lambda h: max(h["val_top1"], h["ema_val_top1"]))
    assert card["metrics"]["val_top1"] == max(top["val_top1"], top["ema_val_top1"])
    assert card["metrics"]["val_top1"] > 0.3  # learns through the mixing (chance is 0.1)
