"""What every preflight check returns (``Finding``), how a failed one stops a run, and the region tables the
checks of both kinds use (the TPU type's region without credentials, the buckets' with): the preflight
package's leaf, which its other modules import and which imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Literal

from tpustream.errors import TpustreamError

__all__ = [
    "Status",
    "OK",
    "WARN",
    "FAIL",
    "Finding",
    "PreflightFailed",
    "raise_on_failure",
    "TPU_REGIONS",
    "TENSORBOARD_BUCKET_DOC",
    "TPU_LOCATIONS_DOC",
    "MODEL_ARTIFACTS_DOC",
    "bucket_serves_region",
    "check_tpu_region",
]

Status = Literal["ok", "warn", "fail"]
OK: Final = "ok"
WARN: Final = "warn"
FAIL: Final = "fail"


@dataclass(frozen=True)
class Finding:
    """The outcome of one check: ``status`` ok, warn or fail, and one line saying what and the fix
    (positional: a record, built in many places, not a config)."""

    check: str
    status: Status
    message: str

    def line(self) -> str:
        return f"{self.status:<4} {self.check}: {self.message}"


class PreflightFailed(TpustreamError, ValueError):
    """A run that would fail or hang on Vertex AI, refused before it is submitted."""

    def __init__(self, findings: list[Finding], hint: str = "") -> None:
        self.findings = findings
        failed = "; ".join(f"{f.check}: {f.message}" for f in findings if f.status == FAIL)
        super().__init__(f"preflight failed: {failed}" + (f" ({hint})" if hint else ""))


def raise_on_failure(findings: list[Finding], hint: str = "") -> None:
    """Raise PreflightFailed if any finding failed (``hint``, what else the user can do, appended)."""
    if any(f.status == FAIL for f in findings):
        raise PreflightFailed(findings, hint)


# --------------------------------------------------------------------------- region tables

# Where Vertex AI custom training offers each TPU family, as Google documents it (as of 2026-11; Google adds
# regions, so re-check and update this table): "Vertex AI locations", section "Custom training: accelerators"
# (https://cloud.google.com/vertex-ai/docs/general/locations#accelerators) and "Use Cloud TPU for custom
# training" (https://cloud.google.com/vertex-ai/docs/training/training-with-tpu-vm); a Vertex TPU job runs
# in the zones of "TPU regions and zones" (https://cloud.google.com/tpu/docs/regions-zones). A family
# missing here (a TPU type added to pipelines/tpu.py later) is a warning, not a failure.
TPU_REGIONS: dict[str, frozenset[str]] = {
    "v2": frozenset({"us-central1", "europe-west4", "asia-east1"}),
    "v3": frozenset({"us-central1", "europe-west4"}),
    "v5e": frozenset({"us-central1", "us-south1", "us-west1", "us-west4", "europe-west4", "asia-southeast1"}),
    "v6e": frozenset(
        {"us-central1", "us-east1", "us-east5", "europe-west4", "asia-northeast1", "southamerica-east1"}
    ),
}
TPU_LOCATIONS_DOC = "https://cloud.google.com/vertex-ai/docs/general/locations#accelerators"

# "Set up Vertex AI TensorBoard": the Cloud Storage bucket of a job's TensorBoard logs must be regional (not
# multi- or dual-region) and in the region of the training job and the TensorBoard instance.
TENSORBOARD_BUCKET_DOC = "https://cloud.google.com/vertex-ai/docs/experiments/tensorboard-setup"

# "Import models to Vertex AI", Upload model artifacts to Cloud Storage: the bucket holding a model's
# artifacts must be in the region of the regional endpoint the model is uploaded to. A multi- or
# dual-region bucket whose regions include it serves it too.
MODEL_ARTIFACTS_DOC = "https://cloud.google.com/vertex-ai/docs/model-registry/import-model"

# Cloud Storage "Bucket locations" (https://cloud.google.com/storage/docs/locations): the multi-regions are
# data centers in the named area; the predefined dual-regions are pairs of regions.
_EU_OUTSIDE = {"europe-west2", "europe-west6"}  # London, Zurich: in Europe, not in the EU multi-region
_MULTI_REGIONS: dict[str, Callable[[str], bool]] = {
    "US": lambda region: region.startswith("us-"),
    "EU": lambda region: region.startswith("europe-") and region not in _EU_OUTSIDE,
    "ASIA": lambda region: region.startswith("asia-"),
}
_DUAL_REGIONS = {
    "NAM4": {"us-central1", "us-east1"},
    "EUR4": {"europe-north1", "europe-west4"},
    "EUR5": {"europe-west1", "europe-west2"},
    "EUR7": {"europe-west2", "europe-west3"},
    "EUR8": {"europe-west3", "europe-west6"},
    "ASIA1": {"asia-northeast1", "asia-northeast2"},
}


def bucket_serves_region(location: str, region: str, data_locations: Iterable[str] = ()) -> bool:
    """Whether a bucket at GCS ``location`` keeps its data in ``region`` (itself, or a multi- or
    dual-region containing it; a configurable dual-region names its regions in ``data_locations``)."""
    location, region = location.upper(), region.lower()
    regions = {r.lower() for r in data_locations}
    if regions:
        return region in regions
    if location.lower() == region:
        return True
    if location in _DUAL_REGIONS:
        return region in _DUAL_REGIONS[location]
    contains = _MULTI_REGIONS.get(location)
    return bool(contains and contains(region))


def check_tpu_region(tpu: str | None, region: str) -> Finding:
    """Whether Vertex AI offers the compiled TPU type in ``region`` (TPU_REGIONS; no credentials)."""
    if tpu is None:
        return Finding("tpu-region", OK, "the template trains on the CPU image: no TPU to place")
    family = tpu.split("-")[0]
    regions = TPU_REGIONS.get(family)
    if regions is None:
        return Finding(
            "tpu-region",
            WARN,
            f"no region table for TPU family {family} here: check {TPU_LOCATIONS_DOC} offers {tpu} in "
            f"{region}, then add it to TPU_REGIONS in pipelines/preflight/findings.py",
        )
    if region in regions:
        return Finding("tpu-region", OK, f"Vertex AI offers TPU {family} ({tpu}) in {region}")
    return Finding(  # a warning: Google adds regions and zones faster than this table is updated
        "tpu-region",
        WARN,
        f"this table (as recorded 2026-11) has TPU {family} for Vertex AI custom training in "
        f"{', '.join(sorted(regions))}, not {region}: check {TPU_LOCATIONS_DOC} and "
        f"https://cloud.google.com/tpu/docs/regions-zones before the run; if {region} is not listed there, "
        "pass one of those as --region or compile for another TPU type",
    )
