"""Vertex AI Model Registry: publish promoted models as versions of one parent model, servable.

A version is uploaded when tpustream's own registry promotes a model (the compare-and-swap in
``promote.py`` stays the source of truth; Vertex mirrors it): ``artifact_uri`` is the immutable
``REGISTRY/versions/<n>`` directory, never a run's output that a later run could overwrite, and the
``champion`` alias moves to it. The container is tpustream's serving image (containers/serve/Dockerfile:
aiplatform's Custom Prediction Routine server + ``tpustream.serving``): the prebuilt ``pytorch-cpu``
images serve a TorchServe ``model.mar`` and cannot serve ``model.pt`` + ``model.json``.
The container spec follows https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements
(port, health and predict routes; Vertex passes them back as AIP_HTTP_PORT / AIP_HEALTH_ROUTE /
AIP_PREDICT_ROUTE and the artifact copy as AIP_STORAGE_URI).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from tpustream import storage

__all__ = ["VertexTarget", "publish", "container_spec", "target_from_env"]

log = logging.getLogger(__name__)

_PLACEHOLDER_IMAGE = re.compile(r"(^|/)(PROJECT|CHANGE-ME|YOUR[-_]PROJECT)(/|$)|\$", re.IGNORECASE)


def check_serving_image(image: str) -> str:
    """Refuse a missing or placeholder serving image; return it unchanged."""
    if not image or "/" not in image or _PLACEHOLDER_IMAGE.search(image):
        raise ValueError(
            f"--serving-image {image!r} is not a pushed image: give the serve image Cloud Build pushed "
            "(REGION-docker.pkg.dev/PROJECT_ID/REPO/serve@sha256:..., printed by containers/cloudbuild.yaml)"
        )
    return image


def container_spec(serving_image: str) -> dict[str, Any]:
    """``Model.upload``'s serving-container arguments for tpustream's serving image."""
    from tpustream.serving import HEALTH_ROUTE, PREDICT_ROUTE, SERVING_ENV, SERVING_PORT

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
            raise ValueError(
                "--vertex-model needs a model name and a project (--vertex-project or GOOGLE_CLOUD_PROJECT)"
            )
        check_serving_image(self.serving_image)


def _label(value: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", value.lower())[:63]


def _init(target: VertexTarget) -> Any:
    from google.cloud import aiplatform

    kwargs: dict[str, Any] = {"project": target.project, "location": target.location}
    if target.api_endpoint:
        kwargs["api_endpoint"] = target.api_endpoint
        if target.api_endpoint.startswith("http://"):  # loopback endpoint: REST and no credentials
            from google.auth.credentials import AnonymousCredentials

            kwargs.update(api_transport="rest", credentials=AnonymousCredentials())
    aiplatform.init(**kwargs)
    return aiplatform


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


def publish(target: VertexTarget, *, artifact_uri: str, labels: dict[str, str]) -> dict[str, Any]:
    """Make ``artifact_uri`` (a gs:// registry version) the ``champion`` version of ``target.model_name``.

    Idempotent, so a failed upload is repaired by running promote again: a version already uploaded from
    this artifact (found by its ``tpustream_version`` + ``model_sha256`` labels and checked by its artifact
    URI) is reused; otherwise it is uploaded with the serving container as the default version. Then the
    ``champion`` alias moves to it (mergeVersionAliases takes an alias off the version that held it; an upload
    naming an alias another version holds is not documented to). Returns the model resource name, version
    id, versioned name and whether this call uploaded it."""
    if not storage.is_gcs(artifact_uri):
        raise ValueError(f"Vertex AI reads models from gs:// only, not {artifact_uri}: use a gs:// registry")
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
        )
    else:
        log.info("Vertex AI: %s@%s was uploaded from %s already", parent, model.version_id, artifact_uri)
    if "champion" not in (model.version_aliases or []):
        model.versioning_registry.add_version_aliases(["champion"], version=model.version_id)
    versioned = f"{model.resource_name}@{model.version_id}"
    log.info("Vertex AI: %s is the champion (%s)", versioned, artifact_uri)
    host = f"{target.location}-aiplatform.googleapis.com"
    return {
        "resource_name": model.resource_name,
        "version_id": model.version_id,
        "versioned_name": versioned,  # what GCPC's VertexModel artifact carries (upload_model/remote_runner.py)
        "uri": f"https://{host}/v1/{versioned}",
        "champion": True,
        "uploaded": uploaded,
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
