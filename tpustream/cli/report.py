"""`tpustream report`: a run's report from its evaluation."""

from __future__ import annotations

from typing import Annotated

import typer

from tpustream.cli.app import app
from tpustream.cli.options import fail
from tpustream.cli.registry import policy_options
from tpustream.registry.policy import PromotionPolicy


@app.command("report")
@policy_options
def report_cmd(
    policy: PromotionPolicy,
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
) -> None:
    """Write the run report: one self-contained HTML page (training curves, confusion matrices, per-class
    accuracy against the champion, the decision and why, the data set, the champion's history) and its
    Markdown summary. The pipeline's evaluate and promote steps write the same report as KFP artifacts."""
    from tpustream.artifacts import ArtifactError, EvalReport, json_file_uri
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
            f"--metrics {metrics_uri} holds champion version {champion.version}'s numbers: give "
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
        policy=policy,
        data_check=data_check,
    )
    verdict = "promote" if facts.decision.promote else "keep the champion"
    typer.echo(f"decision: {verdict} ({facts.decision.reason})")
    typer.echo(f"report: {html_uri}")
    typer.echo(f"summary: {markdown_uri}")
