"""Managed image datasets in the Vertex fake: ``add_image_dataset`` registers one; GetDataset and ExportData
(a long-running operation) answer as Vertex does, the export written into the GCS stand-in as the JSONL
import files (single- or multi-label ioformat) and a schema.yaml Vertex documents.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Sequence

from tests.fakes.vertex.rules import _gcs_client, validate_body

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


class DatasetsMixin:
    """VertexRecorder's managed datasets and their exports (its state lives there)."""

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
