"""How the preflight reaches Google: where each API is (``ApiEndpoints``), the caller's credentials, and the
clients the cloud checks share (``Google``). Each check goes through the installed client where there is one
(google-cloud-storage via ``tpustream.storage.io``, google-cloud-resource-manager) and otherwise REST through
google-auth's ``AuthorizedSession`` (IAM, Cloud Quotas: no client installed), always with short timeouts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from .findings import FAIL, Finding

__all__ = ["ApiEndpoints", "ErrorDetail", "Google", "JsonObject", "api_error", "load_credentials", "short"]

# A REST response's JSON body as it came: each check reads it as the TypedDict of the API it called.
JsonObject = dict[str, object]


class ErrorDetail(TypedDict, total=False):
    """A Google API error (``{"error": {"code", "status", "message"}}``)."""

    status: str
    message: str


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


class Google:
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

    def rest(self, method: str, url: str, **kwargs: Any) -> tuple[int, JsonObject]:
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


def api_error(status: int, body: JsonObject) -> str:
    """``HTTP 403 PERMISSION_DENIED why``: a failed call's status and its error, for a finding's message."""
    error = body.get("error")
    detail = cast(ErrorDetail, error) if isinstance(error, dict) else ErrorDetail()
    return f"HTTP {status} {detail.get('status', '')} {detail.get('message', '')}".strip()


def short(exc: BaseException) -> str:
    """An exception's text on one line, at most 200 characters."""
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."


def load_credentials(endpoints: ApiEndpoints) -> tuple[Any, Finding | None]:
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
            f"no Google Cloud credentials found ({short(exc)}): run `gcloud auth application-default "
            "login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file",
        )
    return credentials, None
