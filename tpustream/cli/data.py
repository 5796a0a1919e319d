"""`tpustream shards create|verify|check`: write a dataset's shards, verify them, check the data."""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer

from tpustream.cli.app import shards_app
from tpustream.cli.options import Opt, fail, from_config
from tpustream.dataset.check import DataCheckThresholds
from tpustream.dataset.plan import ShardConfig
from tpustream.image.codec import DEFAULT_MAX_PIXELS
from tpustream.sources.dispatch import source_help


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
