"""A Vertex AI managed image dataset (``projects/P/locations/L/datasets/ID``) as a SOURCE.

The dataset is exported through the aiplatform v1 DatasetService (``GetDataset``, then ``ExportData``
and its long-running operation, as ``aiplatform.ImageDataset(name).export_data(dir)`` does) to JSONL
import files, which ``import_files.import_files_source`` then reads: the same rows, splits and bad-row
accounting as import files given directly.

- Where: Vertex exports to gs:// only, so the export goes under ``staging`` (the dataset's own gs://
  output; in the pipeline its content-addressed directory): ``STAGING/_vertex_export/<ID>/<VERSION>/``.
  VERSION is the dataset's ``update_time`` plus a digest of its ``update_time``, ``etag``,
  ``data_item_count`` and its annotation sets' (saved queries') ``update_time``/``etag``/label count, all
  from one GET. Every step of one run (plan, write, finalize each open the source again) reuses one export;
  a changed dataset gets a new one. The export's JSONL files are copied to
  ``VERSION/import-files-<OPERATION>/part-NNNNN.jsonl`` (Vertex names its folder after the dataset's display
  name, which may hold the ``,`` or ``*`` an import-file SOURCE gives a meaning), then ``export.json``,
  listing them, is written last: an export is reused only when that marker is there and names files that
  exist. Older versions' exports are left in place (an earlier run's dataset directory may still cite them).
- What: only image datasets (``metadataSchemaUri`` ``.../metadata/image_1.0.0.yaml``); another schema is
  refused by name. Of the export's annotation sets, those whose ``schema.yaml`` title is
  ``ImageClassificationSingleLabel`` are read (a folder without a schema.yaml is read too; a multi-label
  row in it is rejected and counted by ``import_files``); a dataset with only multi-label or bounding-box sets is refused.
- Fingerprint (``managed_dataset_objects``): one ObjectInfo for the dataset resource itself (uri = its name,
  size = its data item count, version = VERSION above), from the GET alone, no export. An image replaced
  in GCS behind an unchanged dataset (same URI, new bytes) is therefore not seen: Vertex does not version
  the images it lists, and listing them would need the export. When images change in place, give the
  export's import files as the SOURCE instead: their fingerprint follows every listed image's generation.
- Client: ``aiplatform_v1.DatasetServiceClient`` over REST (also what keeps gRPC's threads out of the shard
  writers this process forks later), at ``L-aiplatform.googleapis.com`` with application default
  credentials as aiplatform uses them; ``TPUSTREAM_VERTEX_ENDPOINT`` overrides the endpoint, and an
  ``http://`` one (tests' loopback endpoint) is used without credentials, as ``tpustream.vertex.model_registry`` does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tpustream.sources.types import Source, SourceError
from tpustream.storage import io as storage

__all__ = [
    "managed_dataset_source",
    "managed_dataset_objects",
    "dataset_version",
    "DatasetVersion",
    "IMAGE_METADATA_SCHEMA",
    "EXPORT_DIR",
]

log = logging.getLogger(__name__)

# aiplatform's schema.dataset.metadata.image: the metadataSchemaUri of every managed image dataset
IMAGE_METADATA_SCHEMA = "gs://google-cloud-aiplatform/schema/dataset/metadata/image_1.0.0.yaml"
# The title of Vertex's ioformat image_classification_single_label_io_format_1.0.0.yaml, which the export
# writes as schema.yaml next to the JSONL files of a single-label annotation set
SINGLE_LABEL_TITLE = "ImageClassificationSingleLabel"
EXPORT_DIR = "_vertex_export"
EXPORT_MARKER = "export.json"
EXPORT_FORMAT = "tpustream.vertex_export/v1"
EXPORT_TIMEOUT_S = 3600.0  # an export of a million items takes minutes, not hours
API_TIMEOUT_S = 60.0
ENDPOINT_ENV = "TPUSTREAM_VERTEX_ENDPOINT"
_NAME = re.compile(r"^projects/([^/]+)/locations/([^/]+)/datasets/([^/]+)$")
_TITLE = re.compile(r"^title:\s*['\"]?([\w.-]+)", re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class DatasetVersion:
    """What one GET says about a managed dataset: enough to name its export and fingerprint it."""

    name: str
    display_name: str
    data_item_count: int
    update_time: str  # RFC 3339
    version: str  # "<update time, compact>-<digest>": changes whenever the dataset does


def _parts(spec: str) -> tuple[str, str, str]:
    """(project, location, dataset id) of ``projects/P/locations/L/datasets/ID``."""
    match = _NAME.match(spec)
    if match is None:
        raise SourceError(f"source {spec!r} is not a dataset name: use projects/P/locations/L/datasets/ID")
    project, location, dataset_id = match.groups()
    return project, location, dataset_id


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _api_message(exc: Any) -> str:
    """What Vertex said, on one line: without the "GET https://...?$alt=json:" the REST client prefixes."""
    return re.sub(r"^[A-Z]+ https?://\S+: ", "", _one_line(exc.message))


def _client(location: str) -> Any:
    """A DatasetService client for ``location`` (REST; see the module docstring for why and where)."""
    from google.cloud import aiplatform_v1

    endpoint = os.environ.get(ENDPOINT_ENV) or f"{location}-aiplatform.googleapis.com"
    credentials = None  # the default: found in the environment
    if endpoint.startswith("http://"):  # a loopback endpoint (tests): no credentials to find or send
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()
    return aiplatform_v1.DatasetServiceClient(
        transport="rest", client_options={"api_endpoint": endpoint}, credentials=credentials
    )


@contextlib.contextmanager
def _api_errors(spec: str, doing: str) -> Iterator[None]:
    """Vertex AI and credential failures -> one-line SourceErrors that say what to do."""
    import google.auth.exceptions
    from google.api_core import exceptions as api

    project = _parts(spec)[0]
    try:
        yield
    except api.NotFound as exc:
        raise SourceError(
            f"source {spec!r}: no such Vertex AI dataset ({_api_message(exc)}): check the project, the "
            "region (locations/L) and the dataset ID on the console's Vertex AI > Datasets page"
        ) from None
    except (api.PermissionDenied, api.Forbidden) as exc:
        raise SourceError(
            f"source {spec!r}: permission denied while {doing} ({_api_message(exc)}): grant the caller "
            f"roles/aiplatform.user (aiplatform.datasets.get and .export) on project {project}"
        ) from None
    except (api.Unauthenticated, api.Unauthorized) as exc:
        raise SourceError(
            f"source {spec!r}: not authenticated to Vertex AI ({_api_message(exc)}): run "
            "`gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS"
        ) from None
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise SourceError(
            f"source {spec!r}: no Google credentials to call Vertex AI ({_one_line(str(exc))}): run "
            "`gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS"
        ) from None
    except api.GoogleAPICallError as exc:
        raise SourceError(
            f"source {spec!r}: Vertex AI refused {doing}: {exc.code} {_api_message(exc)}"
        ) from None
    except (api.RetryError, TimeoutError, google.auth.exceptions.TransportError, OSError) as exc:
        endpoint = os.environ.get(ENDPOINT_ENV) or f"{_parts(spec)[1]}-aiplatform.googleapis.com"
        raise SourceError(
            f"source {spec!r}: {doing} at {endpoint} did not complete ({_one_line(str(exc))}): check the "
            "network and try again"
        ) from None


def _version(dataset: Any) -> str:
    """A name for this state of the dataset: its update time, made path-safe, and a digest of every
    field that changes when its items or labels do (one saved query per annotation set)."""
    update_time = dataset.update_time.rfc3339() if dataset.update_time else ""
    state = {
        "update_time": update_time,
        "etag": dataset.etag,
        "data_item_count": dataset.data_item_count,
        "annotation_sets": sorted(
            [
                query.name,
                query.update_time.rfc3339() if query.update_time else "",
                query.etag,
                query.annotation_spec_count,
            ]
            for query in dataset.saved_queries
        ),
    }
    digest = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:12]
    return f"{re.sub(r'[^0-9A-Za-z.]', '', update_time) or 'unknown'}-{digest}"


def dataset_version(spec: str) -> DatasetVersion:
    """GET the dataset (no export): refuse a non-image one by its schema; return its version.

    Raises:
        SourceError: no such dataset, no permission, no credentials, or not an image dataset.
    """
    _, location, _ = _parts(spec)
    with _api_errors(spec, "reading the dataset"):
        dataset = _client(location).get_dataset(name=spec, timeout=API_TIMEOUT_S)
    if dataset.metadata_schema_uri != IMAGE_METADATA_SCHEMA:
        raise SourceError(
            f"source {spec!r} is not an image dataset: its metadataSchemaUri is "
            f"{dataset.metadata_schema_uri!r}; tpustream reads image classification datasets "
            f"({IMAGE_METADATA_SCHEMA})"
        )
    return DatasetVersion(
        name=spec,
        display_name=dataset.display_name,
        data_item_count=int(dataset.data_item_count),
        update_time=dataset.update_time.rfc3339() if dataset.update_time else "",
        version=_version(dataset),
    )


def managed_dataset_objects(spec: str) -> list[storage.ObjectInfo]:
    """What the data fingerprint hashes: the dataset resource at its current version (GET only)."""
    info = dataset_version(spec)
    return [storage.ObjectInfo(info.name, info.data_item_count, info.version)]


# --------------------------------------------------------------------------- the export


def _check_staging(spec: str, staging: str | None) -> str:
    """The gs:// directory the export goes under; refuses None and local paths (Vertex writes gs:// only)."""
    if not staging or not storage.is_gcs(staging):
        where = f"the output {staging!r} is local" if staging else "no output directory was given"
        raise SourceError(
            f"source {spec!r}: a Vertex AI dataset is exported to gs:// before it is read and {where}: "
            "give a gs:// --output (the export goes under OUTPUT/_vertex_export/)"
        )
    try:
        staging = storage.check_uri(staging).rstrip("/")
        storage.ensure_prefix_writable(staging)
    except storage.StorageError as exc:
        raise SourceError(f"source {spec!r}: cannot export the dataset under {staging}: {exc}") from exc
    return staging


def _reusable_export(marker: str, info: DatasetVersion) -> list[str] | None:
    """The import files of a finished export of this dataset version, or None (none, or not usable)."""
    try:
        record = json.loads(storage.read_text(marker))
    except storage.NotFound:
        return None
    except (ValueError, storage.StorageError) as exc:
        log.warning("ignoring %s (%s): exporting the dataset again", marker, exc)
        return None
    if not isinstance(record, dict):
        record = {}
    files = record.get("import_files")
    if (
        record.get("format") != EXPORT_FORMAT
        or record.get("dataset") != info.name
        or record.get("version") != info.version
        or not isinstance(files, list)
        or not files
    ):
        log.warning("ignoring %s: not an export of %s at version %s", marker, info.name, info.version)
        return None
    missing = [uri for uri in files if not storage.exists(uri)]
    if missing:
        log.warning("%s lists %s, which is gone: exporting the dataset again", marker, missing[0])
        return None
    return [str(uri) for uri in files]


def _schema_title(folder: str) -> str | None:
    """The ``title:`` of the schema.yaml Vertex writes next to one annotation set's JSONL files."""
    try:
        match = _TITLE.search(storage.read_text(f"{folder}/schema.yaml"))
    except storage.NotFound:
        return None
    return match.group(1) if match else None


def _single_label_files(spec: str, exported: list[str]) -> list[str]:
    """The exported JSONL files of single-label classification annotation sets; refuses an export that has
    none (a multi-label or bounding-box dataset, or one with no labelled image)."""
    jsonl = [uri for uri in exported if uri.lower().endswith(".jsonl")]
    titles = {folder: _schema_title(folder) for folder in sorted({uri.rsplit("/", 1)[0] for uri in jsonl})}
    kept = [uri for uri in jsonl if titles[uri.rsplit("/", 1)[0]] in (None, SINGLE_LABEL_TITLE)]
    others = sorted({title for title in titles.values() if title not in (None, SINGLE_LABEL_TITLE)})
    if not kept and others:
        raise SourceError(
            f"source {spec!r}: its annotations are {', '.join(others)}, not {SINGLE_LABEL_TITLE}: tpustream "
            "trains single-label image classifiers; label each image with one class in a single-label set"
        )
    if not kept:
        raise SourceError(
            f"source {spec!r}: the export wrote no JSONL import file ({len(exported)} file(s)): import "
            "labelled images into the dataset first"
        )
    if others:
        log.info(
            "%s: reading its %s annotations, leaving out %s", spec, SINGLE_LABEL_TITLE, ", ".join(others)
        )
    return kept


def _export(spec: str, info: DatasetVersion, directory: str) -> list[str]:
    """Export the dataset under ``directory``, copy its single-label JSONL files beside it, write the
    marker last; returns the copies (the import files to read)."""
    from google.api_core import exceptions as api
    from google.cloud import aiplatform_v1

    _, location, _ = _parts(spec)
    config = aiplatform_v1.ExportDataConfig(
        gcs_destination=aiplatform_v1.GcsDestination(output_uri_prefix=f"{directory}/")
    )
    log.info("exporting Vertex AI dataset %s (%d items) to %s", spec, info.data_item_count, directory)
    with _api_errors(spec, "starting the export"):
        operation = _client(location).export_data(name=spec, export_config=config, timeout=API_TIMEOUT_S)
    with _api_errors(spec, f"waiting for the export to {directory}"):
        try:
            response = operation.result(timeout=EXPORT_TIMEOUT_S)
        except api.GoogleAPICallError as exc:
            if not operation.operation.HasField("error"):  # the polling failed, not the export
                raise
            raise SourceError(
                f"source {spec!r}: the export to {directory} failed ({exc.code} {_api_message(exc)}): "
                "the Vertex AI Service Agent (service-PROJECT_NUMBER@gcp-sa-aiplatform.iam.gserviceaccount"
                ".com) needs write access to the --output bucket; fix that and run again"
            ) from None
    selected = _single_label_files(spec, list(response.exported_files))
    run = operation.operation.name.rsplit("/", 1)[-1]
    import_files = [f"{directory}/import-files-{run}/part-{i:05d}.jsonl" for i in range(len(selected))]
    for exported, copy in zip(selected, import_files, strict=True):
        storage.copy(exported, copy)
    record = {
        "format": EXPORT_FORMAT,
        "dataset": spec,
        "display_name": info.display_name,
        "version": info.version,
        "update_time": info.update_time,
        "operation": operation.operation.name,
        "exported_files": list(response.exported_files),
        "import_files": import_files,
    }
    storage.write_bytes(
        f"{directory}/{EXPORT_MARKER}", json.dumps(record, indent=1).encode(), content_type="application/json"
    )
    return import_files


def managed_dataset_source(spec: str, *, staging: str | None = None) -> Source:
    """The managed-dataset SOURCE form: export (or reuse the export of this version) and read it.

    Args:
        spec: ``projects/P/locations/L/datasets/ID``.
        staging: the gs:// directory the export goes under (``STAGING/_vertex_export/ID/VERSION/``).

    Raises:
        SourceError: no gs:// staging, no such dataset, no permission, not a single-label image dataset,
            or the export failed; each says what to do.
    """
    spec = spec.strip()
    _, _, dataset_id = _parts(spec)
    staging = _check_staging(spec, staging)
    info = dataset_version(spec)
    directory = f"{staging}/{EXPORT_DIR}/{dataset_id}/{info.version}"
    import_files = _reusable_export(f"{directory}/{EXPORT_MARKER}", info)
    if import_files is None:
        import_files = _export(spec, info, directory)
    else:
        log.info("reusing the export of %s at %s", spec, directory)

    from tpustream.sources.import_files import import_files_source

    try:
        source = import_files_source(",".join(import_files))
    except SourceError as exc:
        raise SourceError(f"Vertex AI dataset {spec} (exported to {directory}): {exc}") from exc
    counts = source.description.split(": ", 1)[-1]  # "N images, K classes (...)", after the file names
    description = (
        f"Vertex AI managed dataset {spec} ({info.display_name!r}, updated {info.update_time or '?'}, "
        f"exported to {directory}): {counts}"
    )
    return dataclasses.replace(source, spec=spec, description=description)
