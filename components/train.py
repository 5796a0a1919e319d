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
    class_weights: str = "none",
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
    --class-weights (none/auto). ``patience`` 0: no early stopping.
    ``compile_cache``: the persistent XLA compilation cache's URI; "auto": ``pipeline_root``/xla-cache (the run's
    root, resolved by Vertex or kfp.local from {{$.pipeline_root}}); "" none.

    On a multi-host slice every host runs this same command (one Vertex worker pool, one replica);
    only process 0 writes checkpoints, the model and KFP's outputs. KFP's executor would have every
    host write executor_output.json (it skips only non-chief CLUSTER_SPEC replicas,
    kfp/dsl/executor.py), so the other hosts leave with exit 0 once process 0 has committed the model.
    """
    from tpustream.run.outcome import failure_recorded

    with failure_recorded(run_outcome, "train-model"):
        from tpustream.train.config import TrainConfig
        from tpustream.train.preemption import Preempted, exit_now, exit_preempted
        from tpustream.train.trainer import train
        from tpustream.train.warm_start import CHAMPION, champion_start
        from tpustream.xla_runtime import is_primary_host

        if compile_cache.strip() == "auto":
            compile_cache = f"{pipeline_root.rstrip('/')}/xla-cache" if pipeline_root.strip() else ""
        optional = init_from.strip() == CHAMPION
        start = (registry if optional else init_from).strip() or None
        if optional:
            from tpustream.errors import ConfigError

            if not registry:
                raise ConfigError("init_from=champion needs the registry parameter")
            start = champion_start(registry, pretrained)  # None: the first run of a new registry
        try:
            # int(): an integer parameter can reach the executor as a float (the YAML keeps defaults as 8.0)
            card = train(
                TrainConfig(
                    data=dataset.uri,
                    output=model.uri,
                    model=model_name,
                    epochs=int(epochs),
                    batch_size=int(batch_size),
                    lr=lr or None,
                    bf16=bf16,
                    workers=int(workers),
                    resume="auto",
                    input_size=int(input_size) or None,
                    init_from=start,
                    init_optional=optional,
                    pretrained=pretrained.strip() or None,
                    weights_cache=f"{pipeline_root.rstrip('/')}/weights-cache"
                    if pipeline_root.strip()
                    else None,
                    freeze_epochs=int(freeze_epochs),
                    backbone_lr_scale=backbone_lr_scale,
                    class_weights=class_weights,  # type: ignore[arg-type]  # TrainConfig checks none/auto
                    patience=int(patience),
                    min_delta=early_stop_min_delta,
                    compile_cache=compile_cache or None,
                )
            )
        except Preempted as exc:  # exit 75: the job (or KFP's retry) runs again and resumes from `last`
            exit_preempted(exc)
        if not is_primary_host():
            exit_now(0)  # process 0 committed the model (train() waited for it) and writes the outputs
        for key, value in card.metrics.items():
            if isinstance(value, int | float):
                metrics.log_metric(key, float(value))
        model.metadata.update(
            {"arch": card.arch, "input_size": card.input_size, "val_top1": card.metrics["val_top1"]}
        )
