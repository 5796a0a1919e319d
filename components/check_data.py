"""Check data step: between "finalize manifest" and "train", is the dataset fit to spend a TPU run on?

Duplicates, train/val leakage (exact, and near copies by perceptual hash), empty classes, the skipped rate, and drift from the data the current champion
trained on (tpustream/dataset/check.py). The Markdown report is the ``report`` artifact (shown in the KFP UI); an
anomaly fails the task, naming it, unless ``data_check`` is "warn" ("off": nothing is checked).
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
    near_duplicate_distance: int,
    run_outcome: str = "",
    class_weights: str = "none",
) -> None:
    """Write the report; raise DataCheckFailed (the task fails) on an anomaly when ``data_check`` is "fail".
    ``class_weights``: the train step's (none/auto), which the report's class-shares note names."""
    from tpustream.launchers.check_data import launch_check_data

    launch_check_data(
        dataset=dataset,
        registry=registry,
        data_check=data_check,
        max_duplicate_fraction=max_duplicate_fraction,
        max_leaked_images=max_leaked_images,
        max_skipped_rate=max_skipped_rate,
        max_class_share_shift=max_class_share_shift,
        max_skipped_rate_increase=max_skipped_rate_increase,
        min_class_train_samples=min_class_train_samples,
        near_duplicate_distance=near_duplicate_distance,
        report=report,
        run_outcome=run_outcome,
        class_weights=class_weights,
    )
