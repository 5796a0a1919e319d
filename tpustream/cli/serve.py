"""`tpustream validate-serving` and `tpustream predict`."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from tpustream.cli.app import app
from tpustream.cli.options import fail


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
