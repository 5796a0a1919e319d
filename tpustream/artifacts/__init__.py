"""The files the stages hand each other, as types: a dataset's ``manifest.json`` (``Manifest``), a trained
model's ``model.json`` (``ModelCard``) and evaluate's ``metrics.json`` (``EvalReport``).

Each type reads and writes its own JSON (``from_json``/``to_json``, ``read``/``write``), so mypy checks every
place that uses a field, and a file of another format version is refused in one place with one message.
Torch-free (and free of every heavy import): the CLI, the KFP components and the report read these.

Format versions and old files:
- Every file carries ``format``. The manifest's reader has always required it; ``model.json`` and
  ``metrics.json`` have always been written with it but were never checked, so a file without one (hand-made,
  a test's) is still read as the current version, while one naming another version is refused.
- Keys a file lacks because it was written before they existed read as their defaults (a manifest without
  ``max_pixels``, shards without a sample index, ``skipped`` without ``by_reason``); the type remembers them
  (``absent``) and ``to_json`` leaves them out again, so ``to_json(from_json(x)) == x`` for old files too,
  ``format`` aside: it is always written.
- Keys no type models are kept in ``extra`` and written back after the known ones: a file a later version
  wrote loses nothing when this one writes it back.
- On-disk bytes are those of the writers before these types: the same keys in the same order, the same
  ``json.dumps`` settings (``manifest_digest`` hashes the manifest's bytes).
"""

from tpustream.artifacts._json import ArtifactError, json_bytes, json_file_uri
from tpustream.artifacts.eval_report import METRICS_FORMAT, Baseline, EvalReport, Evaluation
from tpustream.artifacts.manifest import (
    MANIFEST_FORMAT,
    IgnoredFiles,
    LabelEditsApplied,
    Manifest,
    Shard,
    SizeSummary,
    SkippedSummary,
    Split,
    SplitStats,
)
from tpustream.artifacts.model_card import MODEL_FORMAT, DatasetRef, ModelCard

__all__ = [
    "MANIFEST_FORMAT",
    "MODEL_FORMAT",
    "METRICS_FORMAT",
    "ArtifactError",
    "Baseline",
    "SizeSummary",
    "SplitStats",
    "Shard",
    "Split",
    "SkippedSummary",
    "IgnoredFiles",
    "LabelEditsApplied",
    "Manifest",
    "DatasetRef",
    "ModelCard",
    "EvalReport",
    "Evaluation",
    "json_bytes",
    "json_file_uri",
]
