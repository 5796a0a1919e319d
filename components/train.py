"""Train step: runs `tpustream train` in-process on the task's (TPU) machine, on every host of a slice."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output


def train_model(
    dataset: Input[Dataset], model_name: str, epochs: int, batch_size: int, lr: float, bf16: bool,
    workers: int, model: Output[Model], metrics: Output[Metrics], input_size: int = 0,
) -> None:  # fmt: skip
    """Train with --resume auto into the model artifact's URI: a retried task continues, not restarts.
    ``input_size`` 0: the dataset's rule (the images' median shorter side, within [16, 224]).

    On a multi-host slice every host runs this same command (one Vertex worker pool, one replica);
    only process 0 writes checkpoints, the model and KFP's outputs. KFP's executor would have every
    host write executor_output.json (it skips only non-chief CLUSTER_SPEC replicas,
    kfp/dsl/executor.py), so the other hosts leave with exit 0 once process 0 has committed the model.
    """
    from tpustream.train import Preempted, TrainConfig, exit_now, exit_preempted, train
    from tpustream.xla_runtime import is_primary_host

    try:
        # int(): an integer parameter can reach the executor as a float (the YAML keeps defaults as 8.0)
        card = train(TrainConfig(data=dataset.uri, output=model.uri, model=model_name, epochs=int(epochs),
                                 batch_size=int(batch_size), lr=lr or None, bf16=bf16, workers=int(workers),
                                 resume="auto", input_size=int(input_size) or None))  # fmt: skip
    except Preempted as exc:  # exit 75: the job (or KFP's retry) runs again and resumes from `last`
        exit_preempted(exc)
    if not is_primary_host():
        exit_now(0)  # process 0 committed the model (train() waited for it) and writes the outputs
    for key, value in card["metrics"].items():
        if isinstance(value, int | float):
            metrics.log_metric(key, float(value))
    model.metadata.update(
        {"arch": card["arch"], "input_size": card["input_size"], "val_top1": card["metrics"]["val_top1"]}
    )
