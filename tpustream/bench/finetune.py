"""``tpustream bench finetune``: does our fine-tuning get from pretrained weights what a plain PyTorch
fine-tune of the same weights gets, on a transfer task where pretraining matters?

The task (``bench/transfer_task.py``): 22 procedurally drawn shape x texture classes at 64 px as the source,
8 disjoint classes made of the same shapes and textures in new combinations as the target. No ImageNet
weights can be downloaded here, so the weights are our own: plain PyTorch pretrains the model on the source task
on the CPU (``bench/finetune_plain.py``: eager CPU ran ~6x the images a second that XLA's CPU backend did on the
shared machine), and its state dict (torchvision's layout) is the ``.pth`` every fine-tune starts from. How a user's
weights were made is not under test; the pretrain line's ``source_val_top1`` says whether they learned the
source task at all (resnet18, 100 images a class, 8 epochs, 272 steps, on the shared CPU: 0.068 with the first
version's 5-9 px textures, chance 0.045; 0.173 with today's 10-16 px; hence the default's 24 epochs).

At each target size (images per class) every arm sees the same train images (the first N of each class),
the same number of optimizer steps and the same held-out test images (never trained on, the same at every
size), and reports the final top-1 on them:

- ``random``: ``tpustream train`` from the trainer's random init of the same network at its from-scratch LR
  (left out with ``random_arm=False``);
- ``ours_default``: ``tpustream train --pretrained FILE`` with every default (the fine-tuning LR rule:
  ``train.optimizer.fine_tune_peak_lr``);
- ``ours_recipe``: the same with ``recipe_args`` added (the modern recipe's options; not run when none are
  given);
- ``ours_lr_xF`` (``lr_factors``): the default run at F times the default fine-tuning LR: the LR sweep;
- ``plain_reference``: plain PyTorch on the CPU (no XLA, no tpustream loader) from the same file, as
  torchvision's classification reference fine-tunes: SGD momentum 0.9, weight decay 1e-4, cosine to zero,
  LR 0.01 at batch 32 scaled linearly, no warmup, no label smoothing, RandomResizedCrop (our min crop scale)
  + horizontal flip;
- ``plain_trivial`` (``plain_trivial=True``): the same with TrivialAugmentWide after the crop and flip: what the
  policy does to a short fine-tune, without our trainer;
- ``plain_random``: the plain script from the random init: with ``plain_reference`` it decides whether the
  task is informative at all (``transfer_check``: pretraining must help a plain fine-tune, else no
  comparison here says anything about fine-tuning).

One JSON line per run, then one summary line per size: every arm's final top-1, each of the others over the plain
reference (``ratio_vs_plain``), and the transfer check's code and sentence.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any, Literal

from tpustream.bench.finetune_plain import (
    PRETRAIN_ADAMW_LR,
    TEST_INDEX_START,
    plain_finetune,
    plain_pretrain,
    pretrain_optimizer_name,
)
from tpustream.bench.transfer_task import SOURCE_CLASSES, TARGET_CLASSES, write_folder
from tpustream.bench.warmstart import run_train
from tpustream.errors import ConfigError
from tpustream.storage import io as storage

__all__ = [
    "TransferCheck",
    "FinetuneSize",
    "QUICK",
    "DEFAULT",
    "transfer_check",
    "summarize_size",
    "bench_finetune",
]

REFERENCE_LR_AT_32 = 0.01
"""torchvision's classification reference, fine-tuning: LR 0.01 at batch 32 (scaled linearly here)."""
MIN_TRANSFER_GAIN = 0.05
"""The plain fine-tune's top-1 gain from pretraining that makes the task informative (5 points)."""
PRETRAIN_LR_SCALE = 4.0
"""The plain pretraining's peak LR over the trainer's from-scratch default at the fine-tunes' batch (a one-cycle
schedule at batch 64 takes a higher peak: 0.1 for resnet18 at the default sizes)."""
PLAIN_RULE = "torchvision reference fine-tuning: 0.01 at batch 32, scaled linearly"
TASK_VERSION = 2
"""The transfer task's version (2: 10-16 px texture periods): kept pretraining weights of another are not reused."""


@dataclass(frozen=True)
class TransferCheck:
    """Whether pretraining helps a plain fine-tune of the same weights: the task is informative or not."""

    code: Literal["informative", "uninformative"]
    gain: float
    sentence: str


def transfer_check(
    plain_pretrained: float, plain_random: float, min_gain: float = MIN_TRANSFER_GAIN
) -> TransferCheck:
    """The transfer check of one size from the plain fine-tunes' final top-1 from the pretrained file and from
    the random init: informative when pretraining gains at least ``min_gain``."""
    gain = round(plain_pretrained - plain_random, 4)
    if gain >= min_gain:
        sentence = f"informative: pretraining lifts the plain fine-tune {gain:+.4f} top-1 (>= {min_gain:g})"
        return TransferCheck("informative", gain, sentence)
    sentence = (
        f"UNINFORMATIVE task: pretraining moves the plain fine-tune only {gain:+.4f} top-1 (< {min_gain:g}): "
        "no comparison at this size says anything about fine-tuning"
    )
    return TransferCheck("uninformative", gain, sentence)


@dataclass(frozen=True)
class FinetuneSize:
    """The bench's size: model, pretraining and fine-tuning budgets."""

    model: str
    images_per_class: tuple[int, ...]
    epochs: tuple[int, ...]
    source_per_class: int
    pretrain_epochs: int
    test_per_class: int
    batch_size: int


DEFAULT = FinetuneSize(
    model="resnet18",
    images_per_class=(10, 30, 100),
    epochs=(6, 3, 2),
    source_per_class=100,
    pretrain_epochs=24,
    test_per_class=25,
    batch_size=16,
)
QUICK = FinetuneSize(
    model="tiny",
    images_per_class=(4,),
    epochs=(2,),
    source_per_class=8,
    pretrain_epochs=1,
    test_per_class=4,
    batch_size=8,
)


def summarize_size(seeds: dict[int, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """One size's runs side by side (``seeds``: each fine-tuning seed's lines by arm): every arm's final top-1
    (the mean over the seeds), each of the others over the plain reference (the ratio of the means), and the
    transfer check of the plain arms' means; with several seeds, each seed's top-1 and ratio too."""
    runs = list(seeds.values())
    any_line = runs[0]["plain_reference"]
    top1 = {arm: round(fmean(lines[arm]["final_top1"] for lines in runs), 4) for arm in runs[0]}
    plain = top1["plain_reference"]
    ours = [arm for arm in runs[0] if arm not in PLAIN_ARMS]
    summary = {
        "bench": "finetune",
        "summary": True,
        "images_per_class": any_line["images_per_class"],
        "steps": any_line["steps"],
        "final_top1": top1,
        "lr": {arm: line["lr"] for arm, line in runs[0].items()},
        "ratio_vs_plain": {arm: round(top1[arm] / plain, 4) if plain else None for arm in ours},
    }
    if len(runs) > 1:
        summary["seeds"] = list(seeds)
        summary["final_top1_by_seed"] = {arm: [lines[arm]["final_top1"] for lines in runs] for arm in top1}
        summary["ratio_vs_plain_by_seed"] = {
            arm: [
                round(lines[arm]["final_top1"] / lines["plain_reference"]["final_top1"], 4)
                if lines["plain_reference"]["final_top1"]
                else None
                for lines in runs
            ]
            for arm in ours
        }
    check = transfer_check(plain, top1["plain_random"])
    return summary | {"transfer_check": check.code, "transfer_gain": check.gain, "verdict": check.sentence}


def _kept_pretraining(path: str, key: dict[str, Any]) -> dict[str, Any] | None:
    """The pretrain line's fields of the weights kept at ``path`` (``reused``: the path), or None when there
    are none, they were made by another pretraining than ``key`` says, or the file is not the one its record
    was written for (then they are made again)."""
    sidecar = path + ".json"
    if not path or not os.path.isfile(path) or not os.path.isfile(sidecar):
        return None
    with open(sidecar) as f:
        record = json.load(f)
    if record.get("key") != key or record.get("sha256") != storage.sha256(path):
        return None
    return {**record["pretrain"], "reused": path}


def _keep_pretraining(
    path: str, state: Any, key: dict[str, Any], line: dict[str, Any], *, kept: bool
) -> None:
    """Save the pretraining's weights at ``path`` and, when ``kept`` (the user asked to keep them), what made
    them beside it: the ``.pth`` first and its ``.json`` last, so a cut-short write is never reused."""
    import torch

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(state, path + ".partial")
    os.replace(path + ".partial", path)
    if kept:
        with open(path + ".json.partial", "w") as f:
            json.dump({"key": key, "sha256": storage.sha256(path), "pretrain": line}, f, indent=1)
        os.replace(path + ".json.partial", path + ".json")


Arm = tuple[str, str, list[str], float, str]
"""One run of a size: its arm's name, the weights it starts from, its train options, its LR and the LR's rule."""
PLAIN_ARMS = ("plain_reference", "plain_random")
"""The plain arms every size runs: the reference and the transfer check's."""
TRIVIAL = ["--augment", "trivial"]
"""``plain_trivial``'s option: the plain reference with TrivialAugmentWide (the name our train option has)."""


def _arms(
    weights_file: str,
    random_file: str,
    *,
    lr_factors: Sequence[float],
    recipe_args: Sequence[Sequence[str]],
    random_arm: bool,
    lrs: tuple[float, float, float],
    plain_trivial: bool = False,
    ours: bool = True,
    default_arm: bool = True,
) -> list[Arm]:
    """A size's runs in order: the fine-tunes of the pretrained file first, the plain ones, the random init's
    run last (the context, not the comparison): a bench cut short has the lines that matter. ``lrs``: the
    default fine-tuning LR, the from-scratch one and the plain reference's. ``ours`` False: the plain arms
    alone; ``default_arm`` False: no ``ours_default`` (a sweep's further factors)."""
    default_lr, scratch_lr, reference_lr = lrs
    runs: list[Arm] = []
    if ours:
        if default_arm:
            runs.append(("ours_default", weights_file, [], default_lr, "train's --pretrained default"))
        for number, args in enumerate(recipe_args, 1):
            arm = "ours_recipe" if len(recipe_args) == 1 else f"ours_recipe_{number}"
            runs.append((arm, weights_file, list(args), default_lr, " ".join(args)))
        for factor in lr_factors:
            lr = default_lr * factor
            runs.append(
                (f"ours_lr_x{factor:g}", weights_file, ["--lr", f"{lr:.6g}"], lr, f"{factor:g}x default")
            )
    runs.append(("plain_reference", weights_file, [], reference_lr, PLAIN_RULE))
    if plain_trivial:  # what the policy does to a short fine-tune, without our trainer
        runs.append(
            ("plain_trivial", weights_file, TRIVIAL, reference_lr, f"{PLAIN_RULE}; {' '.join(TRIVIAL)}")
        )
    runs.append(("plain_random", random_file, [], reference_lr, PLAIN_RULE))
    if ours and random_arm:
        runs.append(
            ("random", random_file, ["--lr", str(scratch_lr)], scratch_lr, "train's from-scratch default")
        )
    return runs


def _size_runs(
    runs: list[Arm],
    base: dict[str, Any],
    target: str,
    outputs: str,
    common: list[str],
    env: dict[str, str],
    *,
    random_file: str,
    size: FinetuneSize,
    epochs: int,
    input_size: int,
    seed: int,
) -> Generator[str, None, dict[str, dict[str, Any]]]:
    """Run one size's ``runs`` at one seed, yielding each one's JSON line; returns the lines by arm."""
    lines: dict[str, dict[str, Any]] = {}
    for arm, start, extra, lr, rule in runs:
        line = {
            **base,
            "arm": arm,
            "init": "random" if start == random_file else "pretrained",
            "lr": round(lr, 6),
            "lr_rule": rule,
        }
        started = time.perf_counter()
        if arm.startswith("plain_"):
            # ours' steps: every train image every epoch, the last batch padded to a whole one
            steps = epochs * math.ceil(base["train_images"] / size.batch_size)
            line |= plain_finetune(
                start,
                target + "-images",
                model=size.model,
                epochs=epochs,
                steps_per_epoch=steps // epochs,
                batch_size=size.batch_size,
                lr=lr,
                input_size=input_size,
                seed=seed,
                augment="trivial" if extra == TRIVIAL else "none",
            )
        else:
            args = [*common, "--epochs", str(epochs), "--pretrained", start, *extra]
            card, _ = run_train(target, os.path.join(outputs, f"{arm}-{base['images_per_class']}"), args, env)
            line |= {
                "lr": round(card["peak_lr"], 6),  # as it trained: recipe_args may give --lr
                "head_lr_scale": card.get("head_lr_scale"),  # the head's multiple of it
                "steps": card["steps"],
                "dataset_digest": card["dataset"]["manifest_digest"],
                "start_sha256": card["pretrained"]["sha256"],
                "final_top1": round(card["history"][-1]["val_top1"], 4),
                "top1_by_epoch": [round(h["val_top1"], 4) for h in card["history"]],
            }
        line["seconds"] = round(time.perf_counter() - started, 1)
        lines[arm] = line
        yield json.dumps(line)
    return lines


def _check_size(size: FinetuneSize) -> None:
    if len(size.epochs) != len(size.images_per_class):
        raise ConfigError(
            f"--epochs {','.join(map(str, size.epochs))}: give one epoch count per --images-per-class "
            f"({len(size.images_per_class)})"
        )
    for per_class in size.images_per_class:
        if not 1 <= per_class < TEST_INDEX_START:
            raise ConfigError(f"--images-per-class {per_class}: give 1 to {TEST_INDEX_START - 1}")


def bench_finetune(
    size: FinetuneSize = DEFAULT,
    *,
    lr_factors: Sequence[float] = (),
    recipe_args: Sequence[Sequence[str]] = (),
    input_size: int = 64,
    seed: int = 0,
    seeds: Sequence[int] = (),
    source_weights: str = "",
    pretrain_lr: float | None = None,
    random_arm: bool = True,
    plain_trivial: bool = False,
    ours: bool = True,
    default_arm: bool = True,
) -> Iterator[str]:
    """JSON lines: the pretraining run, then per target size its runs (see the module docstring) and their
    summary. ``lr_factors``: the LR sweep's multiples of the default fine-tuning LR. ``recipe_args``: one
    ``ours_recipe`` arm per list of train options (``ours_recipe_1``, ``_2``, ... when there are several).
    ``seed``: the task's images and the pretraining's; ``seeds``: the fine-tunes' (each runs every arm;
    default: ``seed``), whose summary gives the mean top-1 and each seed's. ``source_weights``: a
    local ``.pth`` path that keeps the pretraining's weights between runs (the pretraining is most of the
    bench's time): reused when it exists and its ``.json`` beside it records the same pretraining (model,
    source images, epochs, seed, input size, task version; optimizer and LR where not the ResNets' SGD
    default), else pretrained and written there. ``pretrain_lr``: the pretraining's peak LR (default: 4x the
    from-scratch LR under SGD, ``PRETRAIN_ADAMW_LR`` under AdamW; the CLI gives the EfficientNets their
    ``finetune_plain.EFFICIENTNET_PRETRAIN`` epochs and LR unless told).
    ``random_arm``: run ``random`` (XLA from scratch, as long as a fine-tune; the transfer check does not need
    it: ``plain_random`` is that check's). ``plain_trivial``: also run ``plain_trivial``, the plain reference with
    TrivialAugmentWide after its crop and flip. ``ours`` False: the plain arms alone (seconds each on a CPU: the
    reference's own spread over many ``seeds``), at the steps our trainer takes. ``default_arm`` False: leave
    out ``ours_default`` (a sweep's further ``lr_factors``, its default measured already)."""
    import torch

    from tpustream.dataset.plan import ShardConfig
    from tpustream.dataset.write import create_shards
    from tpustream.models import model_spec
    from tpustream.train.optimizer import default_peak_lr, fine_tune_peak_lr

    _check_size(size)
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds {','.join(map(str, seeds))}: give each seed once")
    if pretrain_lr is not None and not pretrain_lr > 0:
        raise ConfigError(f"--pretrain-lr {pretrain_lr}: give a positive LR")
    if any(factor <= 0 for factor in lr_factors):
        raise ConfigError(f"--lr-factors {','.join(map(str, lr_factors))}: give positive multiples")
    spec = model_spec(size.model)
    batch = size.batch_size
    scratch_lr = default_peak_lr(batch, spec.base_lr)
    default_lr = fine_tune_peak_lr(batch, spec)
    reference_lr = REFERENCE_LR_AT_32 * batch / 32
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1"}
    common = ["--model", size.model, "--input-size", str(input_size), "--batch-size", str(batch)]
    common += ["--workers", "1", "--log-steps", "1000"]
    with tempfile.TemporaryDirectory(prefix="tpustream-bench-finetune-") as tmp:
        # one XLA compilation cache for every run: the fine-tuning runs share their programs (same network,
        # classes, batch; the LR is an input), so only the first compiles them
        common += ["--compile-cache", os.path.join(tmp, "xla-cache")]
        # the trainer's random init of the stock network, as a file: the random arms' start, and how the
        # pretraining run gets the stock stem (a 64 px run from scratch would get the small-input one)
        torch.manual_seed(seed)
        network = spec.build(num_classes=len(SOURCE_CLASSES), input_size=input_size, small_input_stem=False)
        random_file = os.path.join(tmp, f"{size.model}-random-init.pth")
        torch.save(network.state_dict(), random_file)

        key = {
            "model": size.model,
            "source_per_class": size.source_per_class,
            "pretrain_epochs": size.pretrain_epochs,
            "seed": seed,
            "input_size": input_size,
            "task_version": TASK_VERSION,
        }
        sgd = pretrain_optimizer_name(size.model) == "sgd"
        default_pretrain_lr = scratch_lr * PRETRAIN_LR_SCALE if sgd else PRETRAIN_ADAMW_LR
        pretrain_lr = default_pretrain_lr if pretrain_lr is None else pretrain_lr
        if not sgd:  # SGD's weights kept before these fields stay valid
            key |= {"pretrain_optimizer": "adamw", "pretrain_lr": pretrain_lr}
        elif pretrain_lr != default_pretrain_lr:
            key["pretrain_lr"] = pretrain_lr
        pretrained = _kept_pretraining(source_weights, key)
        if pretrained is not None:
            weights_file = source_weights
        else:
            pretrained = plain_pretrain(size, random_file, input_size=input_size, seed=seed, lr=pretrain_lr)
            weights_file = source_weights or os.path.join(tmp, f"{size.model}-source.pth")
            _keep_pretraining(
                weights_file, pretrained.pop("state"), key, pretrained, kept=bool(source_weights)
            )
        yield json.dumps(
            {
                "bench": "finetune",
                "arm": "pretrain",
                "model": size.model,
                "trainer": "plain PyTorch on the CPU (the user's weights: how they were made is not under test)",
                "source_classes": len(SOURCE_CLASSES),
                "source_images": size.source_per_class * len(SOURCE_CLASSES),
                "epochs": size.pretrain_epochs,
                **pretrained,
            }
        )
        test = range(TEST_INDEX_START, TEST_INDEX_START + size.test_per_class)
        for per_class, epochs in zip(size.images_per_class, size.epochs, strict=True):
            target = os.path.join(tmp, f"target-{per_class}")
            write_folder(os.path.join(target + "-images", "train"), TARGET_CLASSES, seed, range(per_class))
            write_folder(os.path.join(target + "-images", "val"), TARGET_CLASSES, seed, test)
            create_shards(ShardConfig(source=target + "-images", output=target, num_shards=2), progress=False)
            base = {
                "bench": "finetune",
                "model": size.model,
                "images_per_class": per_class,
                "train_images": per_class * len(TARGET_CLASSES),
                "test_images": size.test_per_class * len(TARGET_CLASSES),
                "epochs": epochs,
            }
            by_seed: dict[int, dict[str, dict[str, Any]]] = {}
            for run_seed in seeds or (seed,):
                lines = yield from _size_runs(
                    _arms(
                        weights_file,
                        random_file,
                        lr_factors=lr_factors,
                        recipe_args=recipe_args,
                        random_arm=random_arm,
                        lrs=(default_lr, scratch_lr, reference_lr),
                        plain_trivial=plain_trivial,
                        ours=ours,
                        default_arm=default_arm,
                    ),
                    base | ({"seed": run_seed} if seeds else {}),
                    target,
                    os.path.join(tmp, f"seed-{run_seed}"),
                    [*common, "--seed", str(run_seed)],
                    env,
                    random_file=random_file,
                    size=size,
                    epochs=epochs,
                    input_size=input_size,
                    seed=run_seed,
                )
                by_seed[run_seed] = lines
            yield json.dumps(summarize_size(by_seed))
            shutil.rmtree(target + "-images", ignore_errors=True)
