"""The evaluate step's launcher (components/evaluate.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream.run.outcome import failure_recorded

if TYPE_CHECKING:
    from kfp.dsl import HTML, ClassificationMetrics, Dataset, Markdown, Metrics, Model

__all__ = ["launch_evaluate"]


def launch_evaluate(
    *,
    model: Model,
    dataset: Dataset,
    registry: str,
    metric: str,
    min_delta: float,
    metrics: Metrics,
    confusion: ClassificationMetrics,
    evaluation: Metrics,
    data_check: Markdown,
    report: HTML,
    summary: Markdown,
    max_class_drop: float,
    min_metric: float,
    min_class_recall: float,
    max_p_value: float,
    beat_majority_baseline: bool,
    min_class_support: int,
    run_outcome: str,
) -> str:
    """Evaluate ``model`` against the champion, log the KFP metrics and the confusion matrix, log a refusal in
    the registry's history, write the run report; returns "promote" or "keep"."""
    with failure_recorded(run_outcome, "evaluate-model"):
        import logging

        from tpustream.metrics.label_issues import LABEL_ISSUES_NAME, read_label_issues
        from tpustream.registry.policy import PromotionPolicy
        from tpustream.release.promote import decide_and_log_refusal, preview_decision
        from tpustream.report.build import write_run_report
        from tpustream.report.facts import shows_top5
        from tpustream.run.outcome import record_outcome
        from tpustream.storage import io as storage
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
        issues_uri = storage.join(evaluation.uri, LABEL_ISSUES_NAME)
        if storage.exists(issues_uri):  # evaluate writes it beside metrics.json unless cleanlab refused
            metrics.log_metric("likely_label_errors", float(len(read_label_issues(issues_uri).issues)))
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
                code=decision.code,
                class_index=decision.class_index,
                report=report.uri,
                evaluation=result,
                metric=policy.metric,
            )
        return "promote" if decision.promote else "keep"
