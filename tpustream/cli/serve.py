"""`tpustream validate-serving` and `tpustream predict` (its options: ``PredictConfig``; its printing: here)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from tpustream.cli.app import app
from tpustream.cli.options import Opt, fail, from_config
from tpustream.serve.predict.config import PredictConfig

if TYPE_CHECKING:
    from tpustream.serve.predict.pool import PredictResult


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
    statuses = ", ".join(f"{case.case} {case.status}" for case in report.malformed)
    typer.echo(
        f"validated {report.model} in the serving container: {report.agreed}/{report.samples} val "
        f"images answered as evaluation did (top-1 probability within {report.max_probability_diff:.2g}; "
        f"p50 {report.latency_ms_p50} ms per request); malformed requests: {statuses}; server up in "
        f"{report.startup_s} s"
    )
    if output:
        typer.echo(f"report: {output.rstrip('/')}/validation.json")


@app.command("predict")
@from_config(
    PredictConfig,
    exclude={"inputs"},  # the command's argument, below
    model=Opt(default=""),  # not given: an error, unless --vertex-batch (then optional: the registry)
    as_json=Opt(name="--json"),
    top_k=Opt(min=1),
    limit=Opt(min=1),
    sample_val=Opt(min=0),
    batch_size=Opt(min=1),
    max_pixels=Opt(min=64),
    workers=Opt(min=0),
    part_size=Opt(min=1),
)
def predict_cmd(
    config: PredictConfig,
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
    del inputs  # in config.inputs (from_config passes the argument to the config)
    if vertex_batch:
        from tpustream.vertex import batch_prediction as batch

        if not vertex_model:
            fail(
                "--vertex-batch needs --vertex-model: the Vertex AI model promote published (or a resource name)"
            )
        job = batch.predict_on_vertex(
            list(config.inputs),
            vertex_model,
            vertex_batch,
            registry=config.model or None,
            machine_type=machine_type,
            replicas=replicas,
            batch_size=instances_per_request,
            limit=config.limit,
            wait=wait,
            project=vertex_project,
            region=vertex_region,
            top_k=config.top_k,
        )
        if job.instances is not None:
            typer.echo(f"instances: {job.instances.instances} images in {job.instances.uri}")
        typer.echo(f"batch prediction {job.name}: {job.state} ({job.model})")
        if job.output_directory is not None and job.completion is not None:
            done = job.completion
            errored = job.instance_errors or 0  # counted successful by Vertex: the server's error slot
            typer.echo(
                f"predictions: {job.output_directory} ({done.successful - errored} predicted, "
                f"{done.failed + errored} failed)"
            )
        raise typer.Exit(0)
    if not config.model:
        fail("--model is required: a model directory or a registry (its champion)")
    raise typer.Exit(run_predict(config, echo=typer.echo))


def run_predict(
    config: PredictConfig, *, echo: Callable[[str], object] = print, progress: bool | None = None
) -> int:
    """Print top-k per image (or one JSON object per line), or with ``config.output`` write them as JSON
    lines and print a summary; returns the exit code: 0, or 1 when an image could not be classified.
    Raises PredictError / BadModel for bad arguments."""
    show_bar = sys.stderr.isatty() if progress is None else progress
    if not config.output:
        return _print_results(config, echo=echo, show_bar=show_bar)
    from tpustream.serve.predict.output import predict_to_output

    summary, written = predict_to_output(config, progress=show_bar)
    if not written:
        echo(
            f"{summary.output} is already complete ({summary.answered:,} answered, "
            f"{sum(summary.skipped.values()):,} skipped, {len(summary.parts)} parts): nothing to do; "
            "--overwrite predicts again"
        )
        return 0
    echo(summary.line())
    return 1 if summary.failed else 0


def _print_results(config: PredictConfig, *, echo: Callable[[str], object], show_bar: bool) -> int:
    from tqdm import tqdm

    from tpustream.serve.classifier import Classifier
    from tpustream.serve.predict.inputs import Skipped, planned_items
    from tpustream.serve.predict.pool import device_for_cli, predict_items, say_top_k_cap

    limits = config.limits()
    classifier = Classifier(config.model, limits=limits, device=device_for_cli())
    say_top_k_cap(config.top_k, classifier)
    skipped = Skipped()
    results = predict_items(
        classifier,
        planned_items(config, classifier.uri, skipped),
        top_k=config.top_k,
        batch_size=limits.batch_size,
        workers=config.workers,
    )
    # the bar appears only when the run lasts over a second: many images
    bar = tqdm(
        results, desc="predict", unit="img", file=sys.stderr, disable=not show_bar, miniters=1, delay=1.0
    )
    failed = answered = known = correct = 0
    with contextlib.closing(results):  # stops the decode workers now, also when interrupted
        for result in bar:
            if "error" in result:
                failed += 1
                skipped.add(result["reason"], result["input"])
            else:
                answered += 1
            if "correct" in result:
                known += 1
                correct += bool(result["correct"])
            line = json.dumps(result) if config.as_json else _text(result)
            if bar.disable:
                echo(line)
            else:
                bar.write(line, file=sys.stdout)
    if not config.as_json and known:
        echo(f"{correct}/{known} correct ({classifier.uri})")
    if skipped.counts:
        errors = "; the images that could not be classified are the 'error' lines above" if failed else ""
        total = sum(skipped.counts.values())
        print(
            f"skipped {total:,} of {answered + total:,} inputs: {skipped.describe()}{errors}", file=sys.stderr
        )
    return 1 if failed else 0


def _text(result: PredictResult) -> str:
    if "source" in result:  # a dataset's sample: name the file it came from too
        result = {**result, "input": f"{result['input']} ({result['source']})"}
    if "error" in result:
        return f"{result['input']}  error: {result['error']}"
    top = ", ".join(f"{c} {p:.1%}" for c, p in zip(result["classes"], result["probabilities"], strict=True))
    if "true_class" in result:
        mark = "ok" if result["correct"] else "WRONG"
        return f"{result['input']}  true {result['true_class']}  predicted {top}  {mark}"
    return f"{result['input']}  {top}"
