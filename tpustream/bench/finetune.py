"""``tpustream bench finetune``: random init vs ``train --pretrained`` on the same small target data and the
same step budget, at a few images per class: final val top-1 and steps to a target top-1.

The source of the weights. No ImageNet weights can be downloaded here, and no installed package ships any in
its wheel (the bench looks: ``_packaged_weights`` lists every ``.pth``/``.pt``/``.safetensors`` file over 1 MB
in the environment's site-packages, and the output names what it found). So the weights are our own: the
trainer (a real ``tpustream train`` process, XLA) pretrains the model on one task, scikit-learn's digits 0-4,
and its ``model.pt`` is saved as a torchvision-layout state dict (``.pth``); the target task is the disjoint
digits 5-9. That measures what ``--pretrained`` does with a related source task, not what ImageNet weights do
for natural images (Kornblith, Shlens, Le, CVPR 2019 for those).

The two arms differ in their start only. Both are the same network: the model's stock torchvision form, the
one ``--pretrained`` keeps at every input size (at 32 px, ``train`` without ``--pretrained`` would swap in
ResNet's small-input stem: another network with 16x the compute per step). The random arm starts from the
trainer's own random init of that network (``ModelSpec.builder`` under ``--seed``, saved as a file and given as
``--pretrained``, which is also how the pretraining run gets the stock stem). Each arm trains at the peak LR
``train`` gives it by default: the from-scratch default for the random arm, a tenth of it
(``train.optimizer.FINE_TUNE_LR_FACTOR``) for the pretrained arm; ``--lr``/``--pretrained-lr`` override them.
As the LR then differs too, a third arm (``pretrained_at_random_lr``; ``--no-same-lr-arm`` drops it) starts
from the pretrained file at the random arm's LR: init is then the only difference. All arms see the same train
images (the first N per class of a seeded permutation), the same epochs, hence the same steps, and are
evaluated every epoch on the same held-out val split of the target task (the last ``val_per_class`` images per
class, never trained on). One JSON line per run, then one summary line per size with all side by
side and a plain verdict; nothing is assumed about who wins.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

from tpustream.bench.warmstart import run_train
from tpustream.errors import ConfigError

__all__ = ["bench_finetune", "summarize_size"]

SOURCE_CLASSES = (0, 1, 2, 3, 4)
TARGET_CLASSES = (5, 6, 7, 8, 9)
SAME_LR_ARM = "pretrained_at_random_lr"


def _packaged_weights() -> list[str]:
    """Weight files over 1 MB shipped inside installed packages (ImageNet weights would be tens of MB)."""
    import site

    roots = {*site.getsitepackages(), site.getusersitepackages()}
    found = []
    for root in sorted(r for r in roots if os.path.isdir(r)):
        for folder, _, files in os.walk(root):
            for name in files:
                if name.endswith((".pth", ".pt", ".safetensors")):
                    path = os.path.join(folder, name)
                    if os.path.getsize(path) > 1 << 20:
                        found.append(path)
    return sorted(found)


def _save_png(pixels: Any, path: str) -> None:
    import numpy as np
    from PIL import Image

    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray((pixels * 16).clip(0, 255).astype(np.uint8)).convert("RGB").save(path)


def _digits_by_class(seed: int) -> dict[int, list[int]]:
    """Each digit's image indices in a seeded permutation (the order train and val images are taken in)."""
    import numpy as np
    from sklearn.datasets import load_digits

    targets = load_digits().target
    rng = np.random.default_rng(seed)
    return {c: [int(i) for i in rng.permutation(np.flatnonzero(targets == c))] for c in range(10)}


def _source_folder(root: str, order: dict[int, list[int]]) -> str:
    """Digits 0-4, every image (an ImageFolder; the shards' own 10% val split watches the pretraining)."""
    from sklearn.datasets import load_digits

    images = load_digits().images
    for c in SOURCE_CLASSES:
        for i in order[c]:
            _save_png(images[i], os.path.join(root, str(c), f"{i:05d}.png"))
    return root


def _target_folder(root: str, order: dict[int, list[int]], per_class: int, val_per_class: int) -> str:
    """Digits 5-9 with their own split: train/ the first ``per_class`` of each class, val/ the last
    ``val_per_class`` (the same val images at every size)."""
    from sklearn.datasets import load_digits

    images = load_digits().images
    for c in TARGET_CLASSES:
        for i in order[c][:per_class]:
            _save_png(images[i], os.path.join(root, "train", str(c), f"{i:05d}.png"))
        for i in order[c][-val_per_class:]:
            _save_png(images[i], os.path.join(root, "val", str(c), f"{i:05d}.png"))
    return root


def _run_line(card: dict[str, Any], target: float) -> dict[str, Any]:
    """A run's reading: steps, val top-1 per epoch, the first epoch (and its steps) at ``target``."""
    history = card["history"]
    steps_per_epoch = card["steps"] // max(1, len(history))
    epoch = next((h["epoch"] for h in history if h["val_top1"] >= target), None)
    return {
        "epochs": len(history),
        "steps": card["steps"],
        "epochs_to_target_top1": epoch,
        "steps_to_target_top1": epoch * steps_per_epoch if epoch is not None else None,
        "target_top1": target,
        "final_top1": round(history[-1]["val_top1"], 4),
        "val_top1_by_epoch": [round(h["val_top1"], 4) for h in history],
    }


def _compare(random: dict[str, Any], pretrained: dict[str, Any]) -> tuple[float, float | None, str]:
    """A pretrained run against the random one: the final top-1 gain, the steps ratio, and the sentence."""
    gain = round(pretrained["final_top1"] - random["final_top1"], 4)
    r_steps, p_steps = random["steps_to_target_top1"], pretrained["steps_to_target_top1"]
    ratio = round(p_steps / r_steps, 3) if r_steps and p_steps is not None else None
    if gain > 0:
        final = f"pretrained ends {gain:+.4f} top-1 above random"
    elif gain < 0:
        final = f"pretrained does NOT beat random: it ends {gain:+.4f} top-1 below it"
    else:
        final = "pretrained and random end at the same top-1"
    if p_steps is None and r_steps is None:
        target = "neither reaches the target"
    elif p_steps is None:
        target = f"only random reaches the target ({r_steps} steps)"
    elif r_steps is None:
        target = f"only pretrained reaches the target ({p_steps} steps; random never does)"
    else:
        target = f"the target in {p_steps} steps pretrained vs {r_steps} random"
    return gain, ratio, f"at lr {pretrained['lr']:g} ({pretrained['lr_rule']}): {final}; {target}"


def summarize_size(
    random: dict[str, Any], pretrained: dict[str, Any], same_lr: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One size's runs side by side: final top-1 and steps to the target of random init, of pretrained at
    train's --pretrained LR and (``same_lr``) of pretrained at the random run's LR, and what they say."""
    runs = {"random": random, "pretrained": pretrained}
    if same_lr is not None:
        runs[SAME_LR_ARM] = same_lr
    gain, ratio, verdict = _compare(random, pretrained)
    summary: dict[str, Any] = {
        "bench": "finetune",
        "summary": True,
        "weights_source": pretrained["weights_source"],
        "images_per_class": pretrained["images_per_class"],
        "epochs": pretrained["epochs"],
        "steps": pretrained["steps"],
        "target_top1": pretrained["target_top1"],
        "final_top1": {arm: line["final_top1"] for arm, line in runs.items()},
        "steps_to_target_top1": {arm: line["steps_to_target_top1"] for arm, line in runs.items()},
        "final_top1_gain": gain,
        "steps_to_target_ratio_pretrained_vs_random": ratio,
    }
    verdicts = [verdict]
    if same_lr is not None:
        same_gain, same_ratio, same_verdict = _compare(random, same_lr)
        summary["final_top1_gain_at_random_lr"] = same_gain
        summary["steps_to_target_ratio_at_random_lr"] = same_ratio
        verdicts.append(same_verdict)
    summary["verdict"] = " | ".join(verdicts)
    return summary


def _parse_sizes(images_per_class: Sequence[int], epochs: Sequence[int]) -> list[tuple[int, int]]:
    if len(epochs) == 1:
        epochs = list(epochs) * len(images_per_class)
    if len(epochs) != len(images_per_class):
        raise ConfigError(
            f"--epochs {','.join(map(str, epochs))}: give one epoch count, or one per --images-per-class "
            f"({len(images_per_class)})"
        )
    return list(zip(images_per_class, epochs, strict=True))


def bench_finetune(
    *,
    images_per_class: Sequence[int] = (10, 100),
    epochs: Sequence[int] = (30, 6),
    pretrain_epochs: int = 6,
    model: str = "resnet18",
    input_size: int = 32,
    batch_size: int = 16,
    lr: float | None = None,
    pretrained_lr: float | None = None,
    target_top1: float = 0.7,
    val_per_class: int = 60,
    seed: int = 0,
    same_lr_arm: bool = True,
) -> Iterator[str]:
    """JSON lines: per size in ``images_per_class``, the random run, the pretrained run at train's --pretrained
    LR and (``same_lr_arm``, when the two LRs differ) the pretrained run at the random run's LR, then their
    summary."""
    from tpustream.dataset.plan import ShardConfig
    from tpustream.dataset.write import create_shards
    from tpustream.models import model_spec
    from tpustream.train.optimizer import FINE_TUNE_LR_FACTOR, default_peak_lr

    spec = model_spec(model)
    sizes = _parse_sizes(images_per_class, epochs)
    order = _digits_by_class(seed)
    available = min(len(order[c]) for c in TARGET_CLASSES)
    for per_class, _ in sizes:
        if per_class < 1 or per_class + val_per_class > available:
            raise ConfigError(
                f"--images-per-class {per_class}: digits 5-9 have {available} images in their smallest class, "
                f"{val_per_class} of them held out for val: give 1 to {available - val_per_class}"
            )
    if not 0.0 < target_top1 <= 1.0:
        raise ConfigError(f"--target-top1 {target_top1}: give a top-1 in (0, 1]")
    # the trainer's default peak LRs at this global batch (one device): from scratch, and for --pretrained
    random_lr = lr if lr is not None else default_peak_lr(batch_size, spec.base_lr)
    tuned_lr = pretrained_lr if pretrained_lr is not None else random_lr * FINE_TUNE_LR_FACTOR
    random_rule = "--lr" if lr is not None else "train's from-scratch default"
    tuned_rule = "--pretrained-lr" if pretrained_lr is not None else "train's --pretrained default, a tenth"

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1"}
    common = ["--model", model, "--input-size", str(input_size), "--batch-size", str(batch_size)]
    common += ["--workers", "1", "--log-steps", "1000", "--seed", str(seed)]
    packaged = _packaged_weights()
    with tempfile.TemporaryDirectory(prefix="tpustream-bench-finetune-") as tmp:
        import torch

        # the trainer's random init of the stock network, as a file: the random arm's start, and how the
        # pretraining run gets the stock stem at a small input size
        torch.manual_seed(seed)
        network = spec.builder(num_classes=len(SOURCE_CLASSES), in_channels=3, input_size=input_size)
        random_file = os.path.join(tmp, f"{model}-random-init.pth")
        torch.save(network.state_dict(), random_file)

        source = os.path.join(tmp, "digits-0-4")
        create_shards(
            ShardConfig(source=_source_folder(source + "-images", order), output=source, num_shards=2),
            progress=False,
        )
        pre_args = [*common, "--epochs", str(pretrain_epochs), "--lr", str(random_lr)]
        pre_card, pre_s = run_train(
            source, os.path.join(tmp, "pretrain"), [*pre_args, "--pretrained", random_file], env
        )
        weights_file = os.path.join(tmp, f"{model}-digits0-4.pth")
        state = torch.load(os.path.join(tmp, "pretrain", "model.pt"), map_location="cpu", weights_only=True)
        torch.save(state, weights_file)  # model.pt is the state dict in torchvision's layout (keys, shapes)
        layout = (
            "torchvision-layout" if spec.torchvision_arch else f"{model} state dict (not a torchvision model)"
        )
        weights_source = (
            f"own pretraining: tpustream train {model} on digits 0-4 ({pre_card['steps']} steps, "
            f"{pretrain_epochs} epochs, val top-1 {pre_card['history'][-1]['val_top1']:.4f}, "
            f"{pre_s:.0f} s), saved as a {layout} .pth; "
            + (
                "no installed package ships weight files (ImageNet or other) in its wheel"
                if not packaged
                else f"weight files found in installed packages but not used: {', '.join(packaged)}"
            )
        )
        for per_class, run_epochs in sizes:
            target = os.path.join(tmp, f"digits-5-9-{per_class}")
            folder = _target_folder(target + "-images", order, per_class, val_per_class)
            create_shards(ShardConfig(source=folder, output=target, num_shards=2), progress=False)
            arms = [
                ("random", "random", random_file, random_lr, random_rule),
                ("pretrained", "pretrained", weights_file, tuned_lr, tuned_rule),
            ]
            if same_lr_arm and tuned_lr != random_lr:
                arms.append((SAME_LR_ARM, "pretrained", weights_file, random_lr, "the random run's"))
            lines = {}
            for arm, init, start, run_lr, rule in arms:
                args = [*common, "--epochs", str(run_epochs), "--lr", str(run_lr), "--pretrained", start]
                card, seconds = run_train(target, os.path.join(tmp, f"{arm}-{per_class}"), args, env)
                line = {
                    "bench": "finetune",
                    "weights_source": weights_source,
                    "images_per_class": per_class,
                    "init": init,
                    "arm": arm,
                    "model": model,
                    "input_size": input_size,
                    "lr": round(run_lr, 6),
                    "lr_rule": rule,
                    "train_images": per_class * len(TARGET_CLASSES),
                    "val_images": val_per_class * len(TARGET_CLASSES),
                    "dataset_digest": card["dataset"]["manifest_digest"],
                    "start_sha256": card["pretrained"]["sha256"],  # the file the run loaded its backbone from
                    **_run_line(card, target_top1),
                    "seconds": round(seconds, 1),
                }
                lines[arm] = line
                yield json.dumps(line)
            yield json.dumps(summarize_size(lines["random"], lines["pretrained"], lines.get(SAME_LR_ARM)))
            shutil.rmtree(target + "-images", ignore_errors=True)
