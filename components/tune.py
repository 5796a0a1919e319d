"""Tune step, off Vertex: the search space searched in this step with optuna (`tpustream tune`'s search), the best
trial's model handed on as the candidate. On Vertex the pipeline runs plan_tuning -> the HyperparameterTuningJob ->
pick_trial instead (pipelines/training.py)."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output


def tune_model(
    dataset: Input[Dataset],
    model_name: str,
    epochs: int,
    batch_size: int,
    lr: float,
    bf16: bool,
    workers: int,
    model: Output[Model],
    metrics: Output[Metrics],
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
) -> None:
    """Search ``tune_space`` ("" the default space: tpustream/tune/space.py) around the train step's options
    (the same parameters, the base of every trial); ``model`` is the best trial's model, its model.json
    recording the trial, tuning.json beside it (the report's trials section)."""
    from tpustream.launchers.tune import launch_tune

    launch_tune(
        dataset=dataset.uri,
        space=tune_space,
        model=model,
        metrics=metrics,
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
