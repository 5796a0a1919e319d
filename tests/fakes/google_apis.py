"""A recording REST endpoint on loopback for the Google APIs ``pipelines/preflight/`` calls besides GCS and
Vertex: IAM (service accounts' testIamPermissions and getIamPolicy), Cloud Resource Manager v3 (projects'
testIamPermissions and getIamPolicy, through the real google-cloud-resource-manager REST client) and the Cloud
Quotas API (quotaInfos of a service).

Every request is recorded (method, path, query, JSON body). Request bodies are parsed as the iam v1 protos the
APIs parse them with (``ignore_unknown_fields=False``): an unknown or mistyped field gets the 400
INVALID_ARGUMENT the API would answer, and lands in ``rejected``. Policies the fake answers are checked to parse
as ``google.iam.v1.Policy``. Used because Google's APIs cannot be reached from here.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["GoogleApisFake", "tpu_quota_info"]


def cpu_quota_info(values: dict[str, int]) -> dict:
    """A QuotaInfo as the Cloud Quotas API lists Vertex AI's custom-training CPU quota (N1/E2 machines), per
    region (``values``: region -> vCPUs). Field names: cloudquotas v1 QuotaInfo."""
    quota_id = "CustomModelTrainingCPUsPerProjectPerRegion"
    return {
        "name": f"projects/proj/locations/global/services/aiplatform.googleapis.com/quotaInfos/{quota_id}",
        "quotaId": quota_id,
        "metric": "aiplatform.googleapis.com/custom_model_training_cpus",
        "service": "aiplatform.googleapis.com",
        "isPrecise": True,
        "containerType": "PROJECT",
        "dimensions": ["region"],
        "metricDisplayName": "Custom model training CPUs for N1/E2 machine types",
        "quotaDisplayName": "Custom model training CPUs for N1/E2 machine types per region",
        "metricUnit": "1",
        "dimensionsInfos": [
            {
                "dimensions": {"region": region},
                "details": {"value": str(value)},
                "applicableLocations": [region],
            }
            for region, value in values.items()
        ],
    }


def tpu_quota_info(family: str, values: dict[str, int], *, spot: bool = False) -> dict:
    """A QuotaInfo as the Cloud Quotas API lists it for Vertex AI's custom-training TPU quota of ``family``
    ("v3", "v5e"), per region (``values``: region -> limit). Field names: cloudquotas v1 QuotaInfo."""
    kind = "preemptible_" if spot else ""
    metric = f"aiplatform.googleapis.com/custom_model_training_{kind}tpu_{family}"
    quota_id = f"CustomModelTraining{'Preemptible' if spot else ''}TPU{family.upper()}PerProjectPerRegion"
    return {
        "name": f"projects/proj/locations/global/services/aiplatform.googleapis.com/quotaInfos/{quota_id}",
        "quotaId": quota_id,
        "metric": metric,
        "service": "aiplatform.googleapis.com",
        "isPrecise": True,
        "containerType": "PROJECT",
        "dimensions": ["region"],
        "metricDisplayName": f"Custom model training {'preemptible ' if spot else ''}TPU {family} cores",
        "quotaDisplayName": f"Custom model training {'preemptible ' if spot else ''}TPU {family} cores per region",
        "metricUnit": "1",
        "dimensionsInfos": [
            {
                "dimensions": {"region": region},
                "details": {"value": str(value)},
                "applicableLocations": [region],
            }
            for region, value in values.items()
        ],
    }


def _other_quota_info(index: int) -> dict:
    """A quota of the service that is not a TPU one (the real list holds hundreds)."""
    return {
        "name": f"projects/proj/locations/global/services/aiplatform.googleapis.com/quotaInfos/Other{index}",
        "quotaId": f"CustomModelTrainingNvidiaT4GpusPerProjectPerRegion{index}",
        "metric": "aiplatform.googleapis.com/custom_model_training_nvidia_t4_gpus",
        "dimensions": ["region"],
        "dimensionsInfos": [{"dimensions": {}, "details": {"value": "4"}}],
    }


def _parse(message: type, body: dict) -> None:
    from google.protobuf import json_format

    json_format.ParseDict(body, message(), ignore_unknown_fields=False)


class GoogleApisFake:
    """IAM, Resource Manager v3 and Cloud Quotas on one loopback port; point every endpoint at ``url``.

    State, set by the test: ``service_accounts`` (email -> {"caller": permissions the caller holds on it,
    "policy": its IAM policy}); ``project_permissions`` (project -> permissions the caller holds);
    ``project_policies`` (project -> IAM policy); ``quota_infos`` (project -> QuotaInfo list, served in pages
    of ``page_size``); ``quota_status`` (answer quotaInfos with this HTTP error) and ``quota_delay`` (seconds
    before answering it: a slow API).
    """

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.rejected: list[dict] = []
        self.service_accounts: dict[str, dict] = {}
        self.project_permissions: dict[str, set[str]] = {}
        self.project_policies: dict[str, dict] = {}
        self.quota_infos: dict[str, list[dict]] = {}
        self.quota_status: int | None = None
        self.quota_delay = 0.0
        self.page_size = 3
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, body: dict, status: int = 200) -> None:
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (its timeout): nothing to answer
                    pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                url = urlsplit(self.path)
                body = json.loads(raw) if raw else None
                request = {
                    "method": self.command,
                    "path": unquote(url.path),
                    "query": parse_qs(url.query),
                    "body": body,
                }
                fake.requests.append(request)
                problem = fake.check(self.command, request["path"], body)
                if problem:
                    fake.rejected.append({**request, "error": problem})
                    self._reply(
                        {"error": {"code": 400, "message": problem, "status": "INVALID_ARGUMENT"}}, 400
                    )
                    return
                self._reply(*fake.route(self.command, request["path"], body or {}, request["query"]))

            do_GET = do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def endpoints(self) -> dict[str, str]:
        """ApiEndpoints keyword arguments that send every API here."""
        return {"iam": self.url, "resource_manager": self.url, "cloud_quotas": self.url}

    def check(self, method: str, path: str, body: dict | None) -> str | None:
        """Why the API would refuse this request body (400), or None."""
        from google.iam.v1 import iam_policy_pb2

        message = None
        if method == "POST" and path.endswith(":testIamPermissions"):
            message = iam_policy_pb2.TestIamPermissionsRequest
        elif method == "POST" and path.endswith(":getIamPolicy"):
            message = iam_policy_pb2.GetIamPolicyRequest
        if message is None or body is None:
            return None
        try:
            _parse(message, body)
        except Exception as exc:  # ParseError: INVALID_ARGUMENT on Google's side
            return f"invalid {message.__name__}: {exc}"
        return None

    def _policy(self, policy: dict) -> tuple[dict, int]:
        from google.iam.v1 import policy_pb2

        answer = {"version": 1, "etag": "BwYAAAAAAAA=", **policy}
        _parse(policy_pb2.Policy, answer)  # the fake answers only what a Policy holds
        return answer, 200

    def route(self, method: str, path: str, body: dict, query: dict[str, list[str]]) -> tuple[dict, int]:
        m_sa = re.match(r"^/v1/projects/-/serviceAccounts/([^/:]+):(testIamPermissions|getIamPolicy)$", path)
        if method == "POST" and m_sa:
            email, verb = m_sa.groups()
            account = self.service_accounts.get(email)
            if account is None:
                message = f"Unknown service account: {email}"
                return {"error": {"code": 404, "message": message, "status": "NOT_FOUND"}}, 404
            if verb == "getIamPolicy":
                return self._policy(account.get("policy", {}))
            held = account.get("caller", set())
            return {"permissions": [p for p in body.get("permissions", []) if p in held]}, 200
        m_project = re.match(r"^/v3/projects/([^/:]+):(testIamPermissions|getIamPolicy)$", path)
        if method == "POST" and m_project:
            project, verb = m_project.groups()
            if project not in self.project_permissions:
                message = "The caller does not have permission"
                return {"error": {"code": 403, "message": message, "status": "PERMISSION_DENIED"}}, 403
            if verb == "getIamPolicy":
                return self._policy(self.project_policies.get(project, {}))
            held = self.project_permissions[project]
            return {"permissions": [p for p in body.get("permissions", []) if p in held]}, 200
        m_quota = re.match(r"^/v1/projects/([^/]+)/locations/global/services/([^/]+)/quotaInfos$", path)
        if method == "GET" and m_quota:
            time.sleep(self.quota_delay)
            if self.quota_status:
                message = "Permission 'cloudquotas.quotas.get' denied on resource"
                error = {"code": self.quota_status, "message": message, "status": "PERMISSION_DENIED"}
                return {"error": error}, self.quota_status
            project, service = m_quota.groups()
            infos = (
                [_other_quota_info(i) for i in range(4)] + self.quota_infos.get(project, [])
                if service == "aiplatform.googleapis.com"
                else []
            )
            start = int(query.get("pageToken", ["0"])[0])
            page = infos[start : start + self.page_size]
            reply: dict = {"quotaInfos": page}
            if start + self.page_size < len(infos):
                reply["nextPageToken"] = str(start + self.page_size)
            return reply, 200
        return {"error": {"code": 404, "message": f"unhandled {method} {path}", "status": "NOT_FOUND"}}, 404

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
