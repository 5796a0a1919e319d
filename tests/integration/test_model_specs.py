"""Adding a model is one entry in tpustream/models.py: EfficientNet-B0, told to nothing else, trains through
`tpustream train` on XLA CPU with its spec's input size, stem and optimizer, and `tpustream evaluate` measures
the model it wrote."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.integration.test_train import ENV, _run
from tpustream import shards
from tpustream.shard_plan import ShardConfig

# One XLA compile of EfficientNet-B0's training step takes about 50 s on a 2-core machine (a second step would
# compile again, with momentum buffers: one step of all 48 images is enough to prove the spec trains).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLASSES, PER_CLASS = 4, 16  # 48 train images: one step of 48 on one device


@pytest.fixture(scope="module")
def few_digits(tmp_path_factory):
    """scikit-learn's 8x8 digits, the first 16 of each of 4 classes, as an ImageFolder and then shards."""
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("few-digits")
    data = load_digits()
    for label in range(CLASSES):
        (root / "images" / str(label)).mkdir(parents=True)
        indices = np.flatnonzero(data.target == label)[:PER_CLASS]
        for i in indices:
            pixels = (data.images[i] * 16).clip(0, 255).astype(np.uint8)
            Image.fromarray(pixels).convert("RGB").save(root / "images" / str(label) / f"{i:04d}.png")
    out = str(root / "shards")
    config = ShardConfig(source=str(root / "images"), output=out, num_shards=2, val_fraction=0.25)
    shards.create_shards(config, progress=False)
    return out


def test_efficientnet_b0_trains_and_evaluates_from_its_spec_alone(few_digits, tmp_path):
    one_device = {**ENV, "CPU_NUM_DEVICES": "1"}
    run = tmp_path / "run"
    args = ("--model", "efficientnet_b0", "--epochs", "1", "--lr", "0.05", "--batch-size", "48")
    result = _run(few_digits, run, *args, env=one_device, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    card = json.loads((run / "model.json").read_text())
    assert card["arch"] == "efficientnet_b0" and card["steps"] == 1
    # no --input-size: the spec's rule upscales the 8 px digits to 32 px, which its stride-1 stem trains on
    assert card["input_size"] == 32 and "(multiple of 8 in [32, 224])" in card["input_size_reason"]
    assert card["small_input_stem"] is True
    assert all(math.isfinite(epoch["train_loss"]) for epoch in card["history"])

    # evaluated as the server runs it: eager on the CPU, the network rebuilt from model.json's arch
    eager_cpu = {key: value for key, value in ENV.items() if key != "PJRT_DEVICE"}
    command = [sys.executable, "-m", "tpustream.cli", "evaluate", "--model", str(run), "--data", few_digits]
    evaluated = subprocess.run(
        [*command, "--output", str(tmp_path / "eval"), "--workers", "0"],
        env=eager_cpu,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    candidate = json.loads((tmp_path / "eval" / "metrics.json").read_text())["candidate"]
    assert candidate["num_samples"] == card["metrics"]["val_samples"] == CLASSES * PER_CLASS // 4
    assert candidate["top1"] == pytest.approx(card["metrics"]["val_top1"], abs=1 / candidate["num_samples"])
