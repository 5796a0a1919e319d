"""``tpustream bench finetune --quick``: real pretraining and both fine-tuning runs (tiny model, XLA CPU), every
line's shape, and that random and pretrained ran on the same target data and step budget from different starts.
Which init wins is not asserted: at 3 images per class and 2 epochs that is noise."""

import json

import pytest
from typer.testing import CliRunner

from tpustream.cli import app

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # three train processes: about a minute


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
    assert [line.get("init") for line in lines] == ["random", "pretrained", None]
    random, pretrained, summary = lines
    for line in (random, pretrained):
        assert set(line) >= RUN_KEYS and line["bench"] == "finetune" and line["images_per_class"] == 3
        assert 0.0 <= line["final_top1"] <= 1.0 and len(line["val_top1_by_epoch"]) == line["epochs"] == 2
        assert line["steps_to_target_top1"] is None or 0 < line["steps_to_target_top1"] <= line["steps"]
        assert line["weights_source"].startswith("own pretraining: tpustream train tiny on digits 0-4")
    same = ("dataset_digest", "train_images", "val_images", "epochs", "steps", "target_top1")
    assert {key: random[key] for key in same} == {key: pretrained[key] for key in same}
    assert random["steps"] == 2 * 3  # 15 images at batch 4: 3 steps an epoch
    assert random["start_sha256"] != pretrained["start_sha256"]  # the pretrained file, not the random one
    assert summary["summary"] is True and summary["steps"] == random["steps"]
    assert summary["final_top1"] == {"random": random["final_top1"], "pretrained": pretrained["final_top1"]}
    assert summary["steps_to_target_top1"] == {
        "random": random["steps_to_target_top1"],
        "pretrained": pretrained["steps_to_target_top1"],
    }
    assert summary["verdict"]
