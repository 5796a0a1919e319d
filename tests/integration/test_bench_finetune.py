"""``tpustream bench finetune --quick``: real pretraining on the procedural source task, our fine-tuning runs
(tiny model, XLA CPU) and the plain PyTorch ones, every line's fields, and that all arms ran on the same target
data and step budget. Which arm wins is not asserted: at 4 images per class and 2 epochs that is noise."""

import json

import pytest
from typer.testing import CliRunner

from tpustream.cli.main import app

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # four train processes: about a minute

RUN_KEYS = {
    "bench",
    "model",
    "arm",
    "init",
    "images_per_class",
    "train_images",
    "test_images",
    "epochs",
    "steps",
    "lr",
    "lr_rule",
    "final_top1",
    "seconds",
}


def test_bench_finetune_quick_runs_every_arm_on_the_same_data_and_steps():
    result = CliRunner().invoke(app, ["bench", "finetune", "--quick", "--lr-factors", "3"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    arms = [line.get("arm") for line in lines]
    assert arms == [
        "pretrain",
        "ours_default",
        "ours_lr_x3",
        "plain_reference",
        "plain_random",
        "random",
        None,
    ]
    pretrain, *runs, summary = lines
    assert pretrain["source_classes"] == 22 and pretrain["steps"] > 0
    by_arm = {line["arm"]: line for line in runs}
    for line in runs:
        assert set(line) >= RUN_KEYS and line["bench"] == "finetune" and line["images_per_class"] == 4
        assert line["steps"] == 2 * 4  # 32 images at batch 8, 2 epochs: every arm the same steps
        assert line["train_images"] == 32 and line["test_images"] == 32
        assert 0.0 <= line["final_top1"] <= 1.0
    ours = ("random", "ours_default", "ours_lr_x3")
    assert len({by_arm[arm]["dataset_digest"] for arm in ours}) == 1  # the same target data
    assert by_arm["random"]["start_sha256"] != by_arm["ours_default"]["start_sha256"]
    assert by_arm["ours_lr_x3"]["start_sha256"] == by_arm["ours_default"]["start_sha256"]
    assert by_arm["ours_lr_x3"]["lr"] == pytest.approx(3 * by_arm["ours_default"]["lr"], rel=1e-3)
    assert by_arm["plain_reference"]["lr"] == pytest.approx(0.01 * 8 / 32)
    assert [by_arm[arm]["head_lr_scale"] for arm in ours] == [1.0, 1.0, 1.0]  # the tiny model's rule
    assert [by_arm[arm]["init"] for arm in ("plain_reference", "plain_random")] == ["pretrained", "random"]
    assert summary["summary"] is True and summary["steps"] == 8
    assert summary["final_top1"] == {line["arm"]: line["final_top1"] for line in runs}
    assert set(summary["ratio_vs_plain"]) == set(ours)
    assert summary["transfer_check"] in ("informative", "uninformative") and summary["verdict"]
