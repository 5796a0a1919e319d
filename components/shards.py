"""Shard creation fanned out: plan -> ParallelFor(write a range) -> finalize (manifest last).

Every step writes into the dataset location the check step chose (content-addressed by the source's
fingerprint); on a dataset that is complete already, writing and finalizing change nothing.
"""

from kfp.dsl import Dataset, Input, Output


def plan_shards(
    source: str,
    num_shards: int,
    val_fraction: float,
    upsample: int,
    seed: int,
    max_side: int,
    strict: bool,
    train_hosts: int,
    loader_workers: int,
    shards_per_task: int,
    dataset: Input[Dataset],
    test_fraction: float = 0.0,
    run_outcome: str = "",
) -> list:
    """Plan the dataset; returns the [start, end) shard ranges the writers split between them."""
    from tpustream.run.outcome import failure_recorded

    with failure_recorded(run_outcome, "plan-shards"):
        from tpustream.dataset.fanout import config_from_pipeline, shard_ranges

        config = config_from_pipeline(
            source=source,
            output=dataset.uri,
            num_shards=num_shards,
            val_fraction=val_fraction,
            upsample=upsample,
            seed=seed,
            max_side=max_side,
            strict=strict,
            train_hosts=train_hosts,
            loader_workers=loader_workers,
            test_fraction=test_fraction,
        )
        return shard_ranges(config, shards_per_task)


def write_shards(
    source: str,
    num_shards: int,
    val_fraction: float,
    upsample: int,
    seed: int,
    max_side: int,
    strict: bool,
    train_hosts: int,
    loader_workers: int,
    shard_range: list,
    dataset: Input[Dataset],
    test_fraction: float = 0.0,
    run_outcome: str = "",
) -> int:
    """Write one range of the planned shards into the planned dataset location (resumable)."""
    from tpustream.run.outcome import failure_recorded

    with failure_recorded(run_outcome, f"write-shards-{int(shard_range[0])}-{int(shard_range[1])}"):
        from tpustream.dataset.fanout import config_from_pipeline, write_shard_range

        config = config_from_pipeline(
            source=source,
            output=dataset.uri,
            num_shards=num_shards,
            val_fraction=val_fraction,
            upsample=upsample,
            seed=seed,
            max_side=max_side,
            strict=strict,
            train_hosts=train_hosts,
            loader_workers=loader_workers,
            test_fraction=test_fraction,
        )
        return write_shard_range(config, int(shard_range[0]), int(shard_range[1]))


def finalize_shards(
    source: str,
    num_shards: int,
    val_fraction: float,
    upsample: int,
    seed: int,
    max_side: int,
    strict: bool,
    train_hosts: int,
    loader_workers: int,
    written: list,
    planned: Input[Dataset],
    dataset: Output[Dataset],
    test_fraction: float = 0.0,
    run_outcome: str = "",
) -> None:
    """Write manifest.json once every shard exists; the output artifact points at the dataset."""
    from tpustream.run.outcome import failure_recorded

    with failure_recorded(run_outcome, "finalize-shards"):
        from tpustream.dataset.fanout import config_from_pipeline, finalize_dataset

        config = config_from_pipeline(
            source=source,
            output=planned.uri,
            num_shards=num_shards,
            val_fraction=val_fraction,
            upsample=upsample,
            seed=seed,
            max_side=max_side,
            strict=strict,
            train_hosts=train_hosts,
            loader_workers=loader_workers,
            test_fraction=test_fraction,
        )
        manifest = finalize_dataset(config)
        dataset.uri = planned.uri
        dataset.metadata.update({split: info.num_samples for split, info in manifest.splits.items()})
        dataset.metadata["classes"] = manifest.classes
        for key in ("fingerprint", "marker"):  # evaluate records "trained on it" there
            dataset.metadata[key] = planned.metadata.get(key, "")
