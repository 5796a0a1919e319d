"""The preflight's quota checks, read through the Cloud Quotas API: Vertex AI's custom-training quota for the
compiled TPU family in the run's region (0 or less than the slice needs would queue the train job forever), and
its custom-training CPU quota there against the largest CPU step (evaluate's 16 vCPUs by default: a step
Vertex cannot place waits, then fails the run)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypedDict, cast

from .clients import Google, api_error, short
from .findings import FAIL, OK, WARN, Finding

__all__ = ["QuotaInfo", "cpu_quota", "tpu_quota"]


class QuotaDetails(TypedDict, total=False):
    value: str  # int64 as a JSON string ("-1": not limited)


class DimensionsInfo(TypedDict, total=False):
    dimensions: dict[str, str]  # {"region": "us-central1"}; none for the default
    details: QuotaDetails


class QuotaInfo(TypedDict, total=False):
    """One quota of the Cloud Quotas API (``quotaInfos`` of a service), the fields the check reads."""

    quotaId: str
    metric: str
    quotaDisplayName: str
    dimensionsInfos: list[DimensionsInfo]


class QuotaInfosPage(TypedDict, total=False):
    quotaInfos: list[QuotaInfo]
    nextPageToken: str


_FAMILY_ALIASES = {"v5e": ("v5e", "v5lite", "v5litepod")}


def _normalised(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def tpu_quota(
    google: Google, project: str, region: str, tpu: str, needed: int, spot: bool, parallel_trials: int = 0
) -> Finding:
    """Vertex AI's custom-training TPU quota for ``tpu``'s family in ``region`` (Cloud Quotas API
    quotaInfos of aiplatform.googleapis.com): 0 or less than the slice needs would queue the job forever.
    ``parallel_trials``: a tuning job runs that many slices at once, so ``needed`` is theirs together."""
    what = f"{parallel_trials} parallel trials of {tpu}" if parallel_trials else tpu
    family = tpu.split("-")[0]
    console = (
        f"check it in the console: IAM & Admin > Quotas & System Limits (project {project}), service "
        f"Vertex AI API, 'Custom model training TPU {family}' for region {region}, "
        f"https://console.cloud.google.com/iam-admin/quotas?project={project}"
    )
    tokens = [f"tpu{alias}" for alias in _FAMILY_ALIASES.get(family, (family,))]

    def keep(info: QuotaInfo) -> bool:
        text = _normalised(f"{info.get('quotaId', '')} {info.get('metric', '')}")
        preemptible = "preemptible" in text or "spot" in text
        return "training" in text and any(t in text for t in tokens) and preemptible == spot

    matching, unread = _quota_infos(google, project, keep)
    if unread is not None:
        return Finding("tpu-quota", WARN, f"could not read TPU quota ({unread}); {console}")
    if not matching:
        return Finding(
            "tpu-quota",
            WARN,
            f"no Vertex AI training quota for TPU {family} found through the Cloud Quotas API; {console}",
        )
    values = [(info, _region_value(info, region)) for info in matching]
    if all(value is None for _, value in values):
        return Finding(
            "tpu-quota", WARN, f"the TPU {family} training quota names no value for {region}; {console}"
        )
    for info, value in values:
        if value is None or value < 0:  # no entry for this region, or -1: not limited
            continue
        name = info.get("quotaDisplayName") or info.get("metric") or info.get("quotaId")
        if value < needed:
            return Finding(
                "tpu-quota",
                FAIL,
                f"{name} is {value} in {region} and {what} need{'' if parallel_trials else 's'} {needed}: the "
                f"{'tuning job' if parallel_trials else 'train job'} would wait in JOB_STATE_QUEUED "
                "indefinitely; request an increase "
                f"{'or lower parallel_trials in the search space ' if parallel_trials else ''}at "
                f"https://console.cloud.google.com/iam-admin/quotas?project={project}",
            )
    return Finding("tpu-quota", OK, f"TPU {family} quota in {region} covers {what} ({needed})")


def _quota_infos(
    google: Google, project: str, keep: Callable[[QuotaInfo], bool]
) -> tuple[list[QuotaInfo], str | None]:
    """The quotaInfos of aiplatform.googleapis.com (Cloud Quotas API) that ``keep`` accepts, walking their
    pages; or why they could not be read (an API error with the role that reads them, a timeout)."""
    url = (
        f"{google.endpoints.cloud_quotas}/v1/projects/{project}/locations/global/services/"
        "aiplatform.googleapis.com/quotaInfos"
    )
    matching: list[QuotaInfo] = []
    page_token = ""
    try:
        for _ in range(20):  # a bounded walk: the service has a few hundred quotas
            params = {"pageSize": 500, **({"pageToken": page_token} if page_token else {})}
            status, response = google.rest("GET", url, params=params)
            body = cast(QuotaInfosPage, response)
            if status != 200:
                return [], f"{api_error(status, response)}; roles/cloudquotas.viewer reads it"
            matching += [info for info in body.get("quotaInfos", []) if keep(info)]
            page_token = body.get("nextPageToken", "")
            if not page_token:
                break
    except Exception as exc:  # timeout, connection refused: a warning, never a hang
        return [], short(exc)
    return matching, None


def _region_value(info: QuotaInfo, region: str) -> int | None:
    """A quota's value for ``region``: its entry for the region, else its default (no region dimension)."""
    default = None
    for entry in info.get("dimensionsInfos", []):
        dimensions = entry.get("dimensions", {})
        value = entry.get("details", {}).get("value")
        if value is None:
            continue
        if dimensions.get("region") == region:
            return int(value)
        if "region" not in dimensions:
            default = int(value)
    return default


_CPU_METRIC = "aiplatform.googleapis.com/custom_model_training_cpus"  # "Custom model training CPUs for N1/E2"


def cpu_quota(google: Google, project: str, region: str, needed: float) -> Finding:
    """Vertex AI's custom-training CPU quota (``custom_model_training_cpus``, the N1/E2 machines Vertex runs a
    pipeline's CPU steps on) in ``region`` against ``needed``, the largest CPU step's vCPUs."""
    console = (
        f"check it in the console: IAM & Admin > Quotas & System Limits (project {project}), service "
        f"Vertex AI API, 'Custom model training CPUs for N1/E2 machine types' for region {region}, "
        f"https://console.cloud.google.com/iam-admin/quotas?project={project}"
    )
    matching, unread = _quota_infos(google, project, lambda info: info.get("metric") == _CPU_METRIC)
    if unread is not None:
        return Finding("cpu-quota", WARN, f"could not read CPU quota ({unread}); {console}")
    values = [value for value in (_region_value(info, region) for info in matching) if value is not None]
    if not values:
        return Finding("cpu-quota", WARN, f"no Vertex AI training CPU quota found for {region}; {console}")
    for value in values:
        if 0 <= value < needed:  # -1: not limited
            return Finding(
                "cpu-quota",
                FAIL,
                f"Custom model training CPUs is {value} in {region} and the largest CPU step asks for "
                f"{needed:g} vCPUs (evaluate: --eval-cpu): the step could not be placed; lower --eval-cpu / "
                f"--step-cpu at compile or request an increase at "
                f"https://console.cloud.google.com/iam-admin/quotas?project={project}",
            )
    return Finding(
        "cpu-quota", OK, f"training CPU quota in {region} covers the largest CPU step ({needed:g})"
    )
