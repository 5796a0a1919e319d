"""Vertex AI Model Registry: publish evaluated models as versions of one parent model.

Every candidate is uploaded with the ``challenger`` alias; the ``champion`` alias moves to a version
only when tpustream's own registry promoted it (the compare-and-swap in ``promote.py`` stays the
source of truth; Vertex mirrors it).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["VertexTarget", "publish"]

log = logging.getLogger(__name__)

DEFAULT_SERVING_IMAGE = "us-docker.pkg.dev/vertex-ai/prediction/pytorch-cpu.2-4:latest"


@dataclass(frozen=True, kw_only=True)
class VertexTarget:
    """Where to publish: the parent model's display name, project and region."""

    model_name: str
    project: str
    location: str = "us-central1"
    serving_image: str = DEFAULT_SERVING_IMAGE
    api_endpoint: str | None = None  # e.g. a regional endpoint; tests point it at loopback

    def __post_init__(self) -> None:
        if not self.model_name or not self.project:
            raise ValueError(
                "--vertex-model needs a model name and a project (--vertex-project or GOOGLE_CLOUD_PROJECT)"
            )


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


def publish(
    target: VertexTarget, *, artifact_uri: str, promoted: bool, labels: dict[str, str]
) -> dict[str, Any]:
    """Upload ``artifact_uri`` (a gs:// model directory) as a new version; alias it ``challenger``, and
    ``champion`` too when ``promoted``. Returns the model resource name and version id."""
    if not artifact_uri.startswith("gs://"):
        raise ValueError(f"Vertex AI reads models from gs:// only, not {artifact_uri}: use a gs:// registry")
    aiplatform = _init(target)
    existing = aiplatform.Model.list(filter=f'display_name="{target.model_name}"')
    parent = existing[0].resource_name if existing else None
    model = aiplatform.Model.upload(
        display_name=target.model_name,
        artifact_uri=artifact_uri,
        serving_container_image_uri=target.serving_image,
        parent_model=parent,
        is_default_version=promoted,
        version_aliases=["challenger"],
        labels={_label(k): _label(v) for k, v in labels.items()},
        sync=True,
    )
    if promoted:
        model.versioning_registry.add_version_aliases(["champion"], version=model.version_id)
    log.info(
        "Vertex AI: %s version %s (%s)",
        model.resource_name,
        model.version_id,
        "champion" if promoted else "challenger",
    )
    return {"resource_name": model.resource_name, "version_id": model.version_id, "champion": promoted}


def target_from_env(model_name: str | None, project: str | None, location: str | None) -> VertexTarget | None:
    if not model_name:
        return None
    return VertexTarget(
        model_name=model_name,
        project=project or os.environ.get("GOOGLE_CLOUD_PROJECT", ""),
        location=location or os.environ.get("GOOGLE_CLOUD_REGION", "us-central1"),
        api_endpoint=os.environ.get("TPUSTREAM_VERTEX_ENDPOINT") or None,
    )
