"""Vertex AI batch prediction with the champion's uploaded model: its serving container answers the requests.

Input, by default: a JSONL file of one image per line, ``{"key": "<where it came from>", "b64": "<base64 image
bytes>"}`` (``write_instances``), submitted with ``instanceConfig.keyField = "key"``. The v1 docs
(aiplatform_v1 types/batch_prediction_job.py, ``InstanceConfig``) say what Vertex then does: for ``jsonl``
the instance is each line, the key field is taken out of the instance sent to the model, and the output has
a ``key`` field instead of the instance. So the model server gets exactly its online request,
``{"instances": [{"b64": ...}, ...]}`` (tpustream/serve/server.py; "Get batch predictions from a custom trained
model": one instance per JSONL line), and each output line names its image without echoing its base64.
The other way, ``instances_format="file-list"`` (a text file of gs:// image URIs; Vertex sends each file as
``{"b64": <its base64>}``, ``InstanceConfig.instance_type`` docs), needs no copy of the images, but a key
field is not allowed for it, so nothing documented ties an output line to its file: it is accepted as given,
not written here. A JSONL file in AutoML's image classification format (``{"content": "gs://...", "mimeType":
"image/jpeg"}`` per line, no key) is accepted as given too: Vertex passes its lines unchanged and the model
server reads each object (``tpustream.serve.request.read_content_object``); without a key on every line no key
field is set, and each output line carries its ``instance``.
``batch_size`` instances go in one request (``ManualBatchTuningParameters.batch_size``, Vertex's default 64),
and any ``batch_size`` consecutive instances may share one. So it is chosen to fit the serving image's
budgets (``fitting_batch_size``) for the largest instance of the input, in encoded bytes, base64 body and
pixels from its header (64 photos of 2 MB or 12 MP each are over them: the server would refuse each whole
request with a 400, and its 64 instances would fail together); an image named by a gs:// URI (a file list's
line, an AutoML line's ``content``) is sized from its object's metadata, no byte of it read, its pixels counted
at the most one image may have (``TPUSTREAM_MAX_PIXELS``). An instance that fits no request at all, or names
no object, is left out (``write_instances``) or named before the job is submitted (``measure_instances``). ``top_k`` travels as
``model_parameters``, which Vertex sends as each request's ``parameters``.
Output: ``<output_prefix>/prediction-<model>-<time>/predictions_0001.jsonl`` ..., and ``errors_*.jsonl`` for
failed instances (``OutputConfig.gcs_destination`` docs); ``iter_results`` reads them.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from tpustream.errors import ConfigError
from tpustream.serve.automl import AUTOML_KEY as AUTOML_CONTENT
from tpustream.storage import io as storage
from tpustream.storage.backend import ObjectInfo
from tpustream.storage.gcs import split_gcs
from tpustream.vertex import model_registry as vertex

__all__ = [
    "INSTANCE_KEY",
    "BatchJob",
    "JobCompletion",
    "WrittenInstances",
    "InstanceSizes",
    "fitting_batch_size",
    "measure_instances",
    "write_instances",
    "submit_batch_prediction",
    "predict_on_vertex",
    "iter_results",
]

log = logging.getLogger(__name__)

INSTANCE_KEY = "key"  # the JSONL field that names an image; Vertex keeps it out of the model's request
MAX_BATCH = 64  # tpustream.serve.settings.Limits.max_instances, the serving image's default
_ENVELOPE = 4096  # bytes of a request body besides its instances' base64: brackets, keys, parameters
InstancesFormat = Literal["jsonl", "file-list"]
_FORMATS = get_args(InstancesFormat)
_DONE = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"}


@dataclass
class InstanceSizes:
    """The largest instance of a batch input (encoded bytes, its share of a request body, pixels from its
    header), the ones that no request of the serving image can hold (``(name, why)``: over a budget, or an
    object that does not exist), how many images were sized from their objects' metadata alone (their pixels
    unknown) and how many JSONL lines lack the key field."""

    count: int = 0
    total_bytes: int = 0
    max_bytes: int = 0
    max_instance_body: int = 0  # bytes of the largest instance in a request's JSON body
    max_pixels: int = 0
    unknown_pixels: int = 0  # images sized from Cloud Storage metadata: no header read
    unkeyed: int = 0  # JSONL lines without INSTANCE_KEY: the job then sets no key field
    too_large: list[tuple[str, str]] = field(default_factory=list)
    limits: Any = field(default_factory=lambda: _limits(), repr=False)  # the serving budgets, read once

    def add(self, name: str, data: bytes) -> bool:
        """Count ``name``'s image ``data``; False (and recorded in ``too_large``) when no request fits it."""
        from tpustream.image.codec import image_dimensions, sniff_format

        limits = self.limits
        if len(data) > limits.max_image_bytes:
            self.too_large.append(
                (name, f"{len(data)} bytes, over TPUSTREAM_MAX_IMAGE_BYTES {limits.max_image_bytes}")
            )
            return False
        pixels = 0
        ext = sniff_format(data)
        if ext is not None:
            try:
                width, height = image_dimensions(data, ext, name)
                pixels = width * height
            except ValueError:
                pixels = 0  # undecodable: the server answers that instance's error; it costs no pixels
        if pixels > limits.max_pixels:
            self.too_large.append((name, f"{pixels} px, over TPUSTREAM_MAX_PIXELS {limits.max_pixels}"))
            return False
        self._count(len(data), _inline_body(len(data)))
        self.max_pixels = max(self.max_pixels, pixels)
        return True

    def add_object(self, name: str, info: ObjectInfo | None, instance_body: int | None = None) -> bool:
        """Count the image of the Cloud Storage object ``info`` (None: it does not exist) from its metadata,
        no byte of it read: its size, and its pixels unknown. ``instance_body``: what its instance takes in a
        request body (an AutoML ``{"content": "gs://..."}`` line); None when Vertex inlines the file as
        base64 (``file-list``). False (and recorded in ``too_large``) when no request can hold it."""
        limits = self.limits
        if info is None:
            self.too_large.append((name, "no such Cloud Storage object"))
            return False
        if info.size > limits.max_image_bytes:
            self.too_large.append(
                (name, f"{info.size} bytes, over TPUSTREAM_MAX_IMAGE_BYTES {limits.max_image_bytes}")
            )
            return False
        self._count(info.size, _inline_body(info.size) if instance_body is None else instance_body)
        self.unknown_pixels += 1
        return True

    def _count(self, num_bytes: int, instance_body: int) -> None:
        self.count += 1
        self.total_bytes += num_bytes
        self.max_bytes = max(self.max_bytes, num_bytes)
        self.max_instance_body = max(self.max_instance_body, instance_body)


def _inline_body(num_bytes: int) -> int:
    """What an image of ``num_bytes`` takes in a request body as ``{"b64": ...}``: base64 is 4/3 of it."""
    return 4 * -(-max(num_bytes, 1) // 3) + len('{"b64": ""}, ')


def _limits() -> Any:
    from tpustream.serve.settings import Limits

    return Limits.from_env()


def _max_body_bytes() -> int:
    from tpustream.serve.settings import ServerConfig

    return int(ServerConfig.from_env().max_body_bytes)


def fitting_batch_size(sizes: InstanceSizes, *, unknown_pixels: bool = True) -> tuple[int, str]:
    """The most instances per request (up to 64) whose worst case, ``sizes``' largest instance that many
    times, fits every budget of the serving image (its defaults, or this environment's ``TPUSTREAM_*``
    settings): images per request, encoded bytes per request (read from Cloud Storage or not), the HTTP body
    (base64 is 4/3 of the bytes; a gs:// reference its length) and pixels per request. An image sized from
    its object's metadata may have up to ``TPUSTREAM_MAX_PIXELS`` (the server refuses more as that
    instance's error), counted so unless ``unknown_pixels`` is False. Returns it and which budget bound it."""
    limits = _limits()
    pixels = sizes.max_pixels
    if unknown_pixels and sizes.unknown_pixels:
        pixels = max(pixels, limits.max_pixels)
    bounds = {
        "TPUSTREAM_MAX_INSTANCES": limits.max_instances,
        "TPUSTREAM_MAX_REQUEST_BYTES": limits.max_request_bytes // max(sizes.max_bytes, 1),
        "TPUSTREAM_MAX_BODY_BYTES": (_max_body_bytes() - _ENVELOPE) // max(sizes.max_instance_body, 1),
        "TPUSTREAM_MAX_REQUEST_PIXELS": limits.max_request_pixels // max(pixels, 1),
    }
    budget = min(bounds, key=lambda name: bounds[name])
    return max(1, min(MAX_BATCH, bounds[budget])), budget


def measure_instances(input_uris: list[str], instances_format: InstancesFormat = "jsonl") -> InstanceSizes:
    """Measure a batch input's images as the job will send them, reading the input files but no image they
    name. ``jsonl``: each line an instance, ``{"b64": ...}`` or AutoML's ``{"content": ...}`` with the image
    bytes (measured from them) or a ``gs://`` URI (the model server reads it: sized from the object's
    metadata); ``file-list``: each line the gs:// URI of an image that Vertex sends as ``{"b64": ...}``
    (sized from its metadata). Objects are looked up 16 at a time."""
    sizes = InstanceSizes()
    objects: list[tuple[str, str, int | None]] = []  # (name, gs:// URI, its instance's body bytes or None)
    for uri in input_uris:
        for number, line in enumerate(storage.read_bytes(uri).splitlines(), 1):
            if not line.strip():
                continue
            if instances_format == "file-list":
                listed = line.decode("utf-8", "replace").strip()
                objects.append((listed, listed, None))
                continue
            try:
                instance = json.loads(line)
            except ValueError:
                instance = None
            if not isinstance(instance, dict):  # the server answers its error; it costs nothing here
                sizes.count += 1
                continue
            sizes.unkeyed += INSTANCE_KEY not in instance
            content = instance.get(AUTOML_CONTENT)
            if isinstance(content, str) and content.startswith(storage.GCS_SCHEME):
                objects.append((str(instance.get(INSTANCE_KEY) or content), content, len(line) + 2))
                continue
            name = str(instance.get(INSTANCE_KEY) or f"{uri}:{number}")
            data = _base64_bytes(instance.get("b64", content))
            if data is None:  # not an image instance: the server answers its error; it costs nothing here
                sizes.count += 1
                continue
            sizes.add(name, data)
    with ThreadPoolExecutor(max_workers=16, thread_name_prefix="tpustream-stat") as pool:
        infos = pool.map(_object_info, [object_uri for _, object_uri, _ in objects])
        for (name, _, instance_body), info in zip(objects, infos, strict=True):
            sizes.add_object(name, info, instance_body)
    return sizes


def _base64_bytes(encoded: Any) -> bytes | None:
    if not isinstance(encoded, str):
        return None
    try:
        return base64.b64decode(encoded, validate=True)
    except ValueError:
        return None


def _object_info(uri: str) -> ObjectInfo | None:
    """A listed image's object metadata (its size), None when no such gs:// object exists."""
    if not storage.is_gcs(uri) or not split_gcs(uri)[1]:
        return None
    try:
        return storage.stat(uri)
    except storage.NotFound:
        return None


@dataclass(frozen=True, kw_only=True)
class WrittenInstances:
    """A JSONL instances file ``write_instances`` wrote: its ``uri``, how many ``instances``, the images'
    total bytes, the images ``too_large`` for any request (left out) and the ``sizes`` measured on the way
    (``InstanceSizes``, for ``fitting_batch_size``)."""

    uri: str
    instances: int
    num_bytes: int
    too_large: list[str]
    sizes: InstanceSizes


@dataclass(frozen=True, kw_only=True)
class JobCompletion:
    """A finished job's instance counts, as Vertex counts them (``completion_stats``)."""

    successful: int
    failed: int
    incomplete: int


@dataclass(frozen=True, kw_only=True)
class BatchJob:
    """A submitted BatchPredictionJob: its resource ``name``, ``state`` and ``model`` version (ID@VERSION);
    once it wrote output, the ``output_directory`` and its ``completion``; for a succeeded job
    ``instance_errors``: the instances Vertex counted successful whose prediction is the server's error;
    and the ``instances`` file ``predict_on_vertex`` wrote for it (None: the input was given as JSONL)."""

    name: str
    state: str
    model: str
    output_directory: str | None = None
    completion: JobCompletion | None = None
    instance_errors: int | None = None
    instances: WrittenInstances | None = None


def write_instances(inputs: list[str], destination: str, *, limit: int | None = None) -> WrittenInstances:
    """Write the images that ``inputs`` name (as ``tpustream predict`` reads them: images, directories or
    gs:// prefixes, shards, datasets' val splits) to ``destination`` as JSONL instances. An image that no
    request of the serving image can hold (over its byte or pixel limit) is left out and logged."""
    from tpustream.serve.predict.inputs import iter_items

    if not destination.endswith(".jsonl"):
        raise ConfigError(
            f"{destination}: the instances file must end in .jsonl (Vertex reads it as JSON lines)"
        )
    sizes = InstanceSizes()
    with storage.open_write(destination, content_type="application/jsonl") as out:
        for item in iter_items(inputs):
            data = item.data if item.data is not None else storage.read_bytes(item.name)
            if not sizes.add(item.name, data):
                continue
            line = {INSTANCE_KEY: item.name, "b64": base64.b64encode(data).decode()}
            out.write(json.dumps(line).encode() + b"\n")
            if limit is not None and sizes.count >= limit:
                break
    if sizes.too_large:
        log.warning(
            "left out %d images no request to the serving image can hold: %s",
            len(sizes.too_large),
            "; ".join(f"{name} ({why})" for name, why in sizes.too_large[:5]),
        )
    if not sizes.count:
        raise ConfigError(f"{', '.join(inputs)}: no images to predict")
    log.info(
        "wrote %d instances (%.1f MB of images) to %s", sizes.count, sizes.total_bytes / 1e6, destination
    )
    return WrittenInstances(
        uri=destination,
        instances=sizes.count,
        num_bytes=sizes.total_bytes,
        too_large=[name for name, _ in sizes.too_large],
        sizes=sizes,
    )


def submit_batch_prediction(
    model: str,
    input_uris: list[str],
    output_prefix: str,
    *,
    machine_type: str = "n1-standard-4",
    instances_format: InstancesFormat = "jsonl",
    replicas: int = 1,
    batch_size: int | None = None,
    sizes: InstanceSizes | None = None,
    top_k: int | None = None,
    registry: str | None = None,
    display_name: str | None = None,
    project: str | None = None,
    region: str | None = None,
    wait: bool = False,
    poll_seconds: float = 30.0,
) -> BatchJob:
    """Submit a Vertex AI BatchPredictionJob on a Model Registry version (by default the ``champion``).

    Args:
        model: a model resource name (optionally ``@VERSION``/``@ALIAS``) or display name, as for
            ``tpustream.release.deploy.deploy``; with ``registry``, the version uploaded from its champion.
        input_uris: gs:// JSONL files (``write_instances``), or with ``instances_format="file-list"``
            text files of gs:// image URIs.
        output_prefix: gs:// prefix under which Vertex writes ``prediction-<model>-<time>/``.
        machine_type, replicas: the machines the job runs on. Batch prediction does not autoscale: Vertex
            starts ``starting_replica_count`` machines and ignores ``max_replica_count`` ("Get batch
            predictions from a custom trained model", Limitations), so both are ``replicas``.
        batch_size: instances per request to the model server (1-64); default, and at most, what
            ``fitting_batch_size`` finds for the input's largest instance.
        sizes: the input's ``InstanceSizes`` when known (``write_instances``); else jsonl inputs are read to
            measure them.
        top_k: classes per prediction (default: the server's, 5).
        wait: poll every ``poll_seconds`` until the job ends; a failed job raises ``VertexError``.

    Returns:
        The job (``BatchJob``); once done, with its output directory and counts.
    """
    if instances_format not in _FORMATS:
        raise ConfigError(f"--instances-format {instances_format!r}: choose {' or '.join(_FORMATS)}")
    bad = [uri for uri in input_uris if not storage.is_gcs(uri)]
    if not input_uris or bad:
        raise ConfigError(
            f"batch prediction input {bad or input_uris}: give gs:// files (Vertex AI reads from Cloud Storage)"
        )
    if not storage.is_gcs(output_prefix):
        raise ConfigError(f"--vertex-batch {output_prefix}: give a gs:// prefix for the predictions")
    if batch_size is not None and not 1 <= batch_size <= MAX_BATCH:
        raise ConfigError(
            f"--instances-per-request {batch_size}: 1 to {MAX_BATCH}, the most instances the serving image "
            "takes per request"
        )
    if sizes is None:
        sizes = measure_instances(input_uris, instances_format)
    batch_size = _checked_batch_size(batch_size, sizes)
    if top_k is not None and top_k < 1:
        raise ConfigError(f"--top-k {top_k} must be positive")
    resources = vertex.MachineResources(
        machine_type=machine_type, min_replicas=replicas, max_replicas=replicas
    )
    place = vertex.place_of_model(model, project, region)
    aiplatform = vertex.init(place)
    version = vertex.find_model_version(aiplatform, model, registry=registry)
    job: dict[str, Any] = {
        "display_name": (display_name or f"{version.display_name}-v{version.version_id}-batch")[:128],
        "model": version.versioned_name,
        "input_config": {"instances_format": instances_format, "gcs_source": {"uris": list(input_uris)}},
        "output_config": {
            "predictions_format": "jsonl",
            "gcs_destination": {"output_uri_prefix": output_prefix},
        },
        "dedicated_resources": resources.dedicated_resources(starting=True),
        "manual_batch_tuning_parameters": {"batch_size": batch_size},
    }
    if instances_format == "jsonl" and not sizes.unkeyed:  # an AutoML batch file's lines may have no key
        job["instance_config"] = {"key_field": INSTANCE_KEY}
    if top_k is not None:
        job["model_parameters"] = {"top_k": top_k}
    client = vertex.v1_client("job")
    created = client.create_batch_prediction_job(
        parent=f"projects/{place.project}/locations/{place.location}", batch_prediction_job=job
    )
    log.info(
        "submitted batch prediction %s: %s on %s (%s x %d, no autoscaling), predictions under %s",
        created.name,
        version.versioned_name,
        ", ".join(input_uris),
        machine_type,
        replicas,
        output_prefix,
    )
    if wait:
        created = _wait(client, created.name, poll_seconds)
    return _summary(created, version.versioned_name)


def _checked_batch_size(batch_size: int | None, sizes: InstanceSizes) -> int:
    """``batch_size`` (or the fitting one), refused when its requests could exceed a serving budget, and
    the input refused when an instance fits no request."""
    if sizes.too_large:
        named = "; ".join(f"{name} ({why})" for name, why in sizes.too_large[:5])
        raise ConfigError(
            f"{len(sizes.too_large)} instances fit no request to the serving image or name no image, e.g. "
            f"{named}: leave them out of the input (`tpustream predict --vertex-batch` on the images leaves "
            "them out itself)"
        )
    fitting, budget = fitting_batch_size(sizes)
    if batch_size is None:
        log.info(
            "%d instances per request: the most that fit the serving image's %s with the input's largest "
            "image (%d bytes, %s)",
            fitting,
            budget,
            sizes.max_bytes,
            _pixels_said(sizes),
        )
        return fitting
    if batch_size > fitting and batch_size <= fitting_batch_size(sizes, unknown_pixels=False)[0]:
        log.warning(
            "--instances-per-request %d: %d images were sized from their Cloud Storage metadata, their "
            "pixels unknown; a request of %d images of over %d px each is refused whole by the serving "
            "image's TPUSTREAM_MAX_REQUEST_PIXELS (%d fit whatever their pixels)",
            batch_size,
            sizes.unknown_pixels,
            batch_size,
            sizes.limits.max_request_pixels // batch_size,
            fitting,
        )
        return batch_size
    if batch_size > fitting:
        raise ConfigError(
            f"--instances-per-request {batch_size}: requests of {batch_size} of the input's largest image "
            f"({sizes.max_bytes} bytes, {_pixels_said(sizes)}) are over the serving image's {budget}; "
            f"use {fitting} or fewer, or leave it out (it is chosen to fit)"
        )
    return batch_size


def _pixels_said(sizes: InstanceSizes) -> str:
    if not sizes.unknown_pixels:
        return f"{sizes.max_pixels} px"
    return f"pixels unknown for {sizes.unknown_pixels} read from metadata, up to {sizes.limits.max_pixels} px"


def _wait(client: Any, name: str, poll_seconds: float) -> Any:
    state = ""
    while True:
        job = client.get_batch_prediction_job(name=name)
        if job.state.name != state:
            state = job.state.name
            log.info("batch prediction %s: %s", name, state)
        if state in _DONE:
            break
        time.sleep(poll_seconds)
    if state != "JOB_STATE_SUCCEEDED":
        raise vertex.VertexError(
            f"batch prediction {name} ended {state}: {job.error.message or 'no error message'}; "
            "its errors_*.jsonl under the output prefix name the failed instances"
        )
    return job


def _summary(job: Any, model: str) -> BatchJob:
    directory = job.output_info.gcs_output_directory
    if not directory:
        return BatchJob(name=job.name, state=job.state.name, model=model)
    stats = job.completion_stats
    errors = None
    if job.state.name == "JOB_STATE_SUCCEEDED":
        # The model server answers a bad image in its own slot ({"error": ...}) and the rest of its request;
        # Vertex writes that slot as the instance's prediction and counts it successful.
        errors = sum(
            1
            for result in iter_results(directory)
            if isinstance(result.get("prediction"), dict) and "error" in result["prediction"]
        )
    return BatchJob(
        name=job.name,
        state=job.state.name,
        model=model,
        output_directory=directory,
        completion=JobCompletion(
            successful=int(stats.successful_count),
            failed=int(stats.failed_count),
            incomplete=int(stats.incomplete_count),
        ),
        instance_errors=errors,
    )


def predict_on_vertex(
    inputs: list[str],
    model: str,
    output_prefix: str,
    *,
    limit: int | None = None,
    machine_type: str = "n1-standard-4",
    replicas: int = 1,
    batch_size: int | None = None,
    top_k: int | None = None,
    registry: str | None = None,
    project: str | None = None,
    region: str | None = None,
    wait: bool = False,
    poll_seconds: float = 30.0,
) -> BatchJob:
    """``tpustream predict --vertex-batch``: submit ``inputs`` as they are when they all are gs:// JSONL
    files, else first write their images (at most ``limit``) as instances to
    ``<output_prefix>/instances-<time>.jsonl``. The other options are ``submit_batch_prediction``'s."""
    submit = functools.partial(
        submit_batch_prediction,
        machine_type=machine_type,
        replicas=replicas,
        batch_size=batch_size,
        top_k=top_k,
        registry=registry,
        project=project,
        region=region,
        wait=wait,
        poll_seconds=poll_seconds,
    )
    if inputs and all(storage.is_gcs(uri) and uri.endswith(".jsonl") for uri in inputs):
        return submit(model, inputs, output_prefix)
    if not storage.is_gcs(output_prefix):
        raise ConfigError(f"--vertex-batch {output_prefix}: give a gs:// prefix for the predictions")
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    written = write_instances(inputs, storage.join(output_prefix, f"instances-{stamp}.jsonl"), limit=limit)
    job = submit(model, [written.uri], output_prefix, sizes=written.sizes)
    return replace(job, instances=written)


def iter_results(output_directory: str) -> Iterator[dict[str, Any]]:
    """Every line of a finished job's ``predictions_*.jsonl`` then ``errors_*.jsonl``, in file order: a
    prediction has ``key`` (or ``instance``) and ``prediction``, a failure ``error`` {code, message}."""
    objects = sorted(o.uri for o in storage.list_objects(output_directory) if o.uri.endswith(".jsonl"))
    for stem in ("predictions_", "errors_"):
        for uri in objects:
            if uri.rsplit("/", 1)[1].startswith(stem):
                for line in storage.read_bytes(uri).splitlines():
                    if line.strip():
                        yield json.loads(line)
