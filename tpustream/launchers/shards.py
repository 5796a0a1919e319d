"""The shard steps' launchers (components/shards.py): plan, write one range, finalize."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream.run.outcome import failure_recorded

if TYPE_CHECKING:
    from kfp.dsl import Dataset

__all__ = ["launch_plan_shards", "launch_write_shards", "launch_finalize_shards"]


def launch_plan_shards(
    *,
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
    dataset: Dataset,
    test_fraction: float,
    run_outcome: str,
) -> list[list[int]]:
    """Plan the dataset at ``dataset.uri``; returns the [start, end) shard ranges the writers split."""
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


def launch_write_shards(
    *,
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
    dataset: Dataset,
    test_fraction: float,
    run_outcome: str,
) -> int:
    """Write the planned shards [``shard_range[0]``, ``shard_range[1]``) into ``dataset.uri`` (resumable);
    returns how many were written now. Each range records its own failure (``write-shards-START-END``)."""
    start, end = int(shard_range[0]), int(shard_range[1])  # KFP may hand the list's numbers over as floats
    with failure_recorded(run_outcome, f"write-shards-{start}-{end}"):
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
        return write_shard_range(config, start, end)


def launch_finalize_shards(
    *,
    source: str,
    num_shards: int,
    val_fraction: float,
    upsample: int,
    seed: int,
    max_side: int,
    strict: bool,
    train_hosts: int,
    loader_workers: int,
    planned: Dataset,
    dataset: Dataset,
    test_fraction: float,
    run_outcome: str,
) -> None:
    """Write manifest.json once every shard exists; ``dataset`` points at ``planned``'s location with the
    splits' sample counts, the classes and the check step's fingerprint and marker."""
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
