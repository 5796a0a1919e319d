"""The check-source step's launcher (components/check.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream.run.outcome import failure_recorded

if TYPE_CHECKING:
    from kfp.dsl import Dataset

__all__ = ["launch_check_source"]


def launch_check_source(
    *,
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
    dataset: Dataset,
    run_outcome: str,
    test_fraction: float,
    exclude_keys: str = "",
    relabel: str = "",
) -> str:
    """Fingerprint ``source``, point ``dataset`` at its content-addressed dataset and record the decision;
    returns "train" or "skip"."""
    with failure_recorded(run_outcome, "check-source"):
        from tpustream.dataset.fanout import config_from_pipeline
        from tpustream.run.new_data import check_source
        from tpustream.run.outcome import record_outcome
        from tpustream.storage import io as storage

        config = config_from_pipeline(
            source=source,
            output=datasets_root,
            num_shards=num_shards,
            val_fraction=val_fraction,
            upsample=upsample,
            seed=seed,
            max_side=max_side,
            strict=strict,
            train_hosts=train_hosts,
            loader_workers=loader_workers,
            test_fraction=test_fraction,
            exclude_keys=exclude_keys,
            relabel=relabel,
        )
        settings = dict(model_name=model_name, epochs=epochs, batch_size=batch_size, lr=lr, bf16=bf16)
        result = check_source(
            config,
            datasets_root=datasets_root or storage.join(registry, "datasets"),
            registry=registry,
            settings=settings,
            retrain=retrain,
        )
        dataset.uri = result.dataset
        dataset.metadata.update(result.as_metadata())
        record_outcome(
            run_outcome,
            step="check source",
            decision="training" if result.train else "skipped",
            reason=result.reason,
        )
        return "train" if result.train else "skip"
