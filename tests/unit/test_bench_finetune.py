"""bench finetune's reading of its runs: steps to the target, the side-by-side summary and its verdict, and
the options it refuses before training anything."""

import pytest

from tpustream.bench.finetune import _run_line, bench_finetune, summarize_size
from tpustream.errors import ConfigError


def _card(tops, steps_per_epoch=4):
    history = [{"epoch": i + 1, "val_top1": top} for i, top in enumerate(tops)]
    return {"history": history, "steps": steps_per_epoch * len(tops)}


def _line(init, tops, target=0.8, lr=0.1):
    reading = _run_line(_card(tops), target)
    return {
        "init": init,
        "weights_source": "own",
        "images_per_class": 10,
        "lr": lr,
        "lr_rule": "r",
        **reading,
    }


def test_a_run_counts_the_first_epoch_at_the_target_and_reports_its_final_top1():
    line = _run_line(_card([0.5, 0.85, 0.7]), 0.8)
    assert line["epochs_to_target_top1"] == 2 and line["steps_to_target_top1"] == 8
    assert line["epochs"] == 3 and line["steps"] == 12 and line["final_top1"] == 0.7
    assert _run_line(_card([0.5]), 0.8)["steps_to_target_top1"] is None


def test_the_summary_puts_both_inits_side_by_side_with_the_steps_ratio():
    summary = summarize_size(_line("random", [0.3, 0.6, 0.85]), _line("pretrained", [0.82, 0.9, 0.95]))
    assert summary["final_top1"] == {"random": 0.85, "pretrained": 0.95}
    assert summary["final_top1_gain"] == pytest.approx(0.1)
    assert summary["steps_to_target_top1"] == {"random": 12, "pretrained": 4}
    assert summary["steps_to_target_ratio_pretrained_vs_random"] == pytest.approx(0.333)
    assert summary["verdict"].startswith("at lr 0.1 (r): pretrained ends +0.1000 top-1 above random")


def test_the_summary_says_so_when_pretrained_does_not_beat_random():
    summary = summarize_size(_line("random", [0.5, 0.9]), _line("pretrained", [0.4, 0.6]))
    assert "pretrained does NOT beat random" in summary["verdict"]
    assert "only random reaches the target (8 steps)" in summary["verdict"]
    assert summary["steps_to_target_ratio_pretrained_vs_random"] is None


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"images_per_class": [200], "epochs": [1]}, "--images-per-class 200"),
        ({"images_per_class": [10, 20], "epochs": [1, 2, 3]}, "--epochs 1,2,3"),
        ({"target_top1": 1.5}, "--target-top1 1.5"),
    ],
)
def test_options_out_of_range_are_one_line_errors_before_any_training(kwargs, named):
    with pytest.raises(ConfigError, match=named):
        next(bench_finetune(**kwargs))


def test_the_summary_adds_the_pretrained_run_at_the_random_lr_when_there_is_one():
    random = _line("random", [0.5, 0.9])
    pretrained = _line("pretrained", [0.4, 0.6], lr=0.01)
    same_lr = _line("pretrained", [0.85, 0.95])
    summary = summarize_size(random, pretrained, same_lr)
    assert summary["final_top1"] == {"random": 0.9, "pretrained": 0.6, "pretrained_at_random_lr": 0.95}
    assert summary["steps_to_target_top1"]["pretrained_at_random_lr"] == 4
    assert summary["final_top1_gain"] == pytest.approx(-0.3)
    assert summary["final_top1_gain_at_random_lr"] == pytest.approx(0.05)
    assert summary["steps_to_target_ratio_at_random_lr"] == pytest.approx(0.5)
    first, second = summary["verdict"].split(" | ")
    assert first.startswith("at lr 0.01 (r): pretrained does NOT beat random")
    assert second.startswith("at lr 0.1 (r): pretrained ends +0.0500 top-1 above random")
