"""The shard steps' launchers (components/shards.py): plan, write one range, finalize. Each takes the plan's
parameters (``**plan``: source, num_shards, val_fraction, ..., the component's own names) as
``tpustream.dataset.fanout.config_from_pipeline`` takes them, the one decoding of them all three share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpustream.run.outcome import failure_recorded

if TYPE_CHECKING:
    from kfp.dsl import Dataset

__all__ = ["launch_plan_shards", "launch_write_shards", "launch_finalize_shards"]


def launch_plan_shards(
    *,
    shards_per_task: int,
    dataset: Dataset,
    run_outcome: str,
    **plan: Any,
) -> list[list[int]]:
    """Plan the dataset at ``dataset.uri``; returns the [start, end) shard ranges the writers split."""
    with failure_recorded(run_outcome, "plan-shards"):
        from tpustream.dataset.fanout import config_from_pipeline, shard_ranges

        config = config_from_pipeline(output=dataset.uri, **plan)
        return shard_ranges(config, shards_per_task)


def launch_write_shards(
    *,
    shard_range: list,
    dataset: Dataset,
    run_outcome: str,
    **plan: Any,
) -> int:
    """Write the planned shards [``shard_range[0]``, ``shard_range[1]``) into ``dataset.uri`` (resumable);
    returns how many were written now. Each range records its own failure (``write-shards-START-END``)."""
    start, end = int(shard_range[0]), int(shard_range[1])  # KFP may hand the list's numbers over as floats
    with failure_recorded(run_outcome, f"write-shards-{start}-{end}"):
        from tpustream.dataset.fanout import config_from_pipeline, write_shard_range

        config = config_from_pipeline(output=dataset.uri, **plan)
        return write_shard_range(config, start, end)


def launch_finalize_shards(
    *,
    planned: Dataset,
    dataset: Dataset,
    run_outcome: str,
    **plan: Any,
) -> None:
    """Write manifest.json once every shard exists; ``dataset`` points at ``planned``'s location with the
    splits' sample counts, the classes and the check step's fingerprint and marker."""
    with failure_recorded(run_outcome, "finalize-shards"):
        from tpustream.dataset.fanout import config_from_pipeline, finalize_dataset

        config = config_from_pipeline(output=planned.uri, **plan)
        manifest = finalize_dataset(config)
        dataset.uri = planned.uri
        dataset.metadata.update({split: info.num_samples for split, info in manifest.splits.items()})
        dataset.metadata["classes"] = manifest.classes
        for key in ("fingerprint", "marker"):  # evaluate records "trained on it" there
            dataset.metadata[key] = planned.metadata.get(key, "")
