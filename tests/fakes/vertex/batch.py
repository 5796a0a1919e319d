"""Batch prediction jobs in the Vertex fake: CreateBatchPredictionJob with the v1 docs' rules, and a JSONL
job run against ``batch_server`` (a model server's base URL), its output written into the GCS stand-in.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request

from tests.fakes.vertex.rules import Refused, _gcs_client, _now


class BatchPredictionMixin:
    """VertexRecorder's batch prediction jobs (its state lives there)."""

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
