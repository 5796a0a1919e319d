"""``tpustream bench compile``: the full-size networks through the trainer's step on XLA, counting compiles.

A TPU run pays for every recompile: an architecture whose step compiles again after the first epoch (another
LR, a new buffer shape) spends minutes of the slice on each. The tests prove "no compile after the first epoch"
on reduced-width networks of the same classes (tests/integration/test_model_specs.py); this benchmark runs
the full sizes, as `train` builds them (`tpustream.models.build_network`, the stock stem at the weights'
input size), each in a fresh process: ``epochs`` epochs of ``steps`` steps, every step at another LR (as the
schedule gives), on one XLA device. One JSON line per model and precision: compiles after each epoch, the
first epoch's seconds (compiling included) and the steady step time, with its ratio to the baseline model
(resnet50, the trainer's default) measured in the same run.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

__all__ = ["BASELINE", "bench_compile"]

BASELINE = "resnet50"


def bench_compile(
    models: list[str], *, precisions: list[str], batch_size: int, epochs: int, steps: int, timeout: float
) -> Iterator[str]:
    """Yield one JSON line per (model, precision), the baseline's first; then nothing else."""
    ordered = [BASELINE, *[m for m in models if m != BASELINE]]
    for precision in precisions:
        baseline_step: float | None = None
        for name in ordered:
            row = _run_one(name, precision, batch_size, epochs, steps, timeout)
            if name == BASELINE:
                baseline_step = row.get("step_s")
            if baseline_step and row.get("step_s"):
                row["step_s_vs_resnet50"] = round(row["step_s"] / baseline_step, 3)
            yield json.dumps(row)


def _run_one(name: str, precision: str, batch_size: int, epochs: int, steps: int, timeout: float) -> dict:
    env = {**os.environ, "PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU"), "CPU_NUM_DEVICES": "1"}
    command = [sys.executable, "-m", "tpustream.bench.compile", name, precision, str(batch_size), str(epochs)]
    command.append(str(steps))
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"bench": "compile", "model": name, "precision": precision, "error": f"over {timeout:g} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return {"bench": "compile", "model": name, "precision": precision, "error": why}
    result: dict = json.loads(lines[-1])
    return result


def _one(name: str, precision: str, batch_size: int, epochs: int, steps: int) -> dict:
    """In this process: build ``name`` at its full size and run the trainer's step (``train_step``)."""
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met

    from tpustream.loader.batch import Batch
    from tpustream.models import build_network, default_small_input_stem, model_spec
    from tpustream.train.config import TrainConfig
    from tpustream.train.pretrained import spec_preprocessing
    from tpustream.train.step import compile_count, train_step
    from tpustream.xla_runtime import Runtime

    spec = model_spec(name)
    size = spec_preprocessing(spec).crop_size if spec.torchvision_arch else 224
    torch.manual_seed(0)
    stem = default_small_input_stem(name, size, pretrained=spec.torchvision_arch is not None)
    model = build_network(name, num_classes=10, input_size=size, small_input_stem=stem)
    device = torch_xla.device()
    model = model.to(device).train()
    optimizer = spec.optimizer(model, lr=1e-3, momentum=0.9, weight_decay=spec.weight_decay)
    rt = Runtime(
        device=device,
        strategy="spmd",
        num_devices=1,
        local_devices=1,
        replica_index=0,
        num_replicas=1,
        is_master=True,
    )
    config = TrainConfig(data="-", output="-", model=name, bf16=precision == "bf16")
    batch = Batch(
        image=torch.randint(0, 255, (batch_size, 3, size, size), dtype=torch.uint8).to(device),
        label=(torch.arange(batch_size) % 10).to(device),
        mask=torch.ones(batch_size, dtype=torch.bool).to(device),
    )
    compiles, epoch_seconds, step_seconds = [], [], []
    for epoch in range(epochs):
        started = time.perf_counter()
        for step in range(steps):
            step_started = time.perf_counter()
            loss = train_step(
                model, optimizer, batch, 1e-3 * (0.9 + 0.01 * (epoch * steps + step)), config, rt
            )
            float(loss.cpu())  # wait for the step: its time, not its dispatch
            if epoch > 0:
                step_seconds.append(time.perf_counter() - step_started)
        epoch_seconds.append(time.perf_counter() - started)
        compiles.append(compile_count(met))
    return {
        "bench": "compile",
        "model": name,
        "precision": precision,
        "input_size": size,
        "batch_size": batch_size,
        "compiles_after_each_epoch": compiles,
        "recompiles_after_first_epoch": compiles[-1] - compiles[0],
        "first_epoch_s": round(epoch_seconds[0], 1),
        "step_s": round(statistics.median(step_seconds), 3) if step_seconds else None,
    }


if __name__ == "__main__":
    name, precision, batch, epochs, steps = sys.argv[1:6]
    print(json.dumps(_one(name, precision, int(batch), int(epochs), int(steps))), flush=True)
