"""The preflight checks that ask Google (pipelines/preflight.py has the others and the entry point).

Each goes through the installed client where there is one (google-cloud-storage via ``tpustream.storage.io``,
google-cloud-resource-manager) and otherwise REST through google-auth's ``AuthorizedSession`` (IAM, Cloud
Quotas: no client installed), always with short timeouts. A check that cannot run is a warning saying how to
check by hand, never a hang or a traceback.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpustream.pipelines.preflight_findings import (
    FAIL,
    MODEL_ARTIFACTS_DOC,
    OK,
    TENSORBOARD_BUCKET_DOC,
    WARN,
    Finding,
    bucket_serves_region,
    check_tpu_region,
)
from tpustream.storage import io as storage

log = logging.getLogger(__name__)

__all__ = ["ApiEndpoints", "ROLE_FOR", "check_cloud"]

# The role to grant for each permission the checks test, named in the fix.
ROLE_FOR = {
    "aiplatform.pipelineJobs.create": "roles/aiplatform.user",
    "aiplatform.schedules.create": "roles/aiplatform.user",
    "iam.serviceAccounts.actAs": "roles/iam.serviceAccountUser",
}
# Roles that hold a permission the pipeline's service account needs, when granted on the project.
_ACT_AS_ROLES = {"roles/iam.serviceAccountUser", "roles/editor", "roles/owner"}
_VERTEX_ROLES = {"roles/aiplatform.user", "roles/aiplatform.admin", "roles/editor", "roles/owner"}
_OBJECT_WRITE_ROLES = {
    "roles/storage.objectAdmin",
    "roles/storage.objectUser",
    "roles/storage.admin",
    "roles/editor",
    "roles/owner",
}
_CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


@dataclass(frozen=True, kw_only=True)
class ApiEndpoints:
    """Where the Google APIs the checks call are; an ``http://`` one (a loopback fake in tests) is called
    with anonymous credentials. GCS follows ``STORAGE_EMULATOR_HOST`` (tpustream.storage.io)."""

    iam: str = "https://iam.googleapis.com"
    resource_manager: str = "https://cloudresourcemanager.googleapis.com"
    cloud_quotas: str = "https://cloudquotas.googleapis.com"

    @classmethod
    def from_env(cls) -> ApiEndpoints:
        """TPUSTREAM_IAM_ENDPOINT, TPUSTREAM_RESOURCE_MANAGER_ENDPOINT, TPUSTREAM_CLOUD_QUOTAS_ENDPOINT
        override the defaults (private endpoints; tests), as TPUSTREAM_VERTEX_ENDPOINT does for Vertex."""
        default = cls()
        return cls(
            iam=os.environ.get("TPUSTREAM_IAM_ENDPOINT") or default.iam,
            resource_manager=os.environ.get("TPUSTREAM_RESOURCE_MANAGER_ENDPOINT")
            or default.resource_manager,
            cloud_quotas=os.environ.get("TPUSTREAM_CLOUD_QUOTAS_ENDPOINT") or default.cloud_quotas,
        )

    def all_local(self) -> bool:
        return all(url.startswith("http://") for url in (self.iam, self.resource_manager, self.cloud_quotas))


class _Google:
    """The clients the checks share: one set of credentials, REST sessions per endpoint, short timeouts."""

    def __init__(self, endpoints: ApiEndpoints, credentials: Any, timeout: float) -> None:
        from google.auth.credentials import AnonymousCredentials
        from google.auth.transport.requests import AuthorizedSession

        self.endpoints = endpoints
        self.timeout = timeout
        self._credentials = credentials
        self._anonymous = AnonymousCredentials()
        self._session = AuthorizedSession(credentials) if credentials is not None else None
        self._anonymous_session = AuthorizedSession(self._anonymous)

    def credentials_for(self, url: str) -> Any:
        return (
            self._anonymous if url.startswith("http://") or self._credentials is None else self._credentials
        )

    def rest(self, method: str, url: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        """One REST call: (HTTP status, JSON body or {})."""
        session = self._anonymous_session if url.startswith("http://") else self._session
        assert session is not None  # remote endpoints are only called with credentials loaded
        response = session.request(method, url, timeout=self.timeout, **kwargs)
        try:
            body = response.json()
        except ValueError:
            body = {}
        return response.status_code, body if isinstance(body, dict) else {}

    def projects(self) -> Any:
        from google.api_core.client_options import ClientOptions
        from google.cloud import resourcemanager_v3

        url = self.endpoints.resource_manager
        return resourcemanager_v3.ProjectsClient(
            credentials=self.credentials_for(url),
            transport="rest",
            client_options=ClientOptions(api_endpoint=url),
        )


def _api_error(status: int, body: dict[str, Any]) -> str:
    error = body.get("error", {}) if isinstance(body.get("error"), dict) else {}
    return f"HTTP {status} {error.get('status', '')} {error.get('message', '')}".strip()


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _act_as(google: _Google, service_account: str) -> Finding:
    """The caller may act as the pipeline's service account (IAM testIamPermissions on it)."""
    url = f"{google.endpoints.iam}/v1/projects/-/serviceAccounts/{service_account}:testIamPermissions"
    status, body = google.rest("POST", url, json={"permissions": ["iam.serviceAccounts.actAs"]})
    grant = (
        f"gcloud iam service-accounts add-iam-policy-binding {service_account} "
        "--member=user:YOUR_EMAIL --role=roles/iam.serviceAccountUser"
    )
    if status == 404:
        return Finding(
            "act-as",
            FAIL,
            f"service account {service_account} does not exist: create it or fix --service-account",
        )
    if status != 200:
        return Finding(
            "act-as",
            WARN,
            f"could not test iam.serviceAccounts.actAs on {service_account} ({_api_error(status, body)}); "
            f"without it submit is refused: {grant}",
        )
    if "iam.serviceAccounts.actAs" in body.get("permissions", []):
        return Finding("act-as", OK, f"you can act as {service_account}")
    return Finding(
        "act-as",
        FAIL,
        f"you lack iam.serviceAccounts.actAs on {service_account}, which submitting a run as it "
        f"needs: grant yourself roles/iam.serviceAccountUser on it ({grant})",
    )


def _project_permissions(google: _Google, project: str, schedule: bool) -> Finding:
    """The caller's project permissions for submitting (and scheduling) a run, with the role for each."""
    wanted = ["aiplatform.pipelineJobs.create"] + (["aiplatform.schedules.create"] if schedule else [])
    response = google.projects().test_iam_permissions(
        request={"resource": f"projects/{project}", "permissions": wanted}, timeout=google.timeout, retry=None
    )
    missing = [p for p in wanted if p not in set(response.permissions)]
    if not missing:
        return Finding("project-permissions", OK, f"you have {', '.join(wanted)} on {project}")
    grants = ", ".join(f"{p} (grant {ROLE_FOR[p]})" for p in missing)
    return Finding(
        "project-permissions",
        FAIL,
        f"you lack {grants} on project {project}: gcloud projects add-iam-policy-binding {project} "
        f"--member=user:YOUR_EMAIL --role={ROLE_FOR[missing[0]]}",
    )


def _members_roles(policy: Any, member: str) -> set[str]:
    """The roles ``member`` holds directly in an IAM policy (a proto or its REST JSON)."""
    bindings = policy.get("bindings", []) if isinstance(policy, dict) else policy.bindings
    roles: set[str] = set()
    for binding in bindings:
        role, members = (
            (binding.get("role", ""), binding.get("members", []))
            if isinstance(binding, dict)
            else (binding.role, binding.members)
        )
        if member in members:
            roles.add(str(role))
    return roles


def _service_account_roles(
    google: _Google, project: str, service_account: str, buckets: list[str]
) -> list[Finding]:
    """What the pipeline's service account holds: actAs on itself (the run's custom jobs run as it),
    roles/aiplatform.user and write access to the buckets. Read from the IAM policies of the account and
    the project: a role that comes through a group, a folder or a custom role is not seen there, so a
    missing one is a warning with the command to grant it."""
    member = f"serviceAccount:{service_account}"
    project_roles: set[str] = set()
    own_roles: set[str] = set()
    unread = []
    try:
        policy = google.projects().get_iam_policy(
            request={"resource": f"projects/{project}"}, timeout=google.timeout, retry=None
        )
        project_roles = _members_roles(policy, member)
    except Exception as exc:  # no resourcemanager.projects.getIamPolicy: say how to check instead
        unread.append(f"project policy: {_short(exc)}")
    url = f"{google.endpoints.iam}/v1/projects/-/serviceAccounts/{service_account}:getIamPolicy"
    try:
        status, body = google.rest("POST", url, json={})
        if status == 200:
            own_roles = _members_roles(body, member)
        else:
            unread.append(f"service account policy: {_api_error(status, body)}")
    except Exception as exc:
        unread.append(f"service account policy: {_short(exc)}")
    cannot_see = f" (could not read {'; '.join(unread)})" if unread else ""
    findings = []
    if (project_roles | own_roles) & _ACT_AS_ROLES:
        findings.append(Finding("service-account-act-as", OK, f"{service_account} can act as itself"))
    else:
        findings.append(
            Finding(
                "service-account-act-as",
                WARN,
                f"{service_account} was not seen holding iam.serviceAccounts.actAs on itself, which "
                f"the run's training job needs{cannot_see}: gcloud iam service-accounts add-iam-policy-binding "
                f"{service_account} --member={member} --role=roles/iam.serviceAccountUser",
            )
        )
    missing = []
    if not project_roles & _VERTEX_ROLES:
        missing.append(
            f"roles/aiplatform.user on the project (gcloud projects add-iam-policy-binding {project} "
            f"--member={member} --role=roles/aiplatform.user)"
        )
    if not project_roles & _OBJECT_WRITE_ROLES:
        missing.append(
            "roles/storage.objectAdmin on "
            + " and ".join(buckets)
            + f" (gcloud storage buckets add-iam-policy-binding gs://BUCKET --member={member} "
            "--role=roles/storage.objectAdmin; fine if already granted on the buckets)"
        )
    if missing:
        findings.append(
            Finding(
                "service-account-roles",
                WARN,
                f"{service_account} was not seen holding {'; '.join(missing)}{cannot_see}",
            )
        )
    else:
        findings.append(
            Finding(
                "service-account-roles",
                OK,
                f"{service_account} holds roles/aiplatform.user and object write access on {project}",
            )
        )
    return findings


def _bucket(name: str, uri: str, region: str, *, must_be_in_region: bool, why: str) -> Finding:
    """The bucket of ``uri`` exists, the caller can read it, and it keeps its data where ``region`` needs."""
    check = f"bucket {name}"
    bucket = uri[len("gs://") :].split("/", 1)[0]
    try:
        info = storage.bucket_info(uri, timeout=15.0)
    except storage.NotFound:
        return Finding(
            check,
            FAIL,
            f"gs://{bucket} does not exist: gcloud storage buckets create gs://{bucket} --location={region}",
        )
    except storage.StorageError as exc:
        return Finding(
            check,
            FAIL,
            f"{exc}: grant yourself roles/storage.legacyBucketReader on gs://{bucket} (or roles/storage.admin)",
        )
    if bucket_serves_region(info.location, region, info.data_locations):
        return Finding(check, OK, f"gs://{bucket} is in {info.location} ({info.location_type})")
    return Finding(
        check,
        FAIL if must_be_in_region else WARN,
        f"gs://{bucket} is in {info.location}, not in {region}: {why}; use a bucket in {region} "
        f"(gcloud storage buckets create gs://NEW --location={region}) or run in the bucket's region",
    )


def _tensorboard_bucket(pipeline_root: str, region: str) -> Finding:
    """The TPU job's log directory is under the pipeline root (pipelines/training.py, TRAIN_JOB_OUTPUT), and
    "Set up Vertex AI TensorBoard" requires its bucket to be regional (not multi- or dual-region) and in the
    region of the training job and the TensorBoard instance (the instance's region is checked against the
    run's by ``check_tensorboard``)."""
    bucket = pipeline_root[len("gs://") :].split("/", 1)[0]
    info = storage.bucket_info(pipeline_root, timeout=15.0)
    location_type = (info.location_type or "").lower()
    fix = (
        f"give --pipeline-root a bucket created with --location={region} "
        f"(gcloud storage buckets create gs://NEW --location={region}), or run without --param tensorboard "
        f"({TENSORBOARD_BUCKET_DOC})"
    )
    if location_type != "region":
        return Finding(
            "tensorboard-bucket",
            FAIL,
            f"gs://{bucket} is a {location_type or 'non-regional'} bucket ({info.location}): Vertex AI "
            f"TensorBoard needs the job's log directory in a regional bucket in {region}; {fix}",
        )
    if info.location.lower() != region.lower():
        return Finding(
            "tensorboard-bucket",
            FAIL,
            f"gs://{bucket} is in {info.location}, the training job and TensorBoard in {region}: Vertex AI "
            f"TensorBoard needs the log bucket in their region; {fix}",
        )
    return Finding(
        "tensorboard-bucket", OK, f"gs://{bucket} is a regional bucket in {region}, as TensorBoard needs"
    )


def _compiled_strategy(spec: dict[str, Any]) -> str:
    """The train job's scheduling strategy compiled into the template (STANDARD, SPOT)."""
    tasks: dict[str, Any] = dict(spec.get("root", {}).get("dag", {}).get("tasks", {}))
    for component in spec.get("components", {}).values():
        tasks.update(component.get("dag", {}).get("tasks", {}))
    for task in tasks.values():
        parameters = task.get("inputs", {}).get("parameters", {})
        if "worker_pool_specs" in parameters:
            constant = parameters.get("strategy", {}).get("runtimeValue", {}).get("constant")
            return str(constant or "STANDARD")
    return "STANDARD"


_FAMILY_ALIASES = {"v5e": ("v5e", "v5lite", "v5litepod")}


def _normalised(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _tpu_quota(google: _Google, project: str, region: str, tpu: str, needed: int, spot: bool) -> Finding:
    """Vertex AI's custom-training TPU quota for ``tpu``'s family in ``region`` (Cloud Quotas API
    quotaInfos of aiplatform.googleapis.com): 0 or less than the slice needs would queue the job forever."""
    family = tpu.split("-")[0]
    console = (
        f"check it in the console: IAM & Admin > Quotas & System Limits (project {project}), service "
        f"Vertex AI API, 'Custom model training TPU {family}' for region {region}, "
        f"https://console.cloud.google.com/iam-admin/quotas?project={project}"
    )
    url = (
        f"{google.endpoints.cloud_quotas}/v1/projects/{project}/locations/global/services/"
        "aiplatform.googleapis.com/quotaInfos"
    )
    tokens = [f"tpu{alias}" for alias in _FAMILY_ALIASES.get(family, (family,))]
    matching = []
    page_token = ""
    try:
        for _ in range(20):  # a bounded walk: the service has a few hundred quotas
            params = {"pageSize": 500, **({"pageToken": page_token} if page_token else {})}
            status, body = google.rest("GET", url, params=params)
            if status != 200:
                return Finding(
                    "tpu-quota",
                    WARN,
                    f"could not read TPU quota ({_api_error(status, body)}; roles/cloudquotas.viewer "
                    f"reads it); {console}",
                )
            for info in body.get("quotaInfos", []):
                text = _normalised(f"{info.get('quotaId', '')} {info.get('metric', '')}")
                preemptible = "preemptible" in text or "spot" in text
                if "training" in text and any(t in text for t in tokens) and preemptible == spot:
                    matching.append(info)
            page_token = body.get("nextPageToken", "")
            if not page_token:
                break
    except Exception as exc:  # timeout, connection refused: a warning, never a hang
        return Finding("tpu-quota", WARN, f"could not read TPU quota ({_short(exc)}); {console}")
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
                f"{name} is {value} in {region} and {tpu} needs {needed}: the train job would wait "
                f"in JOB_STATE_QUEUED indefinitely; request an increase at "
                f"https://console.cloud.google.com/iam-admin/quotas?project={project}",
            )
    return Finding("tpu-quota", OK, f"TPU {family} quota in {region} covers {tpu} ({needed})")


def _region_value(info: dict[str, Any], region: str) -> int | None:
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


def _load_credentials(endpoints: ApiEndpoints) -> tuple[Any, Finding | None]:
    """Application Default Credentials with the project, or the finding that says how to get them."""
    if endpoints.all_local():
        return None, None  # loopback fakes: nothing to authenticate to (GCS has its own client)
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, _ = google.auth.default(scopes=[_CLOUD_PLATFORM])
    except DefaultCredentialsError as exc:
        return None, Finding(
            "credentials",
            FAIL,
            f"no Google Cloud credentials found ({_short(exc)}): run `gcloud auth application-default "
            "login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file",
        )
    return credentials, None


def check_cloud(
    spec: dict[str, Any] | None,
    *,
    project: str,
    region: str,
    pipeline_root: str,
    registry: str | None,
    service_account: str | None,
    parameters: dict[str, Any],
    schedule: bool = False,
    api_endpoints: ApiEndpoints | None = None,
    timeout: float = 10.0,
    tensorboard: str = "",
) -> list[Finding]:
    """Every check but the parameters': TPU region, credentials, IAM, buckets (with ``tensorboard``, the
    run's Vertex AI TensorBoard instance, the log bucket's rule too), TPU quota."""
    from tpustream.pipelines.tpu import TPU_TYPES, compiled_slice

    endpoints = api_endpoints or ApiEndpoints.from_env()
    tpu = compiled_slice(spec)[0] if spec is not None else None
    findings = []
    if spec is None:
        findings.append(
            Finding("tpu-region", WARN, "the template is read by Vertex only: TPU type not checked")
        )
    else:
        findings.append(check_tpu_region(tpu, region))
    credentials, problem = _load_credentials(endpoints)
    if problem is not None:
        return findings + [problem]  # every check below would fail the same way
    google = _Google(endpoints, credentials, timeout)

    def guarded(check: str, run: Callable[[], Finding | list[Finding]]) -> list[Finding]:
        try:
            found = run()
        except Exception as exc:  # a check that cannot run is a warning with what went wrong, not a traceback
            log.debug("preflight check %s", check, exc_info=exc)
            return [Finding(check, WARN, f"could not check: {_short(exc)}")]
        return found if isinstance(found, list) else [found]

    if service_account:
        findings += guarded("act-as", lambda: _act_as(google, service_account))
    else:
        findings.append(
            Finding(
                "act-as",
                WARN,
                "no --service-account: the run acts as the Compute Engine default service account; "
                "give a dedicated one with roles/aiplatform.user and storage access",
            )
        )
    findings += guarded("project-permissions", lambda: _project_permissions(google, project, schedule))
    registry = registry or parameters.get("registry")
    buckets = sorted(
        {
            "gs://" + b.split("/")[2]
            for b in (pipeline_root, registry)
            if isinstance(b, str) and storage.is_gcs(b)
        }
    )
    if service_account:
        findings += guarded(
            "service-account-roles", lambda: _service_account_roles(google, project, service_account, buckets)
        )
    findings += guarded(
        "bucket pipeline-root",
        lambda: _bucket(
            "pipeline-root",
            pipeline_root,
            region,
            must_be_in_region=False,
            why="the TPU hosts stream shards from it across regions (slower, billed egress)",
        ),
    )
    if tensorboard and tpu is not None:
        findings += guarded("tensorboard-bucket", lambda: _tensorboard_bucket(pipeline_root, region))
    if isinstance(registry, str) and storage.is_gcs(registry):
        vertex_model = parameters.get("vertex_model")
        findings += guarded(
            "bucket registry",
            lambda: _bucket(
                "registry",
                registry,
                region,
                must_be_in_region=bool(vertex_model),
                why=f"--param vertex_model uploads promoted versions from it to the Model Registry in {region}, "
                f"which needs the artifacts in a bucket in that region ({MODEL_ARTIFACTS_DOC})"
                if vertex_model
                else "promoted models cross regions when served there; with --param vertex_model the Model "
                f"Registry refuses them ({MODEL_ARTIFACTS_DOC})",
            ),
        )
    if tpu is not None:
        spec_of = TPU_TYPES[tpu]
        needed = spec_of.accelerator_count or spec_of.chips  # v2/v3 quota counts cores, v5e/v6e chips
        spot = _compiled_strategy(spec or {}) == "SPOT"
        findings += guarded("tpu-quota", lambda: _tpu_quota(google, project, region, tpu, needed, spot))
    return findings
