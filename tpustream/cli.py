"""The ``tpustream`` command line: argument parsing lives here and nowhere else."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand, TyperGroup

from tpustream.errors import TpustreamError
from tpustream.models import MODEL_NAMES
from tpustream.sources import source_help

__all__ = ["app"]

log = logging.getLogger("tpustream")


def _user_error_message(exc: Exception) -> str | None:
    """The one line to print for an error the user can act on, or None for a bug (keep its traceback).

    User errors: the `TpustreamError` family (``ConfigError``: what the config dataclasses raise for an
    option out of range, in ``__post_init__``); and a cloud API's refusal or missing credentials. A bare
    ``ValueError`` is a bug: it keeps its traceback."""
    if isinstance(exc, TpustreamError):
        return str(exc)
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import DefaultCredentialsError, GoogleAuthError

    if isinstance(exc, DefaultCredentialsError):
        return (
            "no Google Cloud credentials found: run `gcloud auth application-default login`, or set "
            "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file"
        )
    if isinstance(exc, GoogleAPIError | GoogleAuthError):
        return str(exc)
    return None


class _OneLineErrors(TyperGroup):
    """Every command runs inside this group's ``invoke``: the one place a user error becomes one line on
    stderr and exit code 2 (with ``-v`` its traceback is logged too). Anything else keeps its traceback."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            message = _user_error_message(exc)
            if message is None:
                raise
            log.debug("traceback of the error below", exc_info=exc)
            _fail(message)


app = typer.Typer(
    cls=_OneLineErrors,
    help="tpustream: image dataset -> WebDataset shards on GCS -> ResNet on TPU pods -> evaluated, promoted model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
shards_app = typer.Typer(
    help="Create, verify and check WebDataset tar shards + manifest.", no_args_is_help=True
)
bench_app = typer.Typer(
    help="Benchmarks: one JSON line per result, ratios against the baseline.", no_args_is_help=True
)
app.add_typer(shards_app, name="shards")
pipeline_app = typer.Typer(
    help="Compile, submit, schedule or run locally the KFP training DAG.", no_args_is_help=True
)
champion_app = typer.Typer(help="Inspect the model registry's champion.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(champion_app, name="champion")
app.add_typer(pipeline_app, name="pipeline")


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted, not the stream of the first call:
    an embedding caller (a test runner's CliRunner, a notebook) may swap and close stderr between calls."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[_CurrentStderr()],
    )


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code)


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False) -> None:
    _setup_logging(verbose)


# 2**26 px (see tpustream.imagecodec.DEFAULT_MAX_PIXELS for why): literal here so --help needs no numpy.
DEFAULT_MAX_PIXELS = 1 << 26
MaxPixelsOption = typer.Option(
    "--max-pixels",
    min=64,
    help="Pixel budget: images whose header claims more pixels (width x height) are skipped and counted, "
    "never decoded (default 64 Mi = 8192x8192: above real photos, below decompression bombs).",
)


@shards_app.command("create")
def shards_create(
    source: Annotated[
        str,
        typer.Option(help=source_help()),
    ] = "digits",
    output: Annotated[str, typer.Option(help="Dataset URI (local directory or gs://bucket/prefix).")] = ...,  # type: ignore[assignment]
    num_shards: Annotated[
        int | None, typer.Option(help="Train shards (default: ~2,000 samples each, at least 8).")
    ] = None,
    val_shards: Annotated[
        int | None, typer.Option(help="Val shards (default: about the size of train shards).")
    ] = None,
    val_fraction: Annotated[
        float | None,
        typer.Option(help="Stratified val fraction (default: the source's own split, else 0.1)."),
    ] = None,
    upsample: Annotated[
        int, typer.Option(help="Repeat the train split K times (e.g. 50k CIFAR -> 1.28M).")
    ] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the split and shuffle.")] = 0,
    max_side: Annotated[
        int | None, typer.Option(help="Downsize images whose longer side exceeds PX at write time.")
    ] = None,
    max_pixels: Annotated[int, MaxPixelsOption] = DEFAULT_MAX_PIXELS,
    workers: Annotated[int, typer.Option(help="Parallel shard writers (processes).")] = max(
        1, os.cpu_count() or 1
    ),
    overwrite: Annotated[
        bool,
        typer.Option(
            help="Replace a complete dataset at --output. Checks run first, but once writing starts the old "
            "dataset stops being one (its manifest.json is removed) even if this run then fails: "
            "re-run to finish the new dataset."
        ),
    ] = False,
    strict: Annotated[
        bool, typer.Option(help="Fail on the first unreadable image or non-image file.")
    ] = False,
) -> None:
    """Plan, write and commit WebDataset shards; resumes an interrupted run at the same --output."""
    from tpustream import shards
    from tpustream.shard_plan import ShardConfig

    config = ShardConfig(
        source=source,
        output=output,
        num_shards=num_shards,
        val_shards=val_shards,
        val_fraction=val_fraction,
        upsample=upsample,
        seed=seed,
        max_side=max_side,
        max_pixels=max_pixels,
        workers=workers,
        overwrite=overwrite,
        strict=strict,
    )
    _, summary = shards.create_shards(config)
    typer.echo(summary.line())


@shards_app.command("verify")
def shards_verify(
    uri: Annotated[str, typer.Argument(help="Dataset URI (the directory holding manifest.json).")],
    workers: Annotated[int, typer.Option(help="Shards checked concurrently.")] = 8,
    deep: Annotated[
        bool, typer.Option(help="Also decode every image as the loader does; list each bad sample by key.")
    ] = False,
    max_pixels: Annotated[int, MaxPixelsOption] = DEFAULT_MAX_PIXELS,
) -> None:
    """Re-read every shard; check sample counts, sizes and sha256 against the manifest (--deep: and images)."""
    from tpustream.manifest import verify_shards

    checked, problems = verify_shards(uri, workers=workers, deep=deep, max_pixels=max_pixels)
    if problems:
        for problem in problems:
            typer.echo(f"BAD {problem}", err=True)
        bad = len({problem.split(": ", 1)[0] for problem in problems})
        if len(problems) > bad:
            _fail(f"{len(problems)} problems in {bad} of {checked} shards", code=1)
        _fail(f"{len(problems)} of {checked} shards failed verification", code=1)
    typer.echo(f"ok: {checked} shards match {uri}/manifest.json")


# The defaults are tpustream.datacheck.DataCheckThresholds' (repeated so --help imports nothing more), each
# explained there; tests/unit/test_option_layers.py keeps them equal.
@shards_app.command("check")
def shards_check(
    dataset: Annotated[str, typer.Argument(help="Dataset URI (the directory holding manifest.json).")],
    baseline: Annotated[
        str | None,
        typer.Option(help="Compare with this dataset: new/vanished classes, class shares, skipped rate."),
    ] = None,
    report: Annotated[
        str | None,
        typer.Option(help="Write the Markdown report to FILE.md (local or gs://) instead of printing it."),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON (stdout) instead of Markdown.")
    ] = False,
    warn_only: Annotated[bool, typer.Option(help="List anomalies but exit 0.")] = False,
    max_duplicate_fraction: Annotated[
        float, typer.Option(help="Exact copies under other names, per distinct image of a split.")
    ] = 0.01,
    max_leaked_images: Annotated[int, typer.Option(help="Images (by content) in both train and val.")] = 0,
    max_skipped_rate: Annotated[
        float, typer.Option(help="Skipped images and rejected rows per source item.")
    ] = 0.05,
    max_class_share_shift: Annotated[
        float,
        typer.Option(help="A class's share of the images vs --baseline's (absolute, 0.10 = 10 points)."),
    ] = 0.10,
    max_skipped_rate_increase: Annotated[
        float, typer.Option(help="Rise of the skipped rate vs --baseline's (absolute).")
    ] = 0.02,
    examples: Annotated[int, typer.Option(help="File names listed per finding.", min=1)] = 5,
) -> None:
    """Is this dataset fit to train on? Duplicates, train/val leakage, empty classes, skipped rate, and
    drift from --baseline. Exit 1 with one line per anomaly on stderr (0 with --warn-only)."""
    from tpustream import storage
    from tpustream.datacheck import DataCheckThresholds, check_dataset

    thresholds = DataCheckThresholds(
        max_duplicate_fraction=max_duplicate_fraction,
        max_leaked_images=max_leaked_images,
        max_skipped_rate=max_skipped_rate,
        max_class_share_shift=max_class_share_shift,
        max_skipped_rate_increase=max_skipped_rate_increase,
    )
    result = check_dataset(dataset, baseline, thresholds, max_examples=examples)
    document_on_stdout = json_output or not report  # then every other line goes to stderr
    if report:
        storage.write_bytes(report, result.to_markdown().encode(), content_type="text/markdown")
        typer.echo(f"report: {report}", err=document_on_stdout)
    if document_on_stdout:
        typer.echo(json.dumps(result.to_json(), indent=1) if json_output else result.to_markdown())
    for anomaly in result.anomalies:
        typer.echo(f"ANOMALY {anomaly.code}: {anomaly.reason}", err=True)
    count = len(result.anomalies)
    if count and not warn_only:
        _fail(
            f"{count} anomal{'y' if count == 1 else 'ies'} in {result.dataset} (--warn-only to accept)",
            code=1,
        )
    if not count:
        typer.echo(f"ok: no anomalies in {result.dataset}", err=document_on_stdout)


class _EarlySigterm:
    """SIGTERM in `tpustream train`'s first seconds (importing torch and torch_xla, setting up), before the
    trainer's own handler exists: recorded instead of fatal (exit 143). The trainer's handler takes over
    and finds it ``requested``, so it stops before the first step: exit 75, run again to resume."""

    requested = False

    def __init__(self) -> None:
        self.previous: Any = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.requested = True

    def install(self) -> _EarlySigterm:
        try:
            self.previous = signal.signal(signal.SIGTERM, self)
        except ValueError:  # not the main thread (a test runner's): leave SIGTERM alone
            self.previous = None
        return self

    def uninstall(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None


@app.command("train")
def train_cmd(
    data: Annotated[str, typer.Option(help="Dataset URI (holds manifest.json).")],
    output: Annotated[str, typer.Option(help="Model/checkpoint URI (local or gs://).")],
    model: Annotated[str, typer.Option(help=" | ".join(MODEL_NAMES) + ".")] = "resnet50",
    epochs: Annotated[int, typer.Option(help="Epochs.")] = 10,
    batch_size: Annotated[int, typer.Option(help="Per-device batch size.")] = 128,
    global_batch_size: Annotated[
        int | None, typer.Option(help="Global batch instead of --batch-size (must divide over the devices).")
    ] = None,
    lr: Annotated[float | None, typer.Option(help="Peak LR (default 0.1 x global batch / 256).")] = None,
    momentum: Annotated[float, typer.Option(help="SGD momentum.")] = 0.9,
    weight_decay: Annotated[float, typer.Option(help="SGD weight decay (not on norms/biases).")] = 1e-4,
    label_smoothing: Annotated[float, typer.Option(help="Label smoothing.")] = 0.1,
    warmup_epochs: Annotated[float, typer.Option(help="Linear LR warmup, in epochs.")] = 1.0,
    bf16: Annotated[bool, typer.Option(help="bfloat16 autocast.")] = False,
    strategy: Annotated[
        str, typer.Option(help="spmd (one process per host) or replicas (one per device).")
    ] = "spmd",
    resume: Annotated[
        str, typer.Option(help="auto | never | URI of a checkpoint or output directory.")
    ] = "auto",
    log_steps: Annotated[int, typer.Option(help="Log every N steps.", min=1)] = 20,
    checkpoint_minutes: Annotated[float, typer.Option(help="Also write `last` every N minutes.")] = 30.0,
    keep_checkpoints: Annotated[
        int, typer.Option(help="Newest checkpoint files kept (and always those `last` and `best` name).")
    ] = 2,
    workers: Annotated[int, typer.Option(help="Loader worker processes per host.")] = 4,
    input_size: Annotated[
        int | None,
        typer.Option(
            help="Input side (default: the images' median shorter side, rounded down to a multiple of 8, "
            "within [16, 224]; model.json records how it was chosen)."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of init, data order and augmentation.")] = 0,
    preemption_sync_seconds: Annotated[
        float, typer.Option(help="Multi-host slice: seconds the hosts wait for each other's stop step.")
    ] = 10.0,
    compile_cache: Annotated[
        str | None,
        typer.Option(
            help="Persistent XLA compilation cache (local dir or gs://): a restarted or later run of the same "
            "program loads its executables instead of compiling (process 0 writes, the other hosts read)."
        ),
    ] = None,
    init_from: Annotated[
        str | None,
        typer.Option(
            help="Warm start from these weights: a model artifact (model.json), a registry (its champion), a "
            "checkpoint (.pt) or a training output. Same classes: all weights; other classes: the backbone and "
            "a new head. The optimizer and LR schedule start fresh; model.json records it (init)."
        ),
    ] = None,
    patience: Annotated[
        int,
        typer.Option(
            help="Early stopping: stop after N epochs without a val top-1 gain of more than --min-delta; the "
            "model is the best epoch's (0: off).",
            min=0,
        ),
    ] = 0,
    min_delta: Annotated[
        float, typer.Option(help="Early stopping: the val top-1 gain (0-1) that counts as one.", min=0.0)
    ] = 0.0,
) -> None:
    """Train a ResNet with PyTorch/XLA (SPMD or replicas), checkpointing to --output; resumable. SIGTERM or
    Ctrl-C: the step in flight finishes, `last` is written, exit 75 (run again to resume)."""
    early = _EarlySigterm().install()  # before these imports, which take seconds
    from tpustream import train

    try:
        config = train.TrainConfig(
            data=data,
            output=output,
            model=model,
            epochs=epochs,
            batch_size=batch_size,
            global_batch_size=global_batch_size,
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            label_smoothing=label_smoothing,
            warmup_epochs=warmup_epochs,
            bf16=bf16,
            strategy=strategy,
            resume=resume,
            log_steps=log_steps,
            checkpoint_minutes=checkpoint_minutes,
            keep_checkpoints=keep_checkpoints,
            workers=workers,
            input_size=input_size,
            seed=seed,
            preemption_sync_seconds=preemption_sync_seconds,
            compile_cache=compile_cache,
            init_from=init_from,
            patience=patience,
            min_delta=min_delta,
        )
        if config.strategy == "replicas":  # one process per device, each with its own handler from its start
            if early.requested:
                raise train.Preempted("SIGTERM before training started: nothing to save")
            early.uninstall()
        card = train.train(config)
    except train.Preempted as exc:
        train.exit_preempted(exc)  # exit 75
    except KeyboardInterrupt:  # Ctrl-C before the trainer's handler existed (importing torch, setting up)
        typer.echo("tpustream: Ctrl-C before the first step: nothing to save; exit 130", err=True)
        train.exit_now(130)
    finally:
        early.uninstall()
    if card:
        metrics = card.metrics
        early_stop = f"; stopped early after epoch {len(card.history)}" if card.stopped_early else ""
        typer.echo(
            f"model: {output} (best epoch {metrics['epoch']}, val top-1 {metrics['val_top1']:.4f}{early_stop})"
        )


@app.command("evaluate")
def evaluate_cmd(
    model: Annotated[str, typer.Option(help="Model artifact URI (model.pt + model.json).")],
    data: Annotated[str, typer.Option(help="Dataset URI; its val split is evaluated.")],
    output: Annotated[str, typer.Option(help="Where metrics.json is written.")],
    registry: Annotated[
        str | None, typer.Option(help="Also evaluate this registry's champion on the same shards.")
    ] = None,
    workers: Annotated[int, typer.Option(help="Loader worker processes.")] = 2,
) -> None:
    """Top-1/top-5/loss, per-class accuracy and confusion matrix on the val split (XLA if PJRT_DEVICE is set)."""
    from tpustream import evaluate

    result = evaluate.evaluate(model, data, output, registry=registry, workers=workers)
    for role, entry in (("candidate", result.candidate), ("champion", result.champion)):
        if entry:
            version = f" (version {entry['version']})" if role == "champion" else ""
            typer.echo(
                f"{role}{version}: top-1 {entry['top1']:.4f} top-5 {entry['top5']:.4f} loss {entry['loss']:.4f} "
                f"on {entry['num_samples']} val samples"
            )
    typer.echo(f"metrics: {output.rstrip('/')}/metrics.json")


@app.command("promote")
def promote_cmd(
    candidate: Annotated[str, typer.Option(help="Candidate model artifact URI.")],
    metrics: Annotated[str, typer.Option(help="metrics.json (or its directory) from tpustream evaluate.")],
    registry: Annotated[str, typer.Option(help="Registry URI (versions/, champion.json, events/).")],
    metric: Annotated[str, typer.Option(help="top1 | top5 | loss.")] = "top1",
    min_delta: Annotated[float, typer.Option(help="Required improvement over the champion.")] = 0.0,
    max_class_drop: Annotated[
        float | None, typer.Option(help="Refuse if any class's accuracy drops by more than this.")
    ] = None,
    vertex_model: Annotated[
        str | None, typer.Option(help="Also publish to this Vertex AI Model Registry model (display name).")
    ] = None,
    vertex_project: Annotated[
        str | None, typer.Option(help="Vertex project (default GOOGLE_CLOUD_PROJECT).")
    ] = None,
    vertex_region: Annotated[str | None, typer.Option(help="Vertex region (default us-central1).")] = None,
    serving_image: Annotated[
        str | None,
        typer.Option(
            help="With --vertex-model: the pushed serve image (containers/serve; Cloud Build's serve.ref). "
            "Default TPUSTREAM_SERVING_IMAGE."
        ),
    ] = None,
    validation: Annotated[
        str | None,
        typer.Option(
            help="validation.json (or its directory) from `tpustream validate-serving` on this candidate: "
            "promote only if it passed for this model.pt (the pipeline always gives it)."
        ),
    ] = None,
) -> None:
    """Promote the candidate if it beats the champion on the same data; atomic, idempotent.

    With --vertex-model, a promoted model is uploaded to the Vertex AI Model Registry from its immutable
    registry version with the serving image, and gets the `champion` alias there (deployable as is)."""
    from tpustream import promote, vertex

    if validation:
        from tpustream.validate_serving import require_validated

        require_validated(validation, candidate)
    target = vertex.target_from_env(vertex_model, vertex_project, vertex_region, serving_image)
    outcome = promote.promote(
        candidate,
        metrics,
        registry,
        metric=metric,
        min_delta=min_delta,
        max_class_drop=max_class_drop,
        vertex=target,
    )
    if outcome.get("vertex"):
        typer.echo(f"vertex: {outcome['vertex']['versioned_name']} (alias champion)")
    elif "vertex" in outcome:
        typer.echo("vertex: nothing uploaded (only promoted models are)")
    if outcome["promoted"]:
        typer.echo(f"promoted: version {outcome['version']} is the champion ({outcome['reason']})")
    else:
        typer.echo(f"not promoted: {outcome['reason']}")


VertexProjectOption = Annotated[
    str | None, typer.Option(help="Vertex project (default GOOGLE_CLOUD_PROJECT).")
]
VertexRegionOption = Annotated[
    str | None, typer.Option(help="Vertex region (default GOOGLE_CLOUD_REGION, us-central1).")
]


def _traffic(split: dict[str, int]) -> str:
    return ", ".join(f"{deployed_id} {share}%" for deployed_id, share in split.items()) or "none"


@app.command("deploy")
def deploy_cmd(
    endpoint: Annotated[
        str,
        typer.Option(
            help="Endpoint display name (created if absent) or resource name projects/P/locations/L/endpoints/ID."
        ),
    ],
    model: Annotated[
        str,
        typer.Option(
            help="Vertex AI model: the display name promote published (--vertex-model; its `champion` version) or "
            "a resource name projects/P/locations/L/models/ID[@VERSION|@ALIAS]."
        ),
    ],
    traffic: Annotated[
        int,
        typer.Option(
            min=0,
            max=100,
            help="Percent of the endpoint's traffic for this version; the models serving keep the rest in their "
            "proportions (an endpoint serving nothing gives it 100). Deploying a served version again sets its share.",
        ),
    ] = 10,
    registry: Annotated[
        str | None,
        typer.Option(
            help="Deploy the version uploaded from this registry's champion (an error if Vertex lacks it)."
        ),
    ] = None,
    machine_type: Annotated[str, typer.Option(help="Serving machine type.")] = "n1-standard-4",
    min_replicas: Annotated[int, typer.Option(min=1, help="Replicas always running.")] = 1,
    max_replicas: Annotated[int, typer.Option(min=1, help="Most replicas under load.")] = 1,
    project: VertexProjectOption = None,
    region: VertexRegionOption = None,
) -> None:
    """Deploy a Model Registry version (the champion) to a Vertex AI endpoint as a canary; undo with `rollback`."""
    from tpustream import deploy

    outcome = deploy.deploy(
        model,
        endpoint,
        traffic_percent=traffic,
        machine_type=machine_type,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        registry=registry,
        project=project,
        region=region,
    )
    done = "deployed" if outcome["deployed"] else "already deployed"
    typer.echo(f"{done}: {outcome['model']} on {outcome['endpoint']} as {outcome['deployed_model_id']}")
    typer.echo(f"traffic: {_traffic(outcome['traffic_split'])}")
    if outcome["previous_split"]:
        typer.echo(f"undo: tpustream rollback --endpoint {outcome['endpoint']}")


@app.command("rollback")
def rollback_cmd(
    endpoint: Annotated[str, typer.Option(help="Endpoint display name or resource name.")],
    project: VertexProjectOption = None,
    region: VertexRegionOption = None,
) -> None:
    """Undo the latest `tpustream deploy` on an endpoint: the models that served before it get their recorded
    shares back and the canary is undeployed."""
    from tpustream import deploy

    outcome = deploy.rollback(endpoint, project=project, region=region)
    typer.echo(
        f"rolled back: undeployed {outcome['undeployed']} (model {outcome['model']}) from {outcome['endpoint']}"
    )
    typer.echo(f"traffic: {_traffic(outcome['traffic_split'])}")


@app.command("validate-serving")
def validate_serving_cmd(
    model: Annotated[
        str,
        typer.Argument(
            help="Candidate model directory (model.pt + model.json), or a registry: its champion."
        ),
    ],
    data: Annotated[
        str | None,
        typer.Option(help="Dataset whose val images are sent (default: the one model.json names)."),
    ] = None,
    samples: Annotated[
        int, typer.Option(min=1, help="Val images to send and compare with evaluation's answers.")
    ] = 64,
    output: Annotated[
        str | None, typer.Option(help="Write validation.json here (what `promote --validation` checks).")
    ] = None,
    timeout: Annotated[
        float, typer.Option(min=1, help="Seconds the server may take to become healthy.")
    ] = 180,
) -> None:
    """Start the serving container's model server on MODEL as Vertex AI would, send it val images and malformed
    requests, and check its answers equal `tpustream evaluate`'s; exit 1 if any check fails (not promotable)."""
    from tpustream.validate_serving import ServingValidationError, validate_serving

    try:
        report = validate_serving(model, data=data, samples=samples, output=output, timeout=timeout)
    except ServingValidationError as exc:
        typer.echo(f"validation failed: {exc}", err=True)
        raise typer.Exit(1) from exc
    statuses = ", ".join(f"{case['case']} {case['status']}" for case in report["malformed"])
    typer.echo(
        f"validated {report['model']} in the serving container: {report['agreed']}/{report['samples']} val "
        f"images answered as evaluation did (top-1 probability within {report['max_probability_diff']:.2g}; "
        f"p50 {report['latency_ms_p50']} ms per request); malformed requests: {statuses}; server up in "
        f"{report['startup_s']} s"
    )
    if output:
        typer.echo(f"report: {output.rstrip('/')}/validation.json")


@app.command("predict")
def predict_cmd(
    inputs: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="IMAGE_OR_URI...",
            help="Images (JPEG, PNG, PPM, WebP, BMP, TIFF, GIF, PGM: what `shards create` accepts), "
            "directories or gs:// prefixes of images (other files are skipped and counted), .tar shards, or "
            "datasets (manifest.json: their val split).",
            show_default=False,
        ),
    ] = None,
    model: Annotated[
        str, typer.Option(help="Model directory (model.pt + model.json), or a registry: its champion.")
    ] = "",
    top_k: Annotated[int, typer.Option(min=1, help="Classes to show per image.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per image (JSON lines).")] = False,
    limit: Annotated[int | None, typer.Option(min=1, help="Stop after this many images.")] = None,
    sample_val: Annotated[
        int,
        typer.Option(
            min=0, help="Also predict N images of the val split the model was trained on (model.json)."
        ),
    ] = 0,
    batch_size: Annotated[int, typer.Option(min=1, help="Images per forward pass.")] = 32,
    max_pixels: Annotated[
        int,
        typer.Option(
            min=64,
            help="Pixel budget: an image whose header claims more pixels is refused, never decoded "
            "(default 16 Mi, as the serving container).",
        ),
    ] = 1 << 24,
    workers: Annotated[
        int,
        typer.Option(
            min=0,
            help="Processes that read and decode images while the model runs here (0: all in this process). "
            "Default: one per CPU but one, at most 8.",
        ),
    ] = max(0, min(8, (os.cpu_count() or 1) - 1)),
    output: Annotated[
        str | None,
        typer.Option(
            help="Write the results (the objects --json prints) to OUTPUT/predictions-00000.jsonl, ... (local "
            "or gs://) instead of printing them, and OUTPUT/_SUCCESS (the summary) last. Re-run the same "
            "command to resume: parts already written for the same model, options and inputs are kept.",
            show_default=False,
        ),
    ] = None,
    part_size: Annotated[
        int, typer.Option(min=1, help="With --output: images per part file, the unit a re-run resumes by.")
    ] = 1000,
    overwrite: Annotated[
        bool,
        typer.Option(
            help="With --output: predict every part again, replacing what is there, also a complete output "
            "(one with _SUCCESS). Without it a complete output is left as it is and an interrupted one resumed."
        ),
    ] = False,
    vertex_batch: Annotated[
        str | None,
        typer.Option(
            "--vertex-batch",
            metavar="GS_PREFIX",
            show_default=False,
            help="Predict on Vertex AI instead: a batch prediction job of --vertex-model writes "
            "prediction-<model>-<time>/predictions_*.jsonl under this gs:// prefix. Images are first written there "
            "as JSONL instances; gs:// .jsonl inputs are used as they are. With --model REGISTRY: the version "
            "uploaded from its champion.",
        ),
    ] = None,
    vertex_model: Annotated[
        str | None,
        typer.Option(
            help="With --vertex-batch: the Vertex AI model (display name: its champion; or a resource name)."
        ),
    ] = None,
    machine_type: Annotated[
        str, typer.Option(help="With --vertex-batch: the workers' machine type.")
    ] = "n1-standard-4",
    max_replicas: Annotated[int, typer.Option(min=1, help="With --vertex-batch: the most workers.")] = 1,
    wait: Annotated[bool, typer.Option(help="With --vertex-batch: wait for the job to end.")] = False,
    vertex_project: Annotated[
        str | None, typer.Option(help="With --vertex-batch: Vertex project (default GOOGLE_CLOUD_PROJECT).")
    ] = None,
    vertex_region: Annotated[
        str | None,
        typer.Option(help="With --vertex-batch: Vertex region (default GOOGLE_CLOUD_REGION, us-central1)."),
    ] = None,
) -> None:
    """Top-k classes per image with the model (CPU; XLA when PJRT_DEVICE is set), as the serving container answers.

    Where the true class is known (a shard's .cls, or an image in a folder named after a class) it is printed too,
    with a count of correct answers. Files and samples skipped are counted by reason. With --output, the results
    go to JSON lines in parts and a summary line is printed. Exit 1 when an image could not be classified."""
    from tpustream import predict

    if vertex_batch:
        from tpustream import vertex_batch as batch

        if not vertex_model:
            _fail(
                "--vertex-batch needs --vertex-model: the Vertex AI model promote published (or a resource name)"
            )
        job = batch.predict_on_vertex(
            list(inputs or []),
            vertex_model,
            vertex_batch,
            registry=model or None,
            machine_type=machine_type,
            max_replicas=max_replicas,
            limit=limit,
            wait=wait,
            project=vertex_project,
            region=vertex_region,
            top_k=top_k,
        )
        if "instances" in job:
            typer.echo(f"instances: {job['instances']['instances']} images in {job['instances']['uri']}")
        typer.echo(f"batch prediction {job['name']}: {job['state']} ({job['model']})")
        if "output_directory" in job:
            done = job["completion"]
            typer.echo(
                f"predictions: {job['output_directory']} ({done['successful']} predicted, {done['failed']} failed)"
            )
        raise typer.Exit(0)
    if not model:
        _fail("--model is required: a model directory or a registry (its champion)")
    config = predict.PredictConfig(
        model=model,
        inputs=tuple(inputs or ()),
        top_k=top_k,
        as_json=as_json,
        limit=limit,
        sample_val=sample_val,
        batch_size=batch_size,
        max_pixels=max_pixels,
        workers=workers,
        output=output,
        part_size=part_size,
        overwrite=overwrite,
    )
    raise typer.Exit(predict.run(config, echo=typer.echo))


@app.command("report")
def report_cmd(
    model: Annotated[str, typer.Option(help="The candidate model artifact (model.json, model.pt).")],
    metrics: Annotated[str, typer.Option(help="metrics.json (or its directory) from tpustream evaluate.")],
    output: Annotated[str, typer.Option(help="Directory (local or gs://) for report.html and report.md.")],
    registry: Annotated[
        str | None,
        typer.Option(help="The registry: its champion's history goes into the report, and the decision."),
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(help="The dataset (its manifest's facts); default: the one metrics.json names."),
    ] = None,
    data_check: Annotated[
        str | None, typer.Option(help="A data check's Markdown report (`shards check --report`) to include.")
    ] = None,
    metric: Annotated[
        str, typer.Option(help="top1 | top5 | loss: the metric the decision is taken on.")
    ] = "top1",
    min_delta: Annotated[float, typer.Option(help="Required improvement over the champion.")] = 0.0,
    max_class_drop: Annotated[
        float | None, typer.Option(help="The per-class limit the decision applies (as promote's).")
    ] = None,
) -> None:
    """Write the run report: one self-contained HTML page (training curves, confusion matrices, per-class
    accuracy against the champion, the decision and why, the data set, the champion's history) and its
    Markdown summary. The pipeline's evaluate and promote steps write the same report as KFP artifacts."""
    from tpustream import storage
    from tpustream.report import write_run_report

    metrics_uri = metrics if metrics.rstrip("/").endswith(".json") else storage.join(metrics, "metrics.json")
    try:  # read once: the dataset it names (the --data default) and the champion it measured
        evaluation = json.loads(storage.read_bytes(metrics_uri))
        data = data or evaluation["dataset"]["uri"]
        champion = evaluation.get("champion")
    except storage.NotFound:
        _fail(f"--metrics {metrics_uri} does not exist: run tpustream evaluate first")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        _fail(f"--metrics {metrics_uri} is not a tpustream metrics.json ({exc}): re-run evaluate")
    if registry is None and isinstance(champion, dict):
        _fail(
            f"--metrics {metrics_uri} holds champion version {champion.get('version')}'s numbers: give "
            "--registry (the registry evaluate compared with), so that the decision is taken against it"
        )
    output = storage.check_uri(output).rstrip("/")
    html_uri, markdown_uri = storage.join(output, "report.html"), storage.join(output, "report.md")
    facts = write_run_report(
        html_uri=html_uri,
        markdown_uri=markdown_uri,
        model_uri=model,
        metrics_uri=metrics_uri,
        dataset_uri=str(data),
        registry=registry,
        metric=metric,
        min_delta=min_delta,
        max_class_drop=max_class_drop,
        data_check=data_check,
    )
    verdict = "promote" if facts.decision.promote else "keep the champion"
    typer.echo(f"decision: {verdict} ({facts.decision.reason})")
    typer.echo(f"report: {html_uri}")
    typer.echo(f"summary: {markdown_uri}")


@champion_app.command("show")
def champion_show(registry: Annotated[str, typer.Option(help="Registry URI.")]) -> None:
    """Print the champion pointer and check that the version it names is complete."""
    from tpustream.registry import champion_status

    status = champion_status(registry)
    typer.echo(json.dumps(status, indent=1))
    if not status["ok"]:
        raise typer.Exit(1)


@champion_app.command("history")
def champion_history(
    registry: Annotated[str, typer.Argument(help="Registry URI (a local directory or gs://).")],
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the entries as one JSON list (oldest first) instead.")
    ] = False,
    limit: Annotated[int | None, typer.Option(help="Only the newest N entries.", min=1)] = None,
    metric: Annotated[
        str | None,
        typer.Option(
            help="Show this metric (top1, top5, loss); default: the one each decision was taken on."
        ),
    ] = None,
) -> None:
    """Every version promoted and every candidate refused, oldest first: date, dataset, metric, decision.

    Read from the registry's append-only event log (REGISTRY/events). The run report (`tpustream report`,
    the pipeline's evaluate and promote steps) plots the same history."""
    from tpustream.history import champion_history as read_history
    from tpustream.history import format_history_table

    entries = read_history(registry, metric=metric)
    if limit is not None:
        entries = entries[-limit:]
    if json_output:
        typer.echo(json.dumps(entries, indent=1))
    elif not entries:
        typer.echo(f"no decisions yet in {registry} (its events/ log is empty)")
    else:
        typer.echo(format_history_table(entries))


def _pairs(values: list[str]) -> dict[str, str]:
    """KEY=VALUE pairs, values as typed."""
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep:
            _fail(f"--param {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def _params(values: list[str]) -> dict[str, object]:
    """KEY=VALUE pairs; values parsed as JSON when they are JSON (numbers, booleans), else strings."""
    out: dict[str, object] = {}
    for key, value in _pairs(values).items():
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _pipeline_params(template: str, registry: str, values: list[str]) -> dict[str, Any]:
    """The run's parameters, each typed as the template declares it (``--param source=123`` stays a string);
    what is wrong with a name or a value is the preflight's to report."""
    from pipelines import preflight

    spec = preflight.load_template(template)
    declared = preflight.template_parameters(spec) if spec is not None else None
    return preflight.parse_parameters(declared, {"registry": registry, **_pairs(values)})


class _ParametersHelp(TyperCommand):
    """A pipeline command whose ``--help`` ends with the pipeline's parameters, built only when help is
    shown (it imports kfp, never torch)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from pipelines.preflight import parameters_help, pipeline_parameters

        self.epilog = parameters_help(pipeline_parameters())
        super().format_help(ctx, formatter)


def _tpu_help() -> str:
    from pipelines.tpu import tpu_table_text

    return "TPU type (Vertex AI custom training; '' = train on the CPU image): " + tpu_table_text() + "."


TpuOption = Annotated[str | None, typer.Option(help=_tpu_help())]
ParamOption = Annotated[
    list[str] | None, typer.Option("--param", help="Pipeline parameter KEY=VALUE (repeatable).")
]
LabelOption = Annotated[list[str] | None, typer.Option("--label", help="Run label KEY=VALUE (repeatable).")]
TensorboardOption = Annotated[
    str | None,
    typer.Option(
        help="Vertex AI TensorBoard instance (projects/P/locations/REGION/tensorboards/ID, in the run's region) "
        "the TPU training job streams its event files to; sets the pipeline's tensorboard parameter. "
        "Default: the template's ('' = none)."
    ),
]


def _local_file(value: str) -> str:
    """An option naming a local file (the pipeline YAML): ``file:///x`` is ``/x``, as in every other option."""
    if not value.startswith("file:"):
        return value
    from tpustream import storage

    return storage.check_uri(value)


@pipeline_app.command("compile")
def pipeline_compile(
    output: Annotated[str, typer.Option(help="Pipeline YAML to write.")] = "tpustream-pipeline.yaml",
    tpu: TpuOption = "v3-8",
    image: Annotated[
        str, typer.Option(help="Pushed image for the CPU steps, best by digest (REPO/cpu@sha256:...).")
    ] = "",
    tpu_image: Annotated[
        str, typer.Option(help="Pushed image for the TPU trainer, best by digest (REPO/tpu@sha256:...).")
    ] = "",
    serving_image: Annotated[
        str,
        typer.Option(
            help="Pushed serving image (containers/serve; Cloud Build's serve.ref): the validate step starts the "
            "candidate's model server in it before promotion. Default: the CPU steps' image."
        ),
    ] = "",
    capacity: Annotated[
        str,
        typer.Option(
            help="TPU capacity: on-demand (default); spot (single-host TPU types only: Vertex does not offer "
            "Spot VMs for TPU Pods; discounted, can be preempted at any time: the step resumes from `last`). "
            "flex-start is refused: Vertex's Dynamic Workload Scheduler is for GPUs only."
        ),
    ] = "on-demand",
    timeout: Annotated[str, typer.Option(help="Stop the TPU job after this long (e.g. 36h, 3d).")] = "1d",
    step_cpu: Annotated[
        str,
        typer.Option(
            help="CPU limit of every CPU step but evaluate (check source, plan, write, finalize, check data, "
            "promote): CPUs (4) or millicores (500m), at most 96. Vertex picks each step's machine from its "
            "CPU and memory limits."
        ),
    ] = "4",
    step_memory: Annotated[
        str, typer.Option(help="Memory limit of those steps: a size in K, M or G (16G), at most 624G.")
    ] = "16G",
    eval_cpu: Annotated[
        str,
        typer.Option(
            help="CPU limit of the evaluate step, which runs the candidate and the champion over the whole val "
            "split on CPU (README, Evaluation and promotion, has the img/s per core to size it by)."
        ),
    ] = "16",
    eval_memory: Annotated[str, typer.Option(help="Memory limit of the evaluate step (64G).")] = "64G",
    tensorboard: Annotated[
        str,
        typer.Option(
            help="Vertex AI TensorBoard instance (projects/P/locations/REGION/tensorboards/ID) the TPU training "
            "job streams its event files to: the default of the pipeline's tensorboard parameter, which "
            "`pipeline submit|schedule --tensorboard` override. Default: none."
        ),
    ] = "",
) -> None:
    """Compile the DAG for Vertex AI Pipelines (TPU type, pushed images and the CPU steps' sizes fixed at
    compile time)."""
    from pipelines import submit
    from pipelines.tpu import Capacity
    from pipelines.training import StepResources

    plan = Capacity(kind=capacity, timeout=timeout)
    sizes = StepResources(cpu=step_cpu, memory=step_memory, eval_cpu=eval_cpu, eval_memory=eval_memory)
    output = _local_file(output)
    try:
        submit.compile_pipeline(
            output,
            tpu=tpu or None,
            cpu_image=image,
            tpu_image=tpu_image,
            capacity=plan,
            resources=sizes,
            serve_image=serving_image,
            tensorboard=tensorboard,
        )
    except OSError as exc:
        _fail(f"--output {output}: cannot write the YAML ({exc.strerror or exc}): give a local file path")
    typer.echo(
        f"compiled: {output} (train on {tpu or 'the CPU image'}, {capacity} capacity; CPU steps {step_cpu} CPU "
        f"{step_memory}, evaluate {eval_cpu} CPU {eval_memory}"
        + (f"; TensorBoard {tensorboard}" if tensorboard else "")
        + ")"
    )


SkipPreflightOption = Annotated[
    bool,
    typer.Option(
        "--skip-preflight",
        help="Skip the IAM, bucket, TPU region and quota checks of `pipeline preflight` (the parameter names "
        "and types are still checked: that needs no credentials).",
    ),
]


@pipeline_app.command("preflight", cls=_ParametersHelp)
def pipeline_preflight(
    template: Annotated[str, typer.Option(help="Compiled pipeline YAML (local or gs://).")],
    project: Annotated[str, typer.Option(help="Google Cloud project.")],
    pipeline_root: Annotated[str, typer.Option(help="gs:// root for run artifacts.")],
    registry: Annotated[str, typer.Option(help="gs:// model registry.")],
    region: Annotated[str, typer.Option(help="Vertex AI region.")] = "us-central1",
    service_account: Annotated[str | None, typer.Option(help="Service account the run acts as.")] = None,
    schedule: Annotated[
        bool, typer.Option("--schedule", help="Also check what `pipeline schedule` needs.")
    ] = False,
    param: ParamOption = None,
) -> None:
    """Check a run before submitting it: parameter names and types (no credentials needed), the TPU type's
    region, IAM (actAs on the service account, project roles), the buckets and their regions, TPU quota.

    One line per check (ok, warn or fail, and its fix); exit 1 if any fails. Submit and schedule run it."""
    from pipelines import preflight

    template = _local_file(template)
    findings = preflight.preflight(
        template,
        project=project,
        region=region,
        pipeline_root=pipeline_root,
        registry=registry,
        service_account=service_account,
        parameters=_pipeline_params(template, registry, param or []),
        schedule=schedule,
    )
    for finding in findings:
        typer.echo(finding.line())
    if any(finding.status == preflight.FAIL for finding in findings):
        raise typer.Exit(1)


@pipeline_app.command("submit", cls=_ParametersHelp)
def pipeline_submit(
    template: Annotated[str, typer.Option(help="Compiled pipeline YAML.")],
    project: Annotated[str, typer.Option(help="Google Cloud project.")],
    pipeline_root: Annotated[
        str, typer.Option(help="gs:// root for run artifacts (shards, models, metrics).")
    ],
    registry: Annotated[str, typer.Option(help="gs:// model registry (champion.json, versions/).")],
    region: Annotated[str, typer.Option(help="Vertex AI region.")] = "us-central1",
    service_account: Annotated[str | None, typer.Option(help="Service account the run acts as.")] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Turn caching off for every step (it is compiled off already).")
    ] = False,
    param: ParamOption = None,
    label: LabelOption = None,
    skip_preflight: SkipPreflightOption = False,
    tensorboard: TensorboardOption = None,
    experiment: Annotated[
        str | None,
        typer.Option(
            help="Vertex AI Experiment the run joins (created if missing; lowercase letters, digits, hyphens), "
            "to compare runs and their metrics side by side."
        ),
    ] = None,
) -> None:
    """Submit one run to Vertex AI Pipelines (after the checks of `pipeline preflight`)."""
    from pipelines import submit

    template = _local_file(template)
    name = submit.submit_pipeline(
        template,
        project=project,
        region=region,
        pipeline_root=pipeline_root,
        parameters=_pipeline_params(template, registry, param or []),
        service_account=service_account,
        labels={k: str(v) for k, v in _params(label or []).items()},
        no_cache=no_cache,
        skip_preflight=skip_preflight,
        tensorboard=tensorboard,
        experiment=experiment,
    )
    typer.echo(f"submitted: {name}" + (f" (experiment {experiment})" if experiment else ""))


@pipeline_app.command("schedule", cls=_ParametersHelp)
def pipeline_schedule(
    template: Annotated[str, typer.Option(help="Compiled pipeline YAML.")],
    cron: Annotated[
        str, typer.Option(help='Cron, e.g. "0 3 * * 1" (optionally "TZ=Europe/Paris 0 3 * * 1").')
    ],
    project: Annotated[str, typer.Option(help="Google Cloud project.")],
    pipeline_root: Annotated[str, typer.Option(help="gs:// root for run artifacts.")],
    registry: Annotated[str, typer.Option(help="gs:// model registry.")],
    region: Annotated[str, typer.Option(help="Vertex AI region.")] = "us-central1",
    service_account: Annotated[str | None, typer.Option(help="Service account the runs act as.")] = None,
    param: ParamOption = None,
    label: LabelOption = None,
    skip_preflight: SkipPreflightOption = False,
    tensorboard: TensorboardOption = None,
    experiment: Annotated[
        str | None,
        typer.Option(
            help="Vertex AI Experiment every run joins (created now if missing): set as the pipeline's "
            "experiment parameter, which a step of each run acts on (a schedule's runs carry no experiment of "
            "their own)."
        ),
    ] = None,
) -> None:
    """Schedule retraining (at most one concurrent run), after the checks of `pipeline preflight`."""
    from pipelines import submit

    template = _local_file(template)
    name = submit.schedule_pipeline(
        template,
        cron=cron,
        project=project,
        region=region,
        pipeline_root=pipeline_root,
        parameters=_pipeline_params(template, registry, param or []),
        service_account=service_account,
        labels={k: str(v) for k, v in _params(label or []).items()},
        skip_preflight=skip_preflight,
        tensorboard=tensorboard,
        experiment=experiment,
    )
    typer.echo(f"scheduled: {name}" + (f" (experiment {experiment})" if experiment else ""))


@pipeline_app.command("run-local")
def pipeline_run_local(
    root: Annotated[
        str, typer.Option(help="Local directory for the run (pipeline root, registry).")
    ] = "demo-output/pipeline",
    source: Annotated[str, typer.Option(help="SOURCE (default: the bundled digits).")] = "digits",
    model: Annotated[str, typer.Option(help="Model name.")] = "tiny",
    epochs: Annotated[int, typer.Option(help="Epochs.")] = 8,
    batch_size: Annotated[int, typer.Option(help="Per-device batch (4 virtual XLA CPU devices).")] = 16,
    lr: Annotated[float, typer.Option(help="Peak LR (0 = scaled default).")] = 0.2,
    num_shards: Annotated[int, typer.Option(help="Train shards.")] = 8,
    param: ParamOption = None,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="Print every task's full log here instead of to the log file."),
    ] = False,
) -> None:
    """Run the whole DAG here through kfp.local on CPU XLA; prints task outcomes and where everything landed.

    The executors' full logs go to ROOT/logs/run-local-TIME.log (printed first); -v prints them here."""
    from pipelines.local import run_local
    from tpustream.registry import champion_status, version_uri
    from tpustream.sources import open_source

    parameters: dict[str, Any] = {
        "source": source,
        "model_name": model,
        "epochs": epochs,
        "batch_size": batch_size,
        "lr": lr,
        "num_shards": num_shards,
        "bf16": False,
        "workers": 2,
        **_params(param or []),
    }
    open_source(str(parameters["source"]))  # a bad source fails here, not three tasks deep
    log_path = None
    try:
        root = _local_file(root)
    except TpustreamError as exc:
        _fail(f"--root: {exc}")
    if not verbose:
        log_path = os.path.join(
            os.path.abspath(_local_file(root)), "logs", time.strftime("run-local-%Y%m%d-%H%M%S.log")
        )
        typer.echo(f"running the pipeline locally; full logs: {log_path}")
    try:
        out = run_local(root=root, log_path=log_path, **parameters)
    except RuntimeError as exc:  # kfp.local: a task failed; its own log says why
        _fail(f"{exc}: the failing task's log {'in ' + log_path if log_path else 'above'} says why")
    status = champion_status(out["registry"])
    if out["data"] == "skip":
        typer.echo(
            "data: no new data since the last run: shards and training skipped (--param retrain=true "
            "trains anyway)"
        )
    typer.echo(f"pipeline root (shards, model, metrics): {out['pipeline_root']}")
    typer.echo(f"registry: {out['registry']}")
    champion = status["champion"]
    if champion:
        typer.echo(
            f"champion: version {champion['version']}, top-1 {champion['metrics']['top1']:.4f} "
            f"({version_uri(out['registry'], champion['version'])})"
        )
    else:
        typer.echo("champion: none")
    if out["report"]:
        typer.echo(f"report (open in a browser): {out['report']}")


@bench_app.command("write")
def bench_write(
    samples: Annotated[int, typer.Option(help="CIFAR-size samples per run.", min=1)] = 20000,
    imagenet_samples: Annotated[int, typer.Option(help="ImageNet-size JPEG samples per run.", min=1)] = 600,
    repeats: Annotated[int, typer.Option(help="Runs per writer (the median is reported).", min=1)] = 3,
    samples_per_shard: Annotated[int, typer.Option(help="Samples per shard for both writers.", min=1)] = 2000,
) -> None:
    """Our shard writer vs stock webdataset.ShardWriter on the same planned samples, side by side."""
    from tpustream.bench import write

    for line in write.bench_write(
        samples=samples,
        imagenet_samples=imagenet_samples,
        repeats=repeats,
        samples_per_shard=samples_per_shard,
    ):
        typer.echo(line)


@bench_app.command("import")
def bench_import_cmd(
    images: Annotated[
        int, typer.Option(help="Small JPEGs, uploaded flat with an import file and as ImageFolder.", min=10)
    ] = 2000,
    rows: Annotated[
        int, typer.Option(help="Rows of a local JSONL whose parsing is timed (0 skips it).", min=0)
    ] = 1_000_000,
    repeats: Annotated[int, typer.Option(help="Runs per source (the median is reported).", min=1)] = 3,
    workers: Annotated[
        int, typer.Option(help="shards create writer processes, the same for both sources.", min=1)
    ] = max(1, os.cpu_count() or 1),
) -> None:
    """Vertex AI import file vs ImageFolder on the GCS test server: listing rows/s and shards create images/s,
    and the parse rate of a large JSONL."""
    from tpustream.bench.import_files import bench_import

    for line in bench_import(images=images, rows=rows, repeats=repeats, workers=workers):
        typer.echo(line)


@bench_app.command("warmstart")
def bench_warmstart_cmd(
    old: Annotated[
        int, typer.Option(help="Images of last week's data (the digits' first N; now: all).", min=100)
    ] = 1000,
    epochs: Annotated[int, typer.Option(help="Epochs of every run.", min=1)] = 6,
    model: Annotated[str, typer.Option(help="Model name.")] = "tiny",
    batch_size: Annotated[int, typer.Option(help="Per-device batch size.", min=1)] = 16,
    lr: Annotated[float, typer.Option(help="Peak LR of every run.")] = 0.2,
) -> None:
    """Epochs and steps to reach the champion's val top-1 after new data lands: from scratch vs --init-from."""
    from tpustream.bench.warmstart import bench_warmstart

    for line in bench_warmstart(old=old, epochs=epochs, model=model, batch_size=batch_size, lr=lr):
        typer.echo(line)


@bench_app.command("train")
def bench_train_cmd(
    data: Annotated[str, typer.Option(help="Dataset URI (train split is streamed).")],
    model: Annotated[str, typer.Option(help="Model name.")] = "resnet50",
    steps: Annotated[int, typer.Option(help="Timed steps per input (after two warm-up steps).", min=1)] = 20,
    batch_size: Annotated[int, typer.Option(help="Per-device batch size.")] = 32,
    workers: Annotated[int, typer.Option(help="Loader worker processes.")] = max(1, os.cpu_count() or 1),
    bf16: Annotated[bool, typer.Option(help="bfloat16 autocast.")] = False,
) -> None:
    """Steps/s with synthetic on-device input vs the real loader: the data wait your host would cause."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    from tpustream.bench.train import bench_train

    for line in bench_train(
        data=data, model_name=model, steps=steps, batch_size=batch_size, workers=workers, bf16=bf16
    ):
        typer.echo(line)


@bench_app.command("preempt")
def bench_preempt_cmd(
    images: Annotated[
        int, typer.Option(help="synthetic-imagenet images (500x375 JPEGs) to train on.", min=64)
    ] = 1200,
    batch_size: Annotated[int, typer.Option(help="Batch size.", min=1)] = 16,
    workers: Annotated[int, typer.Option(help="Loader workers.", min=0)] = 2,
    input_size: Annotated[int, typer.Option(help="Training input side.", min=16)] = 224,
) -> None:
    """SIGTERM mid-epoch and restart, at three positions: signal->exit, restart->first step, and the loader's
    way back to the position (ours: nothing skipped is decoded) against replaying the epoch. JSON lines."""
    from tpustream.bench.preempt import bench_preempt

    for line in bench_preempt(images=images, batch_size=batch_size, workers=workers, input_size=input_size):
        typer.echo(line)


@bench_app.command("serve")
def bench_serve_cmd(
    model: Annotated[
        str | None, typer.Option(help="Model directory or registry (default: a random model built here).")
    ] = None,
    arch: Annotated[
        str, typer.Option(help="The random model's architecture (tiny, resnet18, resnet50).")
    ] = "tiny",
    streamed_case: Annotated[
        bool,
        typer.Option(
            help="Also run 64 images of 16 MP in one request on a second server, request budget raised."
        ),
    ] = True,
) -> None:
    """The model server under hostile requests, as Vertex starts it: status, latency, response size, the server's
    RSS and the health route's latency during each case (malformed bodies, budgets, formats, bombs, load)."""
    from tpustream.bench import serve

    serve.run(model, arch=arch, streamed_case=streamed_case, echo=typer.echo)


@bench_app.command("load")
def bench_load(
    data: Annotated[
        str,
        typer.Option(
            help="Dataset URI, or a SOURCE (e.g. synthetic-cifar:20000) sharded into a temp dir first."
        ),
    ] = "synthetic-cifar:20000",
    split: Annotated[str, typer.Option(help="train (augmented) or val.")] = "train",
    batch_size: Annotated[int, typer.Option(help="Batch size of every pipeline.")] = 128,
    workers: Annotated[
        str, typer.Option(help="DataLoader workers of every pipeline; a list (1,2,4) measures each.")
    ] = str(max(1, os.cpu_count() or 1)),
    seconds: Annotated[
        float, typer.Option(help="Measured seconds per run, after the first batch.", min=0.1)
    ] = 8.0,
    repeats: Annotated[int, typer.Option(help="Interleaved runs per pipeline (median reported).", min=1)] = 3,
    input_size: Annotated[
        int | None, typer.Option(help="Output side (default: 224 for large images, else the image size).")
    ] = None,
) -> None:
    """Per-file ImageFolder (A), the blog's webdataset pipeline (B), ours local and from GCS, installed peers,
    and the ceilings (our kernel alone, the kernel in as many processes as cores used, our pipeline without
    workers)."""
    from tpustream.bench import load as bl

    try:
        worker_counts = [int(count) for count in workers.split(",")]
    except ValueError:
        worker_counts = []
    if not worker_counts or min(worker_counts) < 0:
        raise typer.BadParameter(f"--workers takes counts like 2 or 1,2,4, got {workers!r}")
    for line in bl.bench_load(
        data=data,
        split=split,
        batch_size=batch_size,
        workers=worker_counts,
        seconds=seconds,
        repeats=repeats,
        input_size=input_size,
    ):
        typer.echo(line)


if __name__ == "__main__":  # pragma: no cover
    app()
