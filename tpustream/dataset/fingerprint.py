"""Has the data changed? A fingerprint of a live source, so scheduled retraining trains only on new data.

A scheduled pipeline reads the same source URI every run, so nothing in its inputs changes when images
are added: KFP's cache would serve the first run's model forever, and with the cache off every run would
re-shard and re-train unchanged data on a TPU. Instead the first step lists the source (names, sizes and
versions: GCS generations or local mtimes, never the bytes) and hashes that with the shard parameters.

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

from tpustream.dataset.manifest import MANIFEST_NAME
from tpustream.dataset.plan import MIN_TRAIN_SHARDS, ShardConfig
from tpustream.registry.store import dataset_uri, read_trained, trained_marker
from tpustream.sources.dispatch import source_kind, source_location
from tpustream.storage import io as storage

__all__ = [
    "DataCheck",
    "DataCheckMetadata",
    "FINGERPRINT_FORMAT",
    "source_objects",
    "fingerprint",
    "check_source",
]

log = logging.getLogger(__name__)

FINGERPRINT_FORMAT = "tpustream.fingerprint/v1"


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


def source_objects(spec: str) -> list[storage.ObjectInfo]:
    """The objects a SOURCE reads (sorted); empty for the built-in sources, which never change."""
    kind = source_kind(spec)
    if kind == "import-files":  # the files themselves and every image they list
        from tpustream.sources.import_files import import_file_objects

        return import_file_objects(spec.strip())
    if kind == "managed-dataset":  # the dataset resource's version, and what its export lists
        from tpustream.sources.vertex_dataset import managed_dataset_objects

        return managed_dataset_objects(spec.strip())
    if kind == "shards":  # .tar files named directly (a list, a pattern, a brace range)
        from tpustream.sources.webdataset import shard_objects

        return shard_objects(spec.strip())
    location = source_location(spec)
    if location is None:
        return []
    return storage.stat_or_list(location)  # one archive (cifar10:...tar.gz) or a directory tree


def fingerprint(config: ShardConfig, objects: list[storage.ObjectInfo]) -> str:
    """sha256 over the shard parameters and every object's relative name, size and version."""
    params = {
        "format": FINGERPRINT_FORMAT,
        "source": config.source.strip(),
        "num_shards": config.num_shards,
        "val_shards": config.val_shards,
        "val_fraction": config.val_fraction,
        "upsample": config.upsample,
        "seed": config.seed,
        "max_side": config.max_side,
        "strict": config.strict,
        "max_pixels": config.max_pixels,
    }
    if config.min_train_shards != MIN_TRAIN_SHARDS:  # another plan; the default keeps earlier fingerprints
        params["min_train_shards"] = config.min_train_shards
    if config.test_fraction:  # likewise: 0 (no test split carved) keeps earlier fingerprints
        params["test_fraction"] = config.test_fraction
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode())
    for obj in objects:  # the source URI is in params: the full object URIs add nothing but length
        digest.update(f"{obj.uri}\t{obj.size}\t{obj.version}\n".encode())
    return digest.hexdigest()


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
