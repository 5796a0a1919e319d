"""The check-data step's launcher (components/check_data.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream.run.outcome import failure_recorded

if TYPE_CHECKING:
    from kfp.dsl import Dataset, Markdown

__all__ = ["launch_check_data"]


def launch_check_data(
    *,
    dataset: Dataset,
    registry: str,
    data_check: str,
    max_duplicate_fraction: float,
    max_leaked_images: int,
    max_skipped_rate: float,
    max_class_share_shift: float,
    max_skipped_rate_increase: float,
    min_class_train_samples: int,
    near_duplicate_distance: int,
    report: Markdown,
    run_outcome: str,
    class_weights: str,
) -> None:
    """Check ``dataset``, write the Markdown ``report`` and name the anomalies and warnings in its metadata;
    an anomaly under ``data_check`` "fail" is recorded as the run's outcome and raised (DataCheckFailed)."""
    with failure_recorded(run_outcome, "check-data"):
        from tpustream.dataset.check import DataCheckThresholds
        from tpustream.run.data_gate import DataCheckFailed, check_for_pipeline
        from tpustream.run.outcome import record_outcome

        thresholds = DataCheckThresholds(
            max_duplicate_fraction=max_duplicate_fraction,
            max_leaked_images=int(max_leaked_images),
            max_skipped_rate=max_skipped_rate,
            max_class_share_shift=max_class_share_shift,
            max_skipped_rate_increase=max_skipped_rate_increase,
            min_class_train_samples=int(min_class_train_samples),
            near_duplicate_distance=int(near_duplicate_distance),
        )
        try:
            result = check_for_pipeline(
                dataset.uri,
                registry=registry,
                mode=data_check,
                thresholds=thresholds,
                report_path=report.path,
                report_uri=report.uri,
                class_weights=class_weights,
            )
        except DataCheckFailed as exc:  # the run stops here: its notification says why
            record_outcome(
                run_outcome, step="check data", decision="refused", reason=str(exc), report=report.uri
            )
            raise
        report.metadata["data_check"] = data_check
        if result is not None:
            report.metadata["anomalies"] = [anomaly.code for anomaly in result.anomalies]
            report.metadata["warnings"] = [warning.code for warning in result.warnings]
            report.metadata["baseline"] = result.baseline or ""
