"""A recording Vertex AI REST endpoint on loopback for the real google-cloud-aiplatform client.

It answers the calls tpustream and GCPC's launcher make (pipelineJobs, schedules, customJobs, the Model
Registry's list/upload/get/mergeVersionAliases, managed datasets' get and export with the export's
long-running operation), records every request (method, path, query, JSON body),
and validates every request body against the aiplatform v1 protos the way Vertex parses it
(``json_format.ParseDict(..., ignore_unknown_fields=False)``): an unknown or mistyped field gets the
400 INVALID_ARGUMENT Vertex would answer, and lands in ``rejected`` for the test to assert on.
CustomJobs are also checked against the TPU rules Vertex documents (one worker pool, one replica per TPU
slice, a topology for v5e/v6e) and then handed to ``job_runner``, which runs their hosts (see
tests/vertex_emulation.py). A managed image dataset registered with ``add_image_dataset`` is exported as
Vertex documents ExportDataConfig.gcs_destination: JSONL import files (the single- or multi-label
ioformat) and a schema.yaml under ``<outputUriPrefix>export-data-<display name>-<ISO time>/<schema dir>/``,
written into the GCS stand-in (STORAGE_EMULATOR_HOST); the sub-folder's name is ours (Vertex names it
after the annotations' schema title), so code under test must not depend on it.
Used because Vertex AI cannot be reached from here.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


def _request_message(method: str, rest: str) -> type | None:
    """The aiplatform v1 message a request body must parse as (REST mapping of the v1 API)."""
    from google.cloud import aiplatform_v1 as v1

    if method != "POST":
        return None
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
                self._reply(*recorder.route(self.command, unquote(url.path), body, request["query"]))

            do_GET = do_POST = do_PATCH = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def check(self, method: str, path: str, body: dict | None) -> str | None:
        """Why Vertex would refuse this request (400), or None."""
        m = re.match(r"^/v1/projects/[^/]+/locations/[^/]+(/.*)$", path)
        message = _request_message(method, m.group(1)) if m else None
        if message is None or body is None:
            return None
        try:
            validate_body(message, body)
            if message.__name__ == "CustomJob":
                tpu_job_hosts(body)
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
        }

    def route(
        self, method: str, path: str, body: dict | None, query: dict[str, list[str]] | None = None
    ) -> tuple[dict, int]:
        m_operation = re.match(r"^/(?:v1|ui)/(projects/[^/]+/locations/[^/]+/.+/operations/[^/]+)$", path)
        if method == "GET" and m_operation and m_operation.group(1) in self.operations:
            return self.operations[m_operation.group(1)], 200
        m = re.match(r"^/v1/(projects/[^/]+/locations/[^/]+)(/.*)$", path)
        if not m:
            return {"error": {"code": 404, "message": f"unknown path {path}"}}, 404
        parent, rest = m.groups()
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
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage  # type: ignore[attr-defined]

        client = storage.Client(  # type: ignore[attr-defined]
            project="test",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": os.environ["STORAGE_EMULATOR_HOST"]},
        )
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
