"""The ``tpustream pipeline`` commands: compile, preflight, submit, schedule and run-local the KFP DAG."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand

from tpustream.cli.options import Opt, fail, from_config
from tpustream.dataset.plan import ShardConfig
from tpustream.errors import TpustreamError
from tpustream.pipelines.resources import StepResources
from tpustream.pipelines.tpu import Capacity

if TYPE_CHECKING:
    from tpustream.pipelines.template import RunParameters

__all__ = ["CompileOptions", "LocalDemo", "RunLocalOptions", "VertexRun", "pipeline_app"]

log = logging.getLogger("tpustream")

pipeline_app = typer.Typer(
    help="Compile, submit, schedule or run locally the KFP training DAG.", no_args_is_help=True
)


def _pairs(values: list[str]) -> dict[str, str]:
    """KEY=VALUE pairs, values as typed."""
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep:
            fail(f"--param {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def _params(values: list[str]) -> RunParameters:
    """KEY=VALUE pairs; values parsed as JSON when they are JSON (numbers, booleans), else strings."""
    out: RunParameters = {}
    for key, value in _pairs(values).items():
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _pipeline_params(template: str, registry: str, values: list[str]) -> RunParameters:
    """The run's parameters, each typed as the template declares it (``--param source=123`` stays a string);
    what is wrong with a name or a value is the preflight's to report."""
    from tpustream.pipelines.preflight.parameters import parse_parameters
    from tpustream.pipelines.template import load_template, template_parameters

    spec = load_template(template)
    declared = template_parameters(spec) if spec is not None else None
    return parse_parameters(declared, {"registry": registry, **_pairs(values)})


class _ParametersHelp(TyperCommand):
    """A pipeline command whose ``--help`` ends with the pipeline's parameters, built only when help is
    shown (it imports kfp, never torch)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from tpustream.pipelines.preflight.parameters import parameters_help
        from tpustream.pipelines.template import pipeline_parameters

        self.epilog = parameters_help(pipeline_parameters())
        super().format_help(ctx, formatter)


def _tpu_help() -> str:
    """The TPU types ``--tpu`` takes, from the one table (pipelines/tpu.py)."""
    from tpustream.pipelines.tpu import tpu_table_text

    return tpu_table_text() + "."


def _local_file(value: str) -> str:
    """An option naming a local file (the pipeline YAML): ``file:///x`` is ``/x``, as in every other option."""
    if not value.startswith("file:"):
        return value
    from tpustream.storage import io as storage

    return storage.check_uri(value)


@dataclass(frozen=True, kw_only=True)
class CompileOptions:
    """`pipeline compile`'s options: what the YAML fixes at compile time (the TPU type, the pushed images, the
    TPU job's ``Capacity`` and the CPU steps' ``StepResources``, whose fields are options too) and the defaults
    it compiles into the run's parameters. Each field's docstring is its --help."""

    output: str = "tpustream-pipeline.yaml"
    """Pipeline YAML to write."""
    tpu: str = "v3-8"
    """TPU type (Vertex AI custom training; '' = train on the CPU image):"""
    image: str = ""
    """Pushed image for the CPU steps, best by digest (REPO/cpu@sha256:...)."""
    tpu_image: str = ""
    """Pushed image for the TPU trainer, best by digest (REPO/tpu@sha256:...)."""
    serving_image: str = ""
    """Pushed serving image (containers/serve; Cloud Build's serve.ref): the validate step starts the
    candidate's model server in it before promotion. Default: the CPU steps' image."""
    capacity: Capacity = field(default_factory=Capacity)
    resources: StepResources = field(default_factory=StepResources)
    tensorboard: str = ""
    """Vertex AI TensorBoard instance (projects/P/locations/REGION/tensorboards/ID) the TPU training job
    streams its event files to: the default of the pipeline's tensorboard parameter, which `pipeline
    submit|schedule --tensorboard` override. Default: none."""
    notify: list[str] | None = None
    """Compile in Vertex AI Pipelines' email notification (an exit handler with GCPC's
    VertexNotificationEmailOp): these recipients (repeatable, or EMAIL,EMAIL) get the run's final state and a
    link; the default of the notify_emails parameter, which `pipeline submit|schedule --notify` override.
    Default: no email step."""
    notify_webhook: str = ""
    """Default of the notify_webhook parameter: the URL the exit step POSTs the run's state and outcome to
    (JSON). Default: none (`pipeline submit|schedule --notify-webhook` set one per run)."""
    tune: bool = False
    """Compile the hyperparameter search in place of the train step: a Vertex AI HyperparameterTuningJob (Vizier)
    whose trials train on the TPU slice, the best trial's model handed on as the candidate (the tune_space
    parameter: the search space file; '' the default space)."""


@pipeline_app.command("compile")
@from_config(
    CompileOptions,
    tpu=Opt(more_help=_tpu_help()),
    kind=Opt(name="--capacity"),
    cpu=Opt(name="--step-cpu"),
    memory=Opt(name="--step-memory"),
    notify=Opt(name="--notify", metavar="EMAIL"),
    notify_webhook=Opt(metavar="URL"),
)
def pipeline_compile(options: CompileOptions) -> None:
    """Compile the DAG for Vertex AI Pipelines (TPU type, pushed images and the CPU steps' sizes fixed at
    compile time)."""
    from tpustream.pipelines.compile import compile_pipeline
    from tpustream.run.notify import check_emails, redact_url

    output = _local_file(options.output)
    recipients = check_emails(
        options.notify
    )  # --notify "" is none: no email step (Vertex refuses it without one)
    try:
        compile_pipeline(
            output,
            tpu=options.tpu or None,
            cpu_image=options.image,
            tpu_image=options.tpu_image,
            capacity=options.capacity,
            resources=options.resources,
            serve_image=options.serving_image,
            tensorboard=options.tensorboard,
            notify_emails=recipients,
            notify_webhook=options.notify_webhook,
            tune=options.tune,
        )
    except OSError as exc:
        fail(f"--output {output}: cannot write the YAML ({exc.strerror or exc}): give a local file path")
    sizes = options.resources
    typer.echo(
        f"compiled: {output} (train on {options.tpu or 'the CPU image'}, {options.capacity.kind} capacity; "
        f"CPU steps {sizes.cpu} CPU {sizes.memory}, evaluate {sizes.eval_cpu} CPU {sizes.eval_memory}"
        + (f"; TensorBoard {options.tensorboard}" if options.tensorboard else "")
        + (f"; email {', '.join(recipients)}" if recipients else "")
        + ("; no email step: --notify gave no address" if options.notify and not recipients else "")
        + (f"; webhook {redact_url(options.notify_webhook)}" if options.notify_webhook else "")
        + ("; tuning job (Vizier) in place of the train step" if options.tune else "")
        + ")"
    )


@dataclass(frozen=True, kw_only=True)
class VertexRun:
    """The options `pipeline submit` and `pipeline schedule` share (`pipeline preflight` the first six): where
    and as whom a run of a compiled template goes to Vertex AI Pipelines, and what it is given. Each field's
    docstring is its --help."""

    template: str
    """Compiled pipeline YAML (local or gs://)."""
    project: str
    """Google Cloud project."""
    pipeline_root: str
    """gs:// root for run artifacts (shards, models, metrics)."""
    registry: str
    """gs:// model registry (champion.json, versions/)."""
    region: str = "us-central1"
    """Vertex AI region."""
    service_account: str | None = None
    """Service account the run acts as (default: the project's Compute Engine default service account)."""
    param: list[str] | None = None
    """Pipeline parameter KEY=VALUE (repeatable), over the template's defaults."""
    label: list[str] | None = None
    """Run label KEY=VALUE (repeatable)."""
    skip_preflight: bool = False
    """Skip the IAM, bucket, TPU region and quota checks of `pipeline preflight` (the parameter names and
    types are still checked: that needs no credentials)."""
    tensorboard: str | None = None
    """Vertex AI TensorBoard instance (projects/P/locations/REGION/tensorboards/ID, in the run's region) the TPU
    training job streams its event files to; sets the pipeline's tensorboard parameter. Default: the
    template's ('' = none)."""
    experiment: str | None = None
    """Vertex AI Experiment the run joins (created now if missing; lowercase letters, digits, hyphens), to
    compare runs and their metrics side by side; also set as the pipeline's experiment parameter, which a step
    of each run acts on (a schedule's runs carry no experiment of their own)."""
    notify: list[str] | None = None
    """Email the run's final state (succeeded, failed, cancelled) and a link to it: Vertex AI Pipelines' own
    notification (repeatable, or EMAIL,EMAIL). Sets the notify_emails parameter; the template must be compiled
    with --notify (README, Notifications)."""
    notify_webhook: str | None = None
    """POST the run's state, what it decided (skipped, refused, kept, promoted, deployed) with its one-line
    reason, its report's URI and its console link as JSON to this URL when it ends, however it ends (a Slack
    incoming webhook posts the text as is). Sets the notify_webhook parameter, which whoever sees the run sees
    too (README, Notifications); tpustream logs only its host."""

    def arguments(self) -> dict[str, Any]:
        """``submit_pipeline``'s and ``schedule_pipeline``'s arguments, the template's first; the run's
        parameters typed as the template declares them."""
        template = _local_file(self.template)
        return {
            "template": template,
            "project": self.project,
            "region": self.region,
            "pipeline_root": self.pipeline_root,
            "parameters": _pipeline_params(template, self.registry, self.param or []),
            "service_account": self.service_account,
            "labels": {key: str(value) for key, value in _params(self.label or []).items()},
            "skip_preflight": self.skip_preflight,
            "tensorboard": self.tensorboard,
            "experiment": self.experiment,
            "notify_emails": self.notify,
            "notify_webhook": self.notify_webhook,
        }


vertex_run_options = from_config(
    VertexRun,
    param=Opt(name="--param", metavar="KEY=VALUE"),
    label=Opt(name="--label", metavar="KEY=VALUE"),
    skip_preflight=Opt(name="--skip-preflight"),
    notify=Opt(name="--notify", metavar="EMAIL"),
    notify_webhook=Opt(metavar="URL"),
)


@pipeline_app.command("preflight", cls=_ParametersHelp)
@from_config(
    VertexRun,
    exclude={"label", "skip_preflight", "tensorboard", "experiment", "notify", "notify_webhook"},
    param=Opt(name="--param", metavar="KEY=VALUE"),
)
def pipeline_preflight(
    run: VertexRun,
    schedule: Annotated[
        bool, typer.Option("--schedule", help="Also check what `pipeline schedule` needs.")
    ] = False,
) -> None:
    """Check a run before submitting it: parameter names and types (no credentials needed), the TPU type's
    region, IAM (actAs on the service account, project roles), the buckets and their regions, TPU quota.

    One line per check (ok, warn or fail, and its fix); exit 1 if any fails. Submit and schedule run it."""
    from tpustream.pipelines.preflight.cloud import preflight
    from tpustream.pipelines.preflight.findings import FAIL

    arguments = run.arguments()
    findings = preflight(
        arguments["template"],
        project=run.project,
        region=run.region,
        pipeline_root=run.pipeline_root,
        registry=run.registry,
        service_account=run.service_account,
        parameters=arguments["parameters"],
        schedule=schedule,
    )
    for finding in findings:
        typer.echo(finding.line())
    if any(finding.status == FAIL for finding in findings):
        raise typer.Exit(1)


@pipeline_app.command("submit", cls=_ParametersHelp)
@vertex_run_options
def pipeline_submit(
    run: VertexRun,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Turn caching off for every step (it is compiled off already).")
    ] = False,
) -> None:
    """Submit one run to Vertex AI Pipelines (after the checks of `pipeline preflight`).

    --param source=SOURCE is required: the pipeline's default source is the bundled digits (run-local's demo)."""
    from tpustream.pipelines import submit

    name = submit.submit_pipeline(**run.arguments(), no_cache=no_cache)
    typer.echo(f"submitted: {name}" + (f" (experiment {run.experiment})" if run.experiment else ""))


@pipeline_app.command("schedule", cls=_ParametersHelp)
@vertex_run_options
def pipeline_schedule(
    run: VertexRun,
    cron: Annotated[
        str, typer.Option(help='Cron, e.g. "0 3 * * 1" (optionally "TZ=Europe/Paris 0 3 * * 1").')
    ],
) -> None:
    """Schedule retraining (at most one concurrent run), after the checks of `pipeline preflight`.

    --param source=SOURCE is required: the pipeline's default source is the bundled digits (run-local's demo)."""
    from tpustream.pipelines import submit

    name = submit.schedule_pipeline(**run.arguments(), cron=cron)
    typer.echo(f"scheduled: {name}" + (f" (experiment {run.experiment})" if run.experiment else ""))


@dataclass(frozen=True, kw_only=True)
class LocalDemo:
    """`pipeline run-local`'s defaults unlike the pipeline's own (pipelines/training.py), each field's
    docstring saying why: the demo trains the bundled digits (1,797 8x8 images) on this machine's CPUs, through
    XLA's 4 virtual devices, offline, in about a minute. Every other parameter of a run-local run is the
    pipeline's default, as a Vertex run's (tests/unit/test_option_layers.py checks that only these differ)."""

    model_name: str = "tiny"
    """resnet50 takes hours an epoch on CPU XLA; the tiny model seconds."""
    epochs: int = 8
    """The tiny model's val top-1 on digits levels off by then: a run of about a minute."""
    batch_size: int = 16
    """Digits has 1,600 train images: 128 per device on 4 devices would be 3 steps an epoch."""
    bf16: bool = False
    """bfloat16 is the TPU's fast path; CPU XLA emulates it, slower."""
    workers: int = 2
    """Loader processes on a laptop's few cores, beside the XLA devices' threads."""
    pretrained: str = ""
    """Offline: the pipeline's default fetches the model's published weights (the tiny model has none)."""


@dataclass(frozen=True, kw_only=True)
class RunLocalOptions:
    """`pipeline run-local`'s options, each default written once: ``LocalDemo``'s for what the demo changes;
    for the rest the pipeline's own, which a run-local run leaves to the pipeline (``None``: not given) as a
    Vertex run does, or reads where the pipeline does (``ShardConfig.source``). Each field's docstring is its
    --help."""

    root: str = "demo-output/pipeline"
    """Local directory for the run (pipeline root, registry)."""
    source: str = ShardConfig.source
    """SOURCE (default: the bundled digits)."""
    model: str = LocalDemo.model_name
    """Model name."""
    epochs: int = LocalDemo.epochs
    """Epochs."""
    batch_size: int = LocalDemo.batch_size
    """Per-device batch (4 virtual XLA CPU devices)."""
    lr: float | None = None
    """Peak LR. Default (or 0): the pipeline's, the scaled default (the model's base LR at a global batch of
    256, scaled with the batch); for a fine-tuning run (--param pretrained=SPEC) the model family's factor times
    it (0.3 for the ResNets, 3 for convnext_tiny, 0.03 for the EfficientNets, a tenth for the others), for a
    warm-started one (the champion of an earlier run) a
    tenth; as a Vertex run's."""
    num_shards: int | None = None
    """Train shards. Default (or 0): the pipeline's, auto, as a Vertex run's."""
    exclude_keys: str | None = None
    """Leave out the samples listed in FILE (local or gs://), one source a line (label_issues.json's source):
    the pipeline's exclude_keys. Default: none."""
    relabel: str | None = None
    """Give samples another class: FILE (local or gs://) of CSV rows source,class: the pipeline's relabel.
    Default: none."""
    param: list[str] | None = None
    """Pipeline parameter KEY=VALUE (repeatable)."""
    notify_webhook: str | None = None
    """POST the run's state and outcome to this URL when it ends, as a Vertex run does (the email notification
    is Vertex's own: a local run cannot send it)."""
    tune: bool = False
    """Search hyperparameters in place of the train step (optuna, trial by trial, here; a Vizier tuning job
    on Vertex): the best trial's model is the candidate (--param tune_space=FILE: the search space)."""

    def parameters(self) -> RunParameters:
        """The run's pipeline parameters: the options over ``LocalDemo``'s, ``--param``'s over both,
        ``--notify-webhook`` over ``--param notify_webhook``; none for an option not given, so the pipeline's
        own default applies, as on Vertex."""
        demo = LocalDemo(model_name=self.model, epochs=self.epochs, batch_size=self.batch_size)
        given = {
            name: value
            for name, value in (
                ("lr", self.lr),
                ("num_shards", self.num_shards),
                ("exclude_keys", self.exclude_keys),
                ("relabel", self.relabel),
            )
            if value is not None
        }
        parameters: RunParameters = {
            **dataclasses.asdict(demo),
            "source": self.source,
            **given,
            **_params(self.param or []),
        }
        if self.notify_webhook is not None:
            from tpustream.run.notify import check_webhook

            parameters["notify_webhook"] = check_webhook(self.notify_webhook)
        return parameters


@pipeline_app.command("run-local")
@from_config(
    RunLocalOptions,
    param=Opt(name="--param", metavar="KEY=VALUE"),
    notify_webhook=Opt(name="--notify-webhook", metavar="URL"),
)
def pipeline_run_local(
    run: RunLocalOptions,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="Print every task's full log here instead of to the log file."),
    ] = False,
) -> None:
    """Run the whole DAG here through kfp.local on CPU XLA; prints task outcomes and where everything landed.

    The executors' full logs go to ROOT/logs/run-local-TIME.log (printed first); -v prints them here.
    Random initial weights unless --param pretrained=SPEC: nothing is fetched from the internet by default.
    Every parameter is the pipeline's default but the demo's model, epochs, batch, bf16 (off) and workers (2),
    chosen to train the bundled digits here in about a minute."""
    from tpustream.dataset.label_edits import PIPELINE_PARAMETERS, edit_source
    from tpustream.pipelines.local import PipelineFailed, run_local
    from tpustream.registry.store import champion_status, version_uri
    from tpustream.sources.dispatch import open_source

    parameters = run.parameters()
    source = open_source(str(parameters["source"]))  # a bad source fails here, not three tasks deep
    exclude_keys, relabel = (str(parameters.get(name) or "") or None for name in PIPELINE_PARAMETERS)
    edits = ShardConfig(output=run.root, exclude_keys=exclude_keys, relabel=relabel)
    try:  # and a bad label-edits file, or one naming samples the source lacks
        edit_source(source, edits, dataset_uri=None, options=PIPELINE_PARAMETERS)
    except TpustreamError as exc:
        fail(str(exc))
    log_path = None
    try:
        root = _local_file(run.root)
    except TpustreamError as exc:
        fail(f"--root: {exc}")
    if not verbose:
        log_path = os.path.join(
            os.path.abspath(_local_file(root)), "logs", time.strftime("run-local-%Y%m%d-%H%M%S.log")
        )
        typer.echo(f"running the pipeline locally; full logs: {log_path}")
    try:
        registry = parameters.pop("registry", None)  # --param registry=DIR: the run's registry
        out = run_local(
            root=root,
            registry=str(registry) if registry else None,
            log_path=log_path,
            tune=run.tune,
            **parameters,
        )
    except PipelineFailed as exc:  # a task failed: which and why (its reason is printed under it, too)
        fail(f"{exc}; full log: {log_path}" if log_path else f"{exc} (its log is above)")
    status = champion_status(out.registry)
    if out.outcome is not None:
        typer.echo(f"outcome: {out.outcome.line()}")
    if out.data == "skip":
        typer.echo(
            "data: no new data since the last run: shards and training skipped (--param retrain=true "
            "trains anyway)"
        )
    typer.echo(f"pipeline root (shards, model, metrics): {out.pipeline_root}")
    typer.echo(f"registry: {out.registry}")
    champion = status.champion
    if champion:
        typer.echo(
            f"champion: version {champion.version}, top-1 {champion.metrics['top1']:.4f} "
            f"({version_uri(out.registry, champion.version)})"
        )
    else:
        typer.echo("champion: none")
    if out.report:
        typer.echo(f"report (open in a browser): {out.report}")
