"""The preflight's IAM checks: the caller may act as the run's service account and create runs (and
schedules) in the project; the service account holds what the run needs (actAs on itself, Vertex AI,
object write access to the buckets)."""

from __future__ import annotations

from typing import Any, TypedDict, cast

from .clients import Google, api_error, short
from .findings import FAIL, OK, WARN, Finding

__all__ = ["ROLE_FOR", "act_as", "project_permissions", "service_account_roles"]


class Permissions(TypedDict, total=False):
    """IAM ``testIamPermissions``'s answer: the permissions asked for that the caller holds."""

    permissions: list[str]


class Binding(TypedDict, total=False):
    role: str
    members: list[str]


class Policy(TypedDict, total=False):
    """An IAM policy as REST JSON (``getIamPolicy``), the fields the checks read."""

    bindings: list[Binding]


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


def act_as(google: Google, service_account: str) -> Finding:
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
            f"could not test iam.serviceAccounts.actAs on {service_account} ({api_error(status, body)}); "
            f"without it submit is refused: {grant}",
        )
    if "iam.serviceAccounts.actAs" in cast(Permissions, body).get("permissions", []):
        return Finding("act-as", OK, f"you can act as {service_account}")
    return Finding(
        "act-as",
        FAIL,
        f"you lack iam.serviceAccounts.actAs on {service_account}, which submitting a run as it "
        f"needs: grant yourself roles/iam.serviceAccountUser on it ({grant})",
    )


def project_permissions(google: Google, project: str, schedule: bool) -> Finding:
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


def _members_roles(policy: Policy | Any, member: str) -> set[str]:
    """The roles ``member`` holds directly in an IAM policy (a proto, or its REST JSON: ``Policy``)."""
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


def service_account_roles(
    google: Google, project: str, service_account: str, buckets: list[str]
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
        unread.append(f"project policy: {short(exc)}")
    url = f"{google.endpoints.iam}/v1/projects/-/serviceAccounts/{service_account}:getIamPolicy"
    try:
        status, body = google.rest("POST", url, json={})
        if status == 200:
            own_roles = _members_roles(cast(Policy, body), member)
        else:
            unread.append(f"service account policy: {api_error(status, body)}")
    except Exception as exc:
        unread.append(f"service account policy: {short(exc)}")
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
