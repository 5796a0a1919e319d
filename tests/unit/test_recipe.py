"""tpustream/train/recipe.py: ``--recipe auto`` picks a named recipe by model, trained weights or not and
train images per class, says why, and the run's own values override the recipe's one by one."""

import pytest

from tpustream.errors import ConfigError
from tpustream.train.recipe import (
    FINETUNE_MIN_IMAGES,
    RECIPES,
    SMALL_DATA_PER_CLASS,
    choose_recipe,
    ema_decay_at,
)


def _choose(asked="auto", *, model="resnet18", vit=False, from_weights=False, per_class=1000, **overrides):
    return choose_recipe(
        asked,
        model=model,
        vit=vit,
        from_weights=from_weights,
        train_samples=per_class * 10,
        num_classes=10,
        overrides=overrides,
    )


@pytest.mark.parametrize(
    "kw, name, why",
    [
        ({"model": "tiny"}, "plain", "the tiny test model"),
        ({"model": "vit_b_16", "vit": True, "from_weights": True}, "vit-finetune", "a ViT (vit_b_16)"),
        (
            {"from_weights": True, "per_class": 30},
            "small-data-finetune",
            "300 train images, 30 per class (under",
        ),
        ({"from_weights": True}, "small-data-finetune", "10000 train images, 1000 per class (under 200 per"),
        (
            {"from_weights": True, "per_class": 2000},
            "finetune",
            "20000 train images, 2000 per class (at least",
        ),
        ({"per_class": 30}, "plain", "from random weights on 30 train images per class"),
        ({}, "scratch", "from random weights on 1000 train images per class"),
    ],
)
def test_auto_picks_a_recipe_by_model_weights_and_data_size_and_says_why(kw, name, why):
    choice = _choose(**kw)
    assert choice.name == name and why in choice.why
    vit = kw.get("vit", False)
    assert choice.recipe.layer_decay == (RECIPES[name].layer_decay if vit else 1.0)
    assert choice.to_json()["name"] == name and choice.to_json()["overridden"] == []


def test_the_conservative_defaults_leave_small_data_from_scratch_plain():
    assert SMALL_DATA_PER_CLASS == 200
    assert not _choose(per_class=199).recipe.mixes and _choose(per_class=200).recipe.mixes


def test_a_fine_tune_mixes_only_from_bits_20k_images_and_200_a_class():
    """BiT-HyperRule: MixUp only from 20k examples; and under 200 a class, whatever the total."""
    assert FINETUNE_MIN_IMAGES == 20_000
    assert not _choose(from_weights=True, per_class=1999).recipe.mixes  # 19,990 images
    assert _choose(from_weights=True, per_class=2000).recipe.mixes
    many_classes = choose_recipe(
        "auto",
        model="resnet18",
        vit=False,
        from_weights=True,
        train_samples=199 * 1000,
        num_classes=1000,
        overrides={},
    )
    assert many_classes.name == "small-data-finetune"


def test_explicit_values_override_the_recipe_one_by_one():
    choice = _choose("vit-finetune", model="vit_b_16", vit=True, ema_decay=0.0, augment=None, mixup_alpha=0.2)
    assert choice.name == "vit-finetune" and choice.why == "--recipe vit-finetune"
    assert (choice.recipe.ema_decay, choice.recipe.mixup_alpha) == (0.0, 0.2)
    assert choice.recipe.augment == "randaugment"  # None: the recipe's
    assert choice.overridden == ("ema_decay", "mixup_alpha")
    # A ViT recipe named for another model keeps everything but the layer decay it cannot apply
    assert _choose("vit-finetune").recipe.layer_decay == 1.0


def test_bad_values_are_clear_errors():
    with pytest.raises(ConfigError, match="layer-wise LR decay applies to ViT models only"):
        _choose(layer_decay=0.65)
    with pytest.raises(ConfigError, match="--recipe must be auto or one of"):
        _choose("modern")
    with pytest.raises(ConfigError, match=r"--ema-decay must be in \[0, 1\)"):
        _choose(ema_decay=1.0)
    with pytest.raises(ConfigError, match="--random-erasing must be a probability"):
        _choose(random_erasing=2.0)


def test_the_ema_decay_warms_up():
    assert ema_decay_at(0, 0.999) == pytest.approx(0.1)
    assert ema_decay_at(90, 0.999) == pytest.approx(91 / 100)
    assert ema_decay_at(100_000, 0.999) == 0.999


def test_a_small_data_fine_tune_adds_only_an_ema_to_the_crop_and_flip():
    """bench finetune: TrivialAugmentWide cost a fine-tune of 10 and 30 images a class 5-8 points of top-1."""
    recipe = _choose(from_weights=True, per_class=30).recipe
    assert recipe.augment == "none" and recipe.ema_decay == 0.999
    assert (recipe.random_erasing, recipe.mixes) == (0.0, False)
    asked = _choose(from_weights=True, per_class=30, augment="trivial")  # --augment trivial still turns it on
    assert asked.recipe.augment == "trivial"
