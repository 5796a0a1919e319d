"""Shard creation fanned out: plan -> ParallelFor(write a range) -> finalize (manifest last).

Every step writes into the dataset location the check step chose (content-addressed by the source's
fingerprint); on a dataset that is complete already, writing and finalizing change nothing. ``exclude_keys`` and
``relabel`` (files, "" none) leave samples out or relabel them, named by source (tpustream/dataset/label_edits.py).
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
    exclude_keys: str = "",
    relabel: str = "",
) -> list:
    """Plan the dataset; returns the [start, end) shard ranges the writers split between them."""
    from tpustream.launchers.shards import launch_plan_shards

    return launch_plan_shards(
        source=source,
        num_shards=num_shards,
        val_fraction=val_fraction,
        upsample=upsample,
        seed=seed,
        max_side=max_side,
        strict=strict,
        train_hosts=train_hosts,
        loader_workers=loader_workers,
        shards_per_task=shards_per_task,
        dataset=dataset,
        test_fraction=test_fraction,
        run_outcome=run_outcome,
        exclude_keys=exclude_keys,
        relabel=relabel,
    )


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
    exclude_keys: str = "",
    relabel: str = "",
) -> int:
    """Write one range of the planned shards into the planned dataset location (resumable)."""
    from tpustream.launchers.shards import launch_write_shards

    return launch_write_shards(
        source=source,
        num_shards=num_shards,
        val_fraction=val_fraction,
        upsample=upsample,
        seed=seed,
        max_side=max_side,
        strict=strict,
        train_hosts=train_hosts,
        loader_workers=loader_workers,
        shard_range=shard_range,
        dataset=dataset,
        test_fraction=test_fraction,
        run_outcome=run_outcome,
        exclude_keys=exclude_keys,
        relabel=relabel,
    )


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
    exclude_keys: str = "",
    relabel: str = "",
) -> None:
    """Write manifest.json once every shard exists; the output artifact points at the dataset."""
    from tpustream.launchers.shards import launch_finalize_shards

    launch_finalize_shards(
        source=source,
        num_shards=num_shards,
        val_fraction=val_fraction,
        upsample=upsample,
        seed=seed,
        max_side=max_side,
        strict=strict,
        train_hosts=train_hosts,
        loader_workers=loader_workers,
        planned=planned,
        dataset=dataset,
        test_fraction=test_fraction,
        run_outcome=run_outcome,
        exclude_keys=exclude_keys,
        relabel=relabel,
    )
