"""A recording Vertex AI REST endpoint on loopback for the real google-cloud-aiplatform client.

It answers the Model Registry calls tpustream makes (list, upload, get, mergeVersionAliases) with
plausible bodies and records every request (method, path, query, JSON body) for assertions.
Used because Vertex AI cannot be reached from here.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


class VertexRecorder:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.models: dict[str, dict] = {}  # model id -> {"displayName", "versions": {vid: {...}}}
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, body: dict, status: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                url = urlsplit(self.path)
                body = json.loads(raw) if raw else None
                recorder.requests.append(
                    {
                        "method": self.command,
                        "path": unquote(url.path),
                        "query": parse_qs(url.query),
                        "body": body,
                    }
                )
                self._reply(*recorder.route(self.command, unquote(url.path), body))

            do_GET = do_POST = do_PATCH = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _model_json(self, parent: str, model_id: str, version: str) -> dict:
        model = self.models[model_id]
        info = model["versions"][version]
        return {
            "name": f"{parent}/models/{model_id}",
            "displayName": model["displayName"],
            "versionId": version,
            "versionAliases": info["aliases"],
            "labels": info["labels"],
            "artifactUri": info["artifactUri"],
        }

    def route(self, method: str, path: str, body: dict | None) -> tuple[dict, int]:
        m = re.match(r"^/v1/(projects/[^/]+/locations/[^/]+)(/.*)$", path)
        if not m:
            return {"error": {"code": 404, "message": f"unknown path {path}"}}, 404
        parent, rest = m.groups()
        if method == "GET" and rest == "/models":
            return {
                "models": [
                    self._model_json(parent, mid, max(m["versions"], key=int))
                    for mid, m in self.models.items()
                ]
            }, 200
        if method == "POST" and rest == "/models:upload":
            model = body["model"]
            parent_model = body.get("parentModel")
            model_id = parent_model.rsplit("/", 1)[1] if parent_model else str(4200 + len(self.models))
            entry = self.models.setdefault(model_id, {"displayName": model["displayName"], "versions": {}})
            version = str(len(entry["versions"]) + 1)
            aliases = list(model.get("versionAliases", []))
            for other in entry["versions"].values():  # an alias names one version at a time
                other["aliases"] = [a for a in other["aliases"] if a not in aliases]
            entry["versions"][version] = {
                "aliases": aliases,
                "labels": model.get("labels", {}),
                "artifactUri": model.get("artifactUri"),
            }
            return {"name": f"{parent}/operations/{model_id}{version}", "done": True, "response": {
                "@type": "type.googleapis.com/google.cloud.aiplatform.v1.UploadModelResponse",
                "model": f"{parent}/models/{model_id}", "modelVersionId": version}}, 200  # fmt: skip
        if method == "POST" and rest in ("/pipelineJobs", "/schedules"):
            kind = rest.strip("/")
            number = len([r for r in self.requests if r["path"].endswith(rest)])
            reply = dict(body or {})
            reply["name"] = f"{parent}/{kind}/{kind.lower()}-{number}"
            reply.setdefault("state", "PIPELINE_STATE_PENDING" if kind == "pipelineJobs" else "ACTIVE")
            return reply, 200
        m_job = re.match(r"^/(pipelineJobs|schedules)/([\w-]+)$", rest)
        if method == "GET" and m_job:
            return {"name": f"{parent}{rest}", "state": "PIPELINE_STATE_RUNNING"}, 200
        m2 = re.match(r"^/models/(\d+)(?:@(\w+))?(:mergeVersionAliases)?$", rest)
        if m2:
            model_id, version, merge = m2.groups()
            if model_id not in self.models:
                return {"error": {"code": 404, "message": "model not found"}}, 404
            versions = self.models[model_id]["versions"]
            version = version or max(versions, key=int)
            if merge:
                new = [a for a in body.get("versionAliases", []) if not a.startswith("-")]
                for other in versions.values():
                    other["aliases"] = [a for a in other["aliases"] if a not in new]
                versions[version]["aliases"] += new
            return self._model_json(parent, model_id, version), 200
        return {"error": {"code": 404, "message": f"unhandled {method} {path}"}}, 404

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
