"""The ``tpustream`` command line: argument parsing lives here and nowhere else."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from tpustream.cli.bench import bench_app
from tpustream.cli.options import Opt, fail, from_config
from tpustream.cli.pipeline import pipeline_app
from tpustream.dataset.check import DataCheckThresholds
from tpustream.dataset.plan import ShardConfig
from tpustream.errors import TpustreamError
from tpustream.image.codec import DEFAULT_MAX_PIXELS
from tpustream.models import MODEL_NAMES
from tpustream.sources.dispatch import source_help
from tpustream.train.config import TrainConfig

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
            fail(message)


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
app.add_typer(shards_app, name="shards")
champion_app = typer.Typer(help="Inspect the model registry's champion.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(champion_app, name="champion")
app.add_typer(pipeline_app, name="pipeline")
weights_app = typer.Typer(
    help="Pretrained weights: stage a torchvision weight set where `train --pretrained` reads it.",
    no_args_is_help=True,
)
app.add_typer(weights_app, name="weights")


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


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False) -> None:
    _setup_logging(verbose)


@shards_app.command("create")
@from_config(
    ShardConfig,
    exclude={"min_train_shards"},
    source=Opt(more_help=f"One of: {source_help()}"),
    max_pixels=Opt(min=64),
    # A library caller writes with one process; the CLI with one per CPU.
    workers=Opt(default=max(1, os.cpu_count() or 1)),
)
def shards_create(config: ShardConfig) -> None:
    """Plan, write and commit WebDataset shards; resumes an interrupted run at the same --output."""
    from tpustream.dataset import write as shards

    _, summary = shards.create_shards(config)
    typer.echo(summary.line())


@shards_app.command("verify")
def shards_verify(
    uri: Annotated[str, typer.Argument(help="Dataset URI (the directory holding manifest.json).")],
    workers: Annotated[int, typer.Option(help="Shards checked concurrently.")] = 8,
    deep: Annotated[
        bool, typer.Option(help="Also decode every image as the loader does; list each bad sample by key.")
    ] = False,
    max_pixels: Annotated[
        int,
        typer.Option(
            min=64,
            help="Pixel budget: images whose header claims more pixels (width x height) are skipped and "
            "counted, never decoded (default 64 Mi = 8192x8192: above real photos, below decompression bombs).",
        ),
    ] = DEFAULT_MAX_PIXELS,
) -> None:
    """Re-read every shard; check sample counts, sizes and sha256 against the manifest (--deep: and images)."""
    from tpustream.dataset.manifest import verify_shards

    checked, problems = verify_shards(uri, workers=workers, deep=deep, max_pixels=max_pixels)
    if problems:
        for problem in problems:
            typer.echo(f"BAD {problem}", err=True)
        bad = len({problem.split(": ", 1)[0] for problem in problems})
        if len(problems) > bad:
            fail(f"{len(problems)} problems in {bad} of {checked} shards", code=1)
        fail(f"{len(problems)} of {checked} shards failed verification", code=1)
    typer.echo(f"ok: {checked} shards match {uri}/manifest.json")


@shards_app.command("check")
@from_config(DataCheckThresholds)
def shards_check(
    thresholds: DataCheckThresholds,
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
    examples: Annotated[int, typer.Option(help="File names listed per finding.", min=1)] = 5,
) -> None:
    """Is this dataset fit to train on? Duplicates, train/val leakage, empty classes, skipped rate, and
    drift from --baseline. Exit 1 with one line per anomaly on stderr (0 with --warn-only); a warning (a tiny
    class) is one line on stderr too, and never fails."""
    from tpustream.dataset.check import check_dataset
    from tpustream.storage import io as storage

    result = check_dataset(dataset, baseline, thresholds, max_examples=examples)
    document_on_stdout = json_output or not report  # then every other line goes to stderr
    if report:
        storage.write_bytes(report, result.to_markdown().encode(), content_type="text/markdown")
        typer.echo(f"report: {report}", err=document_on_stdout)
    if document_on_stdout:
        typer.echo(json.dumps(result.to_json(), indent=1) if json_output else result.to_markdown())
    for anomaly in result.anomalies:
        typer.echo(f"ANOMALY {anomaly.code}: {anomaly.reason}", err=True)
    for warning in result.warnings:  # reported, never a failure
        typer.echo(f"WARNING {warning.code}: {warning.reason}", err=True)
    count = len(result.anomalies)
    if count and not warn_only:
        fail(
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
@from_config(
    TrainConfig,
    exclude={"commit_timeout_minutes", "init_optional"},
    model=Opt(more_help=f"One of: {' | '.join(MODEL_NAMES)}."),
    log_steps=Opt(min=1),
    patience=Opt(min=0),
    min_delta=Opt(min=0.0),
)
def train_cmd(config: TrainConfig) -> None:
    """Train a ResNet with PyTorch/XLA (SPMD or replicas), checkpointing to --output; resumable. SIGTERM or
    Ctrl-C: the step in flight finishes, `last` is written, exit 75 (run again to resume)."""
    early = _EarlySigterm().install()  # before these imports, which take seconds
    from tpustream.train import trainer as train

    try:
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
            f"model: {config.output} (best epoch {metrics['epoch']}, val top-1 {metrics['val_top1']:.4f}{early_stop})"
        )


@weights_app.command("fetch")
def weights_fetch(
    name: Annotated[
        str, typer.Argument(help="A torchvision weights name: <arch>.<member>, e.g. resnet50.IMAGENET1K_V2.")
    ],
    cache: Annotated[
        str, typer.Option(help="The weights cache (local or gs://) that `train --weights-cache` will read.")
    ],
    model: Annotated[
        str | None,
        typer.Option(help=f"Model name (default: NAME's arch). One of: {' | '.join(MODEL_NAMES)}."),
    ] = None,
) -> None:
    """Fetch a named weight set once into --cache, its sha256 checked against the hash prefix in its file
    name (torch.hub's rule); a copy already there is only checked. `train --pretrained NAME --weights-cache
    CACHE` (every host of a slice) then reads that copy and fetches nothing."""
    from tpustream.models import MODEL_SPECS
    from tpustream.train.pretrained import is_uri, resolve

    if is_uri(name):
        fail(f"{name} is a file, not a torchvision weights name: pass it to `train --pretrained` as it is")
    arch = name.rpartition(".")[0]
    if model is None:
        found = [m for m, spec in MODEL_SPECS.items() if spec.torchvision_arch == arch]
        if not found:
            fail(f"{name}: give --model (the name has no arch tpustream knows, e.g. resnet50.IMAGENET1K_V2)")
        model = found[0]
    resolved = resolve(name, model=model, cache=cache)
    typer.echo(f"{resolved.name}: {resolved.uri} (sha256 {resolved.sha256})")


@app.command("evaluate")
def evaluate_cmd(
    model: Annotated[str, typer.Option(help="Model artifact URI (model.pt + model.json).")],
    data: Annotated[
        str,
        typer.Option(help="Dataset URI; its test split is evaluated (and val), or val when it has no test."),
    ],
    output: Annotated[str, typer.Option(help="Where metrics.json is written.")],
    registry: Annotated[
        str | None, typer.Option(help="Also evaluate this registry's champion on the same shards.")
    ] = None,
    workers: Annotated[int, typer.Option(help="Loader worker processes.")] = 2,
) -> None:
    """Top-1/top-5/loss, per-class accuracy and confusion matrix on the test split, or val without one (XLA if
    PJRT_DEVICE is set)."""
    from tpustream.report.facts import shows_top5
    from tpustream.train import evaluate

    result = evaluate.evaluate(model, data, output, registry=registry, workers=workers)
    for role, entry in (("candidate", result.candidate), ("champion", result.champion)):
        if entry:
            version = f" (version {entry['version']})" if role == "champion" else ""
            top5 = f" top-5 {entry['top5']:.4f}" if shows_top5(len(result.classes)) else ""
            macro_f1 = f" macro-F1 {entry['macro_f1']:.4f}" if entry.get("macro_f1") is not None else ""
            typer.echo(
                f"{role}{version}: top-1 {entry['top1']:.4f}{top5}{macro_f1} loss {entry['loss']:.4f} "
                f"on {entry['num_samples']} {result.split} samples"
            )
            if entry.get("scores"):
                typer.echo(f"{role} per-sample scores: {output.rstrip('/')}/{entry['scores']}")
    if result.val is not None:
        typer.echo(
            f"candidate on val (chose its best epoch; test decides): top-1 {result.val['top1']:.4f} "
            f"loss {result.val['loss']:.4f} on {result.val['num_samples']} val samples"
        )
    typer.echo(f"metrics: {output.rstrip('/')}/metrics.json")


# The quality floor (promotion_policy.QualityFloor): promote's, and the report's to decide as promote does.
MinMetricOption = Annotated[
    float | None,
    typer.Option(
        help="Quality floor: refuse a candidate whose --metric is below this (top1/top5; for loss: above it), "
        "with or without a champion, so a poor first model is not promoted."
    ),
]
MinClassRecallOption = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        max=1.0,
        help="Quality floor: refuse a candidate with any class's recall (its val samples classified as it) "
        "below this, with or without a champion.",
    ),
]


@app.command("promote")
def promote_cmd(
    candidate: Annotated[str, typer.Option(help="Candidate model artifact URI.")],
    metrics: Annotated[str, typer.Option(help="metrics.json (or its directory) from tpustream evaluate.")],
    registry: Annotated[str, typer.Option(help="Registry URI (versions/, champion.json, events/).")],
    metric: Annotated[str, typer.Option(help="top1 | top5 | loss | macro_f1 | balanced_accuracy.")] = "top1",
    min_delta: Annotated[float, typer.Option(help="Required improvement over the champion.")] = 0.0,
    max_class_drop: Annotated[
        float | None, typer.Option(help="Refuse if any class's accuracy drops by more than this.")
    ] = None,
    min_metric: MinMetricOption = None,
    min_class_recall: MinClassRecallOption = None,
    max_p_value: Annotated[
        float | None,
        typer.Option(
            help="Promote over a champion only if the gain is this unlikely by chance: McNemar's exact test on "
            "the val samples both were scored on (evaluate --registry). Default: not required."
        ),
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
    from tpustream.registry.policy import QualityFloor
    from tpustream.release import promote
    from tpustream.vertex import model_registry as vertex

    if validation:
        from tpustream.serve.validate import require_validated

        require_validated(validation, candidate)
    target = vertex.target_from_env(vertex_model, vertex_project, vertex_region, serving_image)
    outcome = promote.promote(
        candidate,
        metrics,
        registry,
        metric=metric,
        min_delta=min_delta,
        max_class_drop=max_class_drop,
        floor=QualityFloor(min_metric=min_metric, min_class_recall=min_class_recall),
        vertex=target,
        max_p_value=max_p_value,
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
    dedicated_endpoint: Annotated[
        bool,
        typer.Option(
            help="Create the endpoint (when none has the name) as a dedicated public endpoint: its own DNS "
            "name and requests up to 10 MB. A shared public endpoint (the default) takes requests up to 1.5 MB, "
            "far below the model server's 16 MiB body limit: a few photos per request at most."
        ),
    ] = False,
    project: VertexProjectOption = None,
    region: VertexRegionOption = None,
) -> None:
    """Deploy a Model Registry version (the champion) to a Vertex AI endpoint as a canary; undo with `rollback`.

    Request size: a shared public endpoint takes requests up to 1.5 MB, a dedicated one (--dedicated-endpoint)
    up to 10 MB; batch prediction (`predict --vertex-batch`) goes to the model server directly, within its own
    budgets."""
    from tpustream.release import deploy

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
        dedicated_endpoint=dedicated_endpoint,
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
    from tpustream.release import deploy

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
    from tpustream.serve.validate import ServingValidationError, validate_serving

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
    replicas: Annotated[
        int,
        typer.Option(
            "--replicas",
            "--max-replicas",  # its name before: batch jobs never used more than their starting count
            min=1,
            help="With --vertex-batch: the machines the job runs on, all from its start. Vertex AI batch "
            "prediction does not autoscale (it starts starting_replica_count machines and ignores "
            "max_replica_count), so this sets both.",
        ),
    ] = 1,
    instances_per_request: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=64,
            help="With --vertex-batch: images per request to the model server (Vertex's batchSize). Default: "
            "the most that fit the serving image's request budgets with the input's largest image (up to 64); "
            "a larger value is refused.",
        ),
    ] = None,
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
    from tpustream.serve import predict

    if vertex_batch:
        from tpustream.vertex import batch_prediction as batch

        if not vertex_model:
            fail(
                "--vertex-batch needs --vertex-model: the Vertex AI model promote published (or a resource name)"
            )
        job = batch.predict_on_vertex(
            list(inputs or []),
            vertex_model,
            vertex_batch,
            registry=model or None,
            machine_type=machine_type,
            replicas=replicas,
            batch_size=instances_per_request,
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
            errored = job.get("instance_errors", 0)  # counted successful by Vertex: the server's error slot
            typer.echo(
                f"predictions: {job['output_directory']} ({done['successful'] - errored} predicted, "
                f"{done['failed'] + errored} failed)"
            )
        raise typer.Exit(0)
    if not model:
        fail("--model is required: a model directory or a registry (its champion)")
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
        str,
        typer.Option(
            help="top1 | top5 | loss | macro_f1 | balanced_accuracy: the metric the decision is taken on."
        ),
    ] = "top1",
    min_delta: Annotated[float, typer.Option(help="Required improvement over the champion.")] = 0.0,
    max_class_drop: Annotated[
        float | None, typer.Option(help="The per-class limit the decision applies (as promote's).")
    ] = None,
    min_metric: MinMetricOption = None,
    min_class_recall: MinClassRecallOption = None,
) -> None:
    """Write the run report: one self-contained HTML page (training curves, confusion matrices, per-class
    accuracy against the champion, the decision and why, the data set, the champion's history) and its
    Markdown summary. The pipeline's evaluate and promote steps write the same report as KFP artifacts."""
    from tpustream.artifacts import ArtifactError, EvalReport, json_file_uri
    from tpustream.registry.policy import QualityFloor
    from tpustream.report.build import write_run_report
    from tpustream.storage import io as storage

    metrics_uri = json_file_uri(metrics, EvalReport.NAME)
    try:  # read here for the dataset it names (the --data default) and the champion it measured
        evaluation = EvalReport.read(metrics_uri)
    except storage.NotFound:
        fail(f"--metrics {metrics_uri} does not exist: run tpustream evaluate first")
    except ArtifactError as exc:
        fail(f"--metrics: {exc}")
    data = data or evaluation.dataset.uri
    champion = evaluation.champion
    if not data:
        fail(f"--metrics {metrics_uri} names no dataset: give --data")
    if registry is None and champion is not None:
        fail(
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
        floor=QualityFloor(min_metric=min_metric, min_class_recall=min_class_recall),
        data_check=data_check,
    )
    verdict = "promote" if facts.decision.promote else "keep the champion"
    typer.echo(f"decision: {verdict} ({facts.decision.reason})")
    typer.echo(f"report: {html_uri}")
    typer.echo(f"summary: {markdown_uri}")


# Both champion commands take the registry either way: `champion show REGISTRY` and `champion history
# --registry REGISTRY` read as well as the forms each had first (show took --registry, history an argument).
RegistryArgument = Annotated[
    str | None,
    typer.Argument(
        metavar="REGISTRY",
        help="Registry URI (a local directory or gs://); or give it as --registry.",
        show_default=False,
    ),
]
RegistryOption = Annotated[
    str | None, typer.Option("--registry", help="Registry URI, as an option (the same as REGISTRY).")
]


def _registry(argument: str | None, option: str | None, command: str) -> str:
    """The registry of a champion command, given as its argument or as --registry (one of them, or both
    the same)."""
    if argument and option and argument != option:
        fail(f"champion {command}: the registry is given twice, {argument} and --registry {option}: give one")
    registry = argument or option
    if not registry:
        fail(
            f"champion {command}: give the registry: `tpustream champion {command} REGISTRY` (or --registry)"
        )
    return registry


@champion_app.command("show")
def champion_show(registry: RegistryArgument = None, registry_option: RegistryOption = None) -> None:
    """Print the champion pointer and check that the version it names is complete."""
    from tpustream.registry.store import champion_status

    status = champion_status(_registry(registry, registry_option, "show"))
    typer.echo(json.dumps(status, indent=1))
    if not status["ok"]:
        raise typer.Exit(1)


@champion_app.command("history")
def champion_history(
    registry: RegistryArgument = None,
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
    registry_option: RegistryOption = None,
) -> None:
    """Every version promoted and every candidate refused, oldest first: date, dataset, metric, decision.

    Read from the registry's append-only event log (REGISTRY/events). The run report (`tpustream report`,
    the pipeline's evaluate and promote steps) plots the same history."""
    from tpustream.registry.history import champion_history as read_history
    from tpustream.registry.history import format_history_table

    registry = _registry(registry, registry_option, "history")
    entries = read_history(registry, metric=metric)
    if limit is not None:
        entries = entries[-limit:]
    if json_output:
        typer.echo(json.dumps(entries, indent=1))
    elif not entries:
        typer.echo(f"no decisions yet in {registry} (its events/ log is empty)")
    else:
        typer.echo(format_history_table(entries))


if __name__ == "__main__":  # pragma: no cover
    app()
