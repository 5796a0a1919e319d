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
classification's instance / parameters / prediction schemata (``predictSchemata``,
``serve.automl.PREDICT_SCHEMATA``), which the server also speaks, so that the console and AutoML clients know the format.

The promoted version also gets its evaluation (``tpustream evaluate``'s metrics.json) imported with
``ModelService.ImportModelEvaluation`` in Vertex's classification schema (``classification_evaluation``), and
``find_model_version`` names the version that ``tpustream deploy`` and batch prediction use.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from tpustream.artifacts import EvalReport
from tpustream.errors import ConfigError, TpustreamError
from tpustream.registry.store import read_champion, version_uri
from tpustream.serve.automl import PREDICT_SCHEMATA
from tpustream.serve.contract import HEALTH_ROUTE, PREDICT_ROUTE, SERVING_ENV, SERVING_PORT
from tpustream.storage import io as storage
from tpustream.vertex.evaluation import import_evaluation

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
    "PublishedModel",
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


@dataclass(frozen=True, kw_only=True)
class PublishedModel:
    """A registry version as ``publish`` left it in the Vertex AI Model Registry, holding the ``champion``
    alias: the model's ``resource_name``, its ``version_id``, ``versioned_name`` (``ID@VERSION``: what
    GCPC's VertexModel artifact carries, upload_model/remote_runner.py) and REST ``uri``; ``uploaded``:
    whether this call uploaded it (False: it was there already); ``evaluation``: the imported model
    evaluation's resource name (None: none imported, e.g. a partial evaluation)."""

    resource_name: str
    version_id: str
    versioned_name: str
    uri: str
    uploaded: bool
    evaluation: str | None


# The labels that identify what was uploaded (the registry version and the weights), not how well it scored.
_IDENTITY = ("tpustream_version", "model_sha256")


def publish(
    target: VertexTarget,
    *,
    artifact_uri: str,
    labels: dict[str, str],
    evaluation: EvalReport | None = None,
    metrics_uri: str = "",
) -> PublishedModel:
    """Make ``artifact_uri`` (a gs:// registry version) the ``champion`` version of ``target.model_name``.

    Idempotent, so a failed upload is repaired by running promote again: a version already uploaded from
    this artifact (found by its ``tpustream_version`` + ``model_sha256`` labels and checked by its artifact
    URI) is reused; otherwise it is uploaded with the serving container as the default version. Then the
    ``champion`` alias moves to it (mergeVersionAliases takes an alias off the version that held it; an upload
    naming an alias another version holds is not documented to). With ``evaluation`` (the metrics.json of
    this model, read from ``metrics_uri``) its evaluation is imported into that version unless it has it
    already (``tpustream.vertex.evaluation.import_evaluation``)."""
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
            **PREDICT_SCHEMATA,  # the AutoML-compatible format the server also accepts (serve.automl)
        )
    else:
        log.info("Vertex AI: %s@%s was uploaded from %s already", parent, model.version_id, artifact_uri)
    if "champion" not in (model.version_aliases or []):
        model.versioning_registry.add_version_aliases(["champion"], version=model.version_id)
    versioned = f"{model.resource_name}@{model.version_id}"
    log.info("Vertex AI: %s is the champion (%s)", versioned, artifact_uri)
    host = f"{target.location}-aiplatform.googleapis.com"
    imported = None
    if evaluation is not None:
        imported = import_evaluation(v1_client("model"), versioned, evaluation, metrics_uri)
    return PublishedModel(
        resource_name=model.resource_name,
        version_id=str(model.version_id),
        versioned_name=versioned,
        uri=f"https://{host}/v1/{versioned}",
        uploaded=uploaded,
        evaluation=imported,
    )


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
    artifact = version_uri(registry, champion.version)
    identity = {"tpustream_version": str(champion.version), "model_sha256": champion.model_sha256[:16]}
    found = _published_version(aiplatform, parent, artifact, identity)
    if found is None:
        raise VertexError(
            f"the champion of {registry} (version {champion.version}, {artifact}) is not a version of {parent}: "
            "run `tpustream promote` for it again with --vertex-model (it uploads the champion Vertex lacks)"
        )
    return _model_version(found)


# --------------------------------------------------------------------------- evaluations in the Model Registry
