"""What a retraining run saves: warm start from an earlier model (--init-from), early stopping (--patience) that
survives a restart, and Ctrl-C that commits `last` like a preemption. Each run is a real `tpustream train`
process on XLA CPU (4 virtual devices, SPMD), a tiny model on scikit-learn's digits."""

import json
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.common.train import ENV, signal_mid_epoch
from tests.common.train import run_train as _run
from tests.common.train import train_command as _cmd
from tpustream.dataset import write as shards
from tpustream.dataset.plan import ShardConfig
from tpustream.storage import io as storage
from tpustream.train.optimizer import default_peak_lr

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("data") / "digits")
    shards.create_shards(ShardConfig(source="digits", output=out, num_shards=8), progress=False)
    return out


@pytest.fixture(scope="module")
def base(digits, tmp_path_factory):
    """Last week's model: 3 epochs from random weights."""
    output = tmp_path_factory.mktemp("runs") / "base"
    result = _run(digits, output, "--epochs", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    return output


def _card(output):
    return json.loads((output / "model.json").read_text())


def test_warm_start_from_a_model_begins_where_it_ended_and_is_recorded(digits, base, tmp_path):
    scratch = _card(base)["history"][0]  # the same data and settings, epoch 1 from random weights
    command = _cmd(digits, tmp_path / "warm", "--epochs", "1", "--init-from", str(base))
    at = command.index("--lr")
    del command[at : at + 2]  # no --lr: the warm-start default, a tenth of the scratch default
    result = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    card = _card(tmp_path / "warm")
    warm = card["history"][0]
    assert warm["train_loss"] < 0.8 * scratch["train_loss"]  # it starts trained, not at chance
    assert warm["val_top1"] > scratch["val_top1"] + 0.05
    assert card["init"]["from"] == str(base) and card["init"]["kind"] == "model"
    assert card["init"]["weights"] == "all" and card["init"]["resolved"].endswith("model.pt")
    assert "warm start from" in result.stderr and "all weights loaded" in result.stderr
    global_batch = int(re.search(r"global batch (\d+)", result.stderr).group(1))
    assert card["init"]["peak_lr"] == pytest.approx(0.1 * default_peak_lr(global_batch))
    assert f"peak lr {card['init']['peak_lr']:.4g}" in result.stderr


def _digits_without_nine(root):
    from sklearn.datasets import load_digits

    data = load_digits()
    for i, (image, label) in enumerate(zip(data.images, data.target, strict=True)):
        if label == 9:
            continue
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((image * 16).clip(0, 255).astype(np.uint8)).convert("RGB").save(folder / f"{i}.png")
    return root


def test_other_classes_keep_the_backbone_and_get_a_new_head(digits, base, tmp_path):
    data = str(tmp_path / "nine-gone")
    shards.create_shards(
        ShardConfig(source=str(_digits_without_nine(tmp_path / "img")), output=data, num_shards=8),
        progress=False,
    )
    pointer = json.loads((base / "checkpoints" / "best.json").read_text())
    checkpoint = base / "checkpoints" / pointer["checkpoint"]
    result = _run(data, tmp_path / "warm", "--epochs", "1", "--init-from", str(checkpoint))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the classes changed (new: none; gone: 9): backbone loaded, a new head (9 of 9" in result.stderr
    card = _card(tmp_path / "warm")
    assert card["init"]["kind"] == "checkpoint" and card["init"]["weights"] == "backbone"
    assert card["init"]["gone_classes"] == ["9"] and card["init"]["head_rows_kept"] == 9
    assert "peak_lr" not in card["init"]  # --lr given: the run's LR is the user's


def test_early_stopping_stops_keeps_best_and_counts_on_after_a_restart(digits, tmp_path):
    output = tmp_path / "patient"
    # a gain of more than 1.0 in top-1 is impossible after the first epoch: every later epoch counts
    first = _run(digits, output, "--epochs", "2", "--patience", "2", "--min-delta", "1.0")
    assert first.returncode == 0, first.stderr[-3000:]
    assert not _card(output)["stopped_early"]  # 1 epoch without a gain, then --epochs ran out
    # more epochs for the same run: the counter (1) comes back from the checkpoint, so it stops after epoch 3
    again = _run(digits, output, "--epochs", "5", "--patience", "2", "--min-delta", "1.0")
    assert again.returncode == 0, again.stderr[-3000:]
    card = _card(output)
    assert card["stopped_early"] and len(card["history"]) == 3
    assert (
        "early stopping after epoch 3 of 5" in again.stderr and "stopped early after epoch 3" in again.stdout
    )
    best = max(card["history"], key=lambda h: h["val_top1"])
    assert card["metrics"]["epoch"] == best["epoch"]


def test_ctrl_c_commits_last_and_exits_like_a_preemption(digits, tmp_path):
    output = tmp_path / "interrupted"
    code, log = signal_mid_epoch(digits, output, signal.SIGINT)
    assert code == 75, log[-3000:]
    assert "Ctrl-C: finishing the current step and writing `last`" in log
    assert "interrupted (Ctrl-C) at epoch 2" in log and "`last` written" in log
    pointer = json.loads((output / "checkpoints" / "last.json").read_text())
    assert pointer["epoch"] == 1 and pointer["batches_done"] > 0


def test_a_second_ctrl_c_exits_at_once(tmp_path):
    """The flag alone, in a process of its own: the first Ctrl-C asks, the second leaves with 130."""
    script = (
        "import os, signal, time\n"
        "from tpustream.train.preemption import SigtermFlag\n"
        "with SigtermFlag() as flag:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    assert flag.requested and flag.interrupted\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(5)\n"
        "print('not reached')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=ENV
    )
    assert result.returncode == 130 and "second Ctrl-C: stopping now" in result.stdout
    assert "not reached" not in result.stdout


def test_a_second_run_finds_every_program_in_a_gcs_compile_cache(digits, gcs_server, gcs_bucket, tmp_path):
    """Two runs of the same program with --compile-cache gs://...: the first compiles and uploads every program,
    the second downloads them and misses none. XLA's CPU client cannot load a serialized executable (XLA:
    "Deserializing serialized executable not supported"), so here the found entries count as load failures and
    compile again; on a TPU they are hits (tpustream/train/compile_cache.py)."""
    cache = f"{gcs_bucket}/xla-cache"
    env = {**ENV, "STORAGE_EMULATOR_HOST": gcs_server.url}
    first = _run(digits, tmp_path / "first", "--epochs", "1", "--compile-cache", cache, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    cold = _card(tmp_path / "first")["compile_cache"]
    uploaded = storage.list_objects(cache)
    assert cold["misses"] > 0 and cold["hits"] == 0 and len(uploaded) == cold["misses"]
    second = _run(digits, tmp_path / "second", "--epochs", "1", "--compile-cache", cache, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    warm = _card(tmp_path / "second")["compile_cache"]
    assert warm["misses"] == 0 and warm["hits"] + warm["load_failures"] == cold["misses"]
    assert f"{len(uploaded)} entries found, 0 added" in second.stderr
    assert len(storage.list_objects(cache)) == len(uploaded)


def test_only_process_0_of_a_slice_writes_the_cache_and_replicas_get_a_path_each(tmp_path):
    """Per torch_xla's "Compilation Caching" docs: SPMD hosts share one cache that process 0 writes; processes of
    torch_xla.launch each have their own. Checked in fresh processes (the cache is set before any computation)."""
    from tests.fakes.vertex.emulation import emulated_slice_vars

    script = (
        "import os, sys\n"
        "from tpustream.train.compile_cache import open_compile_cache\n"
        "cache = open_compile_cache(sys.argv[1], strategy=sys.argv[2])\n"
        "print(cache.writer, cache.uri, os.environ['XLA_PERSISTENT_CACHE_READ_ONLY'])\n"
    )
    cache = str(tmp_path / "cache")
    for worker, expected in (("0", f"True {cache} 0"), ("1", f"False {cache} 1")):
        env = {**ENV, **emulated_slice_vars(2), "TPU_WORKER_ID": worker}
        result = subprocess.run(
            [sys.executable, "-c", script, cache, "spmd"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.stdout.split("\n")[-2] == expected, result.stderr[-2000:]
    result = subprocess.run(
        [sys.executable, "-c", script, cache, "replicas"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.split("\n")[-2] == f"True {cache}/process-0 0", result.stderr[-2000:]
