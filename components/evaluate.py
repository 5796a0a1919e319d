"""Evaluate step: candidate and champion on the same held-out shards (test when the dataset has a test split,
else val); decides whether to promote; the run report."""

from kfp.dsl import HTML, ClassificationMetrics, Dataset, Input, Markdown, Metrics, Model, Output


def evaluate_model(
    model: Input[Model],
    dataset: Input[Dataset],
    registry: str,
    metric: str,
    min_delta: float,
    metrics: Output[Metrics],
    confusion: Output[ClassificationMetrics],
    evaluation: Output[Metrics],
    data_check: Input[Markdown],
    report: Output[HTML],
    summary: Output[Markdown],
    max_class_drop: float = -1.0,
    min_metric: float = -1.0,
    min_class_recall: float = -1.0,
    max_p_value: float = -1.0,
    beat_majority_baseline: bool = True,
    min_class_support: int = 10,
    run_outcome: str = "",
) -> str:
    """metrics.json under the `evaluation` artifact; KFP metrics and the confusion matrix for the UI; the run
    report (``report``: one HTML page, ``summary``: Markdown; tpustream/report/build.py) with the decision as it
    stands before promote. Returns "promote" or "keep" (the DAG's branch; promote decides again under
    compare-and-swap); a refused candidate is logged in the registry's history here, once, as promote
    would log it. ``data_check``: the check-data step's report. ``max_class_drop`` < 0: no per-class check; ``min_metric``/``min_class_recall``
    < 0: no quality floor; ``max_p_value`` < 0: no significance required; ``beat_majority_baseline``: refuse a
    candidate that does not beat the majority-class baseline; ``min_class_support``: a class with fewer samples
    on the deciding split cannot refuse the candidate by its drop."""
    from tpustream.launchers.evaluate import launch_evaluate

    return launch_evaluate(
        model=model,
        dataset=dataset,
        registry=registry,
        metric=metric,
        min_delta=min_delta,
        metrics=metrics,
        confusion=confusion,
        evaluation=evaluation,
        data_check=data_check,
        report=report,
        summary=summary,
        max_class_drop=max_class_drop,
        min_metric=min_metric,
        min_class_recall=min_class_recall,
        max_p_value=max_p_value,
        beat_majority_baseline=beat_majority_baseline,
        min_class_support=min_class_support,
        run_outcome=run_outcome,
    )
