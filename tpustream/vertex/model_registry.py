"""Vertex AI Model Registry: publish promoted models as versions of one parent model, servable.

A version is uploaded when tpustream's own registry promotes a model (the compare-and-swap in
``promote.py`` stays the source of truth; Vertex mirrors it): ``artifact_uri`` is the immutable
``REGISTRY/versions/<n>`` directory, never a run's output that a later run could overwrite, and the
``champion`` alias moves to it. The container is tpustream's serving image (containers/serve/Dockerfile:
aiplatform's Custom Prediction Routine server + ``tpustream.serve.server``): the prebuilt ``pytorch-cpu``
images serve a TorchServe ``model.mar`` and cannot serve ``model.pt`` + ``model.json``.
The container spec follows https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements
(port, health and predict routes; Vertex passes them back as AIP_HTTP_PORT / AIP_HEALTH_ROUTE /
AIP_PREDICT_ROUTE and the artifact copy as AIP_STORAGE_URI). The upload declares AutoML image
classification's instance / parameters / prediction schemata (``predictSchemata``, ``serving_automl.
PREDICT_SCHEMATA``), which the server also speaks, so that the console and AutoML clients know the format.

The promoted version also gets its evaluation (``tpustream evaluate``'s metrics.json) imported with
``ModelService.ImportModelEvaluation`` in Vertex's classification schema (``classification_evaluation``), and
``find_model_version`` names the version that ``tpustream deploy`` and batch prediction use.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass
from typing import Any

from tpustream.errors import ConfigError, TpustreamError
from tpustream.registry.store import read_champion, version_uri
from tpustream.serve.automl import PREDICT_SCHEMATA
from tpustream.serve.contract import HEALTH_ROUTE, PREDICT_ROUTE, SERVING_ENV, SERVING_PORT
from tpustream.storage import io as storage

__all__ = [
    "VertexTarget",
    "VertexPlace",
    "VertexError",
    "ModelVersion",
    "MachineResources",
    "publish",
    "container_spec",
    "target_from_env",
    "place_from_env",
    "init",
    "v1_client",
    "find_model_version",
    "classification_evaluation",
    "import_evaluation",
    "EVALUATION_SCHEMA",
]

log = logging.getLogger(__name__)

_PLACEHOLDER_IMAGE = re.compile(r"(^|/)(PROJECT|CHANGE-ME|YOUR[-_]PROJECT)(/|$)|\$", re.IGNORECASE)


def check_serving_image(image: str) -> str:
    """Refuse a missing or placeholder serving image; return it unchanged."""
    if not image or "/" not in image or _PLACEHOLDER_IMAGE.search(image):
        raise ConfigError(
            f"--serving-image {image!r} is not a pushed image: give the serve image Cloud Build pushed "
            "(REGION-docker.pkg.dev/PROJECT_ID/REPO/serve@sha256:..., printed by containers/cloudbuild.yaml)"
        )
    return image


def container_spec(serving_image: str) -> dict[str, Any]:
    """``Model.upload``'s serving-container arguments for tpustream's serving image."""
    return {
        "serving_container_image_uri": check_serving_image(serving_image),
        "serving_container_ports": [SERVING_PORT],
        "serving_container_health_route": HEALTH_ROUTE,
        "serving_container_predict_route": PREDICT_ROUTE,
        "serving_container_environment_variables": dict(SERVING_ENV),
    }


@dataclass(frozen=True, kw_only=True)
class VertexTarget:
    """Where to publish: the parent model's display name, project and region."""

    model_name: str
    project: str
    location: str = "us-central1"
    serving_image: str
    api_endpoint: str | None = None  # e.g. a regional endpoint; tests point it at loopback

    def __post_init__(self) -> None:
        if not self.model_name or not self.project:
            raise ConfigError(
                "--vertex-model needs a model name and a project (--vertex-project or GOOGLE_CLOUD_PROJECT)"
            )
        check_serving_image(self.serving_image)


class VertexError(TpustreamError, ValueError):
    """A Vertex AI resource is missing or not as tpustream needs it; the message says what to do."""


@dataclass(frozen=True, kw_only=True)
class VertexPlace:
    """Which project and region to call Vertex AI in, and through which API endpoint (tests: loopback)."""

    project: str
    location: str = "us-central1"
    api_endpoint: str | None = None

    def __post_init__(self) -> None:
        if not self.project:
            raise ConfigError(
                "no Google Cloud project: pass --project, or set GOOGLE_CLOUD_PROJECT "
                "(or log in with `gcloud auth application-default login` to a project)"
            )
        if not re.fullmatch(r"[a-z]+-[a-z]+\d+", self.location):
            raise ConfigError(f"--region {self.location!r} is not a Vertex AI region such as us-central1")


@dataclass(frozen=True, kw_only=True)
class MachineResources:
    """The machines that serve a model (an endpoint deployment, a batch prediction job)."""

    machine_type: str = "n1-standard-4"
    min_replicas: int = 1  # a batch job starts on this many
    max_replicas: int = 1

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", self.machine_type or ""):
            raise ConfigError(
                f"--machine-type {self.machine_type!r} is not a Compute Engine machine type such as n1-standard-4"
            )
        if self.min_replicas < 1:
            raise ConfigError(f"--min-replicas {self.min_replicas}: Vertex AI needs at least 1 replica")
        if self.max_replicas < self.min_replicas:
            raise ConfigError(
                f"--max-replicas {self.max_replicas} is below --min-replicas {self.min_replicas}: "
                "raise --max-replicas"
            )

    def dedicated_resources(self, *, starting: bool = False) -> dict[str, Any]:
        """The v1 ``DedicatedResources`` (``BatchDedicatedResources`` with ``starting``) as a dict."""
        first = "starting_replica_count" if starting else "min_replica_count"
        return {
            "machine_spec": {"machine_type": self.machine_type},
            first: self.min_replicas,
            "max_replica_count": self.max_replicas,
        }


def _label(value: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", value.lower())[:63]


def init(place: VertexPlace) -> Any:
    """``aiplatform`` initialised for ``place``: an ``http://`` endpoint (the tests' loopback recorder) is
    called over REST without credentials."""
    from google.cloud import aiplatform

    kwargs: dict[str, Any] = {"project": place.project, "location": place.location}
    if place.api_endpoint:
        kwargs["api_endpoint"] = place.api_endpoint
        if place.api_endpoint.startswith("http://"):  # loopback endpoint: REST and no credentials
            from google.auth.credentials import AnonymousCredentials

            kwargs.update(api_transport="rest", credentials=AnonymousCredentials())
    aiplatform.init(**kwargs)
    return aiplatform


def _init(target: VertexTarget) -> Any:
    return init(
        VertexPlace(project=target.project, location=target.location, api_endpoint=target.api_endpoint)
    )


def v1_client(service: str) -> Any:
    """The aiplatform v1 GAPIC client of ``service`` ("endpoint", "job" or "model") as ``init`` configured
    it (endpoint, transport, credentials): for the requests the high-level SDK cannot make as needed."""
    from google.cloud.aiplatform import initializer, utils

    classes: dict[str, Any] = {
        "endpoint": utils.EndpointClientWithOverride,
        "job": utils.JobClientWithOverride,
        "model": utils.ModelClientWithOverride,
    }
    return initializer.global_config.create_client(client_class=classes[service]).select_version("v1")


def _published_version(aiplatform: Any, parent: str, artifact_uri: str, labels: dict[str, str]) -> Any:
    """The version of ``parent`` already uploaded from ``artifact_uri`` (found by its labels, checked by its
    artifact URI), or None: what makes a retried or re-run publish upload nothing twice."""
    registry = aiplatform.models.ModelRegistry(parent)
    query = " AND ".join(
        f'labels.{_label(k)}="{_label(v)}"' for k, v in sorted(labels.items()) if k in _IDENTITY
    )
    for info in registry.list_versions(filter=query):
        version = registry.get_model(version=info.version_id)
        if version.uri == artifact_uri:
            return version
    return None


# The labels that identify what was uploaded (the registry version and the weights), not how well it scored.
_IDENTITY = ("tpustream_version", "model_sha256")


def publish(
    target: VertexTarget,
    *,
    artifact_uri: str,
    labels: dict[str, str],
    evaluation: dict[str, Any] | None = None,
    metrics_uri: str = "",
) -> dict[str, Any]:
    """Make ``artifact_uri`` (a gs:// registry version) the ``champion`` version of ``target.model_name``.

    Idempotent, so a failed upload is repaired by running promote again: a version already uploaded from
    this artifact (found by its ``tpustream_version`` + ``model_sha256`` labels and checked by its artifact
    URI) is reused; otherwise it is uploaded with the serving container as the default version. Then the
    ``champion`` alias moves to it (mergeVersionAliases takes an alias off the version that held it; an upload
    naming an alias another version holds is not documented to). With ``evaluation`` (the metrics.json
    document of this model, read from ``metrics_uri``) its evaluation is imported into that version unless it
    has it already (``import_evaluation``). Returns the model resource name, version id, versioned name,
    whether this call uploaded it, and the evaluation's resource name (or None)."""
    if not storage.is_gcs(artifact_uri):
        raise ConfigError(f"Vertex AI reads models from gs:// only, not {artifact_uri}: use a gs:// registry")
    aiplatform = _init(target)
    existing = aiplatform.Model.list(filter=f'display_name="{target.model_name}"')
    parent = existing[0].resource_name if existing else None
    model = _published_version(aiplatform, parent, artifact_uri, labels) if parent else None
    uploaded = model is None
    if model is None:
        model = aiplatform.Model.upload(
            display_name=target.model_name,
            artifact_uri=artifact_uri,
            parent_model=parent,
            is_default_version=True,
            labels={_label(k): _label(v) for k, v in labels.items()},
            sync=True,
            **container_spec(target.serving_image),
            **PREDICT_SCHEMATA,  # the AutoML-compatible format the server also accepts (serving_automl)
        )
    else:
        log.info("Vertex AI: %s@%s was uploaded from %s already", parent, model.version_id, artifact_uri)
    if "champion" not in (model.version_aliases or []):
        model.versioning_registry.add_version_aliases(["champion"], version=model.version_id)
    versioned = f"{model.resource_name}@{model.version_id}"
    log.info("Vertex AI: %s is the champion (%s)", versioned, artifact_uri)
    host = f"{target.location}-aiplatform.googleapis.com"
    imported = import_evaluation(versioned, evaluation, metrics_uri) if evaluation is not None else None
    return {
        "resource_name": model.resource_name,
        "version_id": model.version_id,
        "versioned_name": versioned,  # what GCPC's VertexModel artifact carries (upload_model/remote_runner.py)
        "uri": f"https://{host}/v1/{versioned}",
        "champion": True,
        "uploaded": uploaded,
        "evaluation": imported,
    }


def _given(value: str | None, *env: str) -> str | None:
    """``value`` unless empty or a KFP placeholder that arrived unresolved (``{{$...}}``), else the first
    of the environment variables ``env`` that is set."""
    if value and not value.startswith("{{$"):
        return value
    return next((os.environ[name] for name in env if os.environ.get(name)), None)


def _credentials_project() -> str | None:
    """The project of the application-default credentials (a pipeline's service account), if any."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        return google.auth.default()[1]
    except DefaultCredentialsError:
        return None


def target_from_env(
    model_name: str | None, project: str | None, location: str | None, serving_image: str | None = None
) -> VertexTarget | None:
    """Where to publish, or None without a model name. Each value not given (or an unresolved KFP
    placeholder) comes from the environment: the project from GOOGLE_CLOUD_PROJECT, then
    CLOUD_ML_PROJECT_ID (Vertex AI sets it in job containers), then the credentials' project; the region
    from GOOGLE_CLOUD_REGION, then CLOUD_ML_REGION, then us-central1; the image from
    TPUSTREAM_SERVING_IMAGE; the API endpoint from TPUSTREAM_VERTEX_ENDPOINT (tests: loopback)."""
    if not model_name:
        return None
    return VertexTarget(
        model_name=model_name,
        serving_image=serving_image or os.environ.get("TPUSTREAM_SERVING_IMAGE", ""),
        project=_given(project, "GOOGLE_CLOUD_PROJECT", "CLOUD_ML_PROJECT_ID")
        or _credentials_project()
        or "",
        location=_given(location, "GOOGLE_CLOUD_REGION", "CLOUD_ML_REGION") or "us-central1",
        api_endpoint=os.environ.get("TPUSTREAM_VERTEX_ENDPOINT") or None,
    )


def place_from_env(project: str | None = None, location: str | None = None) -> VertexPlace:
    """Where to call Vertex AI: each value not given comes from the environment as in ``target_from_env``."""
    return VertexPlace(
        project=_given(project, "GOOGLE_CLOUD_PROJECT", "CLOUD_ML_PROJECT_ID")
        or _credentials_project()
        or "",
        location=_given(location, "GOOGLE_CLOUD_REGION", "CLOUD_ML_REGION") or "us-central1",
        api_endpoint=os.environ.get("TPUSTREAM_VERTEX_ENDPOINT") or None,
    )


# --------------------------------------------------------------------------- which version to serve

_MODEL_NAME = re.compile(
    r"^projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/models/(?P<id>[^/@]+)(?:@(?P<version>[\w-]+))?$"
)


@dataclass(frozen=True)
class ModelVersion:
    """One version of a Vertex AI Model Registry model."""

    resource_name: str  # projects/P/locations/L/models/ID
    version_id: str
    display_name: str
    artifact_uri: str

    @property
    def versioned_name(self) -> str:
        return f"{self.resource_name}@{self.version_id}"

    @property
    def model_id(self) -> str:
        return self.resource_name.rsplit("/", 1)[1]


def place_of_model(model: str, project: str | None, location: str | None) -> VertexPlace:
    """Where to call Vertex AI for ``model``: a full resource name brings its project and region (a
    different one given is refused); a display name is looked up in the given or environment's place."""
    named = _MODEL_NAME.match(model)
    if not named:
        return place_from_env(project, location)
    for given, own, what in (
        (project, named["project"], "--project"),
        (location, named["location"], "--region"),
    ):
        if given and not given.startswith("{{$") and given != own:
            raise VertexError(f"{what} {given} differs from the model's own ({own}, in {model}): drop {what}")
    return place_from_env(named["project"], named["location"])


def find_model_version(aiplatform: Any, model: str, *, registry: str | None = None) -> ModelVersion:
    """The Model Registry version that ``model`` names.

    ``model``: a resource name ``projects/P/locations/L/models/ID`` with an optional ``@VERSION`` or
    ``@ALIAS``, or a model's display name. Without a version: the ``champion`` alias, which ``publish``
    moves. With ``registry`` (a tpustream registry): the version uploaded from the registry's champion
    (found by its labels, checked by its artifact URI), so a champion Vertex has not received yet is an error
    instead of a deployment of the previous one."""
    from google.api_core import exceptions

    named = _MODEL_NAME.match(model)
    if named:
        parent, version = model.split("@", 1)[0], named["version"]
    else:
        found = aiplatform.Model.list(filter=f'display_name="{model}"')
        if not found:
            raise VertexError(
                f"no Vertex AI model is named {model!r} in {aiplatform.initializer.global_config.project}/"
                f"{aiplatform.initializer.global_config.location}: publish one with "
                f"`tpustream promote --vertex-model {model}`, or give a resource name projects/P/locations/L/models/ID"
            )
        if len(found) > 1:
            names = ", ".join(m.resource_name for m in found)
            raise VertexError(
                f"{len(found)} Vertex AI models are named {model!r} ({names}): give a resource name"
            )
        parent, version = found[0].resource_name, None
    if registry:
        if version:
            raise VertexError(f"{model}: give either a version (@{version}) or --registry, not both")
        return _registry_champion(aiplatform, parent, registry)
    try:
        found_version = aiplatform.Model(model_name=f"{parent}@{version or 'champion'}")
    except exceptions.NotFound as exc:
        raise VertexError(
            f"{parent} has no version or alias {version or 'champion'!r}: "
            + (
                "check the version"
                if version
                else "promote a model with --vertex-model to give it a champion"
            )
        ) from exc
    return _model_version(found_version)


def _model_version(model: Any) -> ModelVersion:
    return ModelVersion(
        resource_name=model.resource_name,
        version_id=str(model.version_id),
        display_name=model.display_name,
        artifact_uri=model.uri or "",
    )


def _registry_champion(aiplatform: Any, parent: str, registry: str) -> ModelVersion:
    registry = storage.check_uri(registry).rstrip("/")
    champion = read_champion(registry)
    if champion is None:
        raise VertexError(f"--registry {registry} has no champion yet: promote a model first")
    artifact = version_uri(registry, champion["version"])
    identity = {"tpustream_version": str(champion["version"]), "model_sha256": champion["model_sha256"][:16]}
    found = _published_version(aiplatform, parent, artifact, identity)
    if found is None:
        raise VertexError(
            f"the champion of {registry} (version {champion['version']}, {artifact}) is not a version of {parent}: "
            "run `tpustream promote` for it again with --vertex-model (it uploads the champion Vertex lacks)"
        )
    return _model_version(found)


# --------------------------------------------------------------------------- evaluations in the Model Registry

# Vertex's classification metrics schema (ModelEvaluation.metrics_schema_uri): the URI GCPC's evaluation
# importer uses for classification (google_cloud_pipeline_components/container/_implementation/
# model_evaluation/import_model_evaluation.py, PROBLEM_TYPE_TO_SCHEMA_URI)
EVALUATION_SCHEMA = "gs://google-cloud-aiplatform/schema/modelevaluation/classification_metrics_1.0.0.yaml"


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# The confusion matrix is sent once, and for at most this many classes: a full matrix of 1,000 classes is a
# million cells (megabytes of JSON, past common request-size limits); the classes with the most errors are
# the rows a person reads first.
CONFUSION_MAX_CLASSES = 100


def classification_evaluation(document: dict[str, Any], metrics_uri: str = "") -> dict[str, Any]:
    """A ``ModelEvaluation`` (snake-case fields, as the v1 client takes it) of the candidate in a
    ``tpustream evaluate`` metrics.json, its ``metrics`` in Vertex's classification schema.

    The fields are the schema's (aiplatform v1 REST "SchemaModelevaluationMetricsClassificationEvaluationMetrics";
    the same names in GCPC's ``google.ClassificationMetrics`` artifact schema, types/artifact_types.py):
    ``confusionMatrix`` {``annotationSpecs`` [{id, displayName}], ``rows``: rows[i][j] = val samples of class i
    predicted as j, which is evaluate's matrix}, sent once, capped at ``CONFUSION_MAX_CLASSES`` classes (those
    with the most errors; the metadata says so); ``logLoss`` (evaluate's mean cross-entropy); ``auPrc`` and
    ``auRoc`` (micro, one-vs-rest over the per-sample scores); ``confidenceMetrics``: one point per confidence
    threshold of evaluate's table (``recall``/``precision``: every class at or above the threshold counts as
    predicted; ``*At1``: the top-1 prediction only, when it reaches the threshold), and with more than five
    classes a ``maxPredictions`` 5 point at threshold 0 (top-5). An evaluation written before the per-sample
    scores has only the threshold-0 point these counts determine exactly. Annotation spec ids are the model's
    class indices (a custom model has no dataset annotation specs)."""
    candidate = document["candidate"]
    classes = [str(name) for name in document["classes"]]
    count = len(classes)
    matrix = [[int(cell) for cell in row] for row in candidate["confusion_matrix"]]
    shown = _confusion_classes(matrix, CONFUSION_MAX_CLASSES)
    confusion = {
        "annotationSpecs": [{"id": str(index), "displayName": classes[index]} for index in shown],
        "rows": [[matrix[i][j] for j in shown] for i in shown],
    }
    top1, top5 = candidate["top1"], candidate["top5"]
    thresholds = candidate.get("thresholds")
    if thresholds:
        confidence = [_confidence_point(row) for row in thresholds]
    else:  # an evaluation before per-sample scores: the one point its counts determine
        confidence = [
            {
                "confidenceThreshold": 0.0,
                "recall": 1.0,
                "precision": 1.0 / count,
                "f1Score": 2.0 / (count + 1),
                "recallAt1": top1,
                "precisionAt1": top1,  # one label per sample, one prediction: precision@1 = recall@1 = top-1
                "f1ScoreAt1": top1,
            }
        ]
    if count > 5 and _finite(top5):
        confidence.append(
            {"confidenceThreshold": 0.0, "maxPredictions": 5, "recall": top5, "precision": top5 / 5}
        )
    metrics: dict[str, Any] = {"confusionMatrix": confusion, "confidenceMetrics": confidence}
    for field_name, key in (("logLoss", "loss"), ("auPrc", "auprc"), ("auRoc", "auroc")):
        if _finite(candidate.get(key)):
            metrics[field_name] = candidate[key]
    dataset = document["dataset"]
    metadata = {
        # the keys GCPC's importer writes (evaluation_dataset_type/_path), plus where the numbers come from
        "evaluation_dataset_type": "tpustream-shards",
        "evaluation_dataset_path": [dataset["uri"]],
        "dataset_manifest_digest": dataset["manifest_digest"],
        "model_sha256": candidate["model_sha256"],
        "num_samples": candidate["num_samples"],
        "top1": top1,
        "top5": top5,
        "tpustream_metrics": metrics_uri,
    }
    for key in ("macro_f1", "balanced_accuracy"):
        if _finite(candidate.get(key)):
            metadata[key] = candidate[key]
    if len(shown) < count:
        metadata["confusion_matrix_classes"] = (
            f"{len(shown)} of {count} classes: those with the most errors (false negatives + false positives); "
            f"the full matrix is in {metrics_uri or 'metrics.json'}"
        )
    return {
        "display_name": _evaluation_name(document),
        "metrics_schema_uri": EVALUATION_SCHEMA,
        "metrics": metrics,
        "metadata": metadata,
    }


def _confidence_point(row: dict[str, Any]) -> dict[str, Any]:
    """One row of evaluate's threshold table as a ``ConfidenceMetrics`` point."""
    precision, recall = row["micro_precision"], row["micro_recall"]
    return {
        "confidenceThreshold": row["threshold"],
        "recall": recall,
        "precision": precision,
        "f1Score": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "recallAt1": row["recall"],
        "precisionAt1": row["precision"],
        "f1ScoreAt1": row["f1"],
    }


def _confusion_classes(matrix: list[list[int]], limit: int) -> list[int]:
    """The class indices the sent matrix keeps: all up to ``limit``, else the ``limit`` with the most errors
    (its samples predicted as another class, plus other classes' samples predicted as it), in class order."""
    count = len(matrix)
    if count <= limit:
        return list(range(count))
    errors = [sum(matrix[i]) + sum(row[i] for row in matrix) - 2 * matrix[i][i] for i in range(count)]
    ranked = sorted(range(count), key=lambda i: (-errors[i], i))
    return sorted(ranked[:limit])


def _evaluation_name(document: dict[str, Any]) -> str:
    """The display name that identifies an evaluation: the same model on the same dataset is imported once."""
    digest = document["dataset"]["manifest_digest"][:12]
    return f"tpustream evaluate: {document['candidate']['num_samples']} val samples of dataset {digest}"


def import_evaluation(versioned_name: str, document: dict[str, Any], metrics_uri: str = "") -> str | None:
    """Import the evaluation in ``document`` into the model version ``versioned_name`` (ID@VERSION) unless
    that version has it already (same display name: same dataset); returns its resource name, or None for a
    partial evaluation, which is not imported. Needs ``init`` first."""
    if not document["candidate"].get("complete"):
        log.warning(
            "not importing the evaluation into %s: it did not cover the whole val split", versioned_name
        )
        return None
    client = v1_client("model")
    wanted = _evaluation_name(document)
    for existing in client.list_model_evaluations(parent=versioned_name):
        if existing.display_name == wanted:
            log.info("Vertex AI: %s has this evaluation already (%s)", versioned_name, existing.name)
            return str(existing.name)
    imported = client.import_model_evaluation(
        parent=versioned_name, model_evaluation=classification_evaluation(document, metrics_uri)
    )
    log.info("Vertex AI: imported the evaluation of %s as %s", versioned_name, imported.name)
    return str(imported.name)
