"""Evaluate step: candidate and champion on the same val shards; decides whether to promote."""

from kfp.dsl import ClassificationMetrics, Dataset, Input, Metrics, Model, Output


def evaluate_model(
    model: Input[Model],
    dataset: Input[Dataset],
    registry: str,
    metric: str,
    min_delta: float,
    metrics: Output[Metrics],
    confusion: Output[ClassificationMetrics],
    evaluation: Output[Metrics],
    max_class_drop: float = -1.0,
) -> str:
    """metrics.json under the `evaluation` artifact; KFP metrics and the confusion matrix for the UI.
    Returns "promote" or "keep" (the DAG's branch; promote decides again under compare-and-swap).
    ``max_class_drop`` < 0: no per-class check."""
    import logging

    from tpustream.evaluate import evaluate
    from tpustream.promote import preview_decision

    result = evaluate(model.uri, dataset.uri, evaluation.uri, registry=registry or None)
    candidate = result["candidate"]
    for key in ("top1", "top5", "loss"):
        metrics.log_metric(key, float(candidate[key]))
    metrics.log_metric("num_samples", float(candidate["num_samples"]))
    confusion.log_confusion_matrix(result["classes"], candidate["confusion_matrix"])
    decision = preview_decision(
        result,
        registry or None,
        metric=metric,
        min_delta=min_delta,
        max_class_drop=max_class_drop if max_class_drop >= 0 else None,
    )
    logging.getLogger("tpustream").info(
        "decision: %s (%s)", "promote" if decision.promote else "keep", decision.reason
    )
    evaluation.metadata["decision_reason"] = decision.reason
    if dataset.metadata.get("marker"):  # this dataset + these settings are done: a rerun on them skips
        from tpustream.fingerprint import record_trained

        record_trained(
            dataset.metadata["marker"], dataset=dataset.uri, model=model.uri, decision=decision.reason
        )
    return "promote" if decision.promote else "keep"
