"""The dataset on storage: ``plan`` sizes the shards, ``write`` writes them and the manifest last, ``tario`` reads
and writes tar members, ``manifest`` reads a dataset back, ``check`` is the data check, ``fingerprint`` a source's identity.

The names below are the package's public API, imported on first use so that importing the package loads nothing
heavy (``tpustream --help`` stays torch-free); the modules themselves are imported by their full path inside tpustream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from tpustream.dataset.check import check_dataset
    from tpustream.dataset.check_result import DataCheckReport
    from tpustream.dataset.manifest import ShardError, load_manifest, read_manifest, verify_shards
    from tpustream.dataset.plan import DatasetPlan, ShardConfig, plan_dataset
    from tpustream.dataset.write import CreateSummary, create_shards

_HOMES = {
    "ShardConfig": "plan",
    "DatasetPlan": "plan",
    "plan_dataset": "plan",
    "create_shards": "write",
    "CreateSummary": "write",
    "load_manifest": "manifest",
    "read_manifest": "manifest",
    "verify_shards": "manifest",
    "ShardError": "manifest",
    "check_dataset": "check",
    "DataCheckReport": "check_result",
}
__all__ = [
    "DatasetPlan",
    "ShardConfig",
    "plan_dataset",
    "CreateSummary",
    "create_shards",
    "ShardError",
    "load_manifest",
    "read_manifest",
    "verify_shards",
    "DataCheckReport",
    "check_dataset",
]

__getattr__, __dir__ = lazy_front(__name__, _HOMES)
