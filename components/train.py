"""Train step: runs `tpustream train` in-process on the task's (TPU) machine."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output


def train_model(
    dataset: Input[Dataset], model_name: str, epochs: int, batch_size: int, lr: float, bf16: bool,
    workers: int, model: Output[Model], metrics: Output[Metrics],
) -> None:  # fmt: skip
    """Train with --resume auto into the model artifact's URI: a retried task continues, not restarts."""
    from tpustream.train import TrainConfig, train

    card = train(TrainConfig(data=dataset.uri, output=model.uri, model=model_name, epochs=epochs,
                             batch_size=batch_size, lr=lr or None, bf16=bf16, workers=workers, resume="auto"))  # fmt: skip
    for key, value in card["metrics"].items():
        if isinstance(value, int | float):
            metrics.log_metric(key, float(value))
    model.metadata.update(
        {"arch": card["arch"], "input_size": card["input_size"], "val_top1": card["metrics"]["val_top1"]}
    )
