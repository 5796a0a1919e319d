"""A recording Vertex AI REST endpoint on loopback for the real google-cloud-aiplatform client.

It answers the calls tpustream and GCPC's launcher make (pipelineJobs, schedules, customJobs, the Metadata
service's default store and its contexts with addContextChildren (how a run joins a Vertex AI Experiment:
tpustream/vertex/experiments.py), the Model
Registry's list/upload/get/mergeVersionAliases and model evaluations' import/list, managed datasets' get and
export with the export's long-running operation, endpoints' create/get/list/update (PATCH) with deployModel
and undeployModel as long-running operations, batchPredictionJobs' create/get), records every request
(method, path, query, JSON body), and validates every request body against the aiplatform v1 protos the way
Vertex parses it (``json_format.ParseDict(..., ignore_unknown_fields=False)``): an unknown or mistyped field
gets the 400 INVALID_ARGUMENT Vertex would answer, and lands in ``rejected`` for the test to assert on, as
do requests that break a rule Vertex documents (a traffic split that does not sum to 100, undeploying a
model that still has traffic, a custom model without dedicated resources, a model evaluation whose metrics
are not in the classification schema).
CustomJobs are also checked against the TPU rules Vertex documents (one worker pool, one replica per TPU
slice, a topology for v5e/v6e) and its TensorBoard rules (an instance of the job's region, a service account)
and then handed to ``job_runner``, which runs their hosts (see
tests/vertex_emulation.py). A managed image dataset registered with ``add_image_dataset`` is exported as
Vertex documents ExportDataConfig.gcs_destination: JSONL import files (the single- or multi-label
ioformat) and a schema.yaml under ``<outputUriPrefix>export-data-<display name>-<ISO time>/<schema dir>/``,
written into the GCS stand-in (STORAGE_EMULATOR_HOST); the sub-folder's name is ours (Vertex names it
after the annotations' schema title), so code under test must not depend on it.
A batch prediction job on a JSONL input is run against ``batch_server`` (a model server's base URL) as the
v1 BatchPredictionJob docs describe it (``_run_batch_prediction``), its output written into the GCS stand-in.
Used because Vertex AI cannot be reached from here.
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


def _request_message(method: str, rest: str) -> type | None:
    """The aiplatform v1 message a request body must parse as (REST mapping of the v1 API)."""
    from google.cloud import aiplatform_v1 as v1

    if method == "PATCH" and re.match(r"^/endpoints/[^/:]+$", rest):
        return v1.Endpoint  # UpdateEndpoint: body "endpoint"
    if method != "POST":
        return None
    if rest == "/endpoints":
        return v1.Endpoint  # CreateEndpoint: body "endpoint"
    if re.match(r"^/endpoints/[^/:]+:deployModel$", rest):
        return v1.DeployModelRequest
    if re.match(r"^/endpoints/[^/:]+:undeployModel$", rest):
        return v1.UndeployModelRequest
    if re.match(r"^/models/[^/]+/evaluations:import$", rest):
        return v1.ImportModelEvaluationRequest
    if rest == "/batchPredictionJobs":
        return v1.BatchPredictionJob  # CreateBatchPredictionJob: body "batch_prediction_job"
    if rest == "/metadataStores":
        return v1.MetadataStore  # CreateMetadataStore: body "metadata_store"
    if re.match(r"^/metadataStores/[^/]+/contexts$", rest):
        return v1.Context  # CreateContext: body "context"
    if re.match(r"^/metadataStores/[^/]+/contexts/[^/:]+:addContextChildren$", rest):
        return v1.AddContextChildrenRequest
    if rest == "/pipelineJobs":
        return v1.PipelineJob
    if rest == "/schedules":
        return v1.Schedule
    if rest == "/customJobs":
        return v1.CustomJob
    if rest == "/models:upload":
        return v1.UploadModelRequest
    if rest.endswith(":mergeVersionAliases"):
        return v1.MergeVersionAliasesRequest
    if re.match(r"^/datasets/[^/]+:export$", rest):
        return v1.ExportDataRequest
    return None


def validate_body(message: type, body: dict) -> None:
    """Parse ``body`` as Vertex does; raises ParseError on an unknown field or a wrong type."""
    from google.protobuf import json_format

    json_format.ParseDict(body, message.pb(message()), ignore_unknown_fields=False)


# The fields of Vertex's classification metrics schema (gs://google-cloud-aiplatform/schema/modelevaluation/
# classification_metrics_1.0.0.yaml): aiplatform v1 REST "SchemaModelevaluationMetricsClassificationEvaluation
# Metrics" and its ConfidenceMetrics / ConfusionMatrix, as GCPC's google.ClassificationMetrics artifact schema
# also lists them (google_cloud_pipeline_components/types/artifact_types.py)
_CLASSIFICATION_FIELDS = {"auPrc", "auRoc", "logLoss", "confidenceMetrics", "confusionMatrix"}
_CONFIDENCE_FIELDS = {
    "confidenceThreshold",
    "maxPredictions",
    "recall",
    "precision",
    "falsePositiveRate",
    "f1Score",
    "f1ScoreMicro",
    "f1ScoreMacro",
    "recallAt1",
    "precisionAt1",
    "falsePositiveRateAt1",
    "f1ScoreAt1",
    "truePositiveCount",
    "falsePositiveCount",
    "falseNegativeCount",
    "trueNegativeCount",
    "confusionMatrix",
}
CLASSIFICATION_SCHEMA = (
    "gs://google-cloud-aiplatform/schema/modelevaluation/classification_metrics_1.0.0.yaml"
)


def classification_metrics_problem(metrics: object) -> str | None:
    """Why ``metrics`` does not follow the classification metrics schema, or None."""

    def numbers(entry: dict, where: str) -> str | None:
        for key, value in entry.items():
            if key != "confusionMatrix" and (not isinstance(value, int | float) or isinstance(value, bool)):
                return f"{where}.{key} is not a number"
        return (
            confusion(entry["confusionMatrix"], f"{where}.confusionMatrix")
            if "confusionMatrix" in entry
            else None
        )

    def confusion(matrix: object, where: str) -> str | None:
        if not isinstance(matrix, dict) or set(matrix) - {"annotationSpecs", "rows"}:
            return f"{where} must be {{annotationSpecs, rows}}"
        specs, rows = matrix.get("annotationSpecs", []), matrix.get("rows", [])
        if any(not isinstance(spec, dict) or set(spec) - {"id", "displayName"} for spec in specs):
            return f"{where}.annotationSpecs items must be {{id, displayName}}"
        if len(rows) != len(specs) or any(len(row) != len(specs) for row in rows):
            return f"{where}.rows must be {len(specs)} x {len(specs)}, one row and column per annotation spec"
        if any(
            not isinstance(cell, int | float) or cell < 0 or cell != int(cell) for row in rows for cell in row
        ):
            return f"{where}.rows must hold counts"
        return None

    if not isinstance(metrics, dict):
        return "metrics must be an object"
    unknown = set(metrics) - _CLASSIFICATION_FIELDS
    if unknown:
        return f"metrics has fields the classification schema does not: {sorted(unknown)}"
    for index, entry in enumerate(metrics.get("confidenceMetrics", [])):
        if not isinstance(entry, dict) or set(entry) - _CONFIDENCE_FIELDS:
            return f"confidenceMetrics[{index}] has fields the schema does not: {sorted(set(entry) - _CONFIDENCE_FIELDS)}"
        problem = numbers(entry, f"confidenceMetrics[{index}]")
        if problem:
            return problem
    return numbers({k: v for k, v in metrics.items() if k != "confidenceMetrics"}, "metrics")


class Refused(Exception):
    """A request Vertex refuses for a rule it documents (not a parse error): the HTTP status and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def _split_problem(split: dict, deployed: set[str], new_id: str | None = None) -> str | None:
    """Why Vertex refuses ``split`` (an Endpoint's or a request's trafficSplit), or None."""
    allowed = deployed | ({new_id} if new_id else set())
    if set(split) - allowed:
        return f"trafficSplit names {sorted(set(split) - allowed)}, which are not deployed on the endpoint"
    if any(not isinstance(v, int) or v < 0 for v in split.values()):
        return "trafficSplit values must be non-negative integers"
    if split and sum(split.values()) != 100:
        return f"trafficSplit must add up to 100, got {sum(split.values())} ({split})"
    return None


def _gcs_client():  # noqa: ANN202 - google.cloud.storage.Client
    """A client of the GCS stand-in (STORAGE_EMULATOR_HOST), where Vertex's fake reads and writes objects."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage  # type: ignore[attr-defined]

    return storage.Client(  # type: ignore[attr-defined]
        project="test",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": os.environ["STORAGE_EMULATOR_HOST"]},
    )


def _now() -> str:
    return (
        datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


TPU_MACHINES = re.compile(r"^(cloud-tpu|ct\d+\w*-\w+-(\d+)t)$")


def tpu_job_hosts(body: dict) -> int:
    """Check a CustomJob's worker pools and capacity against Vertex's documented TPU rules; returns the number of TPU
    VMs (hosts) its one pool runs on (1 for a non-TPU job). Raises ValueError as Vertex would reject it.

    Rules (https://cloud.google.com/vertex-ai/docs/training/training-with-tpu-vm; google-cloud-aiplatform
    utils/worker_spec_utils.py "TPU jobs only allow 1 replica"): a TPU job has one worker pool with
    replica_count 1; cloud-tpu (v2/v3) takes acceleratorType TPU_V2|TPU_V3 x 8; the ct5lp/ct6e types need a
    tpuTopology whose chip count is a multiple of the VM's chips (the "-Nt" suffix): chips / N hosts, and
    a slice of more than one VM is made of 4-chip VMs.
    """
    from google.cloud import aiplatform_v1 as v1

    job = v1.CustomJob.from_json(json.dumps(body))  # enums may come as names or numbers
    pools = [p for p in job.job_spec.worker_pool_specs if p.machine_spec.machine_type]
    if not any(TPU_MACHINES.match(p.machine_spec.machine_type) for p in pools):
        return 1
    if len(pools) != 1 or pools[0].replica_count != 1:
        raise ValueError(
            f"TPU jobs allow one worker pool with replicaCount 1, got {len(pools)} pool(s) with replica counts "
            f"{[p.replica_count for p in pools]}"
        )
    spec = pools[0].machine_spec
    strategy = job.job_spec.scheduling.strategy
    if (
        strategy == v1.Scheduling.Strategy.FLEX_START
    ):  # "Schedule training jobs based on resource availability"
        raise ValueError(
            "the Dynamic Workload Scheduler (FLEX_START) for custom training requires GPUs, not TPUs"
        )
    if spec.machine_type == "cloud-tpu":
        accelerators = (v1.AcceleratorType.TPU_V2, v1.AcceleratorType.TPU_V3)
        if spec.accelerator_type not in accelerators or spec.accelerator_count != 8:
            raise ValueError("cloud-tpu needs acceleratorType TPU_V2 or TPU_V3 with acceleratorCount 8")
        return 1
    if not spec.tpu_topology:
        raise ValueError(f"machineType {spec.machine_type} needs machineSpec.tpuTopology")
    chips = math.prod(int(n) for n in spec.tpu_topology.split("x"))
    per_vm = int(TPU_MACHINES.match(spec.machine_type).group(2))  # type: ignore[union-attr]
    if chips % per_vm or (chips > per_vm and per_vm != 4):
        raise ValueError(f"tpuTopology {spec.tpu_topology} does not fit machineType {spec.machine_type}")
    if (
        strategy == v1.Scheduling.Strategy.SPOT and chips > per_vm
    ):  # "Use Spot VMs with training", Limitations
        raise ValueError("Using Spot VMs with TPU Pods isn't supported (a multi-host tpuTopology with SPOT)")
    return chips // per_vm


TENSORBOARD_NAME = re.compile(r"^projects/[^/]+/locations/(?P<location>[^/]+)/tensorboards/[^/]+$")


def tensorboard_problem(body: dict, location: str) -> str | None:
    """Why Vertex refuses a CustomJob's ``jobSpec.tensorboard`` in ``location``, or None (none named is fine).

    Rules: the instance's resource name (aiplatform_v1 CustomJobSpec.tensorboard,
    ``projects/{project}/locations/{location}/tensorboards/{tensorboard}``); the instance and the training job
    in one region ("Set up for Vertex AI TensorBoard"); a service account attached ("The Vertex AI TensorBoard
    integration with custom training requires attaching a service account"; aiplatform jobs.py:
    "service_account is required with provided tensorboard")."""
    spec = body.get("jobSpec", {})
    tensorboard = spec.get("tensorboard", "")
    if not tensorboard:
        return None
    match = TENSORBOARD_NAME.match(tensorboard)
    if match is None:
        return f"jobSpec.tensorboard {tensorboard!r} is not projects/P/locations/L/tensorboards/ID"
    if match["location"] != location:
        return f"TensorBoard {tensorboard} is not in the job's region {location}"
    if not spec.get("serviceAccount"):
        return "a CustomJob with a tensorboard needs jobSpec.serviceAccount"
    return None


def schedule_tick(body: dict, active_runs: int) -> str:
    """What Vertex's scheduler does with a Schedule at a cron tick while ``active_runs`` of its runs are in a
    non-terminal state: "start", "queue" or "skip" (aiplatform_v1 types/schedule.py: max_concurrent_run_count
    limits runs being started at once; max_concurrent_active_run_count limits runs in a non-terminal state,
    and allow_queueing queues a tick that the limit holds back instead of skipping it)."""
    from google.cloud import aiplatform_v1 as v1

    schedule = v1.Schedule.from_json(json.dumps(body), ignore_unknown_fields=False)
    limit = schedule.max_concurrent_active_run_count
    if limit and active_runs >= limit:
        return "queue" if schedule.allow_queueing else "skip"
    return "start"


# aiplatform's schema.dataset.metadata.image / .text: what Dataset.metadataSchemaUri says a dataset holds
IMAGE_METADATA_SCHEMA = "gs://google-cloud-aiplatform/schema/dataset/metadata/image_1.0.0.yaml"
TEXT_METADATA_SCHEMA = "gs://google-cloud-aiplatform/schema/dataset/metadata/text_1.0.0.yaml"
ML_USE_LABEL = "aiplatform.googleapis.com/ml_use"
# The export's schema.yaml per annotation kind: the title line of Vertex's ioformat schema files
# (gs://google-cloud-aiplatform/schema/dataset/ioformat/image_classification_{single,multi}_label_io_format_
# 1.0.0.yaml); the folder names are ours
_EXPORT_SCHEMAS = {
    False: ("image_classification_single_label", "ImageClassificationSingleLabel"),
    True: ("image_classification_multi_label", "ImageClassificationMultiLabel"),
}

# One data item of a fake managed dataset: (image gs:// URI, label or labels, ml_use or None)
DatasetRow = tuple[str, "str | Sequence[str]", "str | None"]


def _export_line(row: DatasetRow, annotation_set: str) -> str:
    """One exported JSONL line, as Vertex writes a data item with its classification annotation(s)."""
    image, labels, ml_use = row

    def annotation(label: str) -> dict:
        return {
            "displayName": label,
            "annotationResourceLabels": {
                "aiplatform.googleapis.com/annotation_set_name": annotation_set,
                "aiplatform.googleapis.com/payload_schema_title": "ImageClassificationAnnotation",
            },
        }

    line: dict = {"imageGcsUri": image}
    if isinstance(labels, str):
        line["classificationAnnotation"] = annotation(labels)
    else:
        line["classificationAnnotations"] = [annotation(label) for label in labels]
    if ml_use is not None:
        line["dataItemResourceLabels"] = {ML_USE_LABEL: ml_use}
    return json.dumps(line)


class VertexRecorder:
    def __init__(self, job_runner: Callable[[dict, int], tuple[bool, str]] | None = None) -> None:
        self.requests: list[dict] = []
        self.rejected: list[dict] = []  # requests Vertex would have refused (400), with why
        self.models: dict[str, dict] = {}  # model id -> {"displayName", "versions": {vid: {...}}}
        self.jobs: dict[str, dict] = {}  # custom job name -> {"body", "state", "hosts", "error"}
        self.job_runner = job_runner  # (job body, hosts) -> (succeeded, message); runs in a thread
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
        if method == "GET" and m_list:  # google.longrunning ListOperations on an endpoint
            under = [
                op
                for name, op in self.operations.items()
                if name.startswith(f"{m_list.group(1)}/operations/")
            ]
            return {"operations": under}, 200
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

    # ------------------------------------------------------------------ pipeline runs and metadata

    def _start_pipeline_job(self, parent: str, job: dict) -> None:
        """What Vertex does once a PipelineJob starts: its state RUNNING and, in the default metadata store,
        a ``system.PipelineRun`` context named after the job, which GET names in ``jobDetail`` (aiplatform's
        ``PipelineJob._get_context`` waits for it). The create reply itself carries none, as on Vertex."""
        from google.cloud import aiplatform_v1 as v1

        store = f"{parent}/metadataStores/default"
        self.metadata_stores.setdefault(store, {"name": store, "createTime": _now()})
        job_id = job["name"].rsplit("/", 1)[1]
        pipeline_name = job.get("pipelineSpec", {}).get("pipelineInfo", {}).get("name", "pipeline")
        pipeline = self._new_context(store, pipeline_name, "system.Pipeline")
        run = self._new_context(store, job_id, "system.PipelineRun")
        running = {
            **job,
            "state": "PIPELINE_STATE_RUNNING",
            "jobDetail": {"pipelineContext": dict(pipeline), "pipelineRunContext": dict(run)},  # as made
        }
        validate_body(v1.PipelineJob, running)  # the fake answers only fields Vertex has
        self.pipeline_jobs[job["name"]] = running

    def scheduled_run(self, schedule: str) -> str:
        """What Vertex's scheduler does at a cron tick of ``schedule``: create a PipelineJob from the schedule's
        ``createPipelineJobRequest`` (its ``pipelineJob``, under a new ID) and start it; returns its name."""
        from google.cloud import aiplatform_v1 as v1

        request = self.schedules[schedule]["createPipelineJobRequest"]
        run_id = f"{self.schedules[schedule]['displayName']}-{len(self.pipeline_jobs) + 1:04d}"
        job = {
            **request["pipelineJob"],
            "name": f"{request['parent']}/pipelineJobs/{run_id}",
            "scheduleName": schedule,
            "state": "PIPELINE_STATE_PENDING",
        }
        validate_body(v1.PipelineJob, job)
        self._start_pipeline_job(request["parent"], job)
        return job["name"]

    def _new_context(self, store: str, context_id: str, schema_title: str) -> dict:
        name = f"{store}/contexts/{context_id}"
        if name not in self.contexts:
            stamp = _now()
            self.contexts[name] = {
                "name": name,
                "displayName": context_id,
                "schemaTitle": schema_title,
                "schemaVersion": "0.0.1",
                "createTime": stamp,
                "updateTime": stamp,
            }
        return self.contexts[name]

    def _metadata_call(
        self, method: str, parent: str, rest: str, body: dict | None, query: dict
    ) -> tuple[dict, int]:
        """MetadataService: Get/CreateMetadataStore (an Operation), Get/CreateContext, AddContextChildren,
        with the rules the v1 API states (context IDs of 4-128 ``[a-z0-9-]``, ALREADY_EXISTS, NOT_FOUND)."""

        def not_found(name: str) -> tuple[dict, int]:
            return {"error": {"code": 404, "message": f"{name} not found.", "status": "NOT_FOUND"}}, 404

        m_store = re.match(
            r"^/metadataStores(?:/([^/]+))?(/contexts(?:/([^/:]+)(:addContextChildren)?)?)?$", rest
        )
        if m_store is None:
            return {"error": {"code": 404, "message": f"unhandled {method} {rest}"}}, 404
        store_id, contexts, context_id, add_children = m_store.groups()
        if not contexts:
            if method == "POST" and store_id is None:  # CreateMetadataStore
                name = f"{parent}/metadataStores/{query.get('metadataStoreId', ['default'])[0]}"
                self.metadata_stores[name] = {**(body or {}), "name": name, "createTime": _now()}
                return self._operation(
                    name, "CreateMetadataStore", self.metadata_stores[name], "MetadataStore"
                ), 200
            name = f"{parent}/metadataStores/{store_id}"
            if method == "GET" and name in self.metadata_stores:
                return self.metadata_stores[name], 200
            return not_found(name)
        store = f"{parent}/metadataStores/{store_id}"
        if store not in self.metadata_stores:
            return not_found(store)
        if method == "POST" and context_id is None:  # CreateContext
            new_id = query.get("contextId", [""])[0]
            if not re.fullmatch(r"[a-z0-9-]{4,128}", new_id):
                raise Refused(400, "INVALID_ARGUMENT", f"contextId {new_id!r}: 4-128 characters of [a-z0-9-]")
            name = f"{store}/contexts/{new_id}"
            if name in self.contexts:
                raise Refused(409, "ALREADY_EXISTS", f"Context {name} already exists.")
            stamp = _now()
            self.contexts[name] = {
                **(body or {}),
                "name": name,
                "createTime": stamp,
                "updateTime": stamp,
                "etag": f"AMEw{next(self._ids)}",
            }
            return self.contexts[name], 200
        name = f"{store}/contexts/{context_id}"
        if name not in self.contexts:
            return not_found(name)
        if method == "GET" and not add_children:
            return self.contexts[name], 200
        if method == "POST" and add_children and self.deny_add_children:
            self.deny_add_children -= 1
            permission = (
                "aiplatform.metadataStores.contexts.addContextChildren"  # roles/aiplatform.user has it
            )
            raise Refused(403, "PERMISSION_DENIED", f"Permission '{permission}' denied on resource '{name}'.")
        if method == "POST" and add_children:
            children = (body or {}).get("childContexts", [])
            missing = [child for child in children if child not in self.contexts]
            if missing:
                raise Refused(404, "NOT_FOUND", f"child contexts {missing} not found.")
            for child in children:
                parents = self.contexts[child].setdefault("parentContexts", [])
                if name not in parents:
                    parents.append(name)
            return {}, 200
        return {"error": {"code": 404, "message": f"unhandled {method} {rest}"}}, 404

    # ------------------------------------------------------------------ endpoints

    def _operation(self, resource: str, kind: str, response: dict | None, response_type: str) -> dict:
        """A long-running operation under ``resource``, done at its first poll (the reply is not done yet)."""
        from google.cloud import aiplatform_v1 as v1

        name = f"{resource}/operations/{9000 + len(self.operations)}"
        stamp = _now()
        metadata = {
            "@type": f"type.googleapis.com/google.cloud.aiplatform.v1.{kind}OperationMetadata",
            "genericMetadata": {"createTime": stamp, "updateTime": stamp},
        }
        done = {
            "name": name,
            "metadata": metadata,
            "done": True,
            "response": {
                "@type": f"type.googleapis.com/google.cloud.aiplatform.v1.{response_type}",
                **(response or {}),
            },
        }
        validate_body(getattr(v1, response_type), response or {})  # the fake answers only fields Vertex has
        self.operations[name] = done
        return {"name": name, "metadata": metadata}

    def _endpoint_json(self, name: str) -> dict:
        from google.cloud import aiplatform_v1 as v1

        endpoint = self.endpoints[name]
        validate_body(v1.Endpoint, endpoint)
        return json.loads(json.dumps(endpoint))  # a copy: later changes do not alter a recorded reply

    def _endpoints_call(self, method: str, parent: str, body: dict | None, query: dict) -> tuple[dict, int]:
        """EndpointService.CreateEndpoint (an Operation) and ListEndpoints with its display_name filter."""
        if method == "GET":
            wanted = re.findall(r'display_name="([^"]*)"', query.get("filter", [""])[0])
            return {
                "endpoints": [
                    self._endpoint_json(name)
                    for name, endpoint in self.endpoints.items()
                    if name.startswith(f"{parent}/") and (not wanted or endpoint["displayName"] in wanted)
                ]
            }, 200
        if method != "POST" or not body:
            return {"error": {"code": 404, "message": f"unhandled {method} {parent}/endpoints"}}, 404
        if not body.get("displayName"):
            raise Refused(400, "INVALID_ARGUMENT", "Endpoint.displayName is required")
        endpoint_id = query.get("endpointId", [str(5100 + len(self.endpoints))])[0]
        # CreateEndpointRequest.endpoint_id (aiplatform_v1 types/endpoint_service.py): a lowercase letter
        # then up to 62 of [a-z0-9-], the last a letter or digit; or up to 9 digits, no leading zero.
        if not re.match(r"^(?:[1-9][0-9]{0,8}|[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?)$", endpoint_id):
            raise Refused(400, "INVALID_ARGUMENT", f"Invalid endpoint_id {endpoint_id!r}")
        name = f"{parent}/endpoints/{endpoint_id}"
        if name in self.endpoints:
            raise Refused(409, "ALREADY_EXISTS", f'Endpoint "{name}" already exists.')
        stamp = _now()
        self.endpoints[name] = {
            **{
                k: v
                for k, v in body.items()
                if k in ("displayName", "description", "labels", "dedicatedEndpointEnabled")
            },
            # Endpoint.dedicated_endpoint_dns: "https://{endpoint_id}.{region}-{uid}.prediction.vertexai.goog"
            **(
                {"dedicatedEndpointDns": f"{endpoint_id}.{parent.split('/')[3]}-0.prediction.vertexai.goog"}
                if body.get("dedicatedEndpointEnabled")
                else {}
            ),
            "name": name,
            "createTime": stamp,
            "updateTime": stamp,
            "etag": f"AMEw{next(self._ids)}",
        }
        return self._operation(name, "CreateEndpoint", self._endpoint_json(name), "Endpoint"), 200

    def _endpoint_call(
        self, method: str, name: str, action: str | None, body: dict | None, query: dict
    ) -> tuple[dict, int]:
        """GetEndpoint, UpdateEndpoint (PATCH with updateMask), DeployModel and UndeployModel (Operations)."""
        endpoint = self.endpoints.get(name)
        if endpoint is None:
            message = f'Endpoint "{name}" not found.'
            return {"error": {"code": 404, "message": message, "status": "NOT_FOUND"}}, 404
        deployed = {dm["id"] for dm in endpoint.get("deployedModels", [])}
        if method == "GET" and not action:
            return self._endpoint_json(name), 200
        body = body or {}
        if method == "PATCH" and not action:
            mask = [p for item in query.get("updateMask", []) for p in item.split(",") if p]
            if not mask or set(mask) - {
                "displayName",
                "description",
                "labels",
                "trafficSplit",
                "display_name",
                "traffic_split",
            }:
                raise Refused(
                    400, "INVALID_ARGUMENT", f"updateMask {mask} is empty or names fields not updatable"
                )
            for path in mask:
                field = re.sub(r"_(\w)", lambda m: m.group(1).upper(), path)
                if field == "trafficSplit":
                    problem = _split_problem(body.get("trafficSplit", {}), deployed)
                    if problem:
                        raise Refused(400, "INVALID_ARGUMENT", problem)
                if field in body:
                    endpoint[field] = body[field]
                else:
                    endpoint.pop(field, None)
            endpoint.update(updateTime=_now(), etag=f"AMEw{next(self._ids)}")
            return self._endpoint_json(name), 200
        if method == "POST" and action == "deployModel":
            return self._deploy(name, endpoint, deployed, body), 200
        if method == "POST" and action == "undeployModel":
            return self._undeploy(name, endpoint, deployed, body), 200
        return {"error": {"code": 404, "message": f"unhandled {method} {name}:{action}"}}, 404

    def _deploy(self, name: str, endpoint: dict, deployed: set[str], body: dict) -> dict:
        """DeployModel, with the rules Vertex documents for a custom-trained model (DeployedModel,
        DedicatedResources, DeployModelRequest.traffic_split in aiplatform_v1 types/endpoint*.py)."""
        requested = body["deployedModel"]
        m = re.match(
            r"^(projects/[^/]+/locations/[^/]+)/models/(\d+)(?:@([\w-]+))?$", requested.get("model", "")
        )
        model_id = m.group(2) if m else None
        if m is None or model_id not in self.models or self._version(model_id, m.group(3)) is None:
            raise Refused(404, "NOT_FOUND", f"Model {requested.get('model')!r} not found.")
        version = self._version(model_id, m.group(3))
        resources = requested.get("dedicatedResources")
        if not resources or requested.get("automaticResources"):
            raise Refused(
                400,
                "INVALID_ARGUMENT",
                "a custom-trained model needs dedicatedResources (automaticResources are not supported)",
            )
        if not resources.get("machineSpec", {}).get("machineType"):
            raise Refused(400, "INVALID_ARGUMENT", "dedicatedResources.machineSpec.machineType is required")
        low, high = resources.get("minReplicaCount", 0), resources.get("maxReplicaCount", 0)
        if low < 1 or (high and high < low):
            raise Refused(
                400,
                "INVALID_ARGUMENT",
                f"minReplicaCount must be >= 1 and maxReplicaCount >= it, got {low} and {high}",
            )
        split = body.get("trafficSplit", {})
        problem = _split_problem(split, deployed, "0")
        if problem:
            raise Refused(400, "INVALID_ARGUMENT", problem)
        new_id = str(7_700_000_000_000_000_000 + next(self._ids))  # Vertex's ids are 19-digit numbers
        model = self.models[model_id]
        deployed_model = {
            "id": new_id,
            "model": f"{m.group(1)}/models/{model_id}",
            "modelVersionId": version,
            "displayName": requested.get("displayName") or model["displayName"],
            "dedicatedResources": resources,
            "createTime": _now(),
        }

        def apply() -> None:
            endpoint.setdefault("deployedModels", []).append(deployed_model)
            if split:  # "0" is the model being deployed (DeployModelRequest.traffic_split)
                endpoint["trafficSplit"] = {(new_id if k == "0" else k): v for k, v in split.items()}
            endpoint.update(updateTime=_now(), etag=f"AMEw{next(self._ids)}")

        reply = self._operation(name, "DeployModel", {"deployedModel": deployed_model}, "DeployModelResponse")
        if not self.hold_deploys:
            apply()
            return reply
        running = self.operations[reply["name"]]
        self.operations[reply["name"]] = {
            "name": running["name"],
            "metadata": running["metadata"],
            "done": False,
        }
        self._held.append(
            (reply["name"], lambda: (apply(), self.operations.__setitem__(reply["name"], running)))
        )
        return reply

    def finish_deploys(self) -> int:
        """Complete every held DeployModel: the models are deployed and the operations done. Returns how many."""
        held, self._held = self._held, []
        for _, finish in held:
            finish()
        return len(held)

    def _undeploy(self, name: str, endpoint: dict, deployed: set[str], body: dict) -> dict:
        """UndeployModel: the model must end with no traffic; a given trafficSplit replaces the endpoint's
        (UndeployModelRequest.traffic_split)."""
        gone = body.get("deployedModelId", "")
        if gone not in deployed:
            raise Refused(404, "NOT_FOUND", f"DeployedModel {gone!r} not found on {name}.")
        if "trafficSplit" in body:
            split = body["trafficSplit"]
            problem = _split_problem(split, deployed - {gone}) if split or deployed - {gone} else None
            if problem or split.get(gone):
                raise Refused(400, "INVALID_ARGUMENT", problem or f"trafficSplit still gives {gone} traffic")
        else:
            split = dict(endpoint.get("trafficSplit", {}))
            if split.get(gone):
                raise Refused(
                    400,
                    "FAILED_PRECONDITION",
                    f"DeployedModel {gone} has {split[gone]}% of the traffic: give a trafficSplit without it",
                )
        endpoint["deployedModels"] = [dm for dm in endpoint["deployedModels"] if dm["id"] != gone]
        endpoint["trafficSplit"] = {k: v for k, v in split.items() if k != gone}
        endpoint.update(updateTime=_now(), etag=f"AMEw{next(self._ids)}")
        return self._operation(name, "UndeployModel", {}, "UndeployModelResponse")

    # ------------------------------------------------------------------ model evaluations

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

    # ------------------------------------------------------------------ batch prediction

    def _create_batch_job(self, parent: str, body: dict) -> tuple[dict, int]:
        """JobService.CreateBatchPredictionJob, with the rules the v1 BatchPredictionJob docs state."""
        m = re.match(r"^(projects/[^/]+/locations/[^/]+)/models/(\d+)(?:@([\w-]+))?$", body.get("model", ""))
        if m is None or m.group(1) != parent:
            raise Refused(
                400,
                "INVALID_ARGUMENT",
                "model must be a Model of this location (projects/P/locations/L/models/ID)",
            )
        if m.group(2) not in self.models or self._version(m.group(2), m.group(3)) is None:
            raise Refused(404, "NOT_FOUND", f"Model {body['model']!r} not found.")
        source = body.get("inputConfig", {})
        formats = ("jsonl", "csv", "tf-record", "tf-record-gzip", "file-list", "bigquery")
        if source.get("instancesFormat") not in formats:
            raise Refused(400, "INVALID_ARGUMENT", f"inputConfig.instancesFormat must be one of {formats}")
        uris = source.get("gcsSource", {}).get("uris", [])
        prefix = body.get("outputConfig", {}).get("gcsDestination", {}).get("outputUriPrefix", "")
        if not uris or not all(u.startswith("gs://") for u in uris) or not prefix.startswith("gs://"):
            raise Refused(
                400, "INVALID_ARGUMENT", "gcsSource.uris and gcsDestination.outputUriPrefix must be gs://"
            )
        if body.get("instanceConfig", {}).get("keyField") and source["instancesFormat"] == "file-list":
            raise Refused(
                400,
                "INVALID_ARGUMENT",
                "instanceConfig.keyField needs JSONL, CSV, BigQuery or TfRecord input",
            )
        if not body.get("dedicatedResources", {}).get("machineSpec", {}).get("machineType"):
            raise Refused(
                400, "INVALID_ARGUMENT", "a custom-trained model needs dedicatedResources.machineSpec"
            )
        name = f"{parent}/batchPredictionJobs/{3000 + len(self.batch_jobs)}"
        job = {**body, "name": name, "state": "JOB_STATE_PENDING", "createTime": _now()}
        self.batch_jobs[name] = job
        if self.batch_server:
            threading.Thread(target=self._run_batch_prediction, args=(name,), daemon=True).start()
        return dict(job), 200

    def _run_batch_prediction(self, name: str) -> None:
        """Run a JSONL batch job as Vertex documents it (aiplatform_v1 types/batch_prediction_job.py): each
        line is an instance; ``instanceConfig.keyField`` is taken out of the instance sent to the model and
        written as ``key`` in the output instead of ``instance``; ``batchSize`` instances (default 64,
        ManualBatchTuningParameters) go in one request ``{"instances": [...], "parameters": modelParameters}``
        to the model's predict route; the output is ``predictions_0001.jsonl`` (and ``errors_0001.jsonl``,
        each line with an ``error`` {code, message}) under ``<prefix>/prediction-<model>-<time>/``."""
        job = self.batch_jobs[name]
        job["state"] = "JOB_STATE_RUNNING"
        try:
            m = re.match(r"^.+/models/(\d+)(?:@([\w-]+))?$", job["model"])
            model_id = m.group(1)  # type: ignore[union-attr]
            model = self.models[model_id]
            spec = model["versions"][self._version(model_id, m.group(2))]["containerSpec"]  # type: ignore[union-attr,index]
            if job["inputConfig"]["instancesFormat"] != "jsonl":
                raise ValueError("this fake runs JSONL batch jobs only")
            key_field = job.get("instanceConfig", {}).get("keyField")
            client = _gcs_client()
            records = []
            for uri in job["inputConfig"]["gcsSource"]["uris"]:
                bucket, _, path = uri[len("gs://") :].partition("/")
                for line in client.bucket(bucket).blob(path).download_as_text().splitlines():
                    if line.strip():
                        instance = json.loads(line)
                        key = instance.pop(key_field) if key_field else None
                        records.append(({"key": key} if key_field else {"instance": instance}, instance))
            size = int(job.get("manualBatchTuningParameters", {}).get("batchSize") or 64)
            predictions, errors = [], []
            for start in range(0, len(records), size):
                chunk = records[start : start + size]
                request = {"instances": [instance for _, instance in chunk]}
                if "modelParameters" in job:
                    request["parameters"] = job["modelParameters"]
                status, answer = self._post_to_model(spec["predictRoute"], request)
                if status == 200:
                    predictions += [
                        {**out, "prediction": p}
                        for (out, _), p in zip(chunk, answer["predictions"], strict=True)
                    ]
                else:
                    message = answer.get("detail") or answer.get("error") or str(answer)
                    errors += [{**out, "error": {"code": status, "message": message}} for out, _ in chunk]
            prefix = job["outputConfig"]["gcsDestination"]["outputUriPrefix"].rstrip("/")
            directory = f"{prefix}/prediction-{model['displayName']}-{_now()}"
            bucket, _, path = directory[len("gs://") :].partition("/")
            for stem, lines in (("predictions", predictions), ("errors", errors)):
                if lines or stem == "predictions":
                    text = "".join(json.dumps(line) + "\n" for line in lines)
                    client.bucket(bucket).blob(f"{path}/{stem}_0001.jsonl").upload_from_string(text)
            job["outputInfo"] = {"gcsOutputDirectory": directory}
            job["completionStats"] = {
                "successfulCount": str(len(predictions)),
                "failedCount": str(len(errors)),
                "incompleteCount": "0",
            }
            if errors and not predictions:  # Vertex fails a job whose every instance failed
                first = errors[0]["error"]
                job["error"] = {
                    "code": 3,
                    "message": f"all {len(errors)} instances failed, e.g. {first['code']}: {first['message']}",
                }
            job["state"] = "JOB_STATE_SUCCEEDED" if predictions or not errors else "JOB_STATE_FAILED"
        except Exception as exc:  # the job fails with why, as Vertex reports it
            job["error"] = {"code": 13, "message": f"{type(exc).__name__}: {exc}"}
            job["state"] = "JOB_STATE_FAILED"

    def _post_to_model(self, route: str, request: dict) -> tuple[int, dict]:
        data = json.dumps(request).encode()
        self.batch_calls.append({"route": route, "body": request})
        http = urllib.request.Request(
            f"{self.batch_server}{route}", data, {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(http, timeout=120) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def add_image_dataset(
        self,
        name: str,
        rows: Sequence[DatasetRow],
        *,
        display_name: str = "flowers",
        update_time: str = "2026-11-01T09:00:00.123456Z",
        metadata_schema_uri: str = IMAGE_METADATA_SCHEMA,
        multi_label: bool = False,
    ) -> dict:
        """Register (or replace: an edited dataset) the managed dataset ``name`` (projects/P/locations/L/
        datasets/ID) of data items ``rows``; returns its resource as GET answers it (a valid v1.Dataset)."""
        from google.cloud import aiplatform_v1 as v1

        problem = "IMAGE_CLASSIFICATION_MULTI_LABEL" if multi_label else "IMAGE_CLASSIFICATION_SINGLE_LABEL"
        previous = self.datasets.get(name)
        revision = previous["revision"] + 1 if previous else 1
        labels = {
            label
            for _, row_labels, _ in rows
            for label in ([row_labels] if isinstance(row_labels, str) else row_labels)
        }
        resource = {
            "name": name,
            "displayName": display_name,
            "metadataSchemaUri": metadata_schema_uri,
            "metadata": {
                "dataItemSchemaUri": "gs://google-cloud-aiplatform/schema/dataset/dataitem/image_1.0.0.yaml"
            },
            "dataItemCount": str(len(rows)),  # int64 travels as a string in JSON
            "createTime": "2026-10-01T08:00:00Z",
            "updateTime": update_time,
            "etag": f"AMEw9yP{revision}",
            "savedQueries": [
                {
                    "name": f"{name}/savedQueries/{7000 + revision}",
                    "displayName": f"{display_name}-labels",
                    "problemType": problem,
                    "annotationSpecCount": len(labels),
                    "createTime": "2026-10-01T08:00:00Z",
                    "updateTime": update_time,
                    "etag": f"AMEw9yQ{revision}",
                }
            ],
        }
        validate_body(v1.Dataset, resource)  # the fake answers only fields Vertex has
        self.datasets[name] = {
            "resource": resource,
            "rows": list(rows),
            "multi_label": multi_label,
            "revision": revision,
        }
        return resource

    def _dataset_call(
        self, method: str, name: str, export: str | None, body: dict | None
    ) -> tuple[dict, int]:
        """DatasetService.GetDataset and ExportData (an Operation, done at its first poll)."""
        if name in self.denied_datasets:
            permission = "aiplatform.datasets." + ("export" if export else "get")
            message = f"Permission '{permission}' denied on resource '{name}' (or it may not exist)."
            return {"error": {"code": 403, "message": message, "status": "PERMISSION_DENIED"}}, 403
        dataset = self.datasets.get(name)
        if dataset is None:
            message = f"The Dataset does not exist: {name}"
            return {"error": {"code": 404, "message": message, "status": "NOT_FOUND"}}, 404
        if method == "GET" and not export:
            return dataset["resource"], 200
        if method != "POST" or not export:
            return {"error": {"code": 404, "message": f"unhandled {method} {name}"}}, 404
        if "/metadata/tabular" in dataset["resource"]["metadataSchemaUri"]:
            message = "Exporting tabular Dataset resources is not supported."  # export-metadata-annotations
            return {"error": {"code": 400, "message": message, "status": "FAILED_PRECONDITION"}}, 400
        prefix = (body or {})["exportConfig"]["gcsDestination"]["outputUriPrefix"]  # check() parsed it
        operation = f"{name}/operations/{8000 + len(self.operations)}"
        stamp = (
            datetime.datetime.now(datetime.timezone.utc)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z")
        )
        directory = f"{prefix.rstrip('/')}/export-data-{dataset['resource']['displayName']}-{stamp}"
        metadata = {
            "@type": "type.googleapis.com/google.cloud.aiplatform.v1.ExportDataOperationMetadata",
            "genericMetadata": {"createTime": stamp, "updateTime": stamp},
            "gcsOutputDirectory": directory,
        }
        done: dict = {"name": operation, "metadata": metadata, "done": True}
        try:
            if self.fail_exports:
                self.fail_exports -= 1
                raise PermissionError(
                    "the Vertex AI Service Agent does not have storage.objects.create access to the bucket"
                )
            files = self._write_export(dataset, directory)
        except Exception as exc:  # the bucket is missing or not writable: the operation fails, as on Vertex
            done["error"] = {"code": 7, "message": f"Failed to write the export to {directory}: {exc}"}
        else:
            self.exports.append({"dataset": name, "directory": directory, "files": files})
            response_type = "type.googleapis.com/google.cloud.aiplatform.v1.ExportDataResponse"
            done["response"] = {"@type": response_type, "exportedFiles": files}
        self.operations[operation] = done
        return {"name": operation, "metadata": metadata}, 200  # not done yet: the client polls

    def _write_export(self, dataset: dict, directory: str) -> list[str]:
        """Write the dataset's data items as JSONL import files + schema.yaml in the GCS stand-in."""
        client = _gcs_client()
        folder, title = _EXPORT_SCHEMAS[dataset["multi_label"]]
        bucket_name, _, path = directory[len("gs://") :].partition("/")
        bucket = client.bucket(bucket_name)
        set_name = dataset["resource"]["savedQueries"][0]["name"].rsplit("/", 1)[1]
        lines = [_export_line(row, set_name) for row in dataset["rows"]]
        per_file = self.export_rows_per_file
        count = max(1, math.ceil(len(lines) / per_file))
        files = []
        for index in range(count):
            name = f"{path}/{folder}/data-{index + 1:05d}-of-{count:05d}.jsonl"
            chunk = lines[index * per_file : (index + 1) * per_file]
            bucket.blob(name).upload_from_string("".join(f"{line}\n" for line in chunk))
            files.append(f"gs://{bucket_name}/{name}")
        schema = f"title: {title}\ndescription: Import and export format for images.\ntype: object\n"
        bucket.blob(f"{path}/{folder}/schema.yaml").upload_from_string(schema)
        return files

    def _job_json(self, name: str) -> dict:
        job = self.jobs[name]
        reply = {
            "name": name,
            "displayName": job["body"].get("displayName", job["body"].get("display_name", "")),
            "state": job["state"],
        }
        if job["error"]:
            reply["error"] = job["error"]
        return reply

    def _run_job(self, name: str) -> None:
        job = self.jobs[name]
        job["state"] = "JOB_STATE_RUNNING"
        if self.job_runner is None:
            ok, message = True, ""
        else:
            try:
                ok, message = self.job_runner(job["body"], job["hosts"])
            except Exception as exc:  # the emulation itself broke: the job fails with why
                ok, message = False, f"job runner: {exc!r}"
        if not ok:
            job["error"] = {"code": 13, "message": message}  # INTERNAL: the launcher raises RuntimeError
        job["state"] = "JOB_STATE_SUCCEEDED" if ok else "JOB_STATE_FAILED"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
