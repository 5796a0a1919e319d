"""Promote step: atomic champion swap (re-decides under compare-and-swap); with ``vertex_model_name``, the
promoted version is also uploaded to the Vertex AI Model Registry with the serving image, and the
``vertex_model`` output (GCPC's ``google.VertexModel``: ``metadata.resourceName`` = ``projects/P/locations/
L/models/ID@VERSION``, as GCPC's own ModelUploadOp writes it) can feed ``ModelDeployOp`` or batch prediction.

``project`` and ``location``: empty = the environment (``tpustream.vertex.model_registry.target_from_env``). GCPC's
placeholders ({{$.pipeline_google_cloud_project_id}}, _placeholders.py) would be resolved by Vertex but make
kfp.local fail (kfp/local/placeholder_utils.py cannot resolve them), so they are not defaults; a value that
is one and arrives unresolved is ignored.
"""

from google_cloud_pipeline_components.types import artifact_types
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output


def promote_model(
    model: Input[Model],
    evaluation: Input[Metrics],
    registry: str,
    metric: str,
    min_delta: float,
    vertex_model: Output[artifact_types.VertexModel],
    validation: Input[Metrics],
    dataset: Input[Dataset],
    data_check: Input[Markdown],
    report: Output[HTML],
    summary: Output[Markdown],
    max_class_drop: float = -1.0,
    min_metric: float = -1.0,
    min_class_recall: float = -1.0,
    max_p_value: float = -1.0,
    beat_majority_baseline: bool = True,
    min_class_support: int = 10,
    vertex_model_name: str = "",
    serving_image: str = "",
    project: str = "",
    location: str = "",
    run_outcome: str = "",
) -> str:
    """``validation``: the validate step's report (tpustream/serve/validate.py); nothing moves unless it is
    a pass for this candidate. ``report``/``summary``: the run report with the final decision (evaluate's,
    now settled). Returns the outcome line; the registry's champion.json is the source of truth. Without
    ``vertex_model_name`` nothing goes to Vertex and ``vertex_model`` carries no resourceName.
    ``max_class_drop`` < 0: no per-class check; ``min_metric``/``min_class_recall``
    < 0: no quality floor; ``max_p_value`` < 0: no significance required; ``beat_majority_baseline``: refuse a
    candidate that does not beat the majority-class baseline; ``min_class_support``: a class with fewer samples
    on the deciding split cannot refuse the candidate by its drop."""
    from tpustream.launchers.promote import launch_promote

    return launch_promote(
        model=model,
        evaluation=evaluation,
        registry=registry,
        metric=metric,
        min_delta=min_delta,
        vertex_model=vertex_model,
        validation=validation,
        dataset=dataset,
        data_check=data_check,
        report=report,
        summary=summary,
        max_class_drop=max_class_drop,
        min_metric=min_metric,
        min_class_recall=min_class_recall,
        max_p_value=max_p_value,
        beat_majority_baseline=beat_majority_baseline,
        min_class_support=min_class_support,
        vertex_model_name=vertex_model_name,
        serving_image=serving_image,
        project=project,
        location=location,
        run_outcome=run_outcome,
    )
