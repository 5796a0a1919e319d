"""Check step: fingerprint the live source; decide whether this run writes shards and trains."""

from kfp.dsl import Dataset, Output


def check_source(
    source: str,
    num_shards: int,
    val_fraction: float,
    upsample: int,
    seed: int,
    max_side: int,
    strict: bool,
    datasets_root: str,
    registry: str,
    model_name: str,
    epochs: int,
    batch_size: int,
    lr: float,
    bf16: bool,
    retrain: bool,
    train_hosts: int,
    loader_workers: int,
    dataset: Output[Dataset],
    run_outcome: str = "",
    test_fraction: float = 0.0,
    exclude_keys: str = "",
    relabel: str = "",
) -> str:
    """Returns "train" or "skip"; `dataset` points at the content-addressed dataset of this fingerprint.
    Never cached (the pipeline turns caching off): it is the step that reads the live source.
    ``run_outcome``: where the run's outcome is recorded (tpustream/run/outcome.py; "" none). The
    ``exclude_keys``/``relabel`` edits are part of the fingerprint: new edits are new data."""
    from tpustream.launchers.check import launch_check_source

    return launch_check_source(
        source=source,
        num_shards=num_shards,
        val_fraction=val_fraction,
        upsample=upsample,
        seed=seed,
        max_side=max_side,
        strict=strict,
        datasets_root=datasets_root,
        registry=registry,
        model_name=model_name,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        bf16=bf16,
        retrain=retrain,
        train_hosts=train_hosts,
        loader_workers=loader_workers,
        dataset=dataset,
        run_outcome=run_outcome,
        test_fraction=test_fraction,
        exclude_keys=exclude_keys,
        relabel=relabel,
    )
