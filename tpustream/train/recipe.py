"""The training recipe a run uses: augmentation policy, random erasing, MixUp/CutMix, an EMA of the weights and
layer-wise LR decay, named per model and data size (``--recipe auto``), each value overridable on its own.

Torch-free: the CLI and the report read it. ``choose_recipe`` is pure: the same config, model and dataset
always choose the same recipe (a resumed run re-chooses what it started with), and the choice carries a code
(the recipe's name) beside its sentence (why), which the trainer logs and model.json records (``recipe``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from tpustream.errors import ConfigError
from tpustream.image.transforms import AugmentPolicy

__all__ = [
    "AugmentPolicy",
    "RecipeName",
    "RECIPES",
    "SMALL_DATA_PER_CLASS",
    "FINETUNE_MIN_IMAGES",
    "Recipe",
    "RecipeChoice",
    "choose_recipe",
    "ema_decay_at",
]

RecipeName = Literal["plain", "scratch", "finetune", "small-data-finetune", "vit-finetune"]

# Fewer train images per class than this is small data: a fine-tune of a few hundred steps, where MixUp/CutMix
# and random erasing slow what little training there is more than they regularise it (issue 46 measures
# 10, 30 and 100 images per class).
SMALL_DATA_PER_CLASS = 200
# A fine-tune from trained weights on fewer train images than this, in all, is small data too, whatever its
# images per class: BiT's fine-tuning rule (Kolesnikov et al., "Big Transfer", ECCV 2020, its BiT-HyperRule)
# adds MixUp only from 20k examples. Measured: `bench finetune --model resnet18 --images-per-class 200 --epochs
# 2 --test-per-class 100 --recipe-args "--recipe small-data-finetune"` (1,600 images, 200 steps, seed 0): the
# finetune recipe 0.7475 top-1, small-data-finetune 0.8287, the plain reference 0.8438 (README, "Fine-tune on
# your own images").
FINETUNE_MIN_IMAGES = 20_000


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """What a run adds to the crop + flip + label smoothing every run has. Off: ``augment`` none, 0 for
    ``random_erasing``, ``mixup_alpha``, ``cutmix_alpha`` and ``ema_decay``, 1 for ``layer_decay``."""

    augment: AugmentPolicy = "none"
    random_erasing: float = 0.0
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    ema_decay: float = 0.0
    layer_decay: float = 1.0

    def __post_init__(self) -> None:
        if self.augment not in ("none", "trivial", "randaugment"):
            raise ConfigError(f"--augment must be none, trivial or randaugment, got {self.augment!r}")
        if not 0 <= self.random_erasing <= 1:
            raise ConfigError(f"--random-erasing must be a probability in [0, 1], got {self.random_erasing}")
        if self.mixup_alpha < 0 or self.cutmix_alpha < 0:
            raise ConfigError(
                f"--mixup-alpha and --cutmix-alpha must be >= 0 (0: off), got {self.mixup_alpha} and "
                f"{self.cutmix_alpha}"
            )
        if not 0 <= self.ema_decay < 1:
            raise ConfigError(f"--ema-decay must be in [0, 1) (0: no EMA), got {self.ema_decay}")
        if not 0 < self.layer_decay <= 1:
            raise ConfigError(f"--layer-decay must be in (0, 1] (1: none), got {self.layer_decay}")

    @property
    def mixes(self) -> bool:
        """MixUp or CutMix in the step."""
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0


# Each named recipe's values and where they come from.
RECIPES: dict[RecipeName, Recipe] = {
    # The crop + flip + label smoothing of every run, nothing more: the test model's, and a short run from
    # random weights on little data.
    "plain": Recipe(),
    # torchvision's ResNet "new recipe" (references/classification, 2021): --auto-augment ta_wide
    # --random-erase 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0 --model-ema (decay per step about 0.9998).
    "scratch": Recipe(
        augment="trivial", random_erasing=0.1, mixup_alpha=0.2, cutmix_alpha=1.0, ema_decay=0.9998
    ),
    # The same policies over pretrained weights, with an EMA of a shorter horizon (a fine-tune is shorter).
    "finetune": Recipe(
        augment="trivial", random_erasing=0.1, mixup_alpha=0.2, cutmix_alpha=1.0, ema_decay=0.999
    ),
    # Few images per class: the crop + flip and an EMA only (see SMALL_DATA_PER_CLASS), as BiT's fine-tuning
    # rule (Kolesnikov et al., "Big Transfer", ECCV 2020, its BiT-HyperRule: random crops and flips, MixUp only
    # from 20k examples). TrivialAugmentWide cost a short fine-tune 3-8 points of top-1 at 10, 30 and 100
    # images a class (`bench finetune --plain-trivial`; README, "Fine-tune on your own images").
    "small-data-finetune": Recipe(ema_decay=0.999),
    # MAE's / BEiT's ViT-B fine-tuning (He et al. 2022, table 9): RandAugment m9, random erasing 0.25,
    # MixUp 0.8, CutMix 1.0, layer-wise LR decay 0.65; timm's EMA.
    "vit-finetune": Recipe(
        augment="randaugment",
        random_erasing=0.25,
        mixup_alpha=0.8,
        cutmix_alpha=1.0,
        ema_decay=0.9999,
        layer_decay=0.65,
    ),
}


@dataclass(frozen=True, kw_only=True)
class RecipeChoice:
    """The recipe a run trains with: ``name`` (the code: "auto" resolved, or the one given), ``why`` (the
    sentence), the ``recipe``'s values with the run's own overrides applied, and which those were."""

    name: RecipeName
    why: str
    recipe: Recipe
    overridden: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """model.json's ``recipe``."""
        return {
            "name": self.name,
            "why": self.why,
            **asdict(self.recipe),
            "overridden": list(self.overridden),
        }


def choose_recipe(
    asked: str,
    *,
    model: str,
    vit: bool,
    from_weights: bool,
    train_samples: int,
    num_classes: int,
    overrides: dict[str, Any],
) -> RecipeChoice:
    """The recipe of a run: ``asked`` (a name, or "auto": by the model, whether it starts from trained
    weights, the train images per class and, from trained weights, in all), then each of ``overrides`` that
    is not None.

    Args:
        asked: ``--recipe``: "auto" or one of ``RECIPES``.
        model: the model's name ("tiny", the test model, gets "plain").
        vit: the model is a ViT (its spec has layer depths).
        from_weights: the run starts from trained weights (--pretrained or --init-from).
        train_samples: images in the train split; num_classes: its classes.
        overrides: the run's explicit values by ``Recipe`` field name (None: the recipe's).

    Raises:
        ConfigError: an unknown recipe name, or a value ``Recipe`` refuses.
    """
    per_class = train_samples / max(1, num_classes)
    if asked != "auto":
        if asked not in RECIPES:
            raise ConfigError(f"--recipe must be auto or one of {', '.join(RECIPES)}, got {asked!r}")
        name: RecipeName = asked  # checked just above
        why = f"--recipe {asked}"
    elif model == "tiny":
        name, why = "plain", "the tiny test model: its runs check the machinery, not accuracy"
    elif from_weights and vit:
        name, why = "vit-finetune", f"a ViT ({model}) from trained weights"
    elif from_weights and (per_class < SMALL_DATA_PER_CLASS or train_samples < FINETUNE_MIN_IMAGES):
        name = "small-data-finetune"
        why = (
            f"from trained weights on {train_samples} train images, {per_class:.0f} per class (under "
            f"{SMALL_DATA_PER_CLASS} per class or {FINETUNE_MIN_IMAGES} in all)"
        )
    elif from_weights:
        name = "finetune"
        why = (
            f"from trained weights on {train_samples} train images, {per_class:.0f} per class (at least "
            f"{SMALL_DATA_PER_CLASS} per class and {FINETUNE_MIN_IMAGES} in all)"
        )
    elif per_class < SMALL_DATA_PER_CLASS:
        name = "plain"
        why = (
            f"from random weights on {per_class:.0f} train images per class (< {SMALL_DATA_PER_CLASS}): "
            "MixUp/CutMix and erasing slow a short run on little data"
        )
    else:
        name = "scratch"
        why = f"from random weights on {per_class:.0f} train images per class (>= {SMALL_DATA_PER_CLASS})"
    given = {key: value for key, value in overrides.items() if value is not None}
    recipe = replace(RECIPES[name], **given)
    if not vit and "layer_decay" not in given:
        recipe = replace(recipe, layer_decay=1.0)  # a named ViT recipe over another model: no layers to decay
    if recipe.layer_decay != 1 and not vit:
        raise ConfigError(
            f"--layer-decay {recipe.layer_decay:g}: layer-wise LR decay applies to ViT models only, and "
            f"{model} is not one: leave it out"
        )
    return RecipeChoice(name=name, why=why, recipe=recipe, overridden=tuple(sorted(given)))


def ema_decay_at(step: int, decay: float) -> float:
    """The EMA's decay at optimizer step ``step`` (0-based): ``decay``, but at most (1 + step) / (10 + step),
    timm's warmup (``ModelEmaV3(use_warmup=True)``), so that a short run's EMA follows its weights rather than
    their random start."""
    return min(decay, (1 + step) / (10 + step))
