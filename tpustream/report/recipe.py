"""How the candidate was trained, as the report states it: the recipe's rows and the alarm over its losses.

Everything comes from the candidate's model card (``tpustream.artifacts.ModelCard``): ``training`` (the
``TrainConfig`` as JSON), ``init`` (a warm start), ``pretrained`` (the weights the backbone began from),
``history`` (the epochs), ``class_weights`` (``--class-weights auto``) and ``recipe`` (the named recipe the run
chose, its augmentation policy, MixUp/CutMix, EMA and layer-wise LR decay, and whose weights model.pt holds),
``head_lr_scale`` (the head's multiple of the scheduled LR). Cards record the peak LR the trainer
chose (``peak_lr``, ``global_batch``); older ones only a warm start's (``init.peak_lr``), and otherwise it is
worked out as the trainer chose it (``tpustream.train.trainer``): ``--lr`` when given, else the model's recipe
LR scaled to the global batch (``default_peak_lr``), its family's factor times that when fine-tuning. A card written before a key existed says "not
recorded" for it. Plain text: the page and the summary escape it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpustream.artifacts import ModelCard
from tpustream.image.transforms import default_min_crop_scale
from tpustream.models import model_spec
from tpustream.registry.policy import is_finite_number
from tpustream.train.optimizer import default_peak_lr

__all__ = ["LOSS_RISE", "loss_alarm", "recipe_rows"]

# A last epoch's loss above this many times the run's lowest is an alarm: an order of magnitude.
LOSS_RISE = 10.0
NOT_RECORDED = "not recorded"
SHOWN_CLASS_WEIGHTS = 12  # class weights listed by name; more are summarised


def recipe_rows(card: ModelCard) -> list[tuple[str, str]]:
    """(what, how) rows of the candidate's training recipe, in the order a reader checks them."""
    training = card.training
    return [
        ("recipe", _recipe(card)),
        ("peak LR", _peak_lr(card)),
        ("schedule", _schedule(training)),
        ("epochs", _epochs(card)),
        ("freeze epochs", _freeze_epochs(card)),
        ("backbone LR scale", _backbone_lr_scale(training)),
        ("head LR scale", _head_lr_scale(card)),
        ("class weights", _class_weights(card)),
        ("augmentation", _augmentation(card)),
        ("MixUp / CutMix", _mixing(card)),
        ("weight average (EMA)", _ema(card)),
        ("layer-wise LR decay", _layer_decay(card)),
        ("precision", _precision(training)),
        ("loss and optimizer", _optimizer(training)),
        ("pretrained weights", _pretrained(card)),
        ("warm start", _warm_start(card)),
    ]


def loss_alarm(history: Sequence[dict[str, Any]]) -> str | None:
    """Why the run's losses are not to be trusted, or None: a train or val loss that is not a finite number
    in some epoch, or a last epoch's loss more than ``LOSS_RISE`` times the run's lowest (the first epoch's
    included): the numbers it saw, by epoch."""
    problems = []
    for key, name in (("train_loss", "train loss"), ("val_loss", "val loss")):
        rows = [(row.get("epoch", n + 1), row.get(key)) for n, row in enumerate(history) if key in row]
        broken = [(epoch, value) for epoch, value in rows if not is_finite_number(value)]
        if broken:
            epoch, value = broken[0]
            problems.append(f"{name} is not a finite number in epoch {epoch} ({_shown(value)})")
            continue
        losses = [(epoch, float(value)) for epoch, value in rows if is_finite_number(value)]
        if len(losses) < 2:
            continue
        (first_epoch, first), (last_epoch, last) = losses[0], losses[-1]
        low_epoch, low = min(losses, key=lambda item: item[1])
        if last > LOSS_RISE * low:
            lowest = "" if low_epoch == first_epoch else f", lowest {low:.4g} in epoch {low_epoch},"
            problems.append(
                f"{name} rose from {first:.4g} in epoch {first_epoch}{lowest} to {last:.4g} in epoch "
                f"{last_epoch}, more than {LOSS_RISE:g}x its lowest"
            )
    if not problems:
        return None
    return (
        f"Training diverged: {'; '.join(problems)}. A model trained so is not to be trusted, whatever its "
        "numbers: check the peak LR below (train again with a lower --lr or a longer --warmup-epochs)."
    )


# --------------------------------------------------------------------------- one row each


def _peak_lr(card: ModelCard) -> str:
    training = card.training
    given = training.get("lr")
    if is_finite_number(given) and given > 0:
        return f"{given:.4g}, given with --lr"
    init = card.init if isinstance(card.init, dict) else {}
    if is_finite_number(init.get("peak_lr")):
        return f"{init['peak_lr']:.4g}: the warm start's, a tenth of the scaled default (no --lr given)"
    if not training:
        return NOT_RECORDED
    if is_finite_number(card.peak_lr) and card.global_batch:  # what the trainer chose, as it recorded it
        how = (
            "fine-tuning's default, its family's factor times the scaled default"
            if card.pretrained
            else "the scaled default"
        )
        return f"{card.peak_lr:.4g}: {how} at a global batch of {card.global_batch} (no --lr given)"
    try:
        spec = model_spec(card.arch)
    except ValueError:  # a model this tpustream does not know: its recipe's LR is unknown here
        return f"the {card.arch} recipe's default (no --lr given)"
    base, factor = spec.base_lr, spec.fine_tune_lr_factor
    batch = _global_batch(card)
    if batch is None:
        scaled = f"{base:g} at a global batch of 256, scaled to the run's global batch"
        return (
            f"fine-tuning's {factor:g}x of {scaled} (no --lr given)"
            if card.pretrained
            else f"the default, {scaled} (no --lr given)"
        )
    scratch = default_peak_lr(batch, base)
    if card.pretrained:
        return (
            f"{scratch * factor:.4g}: fine-tuning's {factor:g}x the scaled default {scratch:.4g} "
            f"({base:g} at a global batch of 256, scaled to {batch}; no --lr given)"
        )
    return f"{scratch:.4g}: the default, {base:g} at a global batch of 256 scaled to {batch} (no --lr given)"


def _global_batch(card: ModelCard) -> int | None:
    """The run's global batch: --global-batch-size, else --batch-size times the devices, which the history
    gives as the ratio of its samples per second to its samples per second per device."""
    training = card.training
    if card.global_batch:
        return card.global_batch
    if isinstance(training.get("global_batch_size"), int):
        return int(training["global_batch_size"])
    per_device = training.get("batch_size")
    for row in card.history:
        total, each = row.get("samples_per_s"), row.get("samples_per_s_per_device")
        if isinstance(per_device, int) and is_finite_number(total) and is_finite_number(each) and each > 0:
            return per_device * max(1, round(total / each))
    return None


def _schedule(training: dict[str, Any]) -> str:
    warmup, epochs = training.get("warmup_epochs"), training.get("epochs")
    if not is_finite_number(warmup) or not isinstance(epochs, int):
        return NOT_RECORDED
    ramp = (
        f"linear warmup over {warmup:g} epoch{'' if warmup == 1 else 's'} to the peak, then "
        if warmup
        else ""
    )
    return f"{ramp}cosine decay to 0 at the end of epoch {epochs}, per step"


def _epochs(card: ModelCard) -> str:
    planned = card.training.get("epochs")
    trained = len(card.history)
    if not isinstance(planned, int):
        return f"{trained} trained" if trained else NOT_RECORDED
    text = f"{planned} planned, {trained} trained"
    if card.stopped_early:
        text += f", stopped early (--patience {card.training.get('patience')})"
    best = card.metrics.get("epoch")
    return text + (f"; the model is epoch {best}'s (best val top-1)" if best is not None else "")


def _freeze_epochs(card: ModelCard) -> str:
    frozen = card.training.get("freeze_epochs")
    if not isinstance(frozen, int):
        return NOT_RECORDED
    if not frozen:
        return "0: every layer trains from the first step"
    if not (card.pretrained or card.init):
        return f"{frozen} asked, ignored: the run started from random weights"
    return (
        f"{frozen}: the head alone for the first {frozen} epoch{'' if frozen == 1 else 's'}, then every layer"
    )


def _backbone_lr_scale(training: dict[str, Any]) -> str:
    scale = training.get("backbone_lr_scale")
    if not is_finite_number(scale):
        return NOT_RECORDED
    if scale == 1:
        return "1: the backbone trains at the scheduled LR, as the head"
    return f"{scale:g}: the backbone at {scale:g} of the scheduled LR, the head at all of it"


def _head_lr_scale(card: ModelCard) -> str:
    scale = card.extra.get("head_lr_scale")
    if not is_finite_number(scale):
        return NOT_RECORDED
    given = is_finite_number(card.training.get("head_lr_scale"))
    if scale == 1:
        return "1: the head at the scheduled LR" + (", given with --head-lr-scale" if given else "")
    why = (
        "given with --head-lr-scale"
        if given
        else "the model's rule for the new head of a run from --pretrained weights"
    )
    return f"{scale:g}: the head at {scale:g}x the scheduled LR, {why}"


def _class_weights(card: ModelCard) -> str:
    mode = card.training.get("class_weights")
    if mode is None:
        return NOT_RECORDED
    if mode != "auto":
        return f"{mode}: every sample weighs the same in the loss"
    weights = card.extra.get("class_weights")
    if not isinstance(weights, dict) or not weights:
        return "auto: inverse class frequency in the train split"
    listed = ", ".join(
        f"{name} {_shown(weight)}" for name, weight in list(weights.items())[:SHOWN_CLASS_WEIGHTS]
    )
    more = f", and {len(weights) - SHOWN_CLASS_WEIGHTS} more" if len(weights) > SHOWN_CLASS_WEIGHTS else ""
    return f"auto: inverse class frequency in the train split: {listed}{more}"


def _recipe(card: ModelCard) -> str:
    recipe = card.recipe
    if not recipe:
        return NOT_RECORDED
    overridden = recipe.get("overridden") or []
    given = f"; given: {', '.join(overridden)}" if overridden else ""
    return f"{recipe.get('name', '?')}: {recipe.get('why', '?')}{given}"


_POLICIES = {"trivial": "TrivialAugmentWide", "randaugment": "RandAugment (2 ops, magnitude 9)"}


def _augmentation(card: ModelCard) -> str:
    size = card.input_size
    crop = card.val_crop_fraction
    recipe = card.recipe or {}
    policy = _POLICIES.get(recipe.get("augment", "none"))
    erasing = recipe.get("random_erasing") or 0
    extra = f", then {policy} (torchvision.transforms.v2)" if policy else ""
    if is_finite_number(erasing) and erasing > 0:
        extra += f", then random erasing of a patch with probability {erasing:g}"
    return (
        f"train: a random crop of {100 * default_min_crop_scale(size):.0f}% to 100% of the image's area (aspect "
        f"3/4 to 4/3) resized to {size} px, and a horizontal flip half the time{extra}; evaluation: resized to "
        f"{round(size / crop)} px and centre-cropped to {size} px"
    )


def _mixing(card: ModelCard) -> str:
    recipe = card.recipe
    if not recipe:
        return NOT_RECORDED
    mixup, cutmix = recipe.get("mixup_alpha") or 0, recipe.get("cutmix_alpha") or 0
    parts = [f"{name} alpha {alpha:g}" for name, alpha in (("MixUp", mixup), ("CutMix", cutmix)) if alpha]
    if not parts:
        return "none"
    each = ", each step one or the other, half the time each" if len(parts) == 2 else ""
    return f"{' and '.join(parts)}{each}: soft targets, in the compiled step"


def _ema(card: ModelCard) -> str:
    recipe = card.recipe
    if not recipe:
        return NOT_RECORDED
    decay = recipe.get("ema_decay") or 0
    if not decay:
        return "none"
    held = recipe.get("model_weights")
    which = {"ema": "the model is the EMA's (better val top-1)", "raw": "the model is the raw weights'"}
    return f"decay {decay:g} per step (with warmup), evaluated each epoch; {which.get(str(held), 'not recorded')}"


def _layer_decay(card: ModelCard) -> str:
    recipe = card.recipe
    if not recipe:
        return NOT_RECORDED
    decay = recipe.get("layer_decay")
    if not is_finite_number(decay) or decay == 1:
        return "none"
    return (
        f"{decay:g}: each transformer block at {decay:g} of the LR of the block above, the head at all of it"
    )


def _precision(training: dict[str, Any]) -> str:
    if "bf16" not in training:
        return NOT_RECORDED
    return "bf16 autocast" if training["bf16"] else "fp32"


def _optimizer(training: dict[str, Any]) -> str:
    if not training:
        return NOT_RECORDED
    decay = training.get("weight_decay")
    return (
        f"label smoothing {_shown(training.get('label_smoothing'))}, momentum {_shown(training.get('momentum'))}, "
        f"weight decay {_shown(decay) if decay is not None else 'the model recipe’s'}"
    )


def _pretrained(card: ModelCard) -> str:
    weights = card.pretrained
    if not isinstance(weights, dict):
        return "none: the backbone did not start from pretrained weights"
    name = weights.get("name") or weights.get("spec") or "?"
    source = weights.get("uri")
    sha = weights.get("sha256")
    return (
        f"{name}{f' from {source}' if source and source != name else ''}"
        f"{f', sha256 {sha}' if sha else ', sha256 not recorded'}"
        f"{_loaded(weights)}; the head is new"
    )


def _loaded(weights: dict[str, Any]) -> str:
    count = weights.get("tensors_loaded")
    return f", {count} backbone tensors loaded" if isinstance(count, int) else ""


def _warm_start(card: ModelCard) -> str:
    init = card.init
    if not isinstance(init, dict):
        return "none"
    kind, kept = init.get("kind", "?"), init.get("weights", "?")
    resolved = init.get("resolved")
    where = f" ({resolved})" if resolved and resolved != init.get("from") else ""
    text = f"from {init.get('from', '?')}{where}, a {kind}: {kept} weights"
    new, gone = init.get("new_classes") or [], init.get("gone_classes") or []
    if new or gone:
        text += f"; {len(new)} new class{'es' if len(new) != 1 else ''}, {len(gone)} gone"
    return text


def _shown(value: Any) -> str:
    if value is None:
        return NOT_RECORDED
    return f"{value:.4g}" if isinstance(value, float) else str(value)
