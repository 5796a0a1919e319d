"""Adding a model is one entry in tpustream/models.py: EfficientNet-B0, told to nothing else, trains through
`tpustream train` on XLA CPU with its spec's input size, stem and optimizer, and `tpustream evaluate` measures
the model it wrote. ViT, ConvNeXt and EfficientNetV2 compile once: reduced-width networks of the same classes,
with their specs' stems and optimizer recipes, run the trainer's step with no recompile after the first epoch."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.common.train import ENV
from tests.common.train import run_train as _run
from tpustream.dataset import write as shards
from tpustream.dataset.plan import ShardConfig

pytestmark = pytest.mark.integration

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


# The reduced networks: the same torchvision classes as the specs' full models, widths and depths cut so that
# a step compiles in seconds; each gets its spec's small-input stem (ViT: none) and optimizer recipe.
REDUCED = """
import sys, torch, torch_xla, torch_xla.debug.metrics as met
from torchvision.models import ConvNeXt, EfficientNet, VisionTransformer
from torchvision.models.convnext import CNBlockConfig
from torchvision.models.efficientnet import FusedMBConvConfig, MBConvConfig
from tpustream.models import MODEL_SPECS
from tpustream.train.config import TrainConfig
from tpustream.train.step import train_step, compile_count
from tpustream.xla_runtime import Runtime

name, bf16 = sys.argv[1], sys.argv[2] == "bf16"
spec = MODEL_SPECS[name]
if name == "vit_b_16":
    model = VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=4
    )
elif name == "convnext_tiny":
    model = ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)], num_classes=4)
else:
    setting = [FusedMBConvConfig(1, 3, 1, 8, 8, 1), MBConvConfig(4, 3, 2, 8, 16, 1)]
    model = EfficientNet(setting, dropout=0.2, num_classes=4, last_channel=32)
if spec.small_input is not None:
    model = spec.small_input(model, in_channels=3)
assert model.get_submodule(spec.head).out_features == 4
device = torch_xla.device()
model = model.to(device).train()
optimizer = spec.optimizer(model, lr=1e-3, momentum=0.9, weight_decay=spec.weight_decay)
rt = Runtime(
    device=device, strategy="spmd", num_devices=1, local_devices=1, replica_index=0, num_replicas=1, is_master=True
)
config = TrainConfig(data="-", output="-", model=name, bf16=bf16)
batch = {
    "image": torch.randint(0, 255, (4, 3, 32, 32), dtype=torch.uint8).to(device),
    "label": torch.tensor([0, 1, 2, 3]).to(device),
    "mask": torch.ones(4, dtype=torch.bool).to(device),
}
losses, compiles = [], []
for epoch in range(3):  # three "epochs" of two steps, each step at another LR (the schedule's)
    for step in range(2):
        losses.append(train_step(model, optimizer, batch, 1e-3 * (0.9 + 0.03 * (2 * epoch + step)), config, rt))
    compiles.append(compile_count(met))
print("compiles", *compiles, "losses", *[float(loss.cpu()) for loss in losses])
"""


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["vit_b_16", "convnext_tiny", "efficientnet_v2_s"])
def test_reduced_architectures_compile_once_through_the_trainer_step(name, precision):
    env = {**ENV, "CPU_NUM_DEVICES": "1"}
    command = [sys.executable, "-c", REDUCED, name, precision]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    words = result.stdout.split()
    compiles = [int(v) for v in words[words.index("compiles") + 1 : words.index("losses")]]
    losses = [float(v) for v in words[words.index("losses") + 1 :]]
    assert compiles[0] >= 1 and compiles[1] == compiles[2], compiles  # nothing compiled after epoch 1
    assert all(math.isfinite(loss) for loss in losses)


# One XLA compile of EfficientNet-B0's training step takes about 50 s on a 2-core machine (a second step would
# compile again, with momentum buffers: one step of all 48 images is enough to prove the spec trains).
@pytest.mark.slow
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
    command = [
        sys.executable,
        "-m",
        "tpustream.cli",
        "evaluate",
        "--model",
        str(run),
        "--data",
        few_digits,
    ]
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
