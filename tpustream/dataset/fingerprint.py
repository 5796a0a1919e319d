"""Has the data changed? A fingerprint of a live source, so scheduled retraining trains only on new data.

A scheduled pipeline reads the same source URI every run, so nothing in its inputs changes when images
are added. The fingerprint lists the source (names, sizes and versions: GCS generations or local mtimes,
never the bytes) and hashes that with the shard parameters: an unchanged source and unchanged parameters
give the same fingerprint, anything added, removed or re-uploaded a new one. The ``exclude_keys``/``relabel``
edits are in it too (what they do, not the files' bytes): a run whose only change is a new list of label fixes
has new data to train on, not "no new data". Whether a model was already
trained on a fingerprint is the run's gate, not the dataset's: ``tpustream.run.new_data``.
"""

from __future__ import annotations

import hashlib
import json

from tpustream.dataset.label_edits import PIPELINE_PARAMETERS, label_edits_digest, read_label_edits
from tpustream.dataset.plan import MIN_TRAIN_SHARDS, ShardConfig
from tpustream.sources.dispatch import source_kind, source_location
from tpustream.storage import io as storage

__all__ = [
    "FINGERPRINT_FORMAT",
    "source_objects",
    "fingerprint",
]

FINGERPRINT_FORMAT = "tpustream.fingerprint/v1"


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
    """sha256 over the shard parameters (the label edits' files read: ``label_edits_digest``) and every
    object's relative name, size and version.

    Raises:
        ConfigError: an ``exclude_keys`` or ``relabel`` file is missing or malformed (it names the parameter).
    """
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
    if config.exclude_keys or config.relabel:  # likewise; read here, so a missing or bad file fails this step
        edits = read_label_edits(config.exclude_keys, config.relabel, options=PIPELINE_PARAMETERS)
        if edits.exclude or edits.relabel:  # files of comments only change nothing
            params["label_edits"] = label_edits_digest(edits)
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode())
    for obj in objects:  # the source URI is in params: the full object URIs add nothing but length
        digest.update(f"{obj.uri}\t{obj.size}\t{obj.version}\n".encode())
    return digest.hexdigest()
