"""Plan-tuning step (Vertex): the HyperparameterTuningJob's run-dependent inputs, from the train step's options and
the search space: the trials' TPU worker pools, the study's metric and parameters, the trial counts."""

from typing import NamedTuple

from kfp.dsl import Dataset, Input


def plan_tuning(
    dataset: Input[Dataset],
    model_name: str,
    epochs: int,
    batch_size: int,
    lr: float,
    bf16: bool,
    workers: int,
    trial_pool: dict,
    trial_image: str,
    tune_space: str = "",
    input_size: int = 0,
    init_from: str = "",
    pretrained: str = "",
    freeze_epochs: int = 0,
    backbone_lr_scale: float = 1.0,
    head_lr_scale: float = -1.0,
    class_weights: str = "none",
    recipe: str = "auto",
    augment: str = "",
    random_erasing: float = -1.0,
    mixup_alpha: float = -1.0,
    cutmix_alpha: float = -1.0,
    ema_decay: float = -1.0,
    layer_decay: float = -1.0,
    registry: str = "",
    patience: int = 0,
    early_stop_min_delta: float = 0.0,
    compile_cache: str = "",
    pipeline_root: str = "",
    run_outcome: str = "",
) -> NamedTuple(  # type: ignore[valid-type]  # KFP's multiple outputs, as its docs write them
    "TuningJobInputs",
    worker_pool_specs=list,
    study_spec_metrics=list,
    study_spec_parameters=list,
    max_trial_count=int,
    parallel_trial_count=int,
    space=dict,
):
    """``trial_pool``: the TPU job's worker pool without its container (pipelines/tpu.py); each trial runs
    tpustream.tune.vertex_trial in ``trial_image`` with the run's base options (tpustream/tune/vertex.py)."""
    from collections import namedtuple

    from tpustream.launchers.tune import plan_tuning_job

    planned = plan_tuning_job(
        dataset=dataset.uri,
        space=tune_space,
        trial_pool=trial_pool,
        image=trial_image,
        run_outcome=run_outcome,
        model_name=model_name,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        bf16=bf16,
        workers=workers,
        input_size=input_size,
        init_from=init_from,
        pretrained=pretrained,
        freeze_epochs=freeze_epochs,
        backbone_lr_scale=backbone_lr_scale,
        head_lr_scale=head_lr_scale,
        class_weights=class_weights,
        recipe=recipe,
        augment=augment,
        random_erasing=random_erasing,
        mixup_alpha=mixup_alpha,
        cutmix_alpha=cutmix_alpha,
        ema_decay=ema_decay,
        layer_decay=layer_decay,
        registry=registry,
        patience=patience,
        early_stop_min_delta=early_stop_min_delta,
        compile_cache=compile_cache,
        pipeline_root=pipeline_root,
    )
    names = [
        "worker_pool_specs",
        "study_spec_metrics",
        "study_spec_parameters",
        "max_trial_count",
        "parallel_trial_count",
        "space",
    ]
    return namedtuple("TuningJobInputs", names)(**planned)
