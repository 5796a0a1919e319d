"""Is there anything new to train on? The gate at the start of a run: the source's fingerprint
(``tpustream.dataset.fingerprint``) against what the registry says was already trained.

A scheduled pipeline reads the same source URI every run, so nothing in its inputs changes when images
are added: KFP's cache would serve the first run's model forever, and with the cache off every run would
re-shard and re-train unchanged data on a TPU. Instead the first step fingerprints the source and asks:

- The dataset for a fingerprint lives at ``DATASETS_ROOT/<fingerprint[:16]>``: content-addressed, so an
  unchanged source maps to the dataset already written, and a changed one to a new location.
- ``REGISTRY/trained/<fingerprint[:16]>-<settings[:12]>.json`` records that a model was trained on that
  dataset with those training settings and evaluated (written by the pipeline's evaluate step).
  Both locations, and that record's writer and reader, are ``tpustream.registry.store``'s.
- Both present: nothing to do ("no new data since ..."). Otherwise: write the shards that are missing
  (none when the dataset is complete) and train.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict

from tpustream.dataset.fingerprint import fingerprint, source_objects
from tpustream.dataset.manifest import MANIFEST_NAME
from tpustream.dataset.plan import ShardConfig
from tpustream.registry.store import dataset_uri, read_trained, trained_marker
from tpustream.storage import io as storage

__all__ = ["DataCheck", "DataCheckMetadata", "check_source"]

log = logging.getLogger(__name__)


class DataCheckMetadata(TypedDict):
    """``DataCheck`` as the pipeline's dataset artifact metadata (JSON: what the KFP UI shows)."""

    fingerprint: str
    num_objects: int
    num_bytes: int
    dataset: str
    marker: str
    train: bool
    reason: str


@dataclass(frozen=True, kw_only=True)
class DataCheck:
    """The outcome of ``check_source``: what the source is now and what the pipeline should do."""

    fingerprint: str
    num_objects: int
    num_bytes: int
    dataset: str  # where the shards of this fingerprint live (complete or not)
    marker: str  # where "trained on it with these settings" is recorded
    train: bool
    reason: str

    def as_metadata(self) -> DataCheckMetadata:
        return {
            "fingerprint": self.fingerprint,
            "num_objects": self.num_objects,
            "num_bytes": self.num_bytes,
            "dataset": self.dataset,
            "marker": self.marker,
            "train": self.train,
            "reason": self.reason,
        }


def _settings_digest(settings: Mapping[str, object]) -> str:
    return hashlib.sha256(json.dumps(dict(settings), sort_keys=True, default=str).encode()).hexdigest()


def check_source(
    config: ShardConfig,
    *,
    datasets_root: str,
    registry: str,
    settings: Mapping[str, object],
    retrain: bool = False,
) -> DataCheck:
    """Fingerprint ``config.source`` and decide whether this run has anything to train on.

    Args:
        config: the shard parameters (``config.output`` is ignored: the dataset location is derived).
        datasets_root: where content-addressed datasets live (``<root>/<fingerprint[:16]>``).
        registry: the model registry; its ``trained/`` records which datasets were already trained on.
        settings: the training settings that make a model (model, epochs, batch size, lr, ...): any JSON
            object, only hashed.
        retrain: train even when nothing changed.
    """
    started = time.perf_counter()
    objects = source_objects(config.source)
    fp = fingerprint(config, objects)
    dataset = dataset_uri(datasets_root, fp)
    marker = trained_marker(registry, fp, _settings_digest(settings))
    complete = storage.exists(storage.join(dataset, MANIFEST_NAME))
    trained = complete and storage.exists(marker)
    num_bytes = sum(o.size for o in objects)
    seen = f"{len(objects)} object(s), {num_bytes} bytes" if objects else "built-in data"
    if trained and not retrain:
        record = read_trained(marker)
        reason = (
            f"no new data since {dataset}: source {config.source} ({seen}) has the same fingerprint "
            f"{fp[:12]}, and {record.model or None} was trained on it with these settings at "
            f"{record.created or None}; skipping shards and training (set retrain=true to train anyway)"
        )
    elif trained:
        reason = f"retrain=true: training again on {dataset} (source unchanged, fingerprint {fp[:12]})"
    elif complete:
        reason = f"training on {dataset} (source unchanged, fingerprint {fp[:12]}; new training settings)"
    else:
        reason = f"new data: source {config.source} ({seen}), fingerprint {fp[:12]} -> shards at {dataset}"
    log.info("%s (checked in %.1f s)", reason, time.perf_counter() - started)
    return DataCheck(
        fingerprint=fp,
        num_objects=len(objects),
        num_bytes=num_bytes,
        dataset=dataset,
        marker=marker,
        train=retrain or not trained,
        reason=reason,
    )
