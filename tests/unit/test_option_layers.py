"""One default per option, whatever the door (issue 42, item 2).

A door is a way in: the CLI commands (`train`, `shards create`, `shards check`, `predict`, `evaluate`,
`validate-serving`, `pipeline run-local`, `pipeline compile|preflight|submit|schedule`, `promote`, `report`,
`deploy`), the pipeline function's parameters and the KFP components' parameters. Every option of every door that has a default either names the one place that
default is written (SOURCES: ``Owner.field``, a config dataclass field such as ``TrainConfig.lr`` or a library
function's keyword default such as ``deploy.traffic_percent``) and has that default, or is the door's own
(OWN: nothing else declares it, so nothing can disagree). An option in neither fails, so a new option is
classified before it can drift; a default unlike its source's fails unless DIFFERS says why.

``tpustream train``, ``shards create``, ``shards check``, ``predict``, ``promote`` and ``report``
(PromotionPolicy), ``pipeline submit`` and ``schedule`` (one block: VertexRun), ``pipeline compile``
(CompileOptions, with Capacity's and StepResources' fields) and ``pipeline run-local`` (RunLocalOptions, its
defaults LocalDemo's or the pipeline's) are derived from their config (tpustream/cli/options.py): their
defaults and help are the fields', so they are checked to still be derived, and the few options each writes
by hand are listed (HAND_WRITTEN).
"""

import dataclasses
import inspect

import pytest
import typer.main
from tpustream.pipelines.resources import StepResources
from tpustream.pipelines.tpu import Capacity

from tpustream.cli.main import app
from tpustream.cli.options import config_fields, field_docs
from tpustream.cli.pipeline import CompileOptions, LocalDemo, RunLocalOptions, VertexRun
from tpustream.dataset.check import DataCheckThresholds
from tpustream.dataset.plan import ShardConfig
from tpustream.registry.policy import PromotionPolicy
from tpustream.serve.predict.config import PredictConfig
from tpustream.train.config import TrainConfig

# command -> the config it is derived from
DERIVED = {
    ("shards", "create"): ShardConfig,
    ("train",): TrainConfig,
    ("shards", "check"): DataCheckThresholds,
    ("predict",): PredictConfig,
    ("promote",): PromotionPolicy,  # its floor (QualityFloor) flattened: --min-metric, --min-class-recall
    ("report",): PromotionPolicy,  # decides as promote does: the same options
    ("pipeline", "submit"): VertexRun,  # one block, shared by submit and schedule
    ("pipeline", "schedule"): VertexRun,
    (
        "pipeline",
        "compile",
    ): CompileOptions,  # its capacity (Capacity) and resources (StepResources) flattened
    ("pipeline", "run-local"): RunLocalOptions,
}
# The options a derived pipeline command declares itself, beside its config's: what belongs to no config.
HAND_WRITTEN = {
    ("pipeline", "compile"): set(),
    ("pipeline", "run-local"): {"verbose"},  # where the executors' logs go, not what runs
    ("pipeline", "submit"): {"no_cache"},
    ("pipeline", "schedule"): {"cron"},
    ("pipeline", "preflight"): {"schedule"},
}
# Config fields that are not CLI options, on purpose.
CONFIG_ONLY = {
    "commit_timeout_minutes": "a multi-host detail: how long hosts wait for process 0's model artifact",
    "min_train_shards": "the pipeline's floor: its slice's hosts x the run's workers (dataset/fanout.py); on the CLI "
    "--num-shards sets the count itself",
    "init_optional": "the pipeline's init_from=champion: a champion that does not fit trains from random weights; "
    "on the CLI an --init-from that does not fit is an error",
}

# The recipe's options (tpustream/train/recipe.py): the same names in TrainConfig, the pipeline and the train step
_RECIPE = ("recipe", "augment", "random_erasing", "mixup_alpha", "cutmix_alpha", "ema_decay", "layer_decay")

# A KFP parameter cannot be None: each source field whose default is None has one stand-in, the same in the
# pipeline and every component (config_from_pipeline, PromotionPolicy.from_pipeline and tpustream/launchers/train.py
# decode them). Run-local writes none: an option it is not given (None) is no parameter, so the pipeline's applies.
STAND_INS: dict[str, object] = {
    "ShardConfig.num_shards": 0,  # auto: ~2,000 samples a shard, at least one per loader worker
    "ShardConfig.val_fraction": -1.0,  # the source's own split
    "ShardConfig.max_side": 0,  # keep every image's size
    "ShardConfig.exclude_keys": "",  # no file: no sample left out
    "ShardConfig.relabel": "",  # no file: no sample relabelled
    "TrainConfig.lr": 0.0,  # the scaled default (a tenth of it for a fine-tuning run)
    "TrainConfig.input_size": 0,  # the dataset's rule
    "TrainConfig.init_from": "",  # random weights
    "TrainConfig.pretrained": "",  # random weights
    "TrainConfig.compile_cache": "",  # none
    "TrainConfig.augment": "",  # the recipe's (and the next five)
    "TrainConfig.random_erasing": -1.0,
    "TrainConfig.mixup_alpha": -1.0,
    "TrainConfig.cutmix_alpha": -1.0,
    "TrainConfig.ema_decay": -1.0,
    "TrainConfig.layer_decay": -1.0,
    "TrainConfig.head_lr_scale": -1.0,  # the model's rule (10 for ConvNeXt's new head, else 1)
    "PromotionPolicy.max_class_drop": -1.0,  # no per-class check
    "PromotionPolicy.max_p_value": -1.0,  # no significance required
    "QualityFloor.min_metric": -1.0,  # no floor
    "QualityFloor.min_class_recall": -1.0,
}

# `pipeline run-local`'s parameters unlike the pipeline's defaults: exactly LocalDemo's fields, whose
# docstrings (tpustream/cli/pipeline.py) say why, all for one reason: the demo trains digits offline on this
# machine's CPUs in about a minute. The LR is not one of them: run-local's is the pipeline's, the scaled
# default (it once fixed 0.2, which a fine-tuning run took as its peak LR and diverged with).
RUN_LOCAL_DIFFERS = {"model_name", "epochs", "batch_size", "bf16", "workers", "pretrained"}

_WIRING = "wiring the pipeline always passes (the run's registry, root, outcome file); '' = none"
_VERTEX = "where on Google Cloud (project, region): the environment's or the CLI's own, no library default"
_NONE = "None: not given (the template's, the environment's, or nothing)"
# door -> option -> why it is the door's own.
OWN: dict[str, dict[str, str]] = {
    "pipeline run-local": {
        "root": "where the local run writes (pipeline root, registry)",
        "param": "--param KEY=VALUE: any pipeline parameter, over the defaults",
        "notify_webhook": "None: the pipeline's notify_webhook default ('': none)",
        "verbose": "where the executors' logs go",
        "tune": "which DAG runs (build_pipeline's tune switch, a compile-time shape), not a pipeline parameter",
    },
    "pipeline compile": {
        "output": "the YAML to write",
        "tpu": "the TPU type the YAML is compiled for (compile_pipeline requires one; '' = the CPU image)",
        "image": "a pushed image: refused when empty (check_image), so no default can drift",
        "tpu_image": "a pushed image: refused when empty (check_image), so no default can drift",
        "tune": "which DAG is compiled (build_pipeline's tune switch, a compile-time shape), not a parameter",
    },
    "pipeline preflight": {"schedule": "what to check: also what a schedule needs"},
    "tune": {
        "space": "None: the default search space (tpustream/tune/space.py DEFAULT_SPACE)",
        "max_trials": "None: the space's max_trials",
    },
    "promote": {
        "vertex_model": _NONE,
        "vertex_project": _VERTEX,
        "vertex_region": _VERTEX,
        "serving_image": _NONE,
        "validation": _NONE,
    },
    "report": {"registry": _NONE, "data": _NONE, "data_check": _NONE},
    "predict": {
        "inputs": "IMAGE_OR_URI...: the command's own argument (PredictConfig.inputs, excluded from the options)",
        "model": "PredictConfig requires one; '' on the command line: an error unless --vertex-batch",
        "vertex_batch": _NONE,
        "vertex_model": _NONE,
        "instances_per_request": _NONE,
        "vertex_project": _VERTEX,
        "vertex_region": _VERTEX,
    },
    "evaluate": {"registry": _NONE},
    "validate-serving": {"data": _NONE, "output": _NONE},
    "shards check": {
        "baseline": "None: no drift checks",
        "report": "None: the report is printed",
        "json_output": "the report's format",
        "warn_only": "the CLI's exit status (the pipeline's data_check=warn)",
    },
    "pipeline": {
        "datasets_root": "'' = under the registry (check_source)",
        "shards_per_task": "the shard writers' fan-out: a DAG shape, no CLI option",
        "retrain": "train even when the data is unchanged: the DAG's skip, no CLI option",
        "vertex_model": "promote --vertex-model's (None there, '' here: none)",
        "serving_image": "promote --serving-image's (None there, '' here: the environment's)",
        "endpoint": "deploy --endpoint (required there; '' here: no deploy step runs)",
        "data_check": "fail/warn/off: on the CLI, `shards check` exits 1 on anomalies, 0 with --warn-only",
        "compile_cache": "auto = the run's pipeline root /xla-cache; `train --compile-cache` takes the URI itself",
        "experiment": "'' = none: the Vertex AI Experiment a scheduled run joins (`pipeline schedule --experiment`)",
        "notify_emails": "compiled in by `pipeline compile --notify` (default there: none)",
        "tune_space": "'' = the default search space (tpustream/tune/space.py), as `tpustream tune` without --space",
    },
    "components": {
        **{name: _WIRING for name in ("registry", "pipeline_root", "run_outcome", "pipeline_job_id", "run")},
        **{name: _VERTEX for name in ("project", "location")},
        "vertex_model_name": "the pipeline's vertex_model ('' = none)",
        "serving_image": "the pipeline's serving_image ('' = the environment's)",
        "tune_space": "the pipeline's tune_space ('' = the default search space)",
    },
}
# door -> option -> why its default is unlike its source's, on purpose.
DIFFERS: dict[str, dict[str, str]] = {
    "shards create": {"workers": "the CLI writes with one process per CPU; library callers get one process"},
    "pipeline": {
        "init_from": "scheduled retraining starts from the registry's champion (none yet: random weights); "
        "the CLI from random weights unless told",
        "bf16": "the pipeline trains on TPUs, where bfloat16 is the fast path; the CLI also runs on CPUs",
        "workers": "a TPU host's loader workers (pipelines/tpu.py PIPELINE_WORKERS; with the slice's hosts it "
        "sizes auto's shard floor); the CLI's 4 suits a workstation",
        "pretrained": "a pipeline run fine-tunes from its model's published weights (DEFAULT; issue 33's "
        "item 6); the CLI starts from random weights unless told",
    },
}

_POLICY = {
    "metric": "PromotionPolicy.metric",
    "min_delta": "PromotionPolicy.min_delta",
    "max_class_drop": "PromotionPolicy.max_class_drop",
    "min_class_support": "PromotionPolicy.min_class_support",
    "beat_majority_baseline": "PromotionPolicy.beat_majority_baseline",
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


def _derived(config: type) -> dict[str, str]:
    """Option -> ``Config.field`` for each field of ``config`` with a default that the CLI derives."""
    fields = {
        field.name
        for field in dataclasses.fields(config)
        if field.default is not dataclasses.MISSING and field.name not in CONFIG_ONLY
    }
    return {name: f"{config.__name__}.{name}" for name in fields}


# door -> option -> the "Owner.field" its default comes from.
SOURCES: dict[str, dict[str, str]] = {
    "train": _derived(TrainConfig),
    "tune": _derived(TrainConfig),  # every trial's base: train's options
    "shards create": _derived(ShardConfig),
    "shards check": {**_derived(DataCheckThresholds), "examples": "check_dataset.max_examples"},
    "predict": {
        **{name: key for name, key in _derived(PredictConfig).items() if name != "inputs"},
        **{name: f"predict_on_vertex.{name}" for name in ("machine_type", "replicas", "wait")},
    },
    "evaluate": {"workers": "evaluate.workers"},
    "validate-serving": {"samples": "validate_serving.samples", "timeout": "validate_serving.timeout"},
    "pipeline run-local": {
        "source": "ShardConfig.source",
        "model": "LocalDemo.model_name",
        "epochs": "LocalDemo.epochs",
        "batch_size": "LocalDemo.batch_size",
        "lr": "TrainConfig.lr",
        "num_shards": "ShardConfig.num_shards",
        "exclude_keys": "ShardConfig.exclude_keys",
        "relabel": "ShardConfig.relabel",
    },
    "pipeline compile": {
        "serving_image": "compile_pipeline.serve_image",
        **_derived(Capacity),  # --capacity (kind), --timeout
        **_derived(StepResources),  # --step-cpu (cpu), --step-memory (memory), --eval-cpu, --eval-memory
        "tensorboard": "compile_pipeline.tensorboard",
        "notify": "compile_pipeline.notify_emails",
        "notify_webhook": "compile_pipeline.notify_webhook",
    },
    "pipeline preflight": {
        name: key
        for name, key in _derived(VertexRun).items()
        if name in ("region", "service_account", "param")
    },
    "pipeline submit": {**_derived(VertexRun), "no_cache": "submit_pipeline.no_cache"},
    "pipeline schedule": _derived(VertexRun),
    "promote": _POLICY,
    "report": _POLICY,
    "deploy": {
        **_DEPLOY,
        "registry": "deploy.registry",
        "project": "deploy.project",
        "region": "deploy.region",
        "dedicated_endpoint": "deploy.dedicated_endpoint",
        "undeploy_idle": "deploy.undeploy_idle",
    },
    "pipeline": {
        **{
            name: f"ShardConfig.{name}"
            for name in ("source", "num_shards", "val_fraction", "test_fraction", "upsample", "seed")
        },
        **{name: f"ShardConfig.{name}" for name in ("max_side", "strict", "exclude_keys", "relabel")},
        **{name: f"TrainConfig.{name}" for name in ("epochs", "batch_size", "lr", "bf16", "workers")},
        **{name: f"TrainConfig.{name}" for name in ("input_size", "init_from", "pretrained", "patience")},
        **{name: f"TrainConfig.{name}" for name in ("freeze_epochs", "backbone_lr_scale", "class_weights")},
        "head_lr_scale": "TrainConfig.head_lr_scale",
        **{name: f"TrainConfig.{name}" for name in _RECIPE},
        "model_name": "TrainConfig.model",
        "early_stop_min_delta": "TrainConfig.min_delta",
        **_derived(DataCheckThresholds),
        **_POLICY,
        **{f"serving_{option}": key for option, key in _DEPLOY.items() if option != "traffic"},
        "canary_percent": _DEPLOY["traffic"],
        "tensorboard": "build_pipeline.tensorboard",
        "notify_webhook": "build_pipeline.notify_webhook",
    },
    # every component's parameter of that name (the components take the pipeline's names)
    "components": {
        **{
            name: f"TrainConfig.{name}"
            for name in ("input_size", "init_from", "pretrained", "freeze_epochs", "backbone_lr_scale")
        },
        "head_lr_scale": "TrainConfig.head_lr_scale",
        **{name: f"TrainConfig.{name}" for name in ("class_weights", "patience", "compile_cache")},
        **{name: f"TrainConfig.{name}" for name in _RECIPE},
        "early_stop_min_delta": "TrainConfig.min_delta",
        "test_fraction": "ShardConfig.test_fraction",
        "exclude_keys": "ShardConfig.exclude_keys",
        "relabel": "ShardConfig.relabel",
        # evaluate and promote require metric and min_delta: the pipeline always passes them
        **{name: key for name, key in _POLICY.items() if name not in ("metric", "min_delta")},
        **{"traffic_percent" if option == "traffic" else option: key for option, key in _DEPLOY.items()},
        "samples": "validate_serving.samples",
    },
}
_CLI_DOORS = {
    "train": ("train",),
    "tune": ("tune",),
    "shards create": ("shards", "create"),
    "shards check": ("shards", "check"),
    "predict": ("predict",),
    "evaluate": ("evaluate",),
    "validate-serving": ("validate-serving",),
    "pipeline run-local": ("pipeline", "run-local"),
    "pipeline compile": ("pipeline", "compile"),
    "pipeline preflight": ("pipeline", "preflight"),
    "pipeline submit": ("pipeline", "submit"),
    "pipeline schedule": ("pipeline", "schedule"),
    "promote": ("promote",),
    "report": ("report",),
    "deploy": ("deploy",),
}


def _cli_params(*path: str) -> dict[str, typer.core.TyperOption]:
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params if p.name}


def _pipeline_inputs() -> dict:
    from tpustream.pipelines.training import build_pipeline

    return build_pipeline(tpu=None).component_spec.inputs


def _source_defaults() -> dict[str, object]:
    """``Owner.field`` -> its default, for every config dataclass and library function an option follows."""
    from tpustream.pipelines.compile import compile_pipeline
    from tpustream.pipelines.submit import schedule_pipeline, submit_pipeline
    from tpustream.pipelines.training import build_pipeline

    from tpustream.dataset.check import check_dataset
    from tpustream.registry.policy import PromotionPolicy, QualityFloor
    from tpustream.release.deploy import deploy
    from tpustream.serve.validate import validate_serving
    from tpustream.train.evaluate import evaluate
    from tpustream.vertex.batch_prediction import predict_on_vertex

    configs = (ShardConfig, TrainConfig, DataCheckThresholds, PromotionPolicy, QualityFloor)
    functions = (compile_pipeline, build_pipeline, submit_pipeline, schedule_pipeline, deploy, check_dataset)
    defaults: dict[str, object] = {}
    for config in (*configs, PredictConfig, LocalDemo, VertexRun, StepResources, Capacity):
        for field in dataclasses.fields(config):
            if field.default is not dataclasses.MISSING:
                defaults[f"{config.__name__}.{field.name}"] = field.default
    for function in (*functions, validate_serving, evaluate, predict_on_vertex):
        for parameter in inspect.signature(function).parameters.values():
            if parameter.default is not inspect.Parameter.empty:
                defaults[f"{function.__name__}.{parameter.name}"] = parameter.default
    return defaults


def _door_defaults(door: str) -> dict[str, object]:
    """Option -> default of every option of ``door`` that has one (a required option cannot drift)."""
    if door == "pipeline":
        return {name: spec.default for name, spec in _pipeline_inputs().items() if spec.default is not None}
    return {name: p.default for name, p in _cli_params(*_CLI_DOORS[door]).items() if not p.required}


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
            found.append(f"{door} {name}: classify it here (SOURCES: the default it follows; OWN: why none)")
            continue
        key = mapped[name]
        expected = sources[key]
        stand_in = STAND_INS.get(key, dataclasses.MISSING)
        agrees = _same(default, expected) or (expected is None and _same(default, stand_in))
        if name in differs:
            if agrees:
                found.append(f"{door} {name}: agrees with {key} now: take it out of DIFFERS")
        elif not agrees:
            shown = f"{expected!r}" + (f" (stand-in {stand_in!r})" if key in STAND_INS else "")
            found.append(f"{door} {name}: default {default!r}, but {key}'s is {shown}")
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
        if door == "components":
            options = component_options
        elif door == "pipeline":
            options = set(_pipeline_inputs())
        else:
            options = set(_cli_params(*_CLI_DOORS[door]))
        assert set(mapped) | set(OWN.get(door, {})) | set(DIFFERS.get(door, {})) <= options, door
        assert not set(mapped) & set(OWN.get(door, {})), f"{door}: an option is its own or follows a source"
        assert set(mapped.values()) <= set(sources), door
    assert set(STAND_INS) <= set(sources) and all(sources[key] is None for key in STAND_INS)
    assert set(OWN) | set(DIFFERS) <= set(SOURCES)


@pytest.mark.parametrize("command", sorted(DERIVED))
def test_the_config_commands_are_derived_from_their_config(command):
    """Each field is an option with the field's docstring as its help (its default: the test above)."""
    config = DERIVED[command]
    cli = _cli_params(*command)
    owners = {field.name: owner for owner, field in config_fields(config)}
    fields = set(owners)
    assert fields - set(cli) == set(CONFIG_ONLY) & fields, "config fields missing on the CLI"
    for name in fields - set(CONFIG_ONLY) - {"inputs"}:  # predict's argument: its help is the command's
        docs = field_docs(owners[name])
        assert (cli[name].help or "").startswith(docs[name]), f"--{name}: its help is not {config.__name__}'s"


def test_run_local_runs_the_pipelines_defaults_but_the_local_demos():
    """Run-local's parameters, as its defaults make them, are the pipeline's defaults except LocalDemo's
    fields, each of which differs from the pipeline's and says why. It passes no other parameter but the
    source: the LR and the shard count are the pipeline's own defaults, never a stand-in written again (a
    fine-tuning run through run-local, --param pretrained=SPEC, gets fine-tuning's LR, as on Vertex, not the
    0.2 run-local once fixed)."""
    inputs = _pipeline_inputs()
    cli = {name: p.default for name, p in _cli_params("pipeline", "run-local").items()}
    run = RunLocalOptions(**{field.name: cli[field.name] for field in dataclasses.fields(RunLocalOptions)})
    parameters = run.parameters()
    demo = {field.name for field in dataclasses.fields(LocalDemo)}
    assert set(parameters) == demo | {"source"} and set(parameters) <= set(inputs)
    assert parameters["source"] == inputs["source"].default
    differs = {name for name, value in parameters.items() if not _same(value, inputs[name].default)}
    assert differs == RUN_LOCAL_DIFFERS == demo
    docs = field_docs(LocalDemo)
    assert all(docs.get(name) for name in RUN_LOCAL_DIFFERS), "each LocalDemo field says why"
    given = dataclasses.replace(run, lr=0.05, num_shards=3).parameters()
    assert (given["lr"], given["num_shards"]) == (0.05, 3)
    tuned = dataclasses.replace(
        run, param=["pretrained=gs://b/resnet18.pth", "lr=0.01"], lr=0.05
    ).parameters()
    assert (tuned["pretrained"], tuned["lr"]) == ("gs://b/resnet18.pth", 0.01)  # --param wins over both
    hook = dataclasses.replace(
        run, param=["notify_webhook=https://a.example/x"], notify_webhook="https://b.example/y"
    )
    assert hook.parameters()["notify_webhook"] == "https://b.example/y"  # --notify-webhook wins over --param


@pytest.mark.parametrize("command", sorted(HAND_WRITTEN))
def test_the_pipeline_commands_write_only_what_no_config_holds(command):
    """A pipeline command's options are its config's fields and the few listed: an option written in the
    command (a default typed again, as compile's 14 and run-local's 10 once were) fails here."""
    config = DERIVED.get(command, VertexRun)  # preflight takes VertexRun's first fields
    fields = {field.name for _, field in config_fields(config)}
    assert set(_cli_params(*command)) - fields == HAND_WRITTEN[command]


def test_the_pipeline_commands_vertex_options_are_its_parameters():
    """`pipeline compile --tensorboard` is the parameter's default; submit and schedule set it per run, and
    name the experiment (the parameter a scheduled run joins with)."""
    params = _pipeline_inputs()
    assert params["tensorboard"].default == _cli_params("pipeline", "compile")["tensorboard"].default == ""
    assert params["experiment"].default == ""  # no experiment: a run joins none
    assert params["endpoint"].default == ""  # no endpoint: no deploy step runs
    for command in ("submit", "schedule"):
        assert {"tensorboard", "experiment"} <= set(_cli_params("pipeline", command)), command
