"""The pipeline's "check data" step through the real kfp.local DAG: a source with a val image copied into
train stops the run before training, naming the leak (in `pipeline run-local`'s own lines, not only in its
log); the next run, on the fixed source, trains."""

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.fakes.webhook_receiver import WebhookReceiver
from tpustream.cli.main import app
from tpustream.release import promote

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _digit_images_with_split(root, count):
    """scikit-learn's bundled digits as PNGs in train/<class>/ and val/<class>/ (every fifth image to val)."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for i in range(count):
        folder = root / ("val" if i % 5 == 0 else "train") / str(digits.target[i])
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (digits.images[i] * (255 / 16)).astype(np.uint8)
        Image.fromarray(pixels).convert("RGB").save(folder / f"{i:05d}.png")


def _models(pipeline_root):
    return sorted(path for path, _, files in os.walk(pipeline_root) if "model.json" in files)


def test_a_leaky_source_stops_before_training_and_the_fixed_source_trains(tmp_path):
    from tpustream.pipelines.local import run_local

    source = tmp_path / "images"
    _digit_images_with_split(source, 500)
    val_three = sorted((source / "val" / "3").iterdir())[0]
    leaked = source / "train" / "3" / "copied-from-val.png"
    shutil.copy(val_three, leaked)  # the same image in both splits: val would score it after training on it
    settings = {
        "source": str(source),
        "num_shards": 4,
        "shards_per_task": 4,
        "model_name": "tiny",
        "epochs": 1,
        "batch_size": 16,
        "lr": 0.2,
        "bf16": False,
        "workers": 2,
    }
    root = str(tmp_path / "run")
    # through the command a user runs: what it prints says why the run failed and what was skipped
    with WebhookReceiver() as hook:  # stands in for Slack or Google Chat
        result = CliRunner().invoke(
            app,
            [
                *("pipeline", "run-local", "--root", root, "--source", str(source), "--model", "tiny"),
                *("--epochs", "1", "--batch-size", "16", "--lr", "0.2", "--num-shards", "4"),
                *("--param", "shards_per_task=4", "--notify-webhook", hook.url),
            ],
        )
    assert result.exit_code == 2, result.output
    # the failed run's exit step told the webhook, with the data check's one-line reason
    (told,) = hook.bodies
    assert told["state"] == "FAILED" and told["decision"] == "refused" and told["step"] == "check data"
    assert told["reason"].startswith("data check of ") and "train-val-leak" in told["reason"]
    assert "s3cr3t-token" not in result.output  # the URL's secret part is never printed
    printed = result.stdout.splitlines()
    failed = printed.index("  check-data: FAILURE")
    anomaly = printed[failed + 1]  # the anomaly right under the failed task, not 400 lines into the log
    assert anomaly.startswith("    anomaly train-val-leak: 1 image(s) are in both train and val")
    assert "copied-from-val.png (train)" in anomaly and f"{val_three.name} (val)" in anomaly
    assert "  train-model: skipped (check-data failed)" in printed[failed:]
    assert "  promotion skipped: check-data failed" in printed[failed:]  # condition-3, by what it means
    assert not any("condition-" in line for line in printed)
    (log_path,) = Path(root, "logs").glob("run-local-*.log")
    error = result.stderr.strip()
    assert error.startswith("error: check-data failed: data check of ")
    assert (
        "train-val-leak" in error and "data_check=warn" in error and error.endswith(f"full log: {log_path}")
    )
    log = log_path.read_text()
    # our lines name the receiver by its host only (KFP's executor logs its whole input, the URL too: README)
    ours = [line for line in log.splitlines() if "notifying http://127.0.0.1:" in line]
    assert ours and not any("s3cr3t-token" in line for line in ours)
    assert "train-val-leak" in log and "copied-from-val.png" in log and val_three.name in log
    assert "data_check=warn" in log  # the way to train anyway
    pipeline_root = os.path.join(root, "pipeline-root")
    assert _models(pipeline_root) == []  # stopped before training: no model, nothing promoted
    registry = os.path.join(root, "registry")
    assert promote.read_champion(registry) is None
    (report,) = Path(pipeline_root).glob("*/check-data/report")  # the Markdown artifact
    assert "`train-val-leak`" in report.read_text() and "copied-from-val.png" in report.read_text()

    leaked.unlink()  # the source is fixed
    fixed = run_local(root=root, log_path=str(tmp_path / "logs" / "fixed.log"), **settings)
    assert fixed.data == "train"
    assert len(_models(pipeline_root)) == 1
    champion = promote.read_champion(registry)
    assert champion is not None and champion.version == 1
    fixed_log = (tmp_path / "logs" / "fixed.log").read_text()
    assert "data check passed" in fixed_log and "no champion yet" in fixed_log
