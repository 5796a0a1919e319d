"""Compile the DAG to YAML, submit it to Vertex AI Pipelines, schedule it for retraining."""

import logging
import os
import re
from typing import Any

from pipelines.tpu import Capacity
from pipelines.training import build_pipeline, check_image
from tpustream import storage

log = logging.getLogger(__name__)

__all__ = ["compile_pipeline", "submit_pipeline", "schedule_pipeline"]


def compile_pipeline(
    output: str,
    *,
    tpu: str | None,
    cpu_image: str,
    tpu_image: str | None = None,
    capacity: Capacity | None = None,
) -> str:
    """Write the pipeline YAML (TPU type and images fixed now; no credentials inside).

    Refuses placeholder images: a YAML that names an image nobody pushed fails only on Vertex, hours later.
    """
    from kfp import compiler

    check_image(cpu_image, "--image")
    if tpu:
        tpu_image = check_image(tpu_image or "", "--tpu-image")
    tpu_image = tpu_image or cpu_image
    for flag, image in (("--image", cpu_image), ("--tpu-image", tpu_image)):
        if "@sha256:" not in image:
            log.warning("%s %s is a tag: tags move; pin the digest (IMAGE@sha256:...) for reproducible runs",
                        flag, image)  # fmt: skip
    if tpu:
        (capacity or Capacity()).check_tpu(tpu)  # what Vertex would reject or never schedule, refused now
    pipeline = build_pipeline(tpu=tpu, cpu_image=cpu_image, tpu_image=tpu_image, capacity=capacity)
    compiler.Compiler().compile(pipeline, output)
    return output


def _init(project: str, region: str, api_endpoint: str | None) -> Any:
    from google.cloud import aiplatform

    # aiplatform.init only adds to a process-wide config: start each call from the defaults, so one
    # call's endpoint or anonymous credentials never carry into the next (notebooks, tests).
    aiplatform.initializer.global_config.__init__()  # type: ignore[misc]
    kwargs: dict[str, Any] = {"project": project, "location": region}
    if api_endpoint:
        kwargs["api_endpoint"] = api_endpoint
        if api_endpoint.startswith("http://"):  # a loopback endpoint (tests): REST, no credentials
            from google.auth.credentials import AnonymousCredentials

            kwargs.update(api_transport="rest", credentials=AnonymousCredentials())
    aiplatform.init(**kwargs)
    return aiplatform


_CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,?-]+$")


def check_cron(cron: str) -> None:
    """Five cron fields, optionally after ``TZ=Area/City`` or ``CRON_TZ=...``: checked here, before any
    credential is needed, so a typo is not reported as an authentication problem."""
    fields = cron.split()
    if fields and fields[0].startswith(("TZ=", "CRON_TZ=")):
        fields = fields[1:]
    if len(fields) != 5 or not all(_CRON_FIELD.match(f) for f in fields):
        raise ValueError(
            f"--cron {cron!r} is not a cron schedule: give five fields (minute hour day-of-month month "
            'day-of-week), e.g. "0 3 * * 1" for Mondays 03:00, optionally prefixed with "TZ=Europe/Paris"'
        )


def _check_template(template: str) -> None:
    if storage.is_gcs(template) or template.startswith("https://"):
        return  # Vertex reads these itself
    if not os.path.isfile(template):
        raise ValueError(
            f"--template {template}: no such file; compile one first: tpustream pipeline compile --output {template}"
        )


def _job(template: str, *, project: str, region: str, pipeline_root: str, parameters: dict[str, Any],
         labels: dict[str, str] | None, no_cache: bool, api_endpoint: str | None) -> Any:  # fmt: skip
    _check_template(template)
    if not storage.is_gcs(pipeline_root):
        raise ValueError(f"--pipeline-root must be a gs:// URI for Vertex AI, got {pipeline_root!r}")
    aiplatform = _init(project, region, api_endpoint or os.environ.get("TPUSTREAM_VERTEX_ENDPOINT"))
    return aiplatform.PipelineJob(
        display_name="tpustream-training", template_path=template, pipeline_root=pipeline_root,
        # enable_caching overrides every task's compiled caching option (aiplatform pipeline_jobs.py): only
        # ever pass False (or None = as compiled, which is off for every task).
        parameter_values=parameters, enable_caching=False if no_cache else None, labels=labels or {},
    )  # fmt: skip


def submit_pipeline(template: str, *, project: str, region: str, pipeline_root: str, parameters: dict[str, Any],
                    service_account: str | None = None, labels: dict[str, str] | None = None,
                    no_cache: bool = False, api_endpoint: str | None = None) -> str:  # fmt: skip
    """Submit one run; returns its resource name. The service account is set here, never compiled in."""
    job = _job(template, project=project, region=region, pipeline_root=pipeline_root, parameters=parameters,
               labels=labels, no_cache=no_cache, api_endpoint=api_endpoint)  # fmt: skip
    job.submit(service_account=service_account)
    return str(job.resource_name)


def schedule_pipeline(template: str, *, cron: str, project: str, region: str, pipeline_root: str,
                      parameters: dict[str, Any], service_account: str | None = None,
                      labels: dict[str, str] | None = None, api_endpoint: str | None = None) -> str:  # fmt: skip
    """Create a schedule (at most one run in flight: a tick while a run is active is skipped); returns its name."""
    check_cron(cron)
    job = _job(template, project=project, region=region, pipeline_root=pipeline_root, parameters=parameters,
               labels=labels, no_cache=True, api_endpoint=api_endpoint)  # fmt: skip
    # max_concurrent_run_count limits runs *started* at once; max_concurrent_active_run_count limits runs in a
    # non-terminal state (aiplatform_v1 types/schedule.py): a run still training at the next tick keeps that
    # tick from starting a second one, which would see no trained-on marker yet and train the same data
    # on a second slice. allow_queueing=False: such a tick is skipped, not queued behind the running one.
    schedule = job.create_schedule(
        cron=cron,
        display_name="tpustream-retraining",
        max_concurrent_run_count=1,
        max_concurrent_active_run_count=1,
        allow_queueing=False,
        service_account=service_account,
    )
    return str(schedule.resource_name)
