"""Check data step: between "finalize manifest" and "train", is the dataset fit to spend a TPU run on?

Duplicates, train/val leakage, empty classes, the skipped rate, and drift from the data the current champion
trained on (tpustream/run/data_gate.py over tpustream/dataset/check.py). The Markdown report is the ``report``
artifact (shown in the KFP UI); an anomaly fails the task, naming it, unless ``data_check`` is "warn" ("off":
nothing is checked).
"""

from kfp.dsl import Dataset, Input, Markdown, Output


def check_data(
    dataset: Input[Dataset],
    registry: str,
    data_check: str,
    max_duplicate_fraction: float,
    max_leaked_images: int,
    max_skipped_rate: float,
    max_class_share_shift: float,
    max_skipped_rate_increase: float,
    min_class_train_samples: int,
    report: Output[Markdown],
    run_outcome: str = "",
    class_weights: str = "none",
) -> None:
    """Write the report; raise DataCheckFailed (the task fails) on an anomaly when ``data_check`` is "fail".
    ``class_weights``: the train step's (none/auto), which the report's class-shares note names."""
    from tpustream.run.outcome import failure_recorded

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
