"""One default per option. The config dataclasses own them (``ShardConfig``, ``TrainConfig``,
``DataCheckThresholds``, ``promote``'s keyword arguments).

``tpustream train``, ``shards create`` and ``shards check`` are derived from their config
(tpustream/cli/options.py): their options cannot drift from it, so here they are only checked to still be
derived. What is still written twice is checked to agree: the pipeline's parameters that do not read their
default from a config (a stand-in for None, a value unlike the CLI's on purpose, promote's keyword
arguments), ``promote``'s options (no config dataclass), run-local's and deploy's. A new option in any layer
fails here until it is classified.
"""

import dataclasses
import inspect

import pytest
import typer.main

from tpustream.cli.main import app
from tpustream.cli.options import field_docs
from tpustream.dataset.check import DataCheckThresholds
from tpustream.dataset.plan import ShardConfig
from tpustream.train.config import TrainConfig

# layer -> the command derived from its config, and the config
DERIVED = {
    "shards": (("shards", "create"), ShardConfig),
    "train": (("train",), TrainConfig),
    "check": (("shards", "check"), DataCheckThresholds),
}
# Config fields that are not CLI options, on purpose.
CONFIG_ONLY = {
    "commit_timeout_minutes": "a multi-host detail: how long hosts wait for process 0's model artifact",
    "min_train_shards": "the compiled pipeline's floor for its TPU slice (pipelines/tpu.py); on the CLI "
    "--num-shards sets the count itself",
    "init_optional": "the pipeline's init_from=champion: a champion that does not fit trains from random weights; "
    "on the CLI an --init-from that does not fit is an error",
}
# CLI defaults that differ from the config's, on purpose.
CLI_DIFFERS = {
    ("shards", "workers"): "the CLI writes with one process per CPU; library callers get one process",
}
# Pipeline parameters with no config field: wiring of the DAG and the registry.
# data_check (fail/warn/off): on the CLI, `shards check` exits 1 on anomalies, or 0 with --warn-only.
PIPELINE_ONLY = {
    "registry",
    "datasets_root",
    "shards_per_task",
    "retrain",
    "vertex_model",
    "serving_image",
    "data_check",
    "compile_cache",  # "auto" = the run's pipeline root /xla-cache; on the CLI --compile-cache takes the URI itself
    *("endpoint", "canary_percent", "serving_machine_type", "serving_min_replicas", "serving_max_replicas"),
    "tensorboard",  # the TPU CustomJob's Vertex AI TensorBoard instance; no CLI train option (the trainer only
    # copies its event files to AIP_TENSORBOARD_LOG_DIR when Vertex sets it): `pipeline submit --tensorboard`
    "experiment",  # the Vertex AI Experiment a scheduled run joins (tpustream/vertex/experiments.py): `pipeline
    # schedule --experiment`; `pipeline submit --experiment` joins through aiplatform instead
    # the quality floor (promotion_policy.QualityFloor, -1 = none): `promote --min-metric/--min-class-recall`
    "min_metric",
    "min_class_recall",
    "max_p_value",  # promote --max-p-value (-1 = off): the paired test's significance (tpustream/metrics/paired_test.py)
    # who hears how a run ended (tpustream/release/notify.py): `pipeline compile|submit|schedule --notify/--notify-webhook`
    "notify_emails",
    "notify_webhook",
}
# The deploy step's parameters -> `tpustream deploy`'s options (no config dataclass: checked below)
PIPELINE_DEPLOY = {
    "canary_percent": "traffic", "serving_machine_type": "machine_type", "serving_min_replicas": "min_replicas",
    "serving_max_replicas": "max_replicas",
}  # fmt: skip
# Pipeline parameter -> (layer, option). KFP parameters cannot be None: 0 or -1 stand for "none".
PIPELINE_OPTIONS = {
    "source": ("shards", "source"), "num_shards": ("shards", "num_shards"),
    "val_fraction": ("shards", "val_fraction"), "test_fraction": ("shards", "test_fraction"), "upsample": ("shards", "upsample"), "seed": ("shards", "seed"),
    "max_side": ("shards", "max_side"), "strict": ("shards", "strict"),
    "model_name": ("train", "model"), "epochs": ("train", "epochs"), "batch_size": ("train", "batch_size"),
    "lr": ("train", "lr"), "bf16": ("train", "bf16"), "workers": ("train", "workers"),
    "metric": ("promote", "metric"), "min_delta": ("promote", "min_delta"),
    "max_class_drop": ("promote", "max_class_drop"),
    "input_size": ("train", "input_size"), "init_from": ("train", "init_from"), "patience": ("train", "patience"),
    "early_stop_min_delta": ("train", "min_delta"), "pretrained": ("train", "pretrained"),
    "freeze_epochs": ("train", "freeze_epochs"), "backbone_lr_scale": ("train", "backbone_lr_scale"),
    "class_weights": ("train", "class_weights"),
    **{name: ("check", name) for name in ("max_duplicate_fraction", "max_leaked_images", "max_skipped_rate",
                                           "max_class_share_shift", "max_skipped_rate_increase",
                                           "min_class_train_samples")},
}  # fmt: skip
PIPELINE_NONE = {
    "num_shards": 0, "val_fraction": -1.0, "lr": 0.0, "max_side": 0, "max_class_drop": -1.0, "input_size": 0,
    "pretrained": "",
}  # fmt: skip
PIPELINE_DIFFERS = {
    "init_from": "scheduled retraining starts from the registry's champion (none yet: random weights); the CLI "
    "from random weights unless told",
    "bf16": "the pipeline trains on TPUs, where bfloat16 is the fast path; the CLI also runs on CPUs",
    "workers": "a TPU host's loader workers; the CLI's 4 suits a workstation",
    "pretrained": "a pipeline run fine-tunes from its model's published weights (DEFAULT; issue 33's item 6); "
    "the CLI starts from random weights unless told",
}
RUN_LOCAL_NAMES = {"model": "model_name"}  # run-local option -> pipeline parameter


def _cli_params(*path: str) -> dict[str, typer.core.TyperOption]:
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params if p.name}


def _cli_defaults(*path: str) -> dict[str, object]:
    return {name: param.default for name, param in _cli_params(*path).items()}


def _config_defaults() -> dict[str, dict[str, object]]:
    from tpustream.registry.policy import PromotionPolicy
    from tpustream.release import promote

    def fields(cls: type) -> dict[str, object]:
        return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}

    # the decision's defaults are the PromotionPolicy's (built once from the options); the rest promote's own
    promote_kwargs = inspect.signature(promote.promote).parameters.values()
    return {
        **{layer: fields(config) for layer, (_, config) in DERIVED.items()},
        "promote": {
            **fields(PromotionPolicy),
            **{p.name: p.default for p in promote_kwargs if p.kind is p.KEYWORD_ONLY},
        },
    }


@pytest.mark.parametrize("layer", sorted(DERIVED))
def test_the_config_commands_are_derived_from_their_config(layer):
    """Each field is an option with the field's docstring as its help and the field's default: they are
    read from the dataclass, so this fails only if the command stops being derived from it."""
    command, config = DERIVED[layer]
    cli = _cli_params(*command)
    fields = {field.name: field for field in dataclasses.fields(config)}
    assert set(fields) - set(cli) == set(CONFIG_ONLY) & set(fields), "config fields missing on the CLI"
    docs = field_docs(config)
    for name, field in fields.items():
        if name in CONFIG_ONLY:
            continue
        assert (cli[name].help or "").startswith(docs[name]), f"--{name}: its help is not {config.__name__}'s"
        if (layer, name) not in CLI_DIFFERS:
            assert cli[name].default == field.default or field.default is dataclasses.MISSING, name


def test_promote_options_have_promotes_defaults():
    cli = _cli_defaults("promote")
    for name, default in _config_defaults()["promote"].items():
        if name in cli:
            assert cli[name] == default, name
    assert {"metric", "min_delta", "max_class_drop"} <= set(cli)


def test_pipeline_parameters_are_config_options_with_their_defaults():
    from tpustream.pipelines.training import build_pipeline

    inputs = build_pipeline(tpu=None).component_spec.inputs
    assert set(inputs) - PIPELINE_ONLY == set(PIPELINE_OPTIONS), "classify the new pipeline parameter here"
    configs = _config_defaults()
    for name, (layer, option) in PIPELINE_OPTIONS.items():
        if name in PIPELINE_DIFFERS:
            continue
        expected = configs[layer][option]
        default = inputs[name].default
        if name in PIPELINE_NONE and default == PIPELINE_NONE[name]:
            default = None
        assert default == expected, (
            f"pipeline parameter {name}: {inputs[name].default!r}, {layer} has {expected!r}"
        )


def test_run_local_options_are_pipeline_parameters():
    from tpustream.pipelines.training import build_pipeline

    inputs = build_pipeline(tpu=None).component_spec.inputs
    options = set(_cli_defaults("pipeline", "run-local")) - {"root", "param", "verbose"}
    assert {RUN_LOCAL_NAMES.get(name, name) for name in options} <= set(inputs)


def test_the_deploy_steps_defaults_are_tpustream_deploys():
    from tpustream.pipelines.training import build_pipeline

    params = build_pipeline().component_spec.inputs
    cli = _cli_defaults("deploy")
    for parameter, option in PIPELINE_DEPLOY.items():
        assert params[parameter].default == cli[option], parameter
    assert params["endpoint"].default == ""  # no endpoint: no deploy step runs


def test_the_pipeline_commands_vertex_options_are_its_parameters():
    """`pipeline compile --tensorboard` is the parameter's default; submit and schedule set it per run, and
    name the experiment (the parameter a scheduled run joins with)."""
    from tpustream.pipelines.training import build_pipeline

    params = build_pipeline().component_spec.inputs
    assert params["tensorboard"].default == _cli_defaults("pipeline", "compile")["tensorboard"] == ""
    assert params["experiment"].default == ""  # no experiment: a run joins none
    for command in ("submit", "schedule"):
        assert {"tensorboard", "experiment"} <= set(_cli_defaults("pipeline", command)), command
