"""tpustream/train/config.py: ``TrainConfig.from_pipeline`` decodes the pipeline's train parameters (stand-ins
for None, float-encoded integers, paths under the run's root, init_from=champion) into one TrainConfig."""

import inspect
import json
import logging
from typing import Any

import pytest

from tpustream.errors import ConfigError
from tpustream.train.config import TrainConfig


def pipeline_parameters(**changes: Any) -> dict[str, Any]:
    """The train step's parameters as the pipeline's defaults send them (the YAML keeps integers as 8.0)."""
    parameters: dict[str, Any] = {
        "data": "gs://b/run/dataset",
        "output": "gs://b/run/model",
        "model_name": "resnet18",
        "epochs": 8.0,
        "batch_size": 128.0,
        "lr": 0.0,
        "bf16": True,
        "workers": 8.0,
        "input_size": 0.0,
        "init_from": "",
        "pretrained": "",
        "freeze_epochs": 0.0,
        "backbone_lr_scale": 1.0,
        "head_lr_scale": -1.0,
        "class_weights": "none",
        "recipe": "auto",
        "augment": "",
        "random_erasing": -1.0,
        "mixup_alpha": -1.0,
        "cutmix_alpha": -1.0,
        "ema_decay": -1.0,
        "layer_decay": -1.0,
        "registry": "",
        "patience": 0.0,
        "early_stop_min_delta": 0.0,
        "compile_cache": "",
        "pipeline_root": "",
    }
    return {**parameters, **changes}


def test_the_stand_ins_are_none_and_float_integers_are_ints():
    config = TrainConfig.from_pipeline(**pipeline_parameters())
    assert config == TrainConfig(
        data="gs://b/run/dataset", output="gs://b/run/model", model="resnet18", epochs=8, bf16=True, workers=8
    )
    assert (config.lr, config.input_size, config.init_from, config.pretrained, config.compile_cache) == (
        None,
        None,
        None,
        None,
        None,
    )
    assert config.head_lr_scale is None  # the model's rule
    assert type(config.epochs) is int and type(config.batch_size) is int and type(config.workers) is int
    assert config.resume == "auto"  # a retried step continues its run


def test_given_values_pass_through_under_the_configs_names():
    config = TrainConfig.from_pipeline(
        **pipeline_parameters(
            lr=0.01,
            input_size=64,
            pretrained=" resnet18.IMAGENET1K_V1 ",
            freeze_epochs=2,
            backbone_lr_scale=0.5,
            head_lr_scale=4.0,
            class_weights="auto",
            patience=3,
            early_stop_min_delta=0.02,
            init_from="gs://b/old/model",
            compile_cache="gs://b/xla",
        )
    )
    assert (config.lr, config.input_size, config.pretrained) == (0.01, 64, "resnet18.IMAGENET1K_V1")
    assert (config.freeze_epochs, config.backbone_lr_scale, config.class_weights) == (2, 0.5, "auto")
    assert config.head_lr_scale == 4.0
    assert (config.patience, config.min_delta) == (3, 0.02)
    assert (config.init_from, config.init_optional, config.compile_cache) == (
        "gs://b/old/model",
        False,
        "gs://b/xla",
    )


def test_the_runs_root_holds_the_weights_cache_and_the_auto_compile_cache():
    config = TrainConfig.from_pipeline(
        **pipeline_parameters(pipeline_root="gs://b/root/", compile_cache="auto")
    )
    assert config.weights_cache == "gs://b/root/weights-cache"
    assert config.compile_cache == "gs://b/root/xla-cache"
    without_root = TrainConfig.from_pipeline(**pipeline_parameters(compile_cache="auto"))
    assert without_root.weights_cache is None and without_root.compile_cache is None


def test_init_from_champion_is_the_registrys_champion_or_random_weights_with_a_warning(tmp_path, caplog):
    registry = tmp_path / "registry"
    registry.mkdir()
    parameters = pipeline_parameters(init_from="champion", registry=str(registry))
    with caplog.at_level(logging.WARNING):
        first = TrainConfig.from_pipeline(**parameters)
    assert (first.init_from, first.init_optional) == (None, True)
    assert "the run starts from random weights" in caplog.text
    (registry / "champion.json").write_text(json.dumps({"version": 1, "model_sha256": "c0ffee"}))
    later = TrainConfig.from_pipeline(**parameters)
    assert (later.init_from, later.init_optional) == (str(registry), True)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"init_from": "champion"}, "init_from=champion needs the registry parameter"),
        ({"epochs": 2.5}, "pipeline parameter epochs=2.5: a whole number"),
        ({"input_size": True}, "pipeline parameter input_size=True: a whole number"),
        ({"class_weights": "balanced"}, "--class-weights must be none or auto"),
        ({"lr": -0.1}, "--lr must be positive"),
    ],
)
def test_a_parameter_the_run_cannot_take_is_a_config_error_naming_it(changes, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig.from_pipeline(**pipeline_parameters(**changes))


def test_it_takes_exactly_the_train_steps_parameters_and_every_one_is_given():
    """The step passes each of its parameters by name (its model and dataset as URIs): none has a default
    here, so a parameter the pipeline adds cannot be silently left at a second default."""
    parameters = inspect.signature(TrainConfig.from_pipeline).parameters
    assert all(p.default is inspect.Parameter.empty for p in parameters.values())
    assert set(parameters) == set(pipeline_parameters())


def test_the_train_step_has_a_parameter_for_each_but_the_uris():
    """Each of the train component's parameters but its artifacts and the run-outcome wiring is one here."""
    from tpustream.components import train_model

    step = set(inspect.signature(train_model).parameters) - {"dataset", "model", "metrics", "run_outcome"}
    assert step == set(pipeline_parameters()) - {"data", "output"}


def test_the_recipe_parameters_are_the_recipes_unless_given():
    """Issue 46: recipe "auto", augment "" and negative values are the recipe's own (None); given ones pass."""
    config = TrainConfig.from_pipeline(**pipeline_parameters())
    assert config.recipe == "auto" and set(config.recipe_overrides().values()) == {None}
    given = TrainConfig.from_pipeline(
        **pipeline_parameters(
            recipe="scratch",
            augment="randaugment",
            random_erasing=0.25,
            mixup_alpha=0.0,
            cutmix_alpha=1.0,
            ema_decay=0.999,
            layer_decay=1.0,
        )
    )
    assert given.recipe == "scratch"
    assert given.recipe_overrides() == {
        "augment": "randaugment",
        "random_erasing": 0.25,
        "mixup_alpha": 0.0,
        "cutmix_alpha": 1.0,
        "ema_decay": 0.999,
        "layer_decay": 1.0,
    }
    with pytest.raises(ConfigError, match="--augment must be none, trivial or randaugment"):
        TrainConfig.from_pipeline(**pipeline_parameters(augment="autoaugment"))
    with pytest.raises(ConfigError, match="--recipe must be auto or one of plain, scratch"):
        TrainConfig.from_pipeline(**pipeline_parameters(recipe="modern"))


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_a_seed_the_xla_devices_rng_cannot_take_is_a_config_error(seed):
    with pytest.raises(ConfigError, match=rf"--seed must be in \[0, 2\*\*64\), got {seed}"):
        TrainConfig(data="d", output="o", seed=seed)
    assert TrainConfig(data="d", output="o", seed=2**64 - 1).seed == 2**64 - 1
