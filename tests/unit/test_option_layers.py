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


# ------------------------------------------------------------------------------------------------------------
# Every option of every door, its default against the one place that default is written (issue 42, item 2).
#
# A door is a way in: the CLI commands `pipeline run-local|compile|submit|schedule`, `train`, `promote`,
# `report`, `deploy`; the pipeline function's parameters; the KFP components' parameters. Each option either
# names its source ("Owner.field": a config dataclass field or a library function's keyword default) or is
# the door's own (OWN: nothing else declares it, so nothing can disagree). An option in neither fails, so a
# new option is classified before it can drift; a default unlike its source's fails unless DIFFERS says why.

# A KFP parameter cannot be None: each source field whose default is None has one stand-in, the same in the
# pipeline and every component (config_from_pipeline, PromotionPolicy.from_pipeline, components/train.py
# decode them), and in run-local, which passes its options on as pipeline parameters.
STAND_INS: dict[str, object] = {
    "ShardConfig.num_shards": 0,  # auto
    "ShardConfig.val_fraction": -1.0,  # the source's own split
    "ShardConfig.max_side": 0,  # keep every image's size
    "TrainConfig.lr": 0.0,  # the scaled default (a tenth of it for a fine-tuning run)
    "TrainConfig.input_size": 0,  # the dataset's rule
    "TrainConfig.init_from": "",  # random weights
    "TrainConfig.pretrained": "",  # random weights
    "TrainConfig.compile_cache": "",  # none
    "PromotionPolicy.max_class_drop": -1.0,  # no per-class check
    "PromotionPolicy.max_p_value": -1.0,  # no significance required
    "QualityFloor.min_metric": -1.0,  # no floor
    "QualityFloor.min_class_recall": -1.0,
}
# `pipeline run-local`'s defaults unlike the pipeline's: exactly LocalDemo's fields, whose docstrings
# (tpustream/cli/pipeline.py) say why, all for one reason: the demo trains digits offline on this machine's
# CPUs in about a minute. The LR is not one of them: run-local's is the pipeline's (the scaled default).
RUN_LOCAL_DIFFERS = {"model_name", "epochs", "batch_size", "bf16", "workers", "pretrained"}
_WIRING = "wiring the pipeline always passes (the run's registry, root, outcome file); '' = none"
_VERTEX = "where on Google Cloud (project, region, service account): no library default to follow"
_NONE = "None: not given (the template's, the environment's, or nothing)"
# door -> option -> why it is the door's own.
OWN: dict[str, dict[str, str]] = {
    "pipeline run-local": {
        "root": "where the local run writes (pipeline root, registry)",
        "param": "--param KEY=VALUE: any pipeline parameter, over the defaults",
        "notify_webhook": "None: the pipeline's notify_webhook default ('': none)",
        "verbose": "where the executors' logs go",
    },
    "pipeline compile": {
        "output": "the YAML to write",
        "tpu": "the TPU type the YAML is compiled for (compile_pipeline requires one; '' = the CPU image)",
        "image": "pushed images: refused when empty (check_image), so no default can drift",
        "tpu_image": "pushed images: refused when empty (check_image), so no default can drift",
    },
    **{
        f"pipeline {command}": {
            "region": _VERTEX,
            "param": "--param KEY=VALUE: any pipeline parameter, over the template's defaults",
            "experiment": _NONE,
        }
        for command in ("submit", "schedule")
    },
    "promote": {
        "vertex_model": _NONE,
        "vertex_project": _VERTEX,
        "vertex_region": _VERTEX,
        "serving_image": _NONE,
        "validation": _NONE,
    },
    "report": {"registry": _NONE, "data": _NONE, "data_check": _NONE},
    "pipeline": {
        "datasets_root": "'' = under the registry (check_source)",
        "shards_per_task": "the shard writers' fan-out: a DAG shape, no CLI option",
        "retrain": "train even when the data is unchanged: the DAG's skip, no CLI option",
        "vertex_model": "promote --vertex-model's (None there, '' here: none)",
        "serving_image": "promote --serving-image's (None there, '' here: the environment's)",
        "endpoint": "deploy --endpoint (required there, '' here: no deploy step)",
        "data_check": "fail/warn/off: `shards check` exits 1 on anomalies, 0 with --warn-only",
        "compile_cache": "auto = the run's pipeline root /xla-cache; `train --compile-cache` takes the URI",
        "experiment": "'' = no experiment: `pipeline submit|schedule --experiment`",
        "notify_emails": "compiled in with `pipeline compile --notify` (its default there: none)",
    },
    "components": {
        **{name: _WIRING for name in ("registry", "pipeline_root", "run_outcome", "pipeline_job_id")},
        **{name: _VERTEX for name in ("project", "location")},
        "vertex_model_name": "the pipeline's vertex_model ('' = none)",
        "serving_image": "the pipeline's serving_image ('' = the environment's)",
    },
}
# door -> option -> why its default is unlike its source's, on purpose.
DIFFERS: dict[str, dict[str, str]] = {
    "pipeline": {name: why for name, why in PIPELINE_DIFFERS.items()},
    "components": {},
}
_POLICY = {
    "metric": "PromotionPolicy.metric",
    "min_delta": "PromotionPolicy.min_delta",
    "max_class_drop": "PromotionPolicy.max_class_drop",
    "max_p_value": "PromotionPolicy.max_p_value",
    "min_metric": "QualityFloor.min_metric",
    "min_class_recall": "QualityFloor.min_class_recall",
}
_DEPLOY = {
    "traffic": "deploy.traffic_percent",
    "machine_type": "deploy.machine_type",
    "min_replicas": "deploy.min_replicas",
    "max_replicas": "deploy.max_replicas",
}
_CONFIG_CLASS = {"shards": "ShardConfig", "train": "TrainConfig", "check": "DataCheckThresholds"}
_VERTEX_RUN = {
    "service_account": "{f}.service_account",
    "label": "{f}.labels",
    "skip_preflight": "{f}.skip_preflight",
    "tensorboard": "{f}.tensorboard",
    "notify": "{f}.notify_emails",
    "notify_webhook": "{f}.notify_webhook",
}
# door -> option -> "Owner.field" its default comes from.
SOURCES: dict[str, dict[str, str]] = {
    "train": {
        field.name: f"TrainConfig.{field.name}"
        for field in dataclasses.fields(TrainConfig)
        if field.name not in CONFIG_ONLY and field.default is not dataclasses.MISSING
    },
    "pipeline run-local": {
        "source": "ShardConfig.source",
        "model": "LocalDemo.model_name",
        "epochs": "LocalDemo.epochs",
        "batch_size": "LocalDemo.batch_size",
        "lr": "TrainConfig.lr",
        "num_shards": "ShardConfig.num_shards",
    },
    "pipeline compile": {
        "serving_image": "compile_pipeline.serve_image",
        "capacity": "Capacity.kind",
        "timeout": "Capacity.timeout",
        "step_cpu": "StepResources.cpu",
        "step_memory": "StepResources.memory",
        "eval_cpu": "StepResources.eval_cpu",
        "eval_memory": "StepResources.eval_memory",
        "tensorboard": "compile_pipeline.tensorboard",
        "notify": "compile_pipeline.notify_emails",
        "notify_webhook": "compile_pipeline.notify_webhook",
    },
    "pipeline submit": {
        **{name: key.format(f="submit_pipeline") for name, key in _VERTEX_RUN.items()},
        "no_cache": "submit_pipeline.no_cache",
    },
    "pipeline schedule": {name: key.format(f="schedule_pipeline") for name, key in _VERTEX_RUN.items()},
    "promote": _POLICY,
    "report": _POLICY,
    "deploy": {
        **_DEPLOY,
        "registry": "deploy.registry",
        "project": "deploy.project",
        "region": "deploy.region",
        "dedicated_endpoint": "deploy.dedicated_endpoint",
    },
    "pipeline": {
        **{
            name: (
                _POLICY[option] if layer == "promote" else f"{_CONFIG_CLASS[layer]}.{option}"
            )
            for name, (layer, option) in PIPELINE_OPTIONS.items()
        },
        **{name: _POLICY[name] for name in ("min_metric", "min_class_recall", "max_p_value")},
        **{parameter: _DEPLOY[option] for parameter, option in PIPELINE_DEPLOY.items()},
        "tensorboard": "build_pipeline.tensorboard",
        "notify_webhook": "build_pipeline.notify_webhook",
    },
    # every component's parameter of that name (the components share the pipeline's names)
    "components": {
        **{
            name: f"TrainConfig.{name}"
            for name in ("input_size", "init_from", "pretrained", "freeze_epochs", "backbone_lr_scale")
        },
        **{name: f"TrainConfig.{name}" for name in ("class_weights", "patience", "compile_cache")},
        "early_stop_min_delta": "TrainConfig.min_delta",
        "min_train_shards": "ShardConfig.min_train_shards",
        "test_fraction": "ShardConfig.test_fraction",
        **{name: key for name, key in _POLICY.items() if name not in ("metric", "min_delta")},
        **{f"{option}_percent" if option == "traffic" else option: key for option, key in _DEPLOY.items()},
        "samples": "validate_serving.samples",
    },
}
_CLI_DOORS = {
    "train": ("train",),
    "pipeline run-local": ("pipeline", "run-local"),
    "pipeline compile": ("pipeline", "compile"),
    "pipeline submit": ("pipeline", "submit"),
    "pipeline schedule": ("pipeline", "schedule"),
    "promote": ("promote",),
    "report": ("report",),
    "deploy": ("deploy",),
}


def _source_defaults() -> dict[str, object]:
    """"Owner.field" -> its default, for every config dataclass and library function an option follows."""
    from tpustream.cli.pipeline import LocalDemo
    from tpustream.pipelines.compile import compile_pipeline
    from tpustream.pipelines.steps import StepResources
    from tpustream.pipelines.submit import schedule_pipeline, submit_pipeline
    from tpustream.pipelines.tpu import Capacity
    from tpustream.pipelines.training import build_pipeline
    from tpustream.registry.policy import PromotionPolicy, QualityFloor
    from tpustream.release.deploy import deploy
    from tpustream.serve.validate import validate_serving

    defaults: dict[str, object] = {}
    for config in (ShardConfig, TrainConfig, DataCheckThresholds, PromotionPolicy, QualityFloor, LocalDemo):
        for field in dataclasses.fields(config):
            if field.default is not dataclasses.MISSING:
                defaults[f"{config.__name__}.{field.name}"] = field.default
    for config in (StepResources, Capacity):
        for field in dataclasses.fields(config):
            defaults[f"{config.__name__}.{field.name}"] = field.default
    functions = (compile_pipeline, build_pipeline, submit_pipeline, schedule_pipeline, deploy, validate_serving)
    for function in functions:
        for parameter in inspect.signature(function).parameters.values():
            if parameter.default is not inspect.Parameter.empty:
                defaults[f"{function.__name__}.{parameter.name}"] = parameter.default
    return defaults


def _door_defaults(door: str) -> dict[str, object]:
    """Option -> default of every option of ``door`` that has one (a required option cannot drift)."""
    if door in _CLI_DOORS:
        return {name: p.default for name, p in _cli_params(*_CLI_DOORS[door]).items() if not p.required}
    if door == "pipeline":
        from tpustream.pipelines.training import build_pipeline

        inputs = build_pipeline(tpu=None).component_spec.inputs
        return {name: spec.default for name, spec in inputs.items() if spec.default is not None}
    raise KeyError(door)


def _component_defaults() -> dict[str, dict[str, object]]:
    """Component -> its parameters' defaults (the plain functions that pipelines/steps.py compiles)."""
    from tpustream import components

    return {
        name: {
            p.name: p.default
            for p in inspect.signature(getattr(components, name)).parameters.values()
            if p.default is not inspect.Parameter.empty
        }
        for name in components.__all__
    }


def _same(default: object, expected: object) -> bool:
    """Equal, and a bool only equals a bool (False == 0 in Python, not here)."""
    return default == expected and isinstance(default, bool) == isinstance(expected, bool)


def _disagreements(door: str, defaults: dict[str, object], sources: dict[str, object]) -> list[str]:
    own, mapped, differs = OWN.get(door, {}), SOURCES[door], DIFFERS.get(door, {})
    found = []
    for name, default in sorted(defaults.items()):
        if name in own:
            continue
        if name not in mapped:
            found.append(f"{door} {name}: classify it here (SOURCES: the default it follows, or OWN: why none)")
            continue
        key = mapped[name]
        expected = sources[key]
        agrees = _same(default, expected) or (expected is None and key in STAND_INS and _same(default, STAND_INS[key]))
        if name in differs:
            if agrees:
                found.append(f"{door} {name}: agrees with {key} now: remove it from DIFFERS")
        elif not agrees:
            found.append(f"{door} {name}: default {default!r}, but {key}'s is {expected!r}")
    return found


@pytest.mark.parametrize("door", [*_CLI_DOORS, "pipeline"])
def test_every_option_of_every_door_has_its_sources_default(door):
    assert _disagreements(door, _door_defaults(door), _source_defaults()) == []


def test_every_components_parameter_has_its_sources_default():
    sources = _source_defaults()
    found = [
        f"{component}: {problem}"
        for component, defaults in _component_defaults().items()
        for problem in _disagreements("components", defaults, sources)
    ]
    assert found == []


def test_the_classification_names_real_options_and_sources():
    """A stale entry (an option renamed, a source field gone) fails here rather than hiding a new option."""
    sources = _source_defaults()
    component_options = {name for defaults in _component_defaults().values() for name in defaults}
    for door, mapped in SOURCES.items():
        options = component_options if door == "components" else set(_door_defaults(door))
        assert set(mapped) | set(OWN.get(door, {})) <= options, door
        assert set(mapped.values()) <= set(sources), door
    assert set(STAND_INS) <= set(sources) and all(sources[key] is None for key in STAND_INS)


def test_run_local_runs_the_pipelines_defaults_but_the_local_demos():
    """Run-local's parameters, as its defaults make them, are the pipeline's defaults except LocalDemo's
    fields, each of which differs from the pipeline's and says why: a fine-tuning run through run-local
    (--param pretrained=...) gets fine-tuning's LR, as on Vertex, not the 0.2 it once fixed."""
    from tpustream.cli.pipeline import LocalDemo, local_parameters
    from tpustream.pipelines.training import build_pipeline

    inputs = build_pipeline(tpu=None).component_spec.inputs
    cli = _cli_defaults("pipeline", "run-local")
    options = {name: cli[name] for name in ("source", "model", "epochs", "batch_size", "lr", "num_shards")}
    parameters = local_parameters(**options, param=[])
    assert set(parameters) <= set(inputs)
    differs = {name for name, value in parameters.items() if not _same(value, inputs[name].default)}
    assert differs == RUN_LOCAL_DIFFERS == {field.name for field in dataclasses.fields(LocalDemo)}
    docs = field_docs(LocalDemo)
    assert all(docs.get(name) for name in RUN_LOCAL_DIFFERS), "each LocalDemo field says why"
    assert parameters["lr"] == inputs["lr"].default == 0.0
    tuned = local_parameters(**options, param=["pretrained=resnet18.pth", "lr=0.01"])
    assert (tuned["pretrained"], tuned["lr"]) == ("resnet18.pth", 0.01)  # --param wins over both
