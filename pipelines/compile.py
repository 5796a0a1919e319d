"""Compile the DAG to the pipeline YAML that submit and schedule send to Vertex AI Pipelines: the TPU type,
images, CPU steps' sizes and parameter defaults fixed now (pipelines/training.py builds the DAG), no
credentials inside; and the TensorBoard instance check compile and the run-time checks share."""

import logging
import re

from tpustream.errors import ConfigError
from tpustream.run.notify import check_emails, check_webhook

from .resources import StepResources
from .steps import check_image
from .tpu import Capacity
from .training import build_pipeline

log = logging.getLogger(__name__)

__all__ = ["compile_pipeline", "check_tensorboard", "TENSORBOARD_SETUP_DOC"]

# A Vertex AI TensorBoard instance's resource name (aiplatform_v1 CustomJobSpec.tensorboard)
_TENSORBOARD = re.compile(
    r"^projects/(?P<project>[^/\s]+)/locations/(?P<location>[a-z]+-[a-z]+\d+)/tensorboards/(?P<id>[\w-]+)$"
)
# "Set up for Vertex AI TensorBoard": the log bucket, the training job and the TensorBoard instance must be in
# the same region; the job needs a service account (aiplatform jobs.py: "service_account is required with
# provided tensorboard"), which the TPU job always has (the run's, pipelines/steps.py).
TENSORBOARD_SETUP_DOC = "https://cloud.google.com/vertex-ai/docs/experiments/tensorboard-setup"


def check_tensorboard(tensorboard: str, *, region: str | None = None, flag: str = "--tensorboard") -> str:
    """Refuse what is not a TensorBoard instance's resource name, or one outside ``region`` (naming ``flag``)."""
    match = _TENSORBOARD.match(tensorboard)
    if match is None:
        raise ConfigError(
            f"{flag} {tensorboard!r} is not a Vertex AI TensorBoard instance: give its resource name, "
            "projects/PROJECT/locations/REGION/tensorboards/ID (`gcloud ai tensorboards list --region REGION` "
            "lists them)"
        )
    if region and match["location"] != region:
        raise ConfigError(
            f"{flag} {tensorboard}: the instance is in {match['location']} and the run in --region {region}; "
            f"Vertex AI needs the TensorBoard instance and the training job in one region ({TENSORBOARD_SETUP_DOC}): "
            f"use an instance in {region}"
        )
    return tensorboard


def compile_pipeline(
    output: str,
    *,
    tpu: str | None,
    cpu_image: str,
    tpu_image: str | None = None,
    capacity: Capacity | None = None,
    resources: StepResources | None = None,
    serve_image: str = "",
    tensorboard: str = "",
    notify_emails: list[str] | None = None,
    notify_webhook: str = "",
    tune: bool = False,
) -> str:
    """Write the pipeline YAML (TPU type, images and the CPU steps' sizes fixed now; no credentials inside).

    Refuses placeholder images: a YAML that names an image nobody pushed fails only on Vertex, hours later.
    ``resources``: the CPU steps' CPU and memory limits (default ``StepResources()``; pipelines/resources.py).
    ``serve_image``: the serving image the validate step runs in (default ``cpu_image``).
    ``tensorboard``: the default of the ``tensorboard`` parameter, the TensorBoard instance the TPU job
    streams to (a run may name another).
    ``notify_emails``: compile in Vertex's email notification to these recipients (the ``notify_emails``
    parameter's default; a run may name others); ``notify_webhook``: the ``notify_webhook`` parameter's
    default (pipelines/training.py, "Notifications"). ``tune``: compile the tune switch in (the candidate from a
    hyperparameter search: a Vertex AI HyperparameterTuningJob with ``tpu``; pipelines/training.py).
    """
    from kfp import compiler

    notify_emails = check_emails(notify_emails)
    check_webhook(notify_webhook)

    if tensorboard:
        check_tensorboard(tensorboard)
        if not tpu:
            raise ConfigError(
                "--tensorboard: the CPU image trains inside the pipeline's own step, not as a Vertex AI custom "
                "job, so no TensorBoard instance can attach to it: give --tpu"
            )
    check_image(cpu_image, "--image")
    if tpu:
        tpu_image = check_image(tpu_image or "", "--tpu-image")
    tpu_image = tpu_image or cpu_image
    serve_image = check_image(serve_image, "--serving-image") if serve_image else cpu_image
    for flag, image in (("--image", cpu_image), ("--tpu-image", tpu_image), ("--serving-image", serve_image)):
        if "@sha256:" not in image:
            log.warning(
                "%s %s is a tag: tags move; pin the digest (IMAGE@sha256:...) for reproducible runs",
                flag,
                image,
            )
    if tpu:
        (capacity or Capacity()).check_tpu(tpu)  # what Vertex would reject or never schedule, refused now
    pipeline = build_pipeline(
        tpu=tpu,
        cpu_image=cpu_image,
        tpu_image=tpu_image,
        capacity=capacity,
        resources=resources,
        serve_image=serve_image,
        tensorboard=tensorboard,
        notify_emails=notify_emails,
        notify_webhook=notify_webhook,
        tune=tune,
    )
    compiler.Compiler().compile(pipeline, output)
    return output
