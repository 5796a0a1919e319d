"""The XLA trainer on PJRT CPU: each run is a real `tpustream train` process (the XLA runtime is
process-global), SPMD over 4 virtual CPU devices unless said otherwise."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.common.train import ENV, signal_mid_epoch
from tests.common.train import run_train as _run
from tests.common.train import train_command as _cmd
from tpustream.dataset import write as shards
from tpustream.dataset.manifest import manifest_digest, read_manifest
from tpustream.dataset.plan import ShardConfig
from tpustream.models import build_model

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("data") / "digits")
    shards.create_shards(ShardConfig(source="digits", output=out, num_shards=8), progress=False)
    return out


def _last_checkpoint(output):
    pointer = json.loads((output / "checkpoints" / "last.json").read_text())
    return torch.load(output / "checkpoints" / pointer["checkpoint"], weights_only=True)


def _last_weights(output):
    return _last_checkpoint(output)["model"]


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def uninterrupted(digits, tmp_path_factory):
    output = tmp_path_factory.mktemp("runs") / "uninterrupted"
    result = _run(digits, output, "--epochs", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    return output


def test_spmd_learns_and_compiles_stay_flat(digits, tmp_path):
    # As on Vertex AI with a base output directory (issue 26): the event files are also copied there
    vertex_logs = tmp_path / "base-output" / "logs"
    env = {**ENV, "AIP_TENSORBOARD_LOG_DIR": f"{vertex_logs}/"}
    result = _run(digits, tmp_path / "run", "--epochs", "5", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    card = json.loads((tmp_path / "run" / "model.json").read_text())
    history = card["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert card["metrics"]["val_top1"] > 0.6  # chance is 0.1
    assert card["metrics"]["val_samples"] == read_manifest(digits)["splits"]["val"]["num_samples"]
    assert len({h["compiles"] for h in history[1:]}) == 1  # no recompilation after epoch 1 (train and eval)
    assert "4 device(s) (spmd), per-device batch 16, global batch 64" in result.stderr
    # issues 37 and 46: every train sample once per epoch, the remainder in a padded last batch, said per epoch
    train_samples = read_manifest(digits)["splits"]["train"]["num_samples"]
    padding = -train_samples % 64
    assert padding  # the digits do not fill whole global batches
    for h in history:
        assert h["train_samples_seen"] == train_samples and h["train_samples_repeated"] == 0
        assert h["train_samples_left_out"] == 0 and h["train_samples_padded"] == padding
    assert f"({train_samples} samples seen, 0 left out, 0 repeated, {padding} padding)" in result.stderr
    assert "GlobalRate" in result.stderr and "data wait" in result.stderr
    weights = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    model = build_model("tiny", num_classes=10, input_size=card["input_size"])
    model.load_state_dict(weights)
    assert card["dataset"]["manifest_digest"] == manifest_digest(digits)
    assert list((tmp_path / "run" / "tensorboard").iterdir())
    (events,) = vertex_logs.iterdir()  # one process, one event file: the same as OUTPUT/tensorboard's
    assert (tmp_path / "run" / "tensorboard" / events.name).read_bytes() == events.read_bytes()
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    top1 = [e.value for e in accumulator.Scalars("epoch/val_top1")]
    assert top1 == pytest.approx([h["val_top1"] for h in history])  # every epoch's, as model.json has them
    assert card["input_size"] == 16 and "median shorter side 8 px" in card["input_size_reason"]


def test_kill_and_resume_equals_uninterrupted(digits, uninterrupted, tmp_path):
    output = tmp_path / "killed"
    proc = subprocess.Popen(
        _cmd(digits, output, "--epochs", "3"),
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    pointer = output / "checkpoints" / "last.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if pointer.exists() and json.loads(pointer.read_text())["epoch"] >= 1:
            proc.kill()  # SIGKILL: no chance to clean up
            break
        time.sleep(0.05)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert json.loads(pointer.read_text())["epoch"] < 3
    resumed = _run(digits, output, "--epochs", "3")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr
    assert _equal(_last_weights(output), _last_weights(uninterrupted))


def test_sigterm_mid_epoch_writes_last_and_resumes(digits, uninterrupted, tmp_path):
    output = tmp_path / "preempted"
    code, log = signal_mid_epoch(digits, output, signal.SIGTERM)
    assert code == 75, log[-3000:]
    pointer = json.loads((output / "checkpoints" / "last.json").read_text())
    assert pointer["epoch"] == 1 and pointer["batches_done"] > 0  # mid-epoch 2
    resumed = _run(digits, output, "--epochs", "3")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _equal(_last_weights(output), _last_weights(uninterrupted))


def test_replicas_strategy_on_one_device(digits, tmp_path):
    env = {**ENV, "CPU_NUM_DEVICES": "1"}
    result = _run(digits, tmp_path / "rep", "--epochs", "1", "--strategy", "replicas", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    card = json.loads((tmp_path / "rep" / "model.json").read_text())
    assert card["training"]["strategy"] == "replicas" and card["metrics"]["epoch"] == 1
    # --seed seeds the XLA device's RNG too (the replica's own process): the same run at another seed ends
    # its epoch at another device RNG state (before, torch_xla's 101 at every seed: the same state, the same
    # dropout and stochastic-depth masks)
    other = _run(
        digits, tmp_path / "rep-seed-1", "--epochs", "1", "--strategy", "replicas", "--seed", "1", env=env
    )
    assert other.returncode == 0, other.stderr[-3000:]
    assert (
        _last_checkpoint(tmp_path / "rep-seed-1")["rng"]["xla"]
        != _last_checkpoint(tmp_path / "rep")["rng"]["xla"]
    )


def test_the_seed_sets_the_xla_devices_draws():
    """seed_rngs: the same seed, the same dropout masks on the XLA device; another seed, others (torch_xla
    keeps the device's RNG apart from torch.manual_seed's)."""
    import torch_xla
    import torch_xla.core.xla_model as xm

    from tpustream.xla_runtime import seed_rngs

    device = torch_xla.device()
    dropout = torch.nn.Dropout(0.5)

    def masks(seed: int) -> torch.Tensor:
        seed_rngs(seed, device)
        assert xm.get_rng_state(str(device)) == seed
        return dropout(torch.ones(2, 256, device=device)).cpu() > 0

    first = masks(3)
    assert torch.equal(masks(3), first)
    assert not torch.equal(masks(4), first)


def test_bad_inputs_are_clear_errors(digits, uninterrupted, tmp_path):
    result = _run(str(tmp_path / "nowhere"), tmp_path / "o", "--epochs", "1")
    assert result.returncode == 2 and "no dataset at" in result.stderr
    result = _run(digits, uninterrupted, "--epochs", "4", "--model", "resnet18")
    assert result.returncode == 2 and "does not fit this run" in result.stderr and "'tiny'" in result.stderr
    result = _run(digits, tmp_path / "o2", "--epochs", "1", "--global-batch-size", "30")
    assert result.returncode == 2 and "does not divide over 4 devices" in result.stderr
    result = _run(digits, tmp_path / "o3", "--epochs", "1", "--model", "vgg")
    assert result.returncode == 2 and "unknown model 'vgg'" in result.stderr
    (tmp_path / "file").write_text("x")
    result = _run(digits, tmp_path / "file", "--epochs", "1")
    assert result.returncode == 2 and "is a file" in result.stderr
    for r in (result,):
        assert "Traceback" not in r.stderr
    other = str(tmp_path / "digits-seed1")  # same classes and images, another order: another manifest
    shards.create_shards(ShardConfig(source="digits", output=other, num_shards=8, seed=1), progress=False)
    before = (uninterrupted / "model.json").read_text()
    result = _run(other, uninterrupted, "--epochs", "4")
    assert (
        result.returncode == 2
        and "does not fit this run" in result.stderr
        and "manifest sha256" in result.stderr
    )
    assert (uninterrupted / "model.json").read_text() == before  # the artifact still names its real dataset


def test_divergence_stops_with_a_clear_error_and_no_model(digits, tmp_path):
    result = _run(digits, tmp_path / "nan", "--epochs", "2", "--lr", "1e12")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "training diverged" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "nan" / "model.pt").exists()  # nothing for evaluate/promote to pick up


@pytest.mark.slow
def test_resnet50_two_steps_on_xla():
    code = """
import torch, torch_xla, torch_xla.debug.metrics as met
from tpustream.models import build_model
from tpustream.train.config import TrainConfig
from tpustream.train.step import train_step
from tpustream.xla_runtime import Runtime
device = torch_xla.device()
model = build_model("resnet50", num_classes=10, input_size=64).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
rt = Runtime(device=device, strategy="spmd", num_devices=1, local_devices=1, replica_index=0, num_replicas=1, is_master=True)
config = TrainConfig(data="-", output="-", model="resnet50")
batch = {"image": torch.randint(0, 255, (2, 3, 64, 64), dtype=torch.uint8).to(device), "label": torch.tensor([1, 2]).to(device), "mask": torch.ones(2, dtype=torch.bool).to(device)}
losses = [train_step(model, opt, batch, 0.1, config, rt).item() for _ in range(2)]
print("losses", losses, "params", sum(p.numel() for p in model.parameters()))
"""
    env = {**ENV, "CPU_NUM_DEVICES": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # ResNet-50, 10-class head, small-image stem (3x3 conv1: 7,680 weights fewer than the 7x7 stem)
    assert "params 23520842" in result.stdout
    losses = [float(v) for v in result.stdout.split("[")[1].split("]")[0].split(",")]
    assert all(map(lambda v: v == v and v < 1e3, losses))  # finite


def test_bench_train_reports_data_wait(digits):
    cmd = [sys.executable, "-m", "tpustream.cli", "bench", "train", "--data", digits, "--model", "tiny",
           "--steps", "4", "--batch-size", "8", "--workers", "1"]  # fmt: skip
    result = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["input"] for r in lines] == ["synthetic-on-device", "tpustream-loader"]
    assert all(r["devices"] == 4 and r["global_batch"] == 32 and r["steps_per_s"] > 0 for r in lines)
    assert 0.0 <= lines[1]["data_wait_fraction"] < 1.0


def _digits_with_poisoned_test(poison: int):
    """The bundled digits plus ``poison`` test items: noise images with random labels. The digits carry no
    split, so their train/val plan (and shards) is the ``digits`` fixture's: the test split is drawn last."""
    import numpy as np

    from tpustream.image.codec import encode_ppm
    from tpustream.sources.builtin import digits_source
    from tpustream.sources.types import Item

    source = digits_source()
    rng = np.random.default_rng(0)
    source.items += [Item(f"poison-{i}", int(rng.integers(10)), "test") for i in range(poison)]
    load_digit = source.loader

    def load(item, max_side):
        if isinstance(item.ref, str):  # a pattern no digit has, under a label that does not describe it
            noise = np.random.default_rng(int(item.ref.split("-")[1])).integers(
                0, 256, (8, 8, 3), dtype=np.uint8
            )
            return encode_ppm(noise), "ppm"
        return load_digit(item, max_side)

    source.loader = load
    return source


def test_a_poisoned_test_split_changes_nothing_in_training(digits, uninterrupted, tmp_path):
    """Training and best-epoch selection read train and val only: a test split of 900 noise images with random
    labels leaves every training and val number and the weights exactly as in the run without it."""
    data = str(tmp_path / "data")
    shards.create_shards(
        ShardConfig(source="digits", output=data, num_shards=8),
        progress=False,
        source=_digits_with_poisoned_test(900),
    )
    clean, poisoned = read_manifest(digits), read_manifest(data)
    assert "test" not in clean["splits"] and poisoned["splits"]["test"]["num_samples"] == 900
    for split in ("train", "val"):  # the same bytes: only the test split differs
        assert [s["sha256"] for s in poisoned["splits"][split]["shards"]] == [
            s["sha256"] for s in clean["splits"][split]["shards"]
        ]
    result = _run(data, tmp_path / "run", "--epochs", "3")  # as the uninterrupted run
    assert result.returncode == 0, result.stderr[-3000:]
    clean_card = json.loads((uninterrupted / "model.json").read_text())
    poisoned_card = json.loads((tmp_path / "run" / "model.json").read_text())
    numbers = ("epoch", "train_loss", "val_loss", "val_top1", "val_top5", "val_samples", "train_samples_seen")
    assert [{k: h[k] for k in numbers} for h in poisoned_card["history"]] == [
        {k: h[k] for k in numbers} for h in clean_card["history"]
    ]
    assert poisoned_card["metrics"] == clean_card["metrics"]  # the best epoch, chosen on val alike
    assert poisoned_card["metrics"]["val_samples"] == clean["splits"]["val"]["num_samples"]
    assert _equal(
        torch.load(tmp_path / "run" / "model.pt", weights_only=True),
        torch.load(uninterrupted / "model.pt", weights_only=True),
    )


def _small_digits(output, per_class, classes=8):
    """The issue 46 case: ``classes`` digit classes of ``per_class`` train images (and 5 val images) each."""
    from tpustream.sources.builtin import digits_source
    from tpustream.sources.types import Item

    source = digits_source()
    by_class: dict[int, list] = {}
    for item in source.items:
        if item.label < classes:
            by_class.setdefault(item.label, []).append(item)
    source.items = [
        Item(item.ref, label, split)
        for label, group in sorted(by_class.items())
        for split, part in (("train", group[:per_class]), ("val", group[per_class : per_class + 5]))
        for item in part
    ]
    source.classes = source.classes[:classes]
    shards.create_shards(
        ShardConfig(source="digits", output=output, num_shards=4), progress=False, source=source
    )
    return output


def test_small_data_trains_on_every_sample_every_epoch_without_a_recompile(tmp_path):
    """Issue 46: 10 images x 8 classes at global batch 32 on 4 devices: 3 steps per epoch, not 2 (a fifth of
    the data unseen), every sample seen each epoch, the last batch padded with 16 copies; and the padded step
    compiles nothing more: the run's compile counts equal those of 12 images x 8 classes (3 full steps)."""
    cards, logs = {}, {}
    for per_class in (10, 12):
        data = _small_digits(str(tmp_path / f"digits-{per_class}"), per_class)
        result = _run(data, tmp_path / f"run-{per_class}", "--epochs", "3", "--global-batch-size", "32")
        assert result.returncode == 0, result.stderr[-3000:]
        cards[per_class] = json.loads((tmp_path / f"run-{per_class}" / "model.json").read_text())
        logs[per_class] = result.stderr
    padded, exact = cards[10], cards[12]
    assert "80 train samples in 3 step(s) per epoch of global batch 32: every sample every epoch, the last batch " \
        "padded with 16 copies" in logs[10]  # fmt: skip
    assert "3 steps/epoch x 3 epochs" in logs[10] and padded["steps"] == 9
    for h in padded["history"]:
        assert (h["train_samples_seen"], h["train_samples_left_out"], h["train_samples_padded"]) == (
            80,
            0,
            16,
        )
    assert "(80 samples seen, 0 left out, 0 repeated, 16 padding)" in logs[10]
    assert [h["train_samples_padded"] for h in exact["history"]] == [0, 0, 0] and exact["steps"] == 9
    assert [h["compiles"] for h in padded["history"]] == [h["compiles"] for h in exact["history"]]
    assert len({h["compiles"] for h in padded["history"]}) == 1  # none after the first epoch either


STEP_WITH_PADDING = """
import copy, json, torch, torch_xla
import torch.nn.functional as F
from tpustream.image.transforms import normalize
from tpustream.models import build_model
from tpustream.train.config import TrainConfig
from tpustream.train.step import train_step
from tpustream.xla_runtime import Runtime

device = torch_xla.device()
rt = Runtime(device=device, strategy="spmd", num_devices=1, local_devices=1, replica_index=0, num_replicas=1,
             is_master=True)
config = TrainConfig(data="-", output="-", model="tiny")
torch.manual_seed(0)
base = build_model("tiny", num_classes=10, input_size=16)
images = torch.randint(0, 255, (8, 3, 16, 16), dtype=torch.uint8)
labels = torch.tensor([1, 7, 3, 5, 2, 4, 6, 8])


def step(real, size, network):
    # the loader's padded batch: `real` samples, then copies of them in turn (labels too), mask False
    order = torch.arange(size) % real
    batch = {"image": images[order].to(device), "label": labels[order].to(device),
             "mask": (torch.arange(size) < real).to(device)}
    model = copy.deepcopy(network).to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    loss = train_step(model, optimizer, batch, 0.5, config, rt)
    return float(loss.cpu()), {k: v.cpu() for k, v in model.state_dict().items()}


out = {}
# BatchNorm in train mode, 4 real samples padded to 8 with copies: the batch statistics are the real ones,
# so the step equals a step on the 4 real samples alone (loss, weights, BatchNorm running means)
loss_padded, padded = step(4, 8, base)
loss_real, real = step(4, 4, base)
out["bn_loss"] = [loss_padded, loss_real]
out["bn_weights_equal"] = all(torch.allclose(padded[k].float(), real[k].float(), rtol=1e-4, atol=1e-5)
                              for k in real if not k.endswith(("running_var", "num_batches_tracked")))
# Without BatchNorm (each sample's loss its own), 3 real samples padded to 8 (samples 0 and 1 three times, 2
# twice): a mean over every slot would weigh samples 0 and 1 more; the masked loss is the 3 real samples' alone
no_bn = torch.nn.Sequential(*(torch.nn.Identity() if isinstance(m, torch.nn.BatchNorm2d) else m for m in base))
loss_padded, padded = step(3, 8, no_bn)
loss_real, real = step(3, 3, no_bn)
out["no_bn_loss"] = [loss_padded, loss_real]
out["no_bn_weights_equal"] = all(torch.allclose(padded[k].float(), real[k].float(), rtol=1e-4, atol=1e-5)
                                for k in real)
with torch.no_grad():  # the witness: what a mean over every slot of that batch would have been
    order = torch.arange(8) % 3
    per_sample = F.cross_entropy(no_bn(normalize(images[order])), labels[order],
                                 label_smoothing=config.label_smoothing, reduction="none")
out["no_bn_unmasked_ratio"] = float(per_sample.mean() / per_sample[:3].mean())
print(json.dumps(out))
"""


def test_padding_weighs_nothing_in_the_loss_and_the_batchnorm_statistics():
    """Issue 46: a train step on the loader's padded batch (real samples, then copies of them, mask False) is a
    step on its real samples alone: with BatchNorm in train mode (a real count dividing the batch: the batch
    statistics are exactly the real ones) and without BatchNorm (3 real in 8, where a mean over every slot
    would weigh two of them 3:2)."""
    env = {**ENV, "CPU_NUM_DEVICES": "1"}
    result = subprocess.run(
        [sys.executable, "-c", STEP_WITH_PADDING], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["bn_loss"][0] == pytest.approx(out["bn_loss"][1], rel=1e-5) and out["bn_weights_equal"]
    assert (
        out["no_bn_loss"][0] == pytest.approx(out["no_bn_loss"][1], rel=1e-5) and out["no_bn_weights_equal"]
    )
    assert abs(out["no_bn_unmasked_ratio"] - 1) > 1e-3  # the padding, weighed, would have shown
