"""`tpustream bench compile` runs a network through the trainer's step in a fresh process and reports its
compiles per epoch (its full-size runs are the benchmark's; here the tiny network at 224 px)."""

import json

import pytest

from tpustream.bench.compile import _run_one, bench_compile

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # XLA compiles in fresh processes: ~1 min


def test_a_model_reports_its_compiles_per_epoch_and_none_after_the_first():
    row = _run_one("tiny", "bf16", 2, 3, 2, timeout=600)
    assert row["bench"] == "compile" and "error" not in row, row
    assert row["input_size"] == 224 and len(row["compiles_after_each_epoch"]) == 3
    assert row["compiles_after_each_epoch"][0] >= 1 and row["recompiles_after_first_epoch"] == 0
    assert row["step_s"] > 0 and row["first_epoch_s"] > 0


def test_a_failing_model_is_a_line_with_its_error_not_a_crash(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "NO_SUCH_DEVICE")
    (line,) = list(bench_compile([], precisions=["fp32"], batch_size=2, epochs=2, steps=1, timeout=600))
    row = json.loads(line)
    assert row["model"] == "resnet50" and row["error"]
