"""A recording Vertex AI REST endpoint on loopback for the real google-cloud-aiplatform client.

It answers the calls tpustream and GCPC's launcher make (pipelineJobs, schedules, customJobs, the Metadata
service's default store and its contexts with addContextChildren (how a run joins a Vertex AI Experiment:
tpustream/vertex/experiments.py), the Model
Registry's list/upload/get/mergeVersionAliases and model evaluations' import/list, managed datasets' get and
export with the export's long-running operation, endpoints' create/get/list/update (PATCH) with deployModel
and undeployModel as long-running operations, batchPredictionJobs' create/get, hyperparameterTuningJobs'
create/get with their trials run through ``trial_runner``: tuning.py), records every request
(method, path, query, JSON body), and validates every request body against the aiplatform v1 protos the way
Vertex parses it (``json_format.ParseDict(..., ignore_unknown_fields=False)``): an unknown or mistyped field
gets the 400 INVALID_ARGUMENT Vertex would answer, and lands in ``rejected`` for the test to assert on, as
do requests that break a rule Vertex documents (a traffic split that does not sum to 100, undeploying a
model that still has traffic, a custom model without dedicated resources, a model evaluation whose metrics
are not in the classification schema).
CustomJobs are also checked against the TPU rules Vertex documents (one worker pool, one replica per TPU
slice, a topology for v5e/v6e) and its TensorBoard rules (an instance of the job's region, a service account)
and then handed to ``job_runner``, which runs their hosts (see
tests/fakes/vertex/emulation.py). A managed image dataset registered with ``add_image_dataset`` is exported as
Vertex documents ExportDataConfig.gcs_destination: JSONL import files (the single- or multi-label
ioformat) and a schema.yaml under ``<outputUriPrefix>export-data-<display name>-<ISO time>/<schema dir>/``,
written into the GCS stand-in (STORAGE_EMULATOR_HOST); the sub-folder's name is ours (Vertex names it
after the annotations' schema title), so code under test must not depend on it.
A batch prediction job on a JSONL input is run against ``batch_server`` (a model server's base URL) as the
v1 BatchPredictionJob docs describe it (batch.py), its output written into the GCS stand-in.
This module holds the server, the request log, validation and routing, the Model Registry and model
evaluations; each family of calls is a mixin of its own module (runs, endpoints, batch, datasets, tuning), and
what Vertex accepts is in rules.py.
Used because Vertex AI cannot be reached from here.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from tests.fakes.vertex.batch import BatchPredictionMixin
from tests.fakes.vertex.datasets import DatasetsMixin
from tests.fakes.vertex.endpoints import EndpointsMixin
from tests.fakes.vertex.rules import (
    CLASSIFICATION_SCHEMA,
    Refused,
    _now,
    _request_message,
    classification_metrics_problem,
    tensorboard_problem,
    tpu_job_hosts,
    tuning_job_problem,
    validate_body,
)
from tests.fakes.vertex.runs import RunsMixin
from tests.fakes.vertex.tuning import TuningJobsMixin


class VertexRecorder(RunsMixin, EndpointsMixin, BatchPredictionMixin, DatasetsMixin, TuningJobsMixin):
    """The fake itself: the HTTP server, the request log, validation, routing, the Model Registry and model
    evaluations; each mixin adds one family of calls."""

    def __init__(
        self,
        job_runner: Callable[[dict, int], tuple[bool, str]] | None = None,
        trial_runner: Callable[[dict, int, dict[str, str]], tuple[bool, str]] | None = None,
    ) -> None:
        self.requests: list[dict] = []
        self.rejected: list[dict] = []  # requests Vertex would have refused (400), with why
        self.models: dict[str, dict] = {}  # model id -> {"displayName", "versions": {vid: {...}}}
        self.jobs: dict[str, dict] = {}  # custom job name -> {"body", "state", "hosts", "error"}
        self.job_runner = job_runner  # (job body, hosts) -> (succeeded, message); runs in a thread
        # (a trial's CustomJob body, hosts, the trial's env) -> (succeeded, message): runs a tuning job's trials
        self.trial_runner = trial_runner
        self.tuning_jobs: dict[str, dict] = {}  # hyperparameter tuning job name -> its state (tuning.py)
        self.tuning_lock = threading.Lock()
        self.fail_uploads = (
            0  # answer this many models:upload requests with a 403, as Vertex does without IAM
        )
        self.datasets: dict[str, dict] = {}  # dataset name -> {"resource", "rows", "multi_label"}
        self.denied_datasets: set[str] = set()  # answered with a 403, as Vertex does without IAM
        self.operations: dict[str, dict] = {}  # operation name -> the Operation once done
        self.exports: list[dict] = []  # every export run: {"dataset", "directory", "files"}
        self.export_rows_per_file = 1000  # Vertex splits an export into several JSONL files
        self.fail_exports = 0  # fail this many export operations, as when the Vertex AI Service Agent
        # cannot write to the destination bucket
        self.endpoints: dict[str, dict] = {}  # endpoint name -> its v1 Endpoint as GET answers it
        # hold_deploys: DeployModel operations stay running (done: false, the model not yet deployed) until
        # finish_deploys(), as a real deployment takes minutes; a retried deploy task can meet one in flight
        self.hold_deploys = False
        self._held: list[tuple[str, Callable[[], None]]] = []  # (operation name, what finishing it applies)
        self.operation_polls: dict[str, int] = {}  # operation name -> GETs of it while it ran
        # ListOperations answers at most this many operations a page (fewer when the request's pageSize is
        # smaller), oldest first, with a nextPageToken while more remain
        self.operations_page_size = 10
        self.evaluations: dict[str, list[dict]] = {}  # "ID@VERSION" -> its ModelEvaluations
        self.batch_jobs: dict[str, dict] = {}  # batch prediction job name -> its v1 BatchPredictionJob
        self.batch_server: str | None = None  # a model server's base URL: batch jobs run against it
        self.batch_calls: list[dict] = []  # every request a batch job sent to the model server
        self.metadata_stores: dict[str, dict] = {}  # name -> v1 MetadataStore ("default": made on first use)
        self.contexts: dict[str, dict] = {}  # name -> v1 Context (with its parentContexts)
        self.pipeline_jobs: dict[str, dict] = {}  # name -> v1 PipelineJob as GET answers it
        self.schedules: dict[str, dict] = {}  # name -> v1 Schedule as created
        self.deny_add_children = (
            0  # answer this many addContextChildren with a 403, as Vertex does without IAM
        )
        self._ids = itertools.count(1)
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
                request = {
                    "method": self.command, "path": unquote(url.path), "query": parse_qs(url.query), "body": body,
                }  # fmt: skip
                recorder.requests.append(request)
                problem = recorder.check(self.command, unquote(url.path), body)
                if problem:
                    recorder.rejected.append({**request, "error": problem})
                    self._reply(
                        {"error": {"code": 400, "message": problem, "status": "INVALID_ARGUMENT"}}, 400
                    )
                    return
                try:
                    self._reply(*recorder.route(self.command, unquote(url.path), body, request["query"]))
                except Refused as refused:
                    recorder.rejected.append({**request, "error": str(refused)})
                    error = {"code": refused.status, "message": str(refused), "status": refused.code}
                    self._reply({"error": error}, refused.status)

            do_GET = do_POST = do_PATCH = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def check(self, method: str, path: str, body: dict | None) -> str | None:
        """Why Vertex would refuse this request (400), or None."""
        m = re.match(r"^/v1/projects/[^/]+/locations/([^/]+)(/.*)$", path)
        message = _request_message(method, m.group(2)) if m else None
        if message is None or body is None:
            return None
        try:
            validate_body(message, body)
            if message.__name__ == "CustomJob":
                tpu_job_hosts(body)
                problem = tensorboard_problem(body, m.group(1) if m else "")
                if problem:
                    raise ValueError(problem)
            if message.__name__ == "HyperparameterTuningJob":
                problem = tuning_job_problem(body)
                if problem:
                    raise ValueError(problem)
        except Exception as exc:  # ParseError, ValueError: both are INVALID_ARGUMENT on Vertex
            return f"invalid {message.__name__}: {exc}"
        return None

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
            **({"containerSpec": info["containerSpec"]} if info.get("containerSpec") else {}),
        }

    def _version(self, model_id: str, version: str | None) -> str | None:
        """The version id that ``version`` (an id, an alias, or None: the default, here the newest) names."""
        versions = self.models[model_id]["versions"]
        if version is None:
            return max(versions, key=int)
        if version in versions:
            return version
        return next((vid for vid, info in versions.items() if version in info["aliases"]), None)

    def route(
        self, method: str, path: str, body: dict | None, query: dict[str, list[str]] | None = None
    ) -> tuple[dict, int]:
        m_operation = re.match(r"^/(?:v1|ui)/(projects/[^/]+/locations/[^/]+/.+/operations/[^/]+)$", path)
        if method == "GET" and m_operation and m_operation.group(1) in self.operations:
            found = self.operations[m_operation.group(1)]
            if not found.get("done"):
                self.operation_polls[found["name"]] = self.operation_polls.get(found["name"], 0) + 1
            return found, 200
        m_list = re.match(r"^/(?:v1|ui)/(projects/[^/]+/locations/[^/]+/endpoints/[^/:]+)/operations$", path)
        if method == "GET" and m_list:  # google.longrunning ListOperations on an endpoint, paged
            return self._list_operations(m_list.group(1), query or {}), 200
        m = re.match(r"^/v1/(projects/[^/]+/locations/[^/]+)(/.*)$", path)
        if not m:
            return {"error": {"code": 404, "message": f"unknown path {path}"}}, 404
        parent, rest = m.groups()
        if rest.startswith("/metadataStores"):
            return self._metadata_call(method, parent, rest, body, query or {})
        m_dataset = re.match(r"^/datasets/([^/:]+)(:export)?$", rest)
        if m_dataset:
            return self._dataset_call(
                method, f"{parent}/datasets/{m_dataset.group(1)}", m_dataset.group(2), body
            )
        m_versions = re.match(r"^/models/(\d+):listVersions$", rest)
        if method == "GET" and m_versions:  # ModelService.ListModelVersions, with its labels filter
            model_id = m_versions.group(1)
            if model_id not in self.models:
                return {"error": {"code": 404, "message": "model not found"}}, 404
            wanted = dict(re.findall(r'labels\.(\w+)="([^"]*)"', (query or {}).get("filter", [""])[0]))
            versions = self.models[model_id]["versions"]
            return {
                "models": [
                    self._model_json(parent, model_id, vid)
                    for vid, info in versions.items()
                    if all(info["labels"].get(k) == v for k, v in wanted.items())
                ]
            }, 200
        if method == "POST" and rest == "/models:upload" and self.fail_uploads:
            self.fail_uploads -= 1
            message = "Permission 'aiplatform.models.upload' denied on resource (or it may not exist)."
            return {"error": {"code": 403, "message": message, "status": "PERMISSION_DENIED"}}, 403
        m_endpoint = re.match(r"^/endpoints/([^/:]+)(?::(deployModel|undeployModel))?$", rest)
        if m_endpoint:
            name = f"{parent}/endpoints/{m_endpoint.group(1)}"
            return self._endpoint_call(method, name, m_endpoint.group(2), body, query or {})
        if rest == "/endpoints":
            return self._endpoints_call(method, parent, body, query or {})
        m_evaluations = re.match(r"^/models/(\d+)(?:@([\w-]+))?/evaluations(:import)?$", rest)
        if m_evaluations:
            return self._evaluations_call(method, parent, *m_evaluations.groups(), body)
        if rest == "/batchPredictionJobs" and method == "POST":
            return self._create_batch_job(parent, body or {})
        m_batch = re.match(r"^/batchPredictionJobs/(\d+)$", rest)
        if m_batch and method == "GET" and f"{parent}{rest}" in self.batch_jobs:
            return self.batch_jobs[f"{parent}{rest}"], 200
        if method == "GET" and rest == "/models":  # ListModels, with its display_name filter
            wanted = re.findall(r'display_name="([^"]*)"', (query or {}).get("filter", [""])[0])
            return {
                "models": [
                    self._model_json(parent, mid, max(m["versions"], key=int))
                    for mid, m in self.models.items()
                    if not wanted or m["displayName"] in wanted
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
                "containerSpec": model.get("containerSpec"),
            }
            return {"name": f"{parent}/operations/{model_id}{version}", "done": True, "response": {
                "@type": "type.googleapis.com/google.cloud.aiplatform.v1.UploadModelResponse",
                "model": f"{parent}/models/{model_id}", "modelVersionId": version}}, 200  # fmt: skip
        if method == "POST" and rest in ("/pipelineJobs", "/schedules"):
            kind = rest.strip("/")
            number = len([r for r in self.requests if r["path"].endswith(rest)])
            job_id = (query or {}).get("pipelineJobId", [f"{kind.lower()}-{number}"])[0]
            reply = dict(body or {})
            reply["name"] = f"{parent}/{kind}/{job_id if kind == 'pipelineJobs' else f'schedules-{number}'}"
            reply.setdefault("state", "PIPELINE_STATE_PENDING" if kind == "pipelineJobs" else "ACTIVE")
            if kind == "pipelineJobs":
                self._start_pipeline_job(parent, reply)
            else:
                self.schedules[reply["name"]] = reply
            return reply, 200
        if method == "POST" and rest == "/customJobs":
            name = f"{parent}/customJobs/{1000 + len(self.jobs)}"
            job = {"body": body, "state": "JOB_STATE_PENDING", "hosts": tpu_job_hosts(body), "error": None}
            self.jobs[name] = job
            threading.Thread(target=self._run_job, args=(name,), daemon=True).start()
            return self._job_json(name), 200
        if method == "POST" and rest == "/hyperparameterTuningJobs":
            return self._create_tuning_job(parent, body or {}), 200
        m_tuning = re.match(r"^/hyperparameterTuningJobs/(\d+)$", rest)
        if method == "GET" and m_tuning and f"{parent}{rest}" in self.tuning_jobs:
            return self._tuning_job_json(f"{parent}{rest}"), 200
        m_custom = re.match(r"^/customJobs/(\d+)$", rest)
        if method == "GET" and m_custom and f"{parent}{rest}" in self.jobs:
            return self._job_json(f"{parent}{rest}"), 200
        m_job = re.match(r"^/(pipelineJobs|schedules)/([\w-]+)$", rest)
        if method == "GET" and m_job and f"{parent}{rest}" in self.pipeline_jobs:
            return self.pipeline_jobs[f"{parent}{rest}"], 200
        if method == "GET" and m_job:
            return {"name": f"{parent}{rest}", "state": "PIPELINE_STATE_RUNNING"}, 200
        m2 = re.match(r"^/models/(\d+)(?:@([\w-]+))?(:mergeVersionAliases)?$", rest)
        if m2:
            model_id, version, merge = m2.groups()
            if model_id not in self.models or self._version(model_id, version) is None:
                return {"error": {"code": 404, "message": "model not found", "status": "NOT_FOUND"}}, 404
            versions = self.models[model_id]["versions"]
            version = self._version(model_id, version)
            if merge:
                new = [a for a in body.get("versionAliases", []) if not a.startswith("-")]
                for other in versions.values():
                    other["aliases"] = [a for a in other["aliases"] if a not in new]
                versions[version]["aliases"] += new
            return self._model_json(parent, model_id, version), 200
        return {"error": {"code": 404, "message": f"unhandled {method} {path}"}}, 404

    def _evaluations_call(
        self,
        method: str,
        parent: str,
        model_id: str,
        version: str | None,
        action: str | None,
        body: dict | None,
    ) -> tuple[dict, int]:
        """ModelService.ImportModelEvaluation (the metrics checked against their schema) and
        ListModelEvaluations, per model version."""
        if model_id not in self.models or self._version(model_id, version) is None:
            return {"error": {"code": 404, "message": "model not found", "status": "NOT_FOUND"}}, 404
        key = f"{model_id}@{self._version(model_id, version)}"
        evaluations = self.evaluations.setdefault(key, [])
        if method == "GET" and not action:
            return {"modelEvaluations": evaluations}, 200
        evaluation = dict((body or {}).get("modelEvaluation", {}))
        if evaluation.get("metricsSchemaUri") == CLASSIFICATION_SCHEMA:
            problem = classification_metrics_problem(evaluation.get("metrics"))
            if problem:
                raise Refused(
                    400, "INVALID_ARGUMENT", f"metrics do not match {CLASSIFICATION_SCHEMA}: {problem}"
                )
        evaluation.update(
            name=f"{parent}/models/{model_id}/evaluations/{6000 + next(self._ids)}", createTime=_now()
        )
        evaluations.append(evaluation)
        return evaluation, 200

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
