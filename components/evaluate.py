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
    from tpustream.run.outcome import failure_recorded

    with failure_recorded(run_outcome, "evaluate-model"):
        import logging

        from tpustream.registry.policy import PromotionPolicy
        from tpustream.release.promote import decide_and_log_refusal, preview_decision
        from tpustream.report.build import write_run_report
        from tpustream.report.facts import shows_top5
        from tpustream.run.outcome import record_outcome
        from tpustream.train.evaluate import evaluate

        policy = PromotionPolicy.from_pipeline(
            metric=metric,
            min_delta=min_delta,
            max_class_drop=max_class_drop,
            min_metric=min_metric,
            min_class_recall=min_class_recall,
            max_p_value=max_p_value,
            beat_majority_baseline=beat_majority_baseline,
            min_class_support=min_class_support,
        )
        result = evaluate(model.uri, dataset.uri, evaluation.uri, registry=registry or None)
        candidate = result.candidate
        for key in ("top1", "top5", "loss") if shows_top5(len(result.classes)) else ("top1", "loss"):
            metrics.log_metric(key, float(candidate.metric(key)))
        metrics.log_metric("num_samples", float(candidate.num_samples or 0))
        for key in ("macro_f1", "balanced_accuracy", "auprc", "auroc"):  # from the per-sample scores
            if candidate.metric(key) is not None:
                metrics.log_metric(key, float(candidate.metric(key)))
        if result.val is not None:  # test decided: the candidate's val numbers, for reference
            for key in ("top1", "loss"):
                metrics.log_metric(f"val_{key}", float(result.val.metric(key)))
        trivial = result.baseline.metric(policy.metric) if result.baseline is not None else None
        if trivial is not None:  # the majority-class answer's, beside the candidate's
            metrics.log_metric(f"baseline_{policy.metric}", trivial)
        evaluation.metadata["split"] = result.split
        confusion.log_confusion_matrix(result.classes, candidate.confusion_matrix)
        # A refusal is final here (promote does not run after it): it goes into the registry's history now,
        # before the report, whose history then shows it.
        decision = (
            decide_and_log_refusal(model.uri, evaluation.uri, registry, policy)
            if registry
            else preview_decision(result, None, policy)
        )
        logging.getLogger("tpustream").info(
            "decision on the %s split: %s (%s)",
            result.split,
            "promote" if decision.promote else "keep",
            decision.reason,
        )
        evaluation.metadata["decision_reason"] = decision.reason
        try:  # the report decides nothing: if it cannot be written, the step goes on and says so
            write_run_report(
                html_uri=report.path,
                markdown_uri=summary.path,
                model_uri=model.uri,
                metrics_uri=evaluation.uri,
                dataset_uri=dataset.uri,
                registry=registry or None,
                policy=policy,
                data_check=data_check.uri,
            )
        except Exception:
            logging.getLogger("tpustream").exception(
                "the run report could not be written (the decision stands)"
            )
        if dataset.metadata.get("marker"):  # this dataset + these settings are done: a rerun on them skips
            from tpustream.registry.store import record_trained

            record_trained(
                dataset.metadata["marker"], dataset=dataset.uri, model=model.uri, decision=decision.reason
            )
        if not decision.promote:  # the run ends here (a winner's outcome is promote's to record)
            record_outcome(
                run_outcome,
                step="evaluate",
                decision="kept",
                reason=decision.reason,
                report=report.uri,
                evaluation=result,
                metric=policy.metric,
            )
        return "promote" if decision.promote else "keep"
