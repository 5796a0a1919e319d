"""One plan, many writers: the pipeline's shard step as KFP ``ParallelFor`` tasks.

``shard_ranges`` splits the plan's shards into ranges, ``write_shard_range`` writes one range (keeping shards an
earlier attempt finished), ``finalize_dataset`` writes the manifest once every shard is there. Each task re-plans
from the same config: the plan is deterministic, so every task sees the same shards. The ``exclude_keys`` and
``relabel`` files apply in every task, naming samples by source only (tpustream/dataset/label_edits.py says why):
the plan task checks them, so a bad file stops the run before any shard is written.
"""

from __future__ import annotations

from tpustream.artifacts import Manifest
from tpustream.dataset.finalize import finalize_manifest
from tpustream.dataset.label_edits import PIPELINE_PARAMETERS, edit_source
from tpustream.dataset.manifest import MANIFEST_NAME, load_manifest
from tpustream.dataset.plan import MIN_TRAIN_SHARDS, DatasetPlan, ShardConfig, plan_dataset
from tpustream.dataset.shard_writer import existing_record, write_shard
from tpustream.dataset.write import check_source_listing
from tpustream.errors import ConfigError
from tpustream.sources.dispatch import open_source
from tpustream.storage import io as storage

__all__ = ["config_from_pipeline", "shard_ranges", "write_shard_range", "finalize_dataset"]


def config_from_pipeline(
    *,
    source: str,
    output: str,
    num_shards: int,
    val_fraction: float,
    upsample: int,
    seed: int,
    test_fraction: float = 0.0,
    max_side: int = 0,
    strict: bool = False,
    train_hosts: int = 1,
    loader_workers: int = MIN_TRAIN_SHARDS,
    exclude_keys: str = "",
    relabel: str = "",
) -> ShardConfig:
    """ShardConfig from pipeline parameters, which cannot be None: 0 shards = auto, val_fraction < 0 =
    the source's own split, max_side 0 = keep every image's size, exclude_keys and relabel "" = no file. Auto
    gives every loader worker of every host of the train job a train shard: at least ``train_hosts`` (the
    compiled slice's) x ``loader_workers`` (the run's ``workers``; 0, loading in the train process, counts as
    one)."""
    if train_hosts < 1:
        raise ConfigError(f"train_hosts must be at least 1, got {train_hosts}")
    return ShardConfig(
        source=source,
        output=output,
        num_shards=num_shards or None,
        val_fraction=val_fraction if val_fraction >= 0 else None,
        test_fraction=test_fraction,
        upsample=upsample,
        seed=seed,
        max_side=max_side or None,
        strict=strict,
        min_train_shards=train_hosts * max(1, loader_workers),
        exclude_keys=exclude_keys or None,
        relabel=relabel or None,
    )


def _plan(config: ShardConfig, output: str) -> DatasetPlan:
    """The plan every shard task makes alike: the source listed, the label edits applied by source."""
    source = open_source(config.source, staging=output, class_names=config.class_names)
    source, edits = edit_source(source, config, dataset_uri=None, options=PIPELINE_PARAMETERS)
    return plan_dataset(source, config, label_edits=edits)


def shard_ranges(config: ShardConfig, shards_per_task: int) -> list[list[int]]:
    """``[[start, end), ...]`` over the plan's shards (train, val, then test) for parallel writers (KFP ParallelFor)."""
    if shards_per_task < 1:
        raise ConfigError(f"shards_per_task must be at least 1, got {shards_per_task}")
    output = storage.check_uri(config.output).rstrip("/")
    source = open_source(config.source, staging=output, class_names=config.class_names)
    check_source_listing(source, strict=config.strict)  # the pipeline's --strict stops here, before writing
    source, edits = edit_source(source, config, dataset_uri=None, options=PIPELINE_PARAMETERS)
    plan = plan_dataset(source, config, label_edits=edits)
    total = len(plan.shards)
    return [[start, min(start + shards_per_task, total)] for start in range(0, total, shards_per_task)]


def write_shard_range(config: ShardConfig, start: int, end: int) -> int:
    """Write the plan's shards ``[start, end)`` (keeping ones an earlier attempt finished); returns how many
    were written now. The manifest is left to ``finalize_dataset``."""
    output = storage.check_uri(config.output).rstrip("/")
    if storage.exists(storage.join(output, MANIFEST_NAME)):
        return 0  # complete already (an earlier run wrote it): nothing to write
    plan = _plan(config, output)
    source = plan.source
    storage.ensure_prefix_writable(output)
    todo = [spec for spec in plan.shards[start:end] if existing_record(spec, output) is None]
    for spec in todo:
        write_shard(
            source, spec, output, max_side=config.max_side, strict=config.strict, max_pixels=config.max_pixels
        )
    return len(todo)


def finalize_dataset(config: ShardConfig) -> Manifest:
    """Write manifest.json from the shard records once every planned shard is there (last step).
    A dataset that is complete already is returned as it is (its manifest, and so its digest, unchanged)."""
    output = storage.check_uri(config.output).rstrip("/")
    if storage.exists(storage.join(output, MANIFEST_NAME)):
        return load_manifest(output)
    plan = _plan(config, output)
    records = [r for r in (existing_record(spec, output) for spec in plan.shards) if r is not None]
    return finalize_manifest(output, plan, records)
