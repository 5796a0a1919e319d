"""The train step's launcher (components/train.py): the pipeline's parameters to a ``TrainConfig``, one
``train()`` run, and its model card into KFP's outputs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream.run.outcome import failure_recorded

if TYPE_CHECKING:
    from kfp.dsl import Dataset, Metrics, Model

    from tpustream.artifacts import ModelCard

__all__ = ["launch_train"]


def launch_train(
    *,
    dataset: Dataset,
    model_name: str,
    epochs: int,
    batch_size: int,
    lr: float,
    bf16: bool,
    workers: int,
    model: Model,
    metrics: Metrics,
    input_size: int,
    init_from: str,
    pretrained: str,
    freeze_epochs: int,
    backbone_lr_scale: float,
    head_lr_scale: float,
    class_weights: str,
    registry: str,
    patience: int,
    early_stop_min_delta: float,
    compile_cache: str,
    pipeline_root: str,
    run_outcome: str,
    recipe: str,
    augment: str,
    random_erasing: float,
    mixup_alpha: float,
    cutmix_alpha: float,
    ema_decay: float,
    layer_decay: float,
) -> None:
    """Train on ``dataset`` into ``model.uri`` (resuming what a retried task left there); process 0 logs the
    card's metrics to ``metrics`` and the architecture, input size and val top-1 to ``model``'s metadata. A
    preempted run exits 75; the hosts other than process 0 exit 0 once it has committed the model."""
    with failure_recorded(run_outcome, "train-model"):
        from tpustream.train.config import TrainConfig

        config = TrainConfig.from_pipeline(
            data=dataset.uri,
            output=model.uri,
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
        from tpustream.train.preemption import Preempted, exit_now, exit_preempted
        from tpustream.train.trainer import train
        from tpustream.xla_runtime import is_primary_host

        try:
            card = train(config)
        except Preempted as exc:  # exit 75: the job (or KFP's retry) runs again and resumes from `last`
            exit_preempted(exc)
        if not is_primary_host():
            exit_now(0)  # process 0 committed the model (train() waited for it) and writes the outputs
        _record_card(card, model=model, metrics=metrics)


def _record_card(card: ModelCard, *, model: Model, metrics: Metrics) -> None:
    """The card's numeric metrics as KFP metrics; its architecture, input size and val top-1 on ``model``."""
    for key, value in card.metrics.items():
        if isinstance(value, int | float):
            metrics.log_metric(key, float(value))
    model.metadata.update(
        {"arch": card.arch, "input_size": card.input_size, "val_top1": card.metrics["val_top1"]}
    )
