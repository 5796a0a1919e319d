"""Careless inputs and early signals through the real CLI (issue 15, Why 4 and 7): a file where a directory
is expected, file:// URIs, an unreadable checkpoint, SIGTERM during start-up, TensorBoard temp dirs.

Training runs are `tpustream train` subprocesses on PJRT CPU (the XLA runtime is process-global), each with
TMPDIR pointed at a fresh directory so what a run leaves in the temp dir can be counted. The dataset is 200
of the bundled digits as PNG files (an ImageFolder source): an epoch takes about a second."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from PIL import Image
from sklearn.datasets import load_digits
from typer.testing import CliRunner

from tpustream.cli.main import app
from tpustream.dataset import write as shards
from tpustream.dataset.plan import ShardConfig

pytestmark = pytest.mark.integration

runner = CliRunner()
FAST = ["--model", "tiny", "--epochs", "1", "--batch-size", "16", "--workers", "0"]


def _env(tmpdir: Path) -> dict[str, str]:
    tmpdir.mkdir(exist_ok=True)
    return {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
            "TMPDIR": str(tmpdir)}  # fmt: skip


def _train(data, output, *args):
    return [
        sys.executable,
        "-m",
        "tpustream.cli",
        "train",
        "--data",
        str(data),
        "--output",
        str(output),
        *FAST,
        *args,
    ]


def _ours(tmpdir: Path) -> list[str]:
    """What tpustream left in a run's temp dir (TensorBoard dirs, checkpoint and copy temp files)."""
    return sorted(p.name for p in tmpdir.iterdir() if p.name.startswith("tpustream-"))


def _partials(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.name.endswith(".partial")]


def _one_error_line(output: str) -> str:
    """The output is exactly one `error: ...` line (no traceback, no multi-line explanation)."""
    lines = [line for line in output.splitlines() if line.strip() and " INFO " not in line]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert "Traceback" not in output
    return lines[0]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """20 images per digit class as 8x8 PNGs, sharded: 160 train and 40 val samples."""
    base = tmp_path_factory.mktemp("data")
    bunch = load_digits()
    counts = dict.fromkeys(range(10), 0)
    for image, label in zip(bunch.images, bunch.target, strict=True):
        if counts[label] < 20:
            (base / "png" / str(label)).mkdir(parents=True, exist_ok=True)
            Image.fromarray((image * 255 / 16).astype("uint8")).save(
                base / "png" / str(label) / f"{counts[label]}.png"
            )
            counts[label] += 1
    out = str(base / "digits")
    config = ShardConfig(source=str(base / "png"), output=out, num_shards=2, val_fraction=0.2, workers=1)
    shards.create_shards(config, progress=False)
    return out


@pytest.fixture(scope="module")
def trained(digits, tmp_path_factory):
    """A tiny model trained through file:// URIs from a fresh working directory and temp dir."""
    base = tmp_path_factory.mktemp("trained")
    cwd, output, tmpdir = base / "cwd", base / "model", base / "tmp"
    cwd.mkdir()
    cmd = _train(f"file://{digits}", f"file://{output}")
    result = subprocess.run(cmd, cwd=cwd, env=_env(tmpdir), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return {"cwd": cwd, "output": output, "left_in_tmp": _ours(tmpdir)}


def test_training_leaves_no_tensorboard_dir_in_the_temp_dir(trained):
    """After success; after a SIGTERM exit: test_sigterm_during_startup_exits_75_and_leaves_nothing."""
    assert trained["left_in_tmp"] == []
    assert (trained["output"] / "tensorboard").is_dir()  # the events were uploaded, not lost


def test_file_uris_are_paths_in_every_command(digits, trained, tmp_path, monkeypatch):
    cwd = trained["cwd"]
    monkeypatch.chdir(cwd)
    model = f"file://{trained['output']}"
    data, metrics, registry = tmp_path / "ds", tmp_path / "metrics", tmp_path / "registry"
    for args in (
        ["shards", "create", "--output", f"file://{data}", "--num-shards", "2", "--workers", "1"],
        ["shards", "verify", f"file://{data}"],
        ["evaluate", "--model", model, "--data", f"file://{digits}", "--output", f"file://{metrics}",
         "--registry", f"file://{registry}"],
        ["promote", "--candidate", model, "--metrics", f"file://{metrics}", "--registry", f"file://{registry}"],
        ["champion", "show", "--registry", f"file://{registry}"],
    ):  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
    assert (data / "manifest.json").is_file() and (metrics / "metrics.json").is_file()
    assert json.loads((registry / "champion.json").read_text())["version"] == 1
    assert (trained["output"] / "model.json").is_file()  # train --data/--output file:// (the fixture)
    assert not list(cwd.rglob("file:*")), sorted(cwd.rglob("*"))  # nothing literally named `file:`
    result = runner.invoke(app, ["shards", "verify", "file:relative"])
    assert result.exit_code == 2 and "file:///ABSOLUTE/PATH" in _one_error_line(result.output)
    assert not (cwd / "file:relative").exists()


def test_a_file_where_a_directory_is_expected_is_one_line(digits, trained, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a directory\n")
    model = str(trained["output"])
    metrics = tmp_path / "metrics"
    evaluated = runner.invoke(app, ["evaluate", "--model", model, "--data", digits, "--output", str(metrics)])
    assert evaluated.exit_code == 0, evaluated.output
    in_process = {
        "shards verify": ["shards", "verify", str(notes)],
        "evaluate --model": ["evaluate", "--model", str(notes), "--data", digits, "--output", str(tmp_path / "e")],
        "evaluate --registry": ["evaluate", "--model", model, "--data", digits, "--output", str(tmp_path / "e2"),
                                "--registry", str(notes)],
        "promote --registry": ["promote", "--candidate", model, "--metrics", str(metrics), "--registry", str(notes)],
        "champion show": ["champion", "show", "--registry", str(notes)],
        "train --data": ["train", "--data", str(notes), "--output", str(tmp_path / "t"), "--model", "tiny"],
    }  # fmt: skip
    for name, args in in_process.items():
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (name, result.output)
        line = _one_error_line(result.output)
        assert f"{notes} is a file where a directory is expected" in line, (name, line)
        assert "give a directory or a gs:// prefix instead" in line, (name, line)
    assert notes.read_text() == "not a directory\n"


def test_bad_resume_inputs_are_one_line(digits, trained, tmp_path):
    """--resume a plain file, a pickle a weights-only load refuses (a truncated file: test_checkpoint.py),
    and a finished run with no more epochs to train."""
    notes = tmp_path / "notes.txt"
    notes.write_text("not a checkpoint\n")
    pickled = tmp_path / "pickled.pt"
    torch.save({"model": {}, "note": Path("/x")}, pickled)  # a Path global: refused by weights_only
    env = _env(tmp_path / "tmp")
    cases = {
        notes: [f"{notes} is a file, not a training output directory", "ends in .pt"],
        pickled: [f"checkpoint {pickled} is unreadable (it pickles pathlib", "--resume never"],
        # another run resumed into a new output: it could never write its model there (its best stays behind)
        trained["output"]: ["is another run's checkpoint", f"--init-from {trained['output']}"],
    }
    procs = {  # started together: each spends its seconds importing torch and setting up XLA
        resume: subprocess.Popen(_train(digits, tmp_path / f"out-{resume.stem}", "--resume", str(resume)),
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for resume in cases
    }  # fmt: skip
    for resume, expected in cases.items():
        out, err = procs[resume].communicate(timeout=300)
        assert procs[resume].returncode == 2, err[-3000:]
        line = _one_error_line(err)
        assert all(part in line for part in expected), line
        assert "weights_only` argument" not in err and "Check the documentation" not in err
    assert _ours(tmp_path / "tmp") == []


def _sigterm_caught(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        mask = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    return bool(int(mask, 16) & (1 << (signal.SIGTERM - 1)))


def test_sigterm_during_startup_exits_75_and_leaves_nothing(digits, tmp_path):
    """SIGTERM as soon as the process catches it: before torch is even loaded, so the CLI (not the trainer)
    caught it; the trainer must still stop before its first step with the preemption exit code."""
    output, tmpdir = tmp_path / "out", tmp_path / "tmp"
    proc = subprocess.Popen(_train(digits, output), env=_env(tmpdir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, "no SIGTERM handler appeared"
        with open(f"/proc/{proc.pid}/maps") as f:
            maps = f.read()
        if _sigterm_caught(proc.pid):
            break
        time.sleep(0.001)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    torch_loaded = "libtorch" in maps
    assert not torch_loaded, "SIGTERM was first caught after torch was loaded: no handler during the imports"
    assert proc.returncode == 75, err[-3000:]
    assert "SIGTERM before the first step" in err and "Traceback" not in err
    assert "training tiny on" in err  # setup ran to the end: its TensorBoard temp dir had been made
    assert not output.exists() or not any(output.iterdir())  # no checkpoint, model or half-written file
    assert _ours(tmpdir) == []
