"""The promote step's launcher (components/promote.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream.run.outcome import failure_recorded

if TYPE_CHECKING:
    from google_cloud_pipeline_components.types.artifact_types import VertexModel
    from kfp.dsl import HTML, Dataset, Markdown, Metrics, Model

__all__ = ["launch_promote"]


def launch_promote(
    *,
    model: Model,
    evaluation: Metrics,
    registry: str,
    metric: str,
    min_delta: float,
    vertex_model: VertexModel,
    validation: Metrics,
    dataset: Dataset,
    data_check: Markdown,
    report: HTML,
    summary: Markdown,
    max_class_drop: float,
    min_metric: float,
    min_class_recall: float,
    max_p_value: float,
    beat_majority_baseline: bool,
    min_class_support: int,
    vertex_model_name: str,
    serving_image: str,
    project: str,
    location: str,
    run_outcome: str,
) -> str:
    """Promote ``model`` if it passed validation and still wins under compare-and-swap (and publish it to
    Vertex with ``vertex_model_name``); write the run report and record the outcome. Returns its line."""
    with failure_recorded(run_outcome, "promote-model"):
        import logging

        from tpustream.artifacts import EvalReport
        from tpustream.registry.policy import PromotionPolicy
        from tpustream.release.promote import promote
        from tpustream.report.build import write_run_report
        from tpustream.run.outcome import record_outcome
        from tpustream.serve.validate import require_validated
        from tpustream.vertex.model_registry import target_from_env

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
        require_validated(validation.uri, model.uri)  # the validate step passed, for this very model.pt
        target = target_from_env(vertex_model_name, project, location, serving_image)
        outcome = promote(model.uri, evaluation.uri, registry, policy, vertex=target)
        try:  # the report decides nothing: if it cannot be written, the step goes on and says so
            write_run_report(
                html_uri=report.path,
                markdown_uri=summary.path,
                model_uri=model.uri,
                metrics_uri=evaluation.uri,
                dataset_uri=dataset.uri,
                registry=registry,
                policy=policy,
                outcome=outcome,
                data_check=data_check.uri,
            )
        except Exception:
            logging.getLogger("tpustream").exception(
                "the run report could not be written (the decision stands)"
            )
        published = outcome.vertex
        if published:
            vertex_model.uri = published.uri
            vertex_model.metadata["resourceName"] = published.versioned_name
        line = (
            f"promoted version {outcome.version}"
            + (f", Vertex AI model {published.versioned_name}" if published else "")
            if outcome.promoted
            else f"not promoted: {outcome.reason}"
        )
        record_outcome(
            run_outcome,
            step="promote",
            decision="promoted" if outcome.promoted else "kept",
            reason=line.removeprefix("promoted ") if outcome.promoted else outcome.reason,
            code=outcome.code,
            class_index=outcome.class_index,
            report=report.uri,
            evaluation=EvalReport.read(evaluation.uri),
            metric=policy.metric,
        )
        return line
