"""``tpustream bench warmstart``: after new data lands, how many epochs (steps: TPU time) a retraining run needs
to reach the champion's val top-1, from random weights vs from the champion (``train --init-from``).

The scheduled-retraining case on real data: scikit-learn's digits as an ImageFolder, "last week" the first
``old`` images, "now" all of them. The champion trains ``epochs`` epochs on last week's data; its val top-1 on
this week's val split is the target. Two runs on this week's data with the same settings and epochs, one from
random weights and one from the champion, and one from the champion at a tenth of the peak LR (fine-tuning's
usual setting); per run, the first epoch whose val top-1 reaches the target. Each run
is a real ``tpustream train`` process (XLA's runtime is per process); on XLA CPU here, steps stand for TPU time.
One JSON line per run, the warm-start line with the ratio against the scratch line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["bench_warmstart"]


def _digits_folder(root: str, count: int) -> str:
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    data = load_digits()
    for i in range(min(count, len(data.target))):
        folder = os.path.join(root, str(int(data.target[i])))
        os.makedirs(folder, exist_ok=True)
        pixels = (data.images[i] * 16).clip(0, 255).astype(np.uint8)
        Image.fromarray(pixels).convert("RGB").save(os.path.join(folder, f"{i:05d}.png"))
    return root


def run_train(data: str, output: str, args: list[str], env: dict[str, str]) -> tuple[dict[str, Any], float]:
    """One `tpustream train` process (``args`` after --data/--output): its model card and wall seconds."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "tpustream.cli", "train", "--data", data, "--output", output, *args]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"train failed ({result.returncode}): {result.stderr[-2000:]}")
    with open(os.path.join(output, "model.json")) as f:
        return json.load(f), time.perf_counter() - started


def _reached(card: dict[str, Any], target: float) -> dict[str, Any]:
    history = card["history"]
    steps_per_epoch = card["steps"] // max(1, len(history))
    epoch = next((h["epoch"] for h in history if h["val_top1"] >= target), None)
    return {
        "epochs_to_target": epoch,
        "steps_to_target": epoch * steps_per_epoch if epoch is not None else None,
        "val_top1_by_epoch": [round(h["val_top1"], 4) for h in history],
        "final_val_top1": round(history[-1]["val_top1"], 4),
    }


def bench_warmstart(
    *, old: int = 1000, epochs: int = 6, model: str = "tiny", batch_size: int = 16, lr: float = 0.2
) -> Iterator[str]:
    from tpustream.dataset.plan import ShardConfig
    from tpustream.dataset.write import create_shards
    from tpustream.train import evaluate

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.setdefault("PJRT_DEVICE", "CPU")
    if env["PJRT_DEVICE"] == "CPU":
        env.setdefault("CPU_NUM_DEVICES", "4")
    common = ["--model", model, "--batch-size", str(batch_size), "--lr", str(lr), "--epochs", str(epochs)]
    common += ["--workers", "2", "--log-steps", "1000"]
    with tempfile.TemporaryDirectory(prefix="tpustream-bench-warmstart-") as tmp:
        datasets = {}
        for name, count in (("last-week", old), ("this-week", 10**9)):
            source = _digits_folder(os.path.join(tmp, f"{name}-images"), count)
            datasets[name] = os.path.join(tmp, name)
            create_shards(ShardConfig(source=source, output=datasets[name], num_shards=8), progress=False)
        champion = os.path.join(tmp, "champion")
        run_train(datasets["last-week"], champion, common, env)
        target = evaluate.evaluate(champion, datasets["this-week"], os.path.join(tmp, "eval"), workers=0)
        top1 = float(target.candidate.top1 or 0.0)
        base = {
            "bench": "warmstart",
            "model": model,
            "epochs": epochs,
            "old_images": old,
            "target_val_top1": top1,
        }
        scratch_card, scratch_s = run_train(datasets["this-week"], os.path.join(tmp, "scratch"), common, env)
        scratch = {
            **base,
            "run": "from-scratch",
            **_reached(scratch_card, top1),
            "seconds": round(scratch_s, 1),
        }
        yield json.dumps(scratch)
        # the same settings; then fine-tuning's usual lower peak LR (a tenth), which keeps more of the start
        for run, lr_factor in (("warm-start", 1.0), ("warm-start-lr/10", 0.1)):
            args = [*common, "--init-from", champion, "--lr", str(lr * lr_factor)]
            warm_card, warm_s = run_train(
                datasets["this-week"], os.path.join(tmp, run.replace("/", "-")), args, env
            )
            warm = {**base, "run": run, "lr": round(lr * lr_factor, 6), **_reached(warm_card, top1)}
            warm["seconds"] = round(warm_s, 1)
            if warm["steps_to_target"] is not None and scratch["steps_to_target"]:
                warm["steps_ratio_vs_scratch"] = round(
                    warm["steps_to_target"] / scratch["steps_to_target"], 3
                )
            yield json.dumps(warm)
