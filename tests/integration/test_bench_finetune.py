"""``tpustream bench finetune --quick``: real pretraining and all three fine-tuning runs (tiny model, XLA CPU),
every line's shape, and that random and pretrained ran on the same target data and step budget from different
starts, the pretrained file also at the random run's LR. Which init wins is not asserted: at 3 images per class
and 2 epochs that is noise."""

import json

import pytest
from typer.testing import CliRunner

from tpustream.cli.main import app

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # four train processes: about 1.5 minutes


RUN_KEYS = {
    "bench",
    "weights_source",
    "images_per_class",
    "init",
    "epochs",
    "steps",
    "steps_to_target_top1",
    "target_top1",
    "final_top1",
    "dataset_digest",
    "start_sha256",
    "train_images",
    "val_images",
}


def test_bench_finetune_quick_compares_both_inits_on_the_same_data_and_steps():
    result = CliRunner().invoke(app, ["bench", "finetune", "--quick"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [line.get("arm") for line in lines] == ["random", "pretrained", "pretrained_at_random_lr", None]
    random, pretrained, same_lr, summary = lines
    assert [random["init"], pretrained["init"], same_lr["init"]] == ["random", "pretrained", "pretrained"]
    assert same_lr["lr"] == random["lr"] and pretrained["lr"] == pytest.approx(random["lr"] / 10, rel=1e-3)
    for line in (random, pretrained, same_lr):
        assert set(line) >= RUN_KEYS and line["bench"] == "finetune" and line["images_per_class"] == 3
        assert 0.0 <= line["final_top1"] <= 1.0 and len(line["val_top1_by_epoch"]) == line["epochs"] == 2
        assert line["steps_to_target_top1"] is None or 0 < line["steps_to_target_top1"] <= line["steps"]
        assert line["weights_source"].startswith("own pretraining: tpustream train tiny on digits 0-4")
    same = ("dataset_digest", "train_images", "val_images", "epochs", "steps", "target_top1")
    assert {key: random[key] for key in same} == {key: pretrained[key] for key in same}
    assert {key: random[key] for key in same} == {key: same_lr[key] for key in same}
    assert random["steps"] == 2 * 3  # 15 images at batch 4: 3 steps an epoch
    assert random["start_sha256"] != pretrained["start_sha256"]  # the pretrained file, not the random one
    assert same_lr["start_sha256"] == pretrained["start_sha256"]
    assert summary["summary"] is True and summary["steps"] == random["steps"]
    arms = {"random": random, "pretrained": pretrained, "pretrained_at_random_lr": same_lr}
    assert summary["final_top1"] == {arm: line["final_top1"] for arm, line in arms.items()}
    assert summary["steps_to_target_top1"] == {
        arm: line["steps_to_target_top1"] for arm, line in arms.items()
    }
    assert summary["verdict"]
