"""Train step: runs `tpustream train` in-process on the task's (TPU) machine, on every host of a slice."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output


def train_model(
    dataset: Input[Dataset],
    model_name: str,
    epochs: int,
    batch_size: int,
    lr: float,
    bf16: bool,
    workers: int,
    model: Output[Model],
    metrics: Output[Metrics],
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
    """Train with --resume auto into the model artifact's URI: a retried task continues, not restarts.
    ``input_size`` 0: the dataset's rule (the images' median shorter side, within [16, 224]).
    ``init_from``: "" random weights; "champion" the current champion of ``registry`` (none yet, or one that
    does not fit the run, e.g. another architecture: random weights, with a warning); else a model artifact,
    registry or checkpoint URI (one that does not fit fails the task). ``pretrained``: "" random weights (or
    the warm start's), else --pretrained's SPEC: a weights file URI, or a torchvision weights name fetched once
    into ``pipeline_root``/weights-cache (shared by the runs under that root). ``freeze_epochs``,
    ``backbone_lr_scale``, ``class_weights``: the fine-tuning recipe's --freeze-epochs, --backbone-lr-scale,
    --class-weights (none/auto). ``recipe``: --recipe (auto: by model and data size); ``augment`` "" and a
    negative ``random_erasing``, ``mixup_alpha``, ``cutmix_alpha``, ``ema_decay``, ``layer_decay``: the
    recipe's own values; a negative ``head_lr_scale`` the model's (--head-lr-scale). ``patience`` 0: no early
    stopping.
    ``compile_cache``: the persistent XLA compilation cache's URI; "auto": ``pipeline_root``/xla-cache (the run's
    root, resolved by Vertex or kfp.local from {{$.pipeline_root}}); "" none.

    On a multi-host slice every host runs this same command (one Vertex worker pool, one replica);
    only process 0 writes checkpoints, the model and KFP's outputs. KFP's executor would have every
    host write executor_output.json (it skips only non-chief CLUSTER_SPEC replicas,
    kfp/dsl/executor.py), so the other hosts leave with exit 0 once process 0 has committed the model.
    """
    from tpustream.launchers.train import launch_train

    launch_train(
        dataset=dataset,
        model_name=model_name,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        bf16=bf16,
        workers=workers,
        model=model,
        metrics=metrics,
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
        run_outcome=run_outcome,
    )
