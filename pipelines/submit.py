"""Compile the DAG to YAML, submit it to Vertex AI Pipelines, schedule it for retraining."""

import logging
import os
import re
from typing import Any

from pipelines.tpu import Capacity
from pipelines.training import StepResources, build_pipeline, check_image
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
    resources: StepResources | None = None,
    serve_image: str = "",
) -> str:
    """Write the pipeline YAML (TPU type, images and the CPU steps' sizes fixed now; no credentials inside).

    Refuses placeholder images: a YAML that names an image nobody pushed fails only on Vertex, hours later.
    ``resources``: the CPU steps' CPU and memory limits (default ``StepResources()``; pipelines/training.py).
    ``serve_image``: the serving image the validate step runs in (default ``cpu_image``).
    """
    from kfp import compiler

    check_image(cpu_image, "--image")
    if tpu:
        tpu_image = check_image(tpu_image or "", "--tpu-image")
    tpu_image = tpu_image or cpu_image
    serve_image = check_image(serve_image, "--serving-image") if serve_image else cpu_image
    for flag, image in (("--image", cpu_image), ("--tpu-image", tpu_image), ("--serving-image", serve_image)):
        if "@sha256:" not in image:
            log.warning("%s %s is a tag: tags move; pin the digest (IMAGE@sha256:...) for reproducible runs",
                        flag, image)  # fmt: skip
    if tpu:
        (capacity or Capacity()).check_tpu(tpu)  # what Vertex would reject or never schedule, refused now
    pipeline = build_pipeline(
        tpu=tpu, cpu_image=cpu_image, tpu_image=tpu_image, capacity=capacity, resources=resources,
        serve_image=serve_image,
    )  # fmt: skip
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


def _find(node: Any, key: str) -> Any:
    """The first value under ``key`` anywhere in a parsed YAML document, or None."""
    if isinstance(node, dict):
        if key in node:
            return node[key]
        node = list(node.values())
    if isinstance(node, list):
        for child in node:
            found = _find(child, key)
            if found is not None:
                return found
    return None


def compiled_slice(spec: dict[str, Any]) -> tuple[str | None, int]:
    """The TPU type a compiled pipeline trains on (None: the CPU image) and its number of hosts."""
    from pipelines.tpu import TPU_TYPES

    pools = _find(spec, "worker_pool_specs")
    default = pools.get("runtimeValue", {}).get("constant") if isinstance(pools, dict) else pools
    machine = (default or [{}])[0].get("machine_spec", {}) if isinstance(default, list) else {}
    for name, tpu in TPU_TYPES.items():
        if tpu.machine_spec() == {k: v for k, v in machine.items() if k in tpu.machine_spec()} and machine:
            return name, tpu.hosts
    return None, 1


def check_slice_parameters(template: str, parameters: dict[str, Any]) -> None:
    """Refuse parameters that cannot train on the template's compiled TPU slice, before anything is written
    or rented: every host needs a train shard of its own (tpustream/epoch_plan.py). A local template is
    read here; a gs:// or https:// one is Vertex's to read."""
    if not os.path.isfile(template):
        return
    import yaml

    with open(template) as f:
        spec = yaml.safe_load(f)
    tpu, hosts = compiled_slice(spec)
    defaults = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})

    def value(name: str) -> int:
        raw = parameters.get(name, defaults.get(name, {}).get("defaultValue", 0))
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise ValueError(f"--param {name}={raw!r}: expected an integer") from None

    num_shards, workers = value("num_shards"), value("workers")
    if num_shards and num_shards < hosts:
        raise ValueError(
            f"--param num_shards={num_shards} cannot train on {tpu} ({hosts} hosts): every host needs a train "
            f"shard of its own; give at least {hosts}, {hosts * max(1, workers)} to keep every loader worker "
            "busy, or 0 (auto: one per loader worker of the slice)"
        )
    if num_shards and num_shards < hosts * max(1, workers):
        log.warning(
            "--param num_shards=%d on %s: fewer train shards than the slice's %d hosts x %d loader workers; "
            "the workers without a shard idle (0 = auto gives every one a shard)",
            num_shards, tpu or "the CPU image", hosts, max(1, workers),
        )  # fmt: skip


def _check_template_parameters(template: str, parameters: dict[str, Any]) -> None:
    """Refuse ``--param`` names and types the template does not declare: free, no credentials, so it runs
    even with --skip-preflight (pipelines/preflight.py)."""
    from pipelines import preflight

    spec = preflight.load_template(template)
    findings = preflight.check_parameters(preflight.template_parameters(spec) if spec else None, parameters)
    for finding in findings:
        if finding.status == preflight.WARN:
            log.warning("preflight %s", finding.line())
    preflight.raise_on_failure(findings, "`tpustream pipeline submit --help` lists the parameters")


def _run_preflight(
    template: str,
    *,
    project: str,
    region: str,
    pipeline_root: str,
    parameters: dict[str, Any],
    service_account: str | None,
    schedule: bool,
    endpoints: Any = None,
) -> None:
    """The cloud checks of pipelines/preflight.py, logged one line each; raises PreflightFailed on a failure,
    before anything is sent to Vertex AI."""
    from pipelines import preflight
    from pipelines.preflight_cloud import check_cloud

    findings = check_cloud(
        preflight.load_template(template),
        project=project,
        region=region,
        pipeline_root=pipeline_root,
        registry=None,
        service_account=service_account,
        parameters=parameters,
        schedule=schedule,
        api_endpoints=endpoints,
    )
    levels = {preflight.OK: logging.INFO, preflight.WARN: logging.WARNING, preflight.FAIL: logging.ERROR}
    for finding in findings:
        log.log(levels[finding.status], "preflight %s", finding.line())
    preflight.raise_on_failure(findings, "fix them, or pass --skip-preflight to submit anyway")


def _job(
    template: str,
    *,
    project: str,
    region: str,
    pipeline_root: str,
    parameters: dict[str, Any],
    labels: dict[str, str] | None,
    no_cache: bool,
    api_endpoint: str | None,
    service_account: str | None,
    schedule: bool,
    skip_preflight: bool,
    preflight_endpoints: Any,
) -> Any:
    # The free checks first (template, parameters, slice), then the cloud's, then Vertex: a mistake is
    # reported before the first credential or TPU is needed.
    _check_template(template)
    _check_template_parameters(template, parameters)
    check_slice_parameters(template, parameters)
    if not storage.is_gcs(pipeline_root):
        raise ValueError(f"--pipeline-root must be a gs:// URI for Vertex AI, got {pipeline_root!r}")
    if not skip_preflight:
        _run_preflight(
            template,
            project=project,
            region=region,
            pipeline_root=pipeline_root,
            parameters=parameters,
            service_account=service_account,
            schedule=schedule,
            endpoints=preflight_endpoints,
        )
    aiplatform = _init(project, region, api_endpoint or os.environ.get("TPUSTREAM_VERTEX_ENDPOINT"))
    return aiplatform.PipelineJob(
        display_name="tpustream-training", template_path=template, pipeline_root=pipeline_root,
        # enable_caching overrides every task's compiled caching option (aiplatform pipeline_jobs.py): only
        # ever pass False (or None = as compiled, which is off for every task).
        parameter_values=parameters, enable_caching=False if no_cache else None, labels=labels or {},
    )  # fmt: skip


def submit_pipeline(
    template: str,
    *,
    project: str,
    region: str,
    pipeline_root: str,
    parameters: dict[str, Any],
    service_account: str | None = None,
    labels: dict[str, str] | None = None,
    no_cache: bool = False,
    api_endpoint: str | None = None,
    skip_preflight: bool = False,
    preflight_endpoints: Any = None,
) -> str:
    """Submit one run; returns its resource name. The service account is set here, never compiled in.

    The preflight (pipelines/preflight.py) runs first; ``skip_preflight`` skips all of it but the
    parameter check. ``preflight_endpoints``: its ``ApiEndpoints`` (default: Google's)."""
    job = _job(
        template,
        project=project,
        region=region,
        pipeline_root=pipeline_root,
        parameters=parameters,
        labels=labels,
        no_cache=no_cache,
        api_endpoint=api_endpoint,
        service_account=service_account,
        schedule=False,
        skip_preflight=skip_preflight,
        preflight_endpoints=preflight_endpoints,
    )
    job.submit(service_account=service_account)
    return str(job.resource_name)


def schedule_pipeline(
    template: str,
    *,
    cron: str,
    project: str,
    region: str,
    pipeline_root: str,
    parameters: dict[str, Any],
    service_account: str | None = None,
    labels: dict[str, str] | None = None,
    api_endpoint: str | None = None,
    skip_preflight: bool = False,
    preflight_endpoints: Any = None,
) -> str:
    """Create a schedule (at most one run in flight: a tick while a run is active is skipped); returns its name.
    The preflight runs first, as for ``submit_pipeline``."""
    check_cron(cron)
    job = _job(
        template,
        project=project,
        region=region,
        pipeline_root=pipeline_root,
        parameters=parameters,
        labels=labels,
        no_cache=True,
        api_endpoint=api_endpoint,
        service_account=service_account,
        schedule=True,
        skip_preflight=skip_preflight,
        preflight_endpoints=preflight_endpoints,
    )
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
