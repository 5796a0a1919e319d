"""The data-check gate: the pipeline's "check data" step between "finalize manifest" and "train". The dataset is
checked against the data the registry's champion was trained on (``champion_baseline``), and an anomaly stops
the run when ``data_check`` is "fail" (``check_for_pipeline``).

The check itself, its limits and its report are the dataset's (``tpustream.dataset.check``: ``shards check``
runs it without a registry); which baseline to compare with, and whether a finding stops a run, are the run's.
"""

from __future__ import annotations

import json
import logging

from tpustream.artifacts import ArtifactError, ModelCard
from tpustream.dataset.check import DataCheckThresholds, check_dataset
from tpustream.dataset.check_result import DataCheckReport, data_check_json_uri
from tpustream.dataset.manifest import manifest_digest
from tpustream.errors import ConfigError, TpustreamError
from tpustream.registry.store import read_champion, version_uri
from tpustream.storage import io as storage

__all__ = ["DATA_CHECK_MODES", "DataCheckFailed", "champion_baseline", "check_for_pipeline"]

log = logging.getLogger(__name__)

DATA_CHECK_MODES = ("fail", "warn", "off")  # the pipeline's data_check parameter


class DataCheckFailed(TpustreamError, RuntimeError):
    """The data check found anomalies and the run was asked to stop on them (``data_check=fail``)."""


def champion_baseline(registry: str) -> tuple[str | None, str]:
    """The dataset the registry's champion was trained on (from its model.json), and how it was found; or
    None and why there is none (no champion yet, its dataset gone or changed)."""
    champion = read_champion(registry)
    if champion is None:
        return None, "no champion yet: the first run has nothing to compare with"
    card_uri = storage.join(version_uri(registry, champion.version), "model.json")
    try:
        trained_on = ModelCard.read(card_uri).dataset
    except (storage.NotFound, ArtifactError) as exc:
        return None, f"the champion's model card {card_uri} names no dataset ({type(exc).__name__})"
    if trained_on is None or not trained_on.uri or not trained_on.manifest_digest:
        return None, f"the champion's model card {card_uri} names no dataset and its digest"
    dataset, digest = trained_on.uri, trained_on.manifest_digest
    try:
        found = manifest_digest(dataset)
    except storage.StorageError:
        return None, f"the champion's training data {dataset} is gone: nothing to compare with"
    if found != digest:
        return (
            None,
            f"the champion's training data {dataset} changed since it trained (manifest digest differs)",
        )
    return dataset, f"the training data of champion version {champion.version}"


def check_for_pipeline(
    dataset: str,
    *,
    registry: str,
    mode: str,
    thresholds: DataCheckThresholds,
    report_path: str,
    report_uri: str = "",
    class_weights: str | None = None,
) -> DataCheckReport | None:
    """The pipeline's "check data" step: check ``dataset`` against the champion's training data, write the
    Markdown report to ``report_path`` and its JSON beside it (``data_check_json_uri``), log each anomaly;
    raise DataCheckFailed on any when ``mode`` is "fail" ("warn": only log them; "off": check nothing).
    ``class_weights``: the train step's, which the class-balance note names."""
    if mode not in DATA_CHECK_MODES:
        raise ConfigError(f"data_check {mode!r} is not one of {', '.join(DATA_CHECK_MODES)}")
    if mode == "off":
        storage.write_bytes(
            report_path, f"# Data check: `{dataset}`\n\nNot checked: the run set `data_check=off`.\n".encode()
        )
        log.warning("data check off (data_check=off): %s goes to training unchecked", dataset)
        return None
    baseline, note = champion_baseline(registry) if registry else (None, "no registry given")
    log.info("data check of %s; baseline: %s (%s)", dataset, baseline or "none", note)
    report = check_dataset(dataset, baseline, thresholds, baseline_note=note, class_weights=class_weights)
    storage.write_bytes(report_path, report.to_markdown().encode(), content_type="text/markdown")
    storage.write_bytes(  # beside it, for the run report's near-leak thumbnails
        data_check_json_uri(report_path),
        (json.dumps(report.to_json(), indent=1) + "\n").encode(),
        content_type="application/json",
    )
    for line in report.notes:
        if line.startswith("class shares:"):
            log.info("data check: %s", line)
    for anomaly in report.anomalies:
        log.warning("data check anomaly %s: %s", anomaly.code, anomaly.reason)
    for warning in report.warnings:
        log.warning("data check warning %s: %s", warning.code, warning.reason)
    if report.anomalies and mode == "fail":
        raise DataCheckFailed(report.failure_line(report_uri))
    if report.anomalies:
        log.warning("data_check=warn: training on %s despite %d anomalies", dataset, len(report.anomalies))
    else:
        log.info("data check passed: %s", dataset)
    return report
