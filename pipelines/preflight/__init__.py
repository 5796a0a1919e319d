"""Preflight: a run's mistakes found before it is submitted, one ``Finding`` per check. ``cloud`` is the entry
point (``preflight``, ``check_cloud``); ``parameters`` the checks that need no credentials; ``iam``,
``buckets`` and ``quota`` the checks that ask Google, through ``clients``; ``findings`` what every check
returns and the region tables.

The names below are the package's public API, imported on first use; the modules themselves are imported by
their full path inside tpustream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from .clients import ApiEndpoints
    from .cloud import check_cloud, preflight
    from .findings import (
        FAIL,
        MODEL_ARTIFACTS_DOC,
        OK,
        TPU_REGIONS,
        WARN,
        Finding,
        PreflightFailed,
        Status,
        bucket_serves_region,
        check_tpu_region,
        raise_on_failure,
    )
    from .parameters import check_parameters, parameters_help, parse_parameters

_HOMES = {
    "preflight": "cloud",
    "check_cloud": "cloud",
    "ApiEndpoints": "clients",
    "check_parameters": "parameters",
    "parse_parameters": "parameters",
    "parameters_help": "parameters",
    "OK": "findings",
    "WARN": "findings",
    "FAIL": "findings",
    "Status": "findings",
    "Finding": "findings",
    "PreflightFailed": "findings",
    "raise_on_failure": "findings",
    "TPU_REGIONS": "findings",
    "MODEL_ARTIFACTS_DOC": "findings",
    "bucket_serves_region": "findings",
    "check_tpu_region": "findings",
}
__all__ = [
    "preflight",
    "check_cloud",
    "ApiEndpoints",
    "check_parameters",
    "parse_parameters",
    "parameters_help",
    "OK",
    "WARN",
    "FAIL",
    "Status",
    "Finding",
    "PreflightFailed",
    "raise_on_failure",
    "TPU_REGIONS",
    "MODEL_ARTIFACTS_DOC",
    "bucket_serves_region",
    "check_tpu_region",
]

__getattr__, __dir__ = lazy_front(__name__, _HOMES)
