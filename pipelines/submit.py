"""Compile the DAG to YAML, submit it to Vertex AI Pipelines, schedule it for retraining."""

import logging
import os
import re
from typing import Any

from tpustream.errors import ConfigError
from tpustream.pipelines.tpu import Capacity, compiled_slice
from tpustream.pipelines.training import StepResources, build_pipeline, check_image
from tpustream.release.notify import EMAIL_DOC, check_emails, check_webhook
from tpustream.storage import io as storage
from tpustream.vertex.experiments import ExperimentError, check_experiment_name, get_or_create_experiment

log = logging.getLogger(__name__)

__all__ = [
    "compile_pipeline",
    "submit_pipeline",
    "schedule_pipeline",
    "check_source_parameter",
    "check_tensorboard",
    "reads_parameter",
    "with_notifications",
]

# A Vertex AI TensorBoard instance's resource name (aiplatform_v1 CustomJobSpec.tensorboard)
_TENSORBOARD = re.compile(
    r"^projects/(?P<project>[^/\s]+)/locations/(?P<location>[a-z]+-[a-z]+\d+)/tensorboards/(?P<id>[\w-]+)$"
)
# "Set up for Vertex AI TensorBoard": the log bucket, the training job and the TensorBoard instance must be in
# the same region; the job needs a service account (aiplatform jobs.py: "service_account is required with
# provided tensorboard"), which the TPU job always has (the run's, pipelines/training.py).
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
) -> str:
    """Write the pipeline YAML (TPU type, images and the CPU steps' sizes fixed now; no credentials inside).

    Refuses placeholder images: a YAML that names an image nobody pushed fails only on Vertex, hours later.
    ``resources``: the CPU steps' CPU and memory limits (default ``StepResources()``; pipelines/training.py).
    ``serve_image``: the serving image the validate step runs in (default ``cpu_image``).
    ``tensorboard``: the default of the ``tensorboard`` parameter, the TensorBoard instance the TPU job
    streams to (a run may name another).
    ``notify_emails``: compile in Vertex's email notification to these recipients (the ``notify_emails``
    parameter's default; a run may name others); ``notify_webhook``: the ``notify_webhook`` parameter's
    default (pipelines/training.py, "Notifications").
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
    )
    compiler.Compiler().compile(pipeline, output)
    return output


def _with_tensorboard(parameters: dict[str, Any], tensorboard: str | None) -> dict[str, Any]:
    """The run's parameters with ``--tensorboard`` as the ``tensorboard`` parameter (None: as given)."""
    if tensorboard is None:
        return parameters
    given = parameters.get("tensorboard")
    if given not in (None, tensorboard):
        raise ConfigError(
            f"--tensorboard {tensorboard} and --param tensorboard={given} disagree: give one of them"
        )
    return {**parameters, "tensorboard": tensorboard}


def with_notifications(
    template: str, parameters: dict[str, Any], emails: list[str] | None, webhook: str | None
) -> dict[str, Any]:
    """The run's parameters with ``--notify`` as ``notify_emails`` and ``--notify-webhook`` as
    ``notify_webhook`` (None: as given). Recipients need a template compiled with ``--notify``: the email
    step is Vertex's own component, compiled in or not (pipelines/training.py)."""
    parameters = dict(parameters)
    for flag, name, value in (
        ("--notify", "notify_emails", check_emails(emails) if emails is not None else None),
        ("--notify-webhook", "notify_webhook", check_webhook(webhook) if webhook is not None else None),
    ):
        if value is None:
            continue
        given = parameters.get(name)
        if given not in (None, value):
            shown = "the URL" if name == "notify_webhook" else given
            raise ConfigError(f"{flag} and --param {name}={shown} disagree: give one of them")
        parameters[name] = value
    if "notify_emails" in parameters:
        parameters["notify_emails"] = check_emails(parameters["notify_emails"], flag="notify_emails")
    if "notify_webhook" in parameters:
        check_webhook(str(parameters["notify_webhook"]), flag="notify_webhook")
    if parameters.get("notify_emails"):
        from tpustream.pipelines import preflight

        spec = preflight.load_template(template)
        if spec is not None and not any(
            name.startswith("comp-vertex-pipelines-notification-email") for name in spec.get("components", {})
        ):
            raise ConfigError(
                f"--notify: {template} has no email notification step (Vertex's, {EMAIL_DOC}), so no one "
                "would be emailed: recompile it with `tpustream pipeline compile --notify EMAIL`"
            )
    return parameters


def _warn_unless_read(template: str, parameter: str) -> None:
    """Warn when no step of a local or gs:// template takes ``parameter``: its value would do nothing."""
    from tpustream.pipelines import preflight

    spec = preflight.load_template(template)
    if spec is not None and not reads_parameter(spec, parameter):
        log.warning(
            "--%s: no step of %s reads the %r parameter, so its runs will not act on it: recompile the "
            "template with a tpustream whose pipeline does",
            parameter,
            template,
            parameter,
        )


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
        raise ConfigError(
            f"--cron {cron!r} is not a cron schedule: give five fields (minute hour day-of-month month "
            'day-of-week), e.g. "0 3 * * 1" for Mondays 03:00, optionally prefixed with "TZ=Europe/Paris"'
        )


def _check_template(template: str) -> None:
    if storage.is_gcs(template) or template.startswith("https://"):
        return  # Vertex reads these itself
    if not os.path.isfile(template):
        raise ConfigError(
            f"--template {template}: no such file; compile one first: tpustream pipeline compile --output {template}"
        )


def check_slice_parameters(template: str, parameters: dict[str, Any]) -> None:
    """Refuse parameters that cannot train on the template's compiled TPU slice, before anything is written
    or rented: every host needs a train shard of its own (tpustream/loader/epoch_plan.py). A local template is
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
            raise ConfigError(f"--param {name}={raw!r}: expected an integer") from None

    num_shards, workers = value("num_shards"), value("workers")
    if num_shards and num_shards < hosts:
        raise ConfigError(
            f"--param num_shards={num_shards} cannot train on {tpu} ({hosts} hosts): every host needs a train "
            f"shard of its own; give at least {hosts}, {hosts * max(1, workers)} to keep every loader worker "
            "busy, or 0 (auto: one per loader worker of the slice)"
        )
    if num_shards and num_shards < hosts * max(1, workers):
        log.warning(
            "--param num_shards=%d on %s: fewer train shards than the slice's %d hosts x %d loader workers; "
            "the workers without a shard idle (0 = auto gives every one a shard)",
            num_shards,
            tpu or "the CPU image",
            hosts,
            max(1, workers),
        )


def _check_tensorboard_parameter(template: str, parameters: dict[str, Any], region: str) -> None:
    """The run's ``tensorboard`` (given, or the template's default): an instance in the run's region, for a
    template whose train step is a Vertex custom job. A local or gs:// template is read here."""
    from tpustream.pipelines import preflight

    spec = preflight.load_template(template)
    if spec is None:
        return  # https://: Vertex reads it
    declared = preflight.template_parameters(spec)
    default = declared["tensorboard"].default if "tensorboard" in declared else ""
    tensorboard = parameters.get("tensorboard", default)
    if not tensorboard:
        return
    check_tensorboard(str(tensorboard), region=region)
    if compiled_slice(spec)[0] is None:
        raise ConfigError(
            f"--tensorboard {tensorboard}: --template {template} trains on the CPU image inside the pipeline's own "
            "step, not as a Vertex AI custom job, so no TensorBoard instance can attach; compile it with --tpu"
        )


def reads_parameter(spec: dict[str, Any], name: str) -> bool:
    """Whether any task of the compiled ``spec`` takes the pipeline parameter ``name`` as an input."""
    wanted = {name, f"pipelinechannel--{name}"}
    components = spec.get("components", {})
    dags = [spec.get("root", {}).get("dag", {})]
    dags += [c["dag"] for c in components.values() if "dag" in c]
    return any(
        source.get("componentInputParameter") in wanted
        for dag in dags
        for task in dag.get("tasks", {}).values()
        # a group (an If, a ParallelFor, an exit handler, a sub-pipeline) only passes parameters on
        if "dag" not in components.get(task.get("componentRef", {}).get("name", ""), {})
        for source in task.get("inputs", {}).get("parameters", {}).values()
    )


def _check_template_parameters(template: str, parameters: dict[str, Any]) -> None:
    """Refuse ``--param`` names and types the template does not declare: free, no credentials, so it runs
    even with --skip-preflight (pipelines/preflight.py)."""
    from tpustream.pipelines import preflight

    spec = preflight.load_template(template)
    findings = preflight.check_parameters(preflight.template_parameters(spec) if spec else None, parameters)
    for finding in findings:
        if finding.status == preflight.WARN:
            log.warning("preflight %s", finding.line())
    preflight.raise_on_failure(findings, "`tpustream pipeline submit --help` lists the parameters")


def check_source_parameter(parameters: dict[str, Any]) -> None:
    """Refuse a Vertex run without ``--param source``: the pipeline's default source is the bundled digits
    (what `pipeline run-local` demonstrates on), and a scheduled run that quietly trains on them instead of the
    user's bucket is a mistake found weeks later. Digits on purpose is ``--param source=digits``."""
    if not str(parameters.get("source", "")).strip():
        raise ConfigError(
            "--param source is required for a Vertex AI run: without it the run trains on the pipeline's default, "
            "the bundled digits. Give your images, e.g. --param source=gs://BUCKET/images "
            "(--param source=digits to train on the digits on purpose)"
        )


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
    from tpustream.pipelines import preflight
    from tpustream.pipelines.preflight_cloud import check_cloud

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
    if any(f.check == "credentials" and f.status == preflight.FAIL for f in findings):
        # the run is sent with the same credentials: skipping the checks would only fail later
        preflight.raise_on_failure(findings, "submitting needs them too: --skip-preflight would not help")
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
    _check_tensorboard_parameter(template, parameters, region)
    check_source_parameter(parameters)
    if not storage.is_gcs(pipeline_root):
        raise ConfigError(f"--pipeline-root must be a gs:// URI for Vertex AI, got {pipeline_root!r}")
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
        display_name="tpustream-training",
        template_path=template,
        pipeline_root=pipeline_root,
        # enable_caching overrides every task's compiled caching option (aiplatform pipeline_jobs.py): only
        # ever pass False (or None = as compiled, which is off for every task).
        parameter_values=parameters,
        enable_caching=False if no_cache else None,
        labels=labels or {},
    )


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
    tensorboard: str | None = None,
    experiment: str | None = None,
    notify_emails: list[str] | None = None,
    notify_webhook: str | None = None,
) -> str:
    """Submit one run; returns its resource name. The service account is set here, never compiled in.

    The preflight (pipelines/preflight.py) runs first; ``skip_preflight`` skips all of it but the
    parameter check. ``preflight_endpoints``: its ``ApiEndpoints`` (default: Google's).
    ``tensorboard``: the Vertex AI TensorBoard instance the TPU job streams to (the ``tensorboard``
    parameter; default: the template's). ``experiment``: the Vertex AI Experiment the run joins, created if
    missing, through aiplatform's ``PipelineJob.submit(experiment=...)`` (tpustream/vertex/experiments.py).
    ``notify_emails``/``notify_webhook``: who hears how the run ended (``with_notifications``; default: the
    template's)."""
    if experiment:
        check_experiment_name(experiment)
    job = _job(
        template,
        project=project,
        region=region,
        pipeline_root=pipeline_root,
        parameters=with_notifications(
            template, _with_tensorboard(parameters, tensorboard), notify_emails, notify_webhook
        ),
        labels=labels,
        no_cache=no_cache,
        api_endpoint=api_endpoint,
        service_account=service_account,
        schedule=False,
        skip_preflight=skip_preflight,
        preflight_endpoints=preflight_endpoints,
    )
    # The experiment is got (or created) first, so that a refusal is the API's own error before any run
    # exists; submit then only adds the run to it.
    from google.cloud import aiplatform  # as _job's _init configured it

    joined = get_or_create_experiment(aiplatform, experiment) if experiment else None
    try:
        job.submit(service_account=service_account, experiment=joined)
    except RuntimeError as exc:  # aiplatform's: the run was created, adding it to the experiment failed
        if joined is None or not job.gca_resource.name:
            raise
        raise ExperimentError(
            f"submitted {job.gca_resource.name}, but it could not join experiment {experiment!r}: "
            f"{exc.__cause__ or exc}"
        ) from exc
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
    tensorboard: str | None = None,
    experiment: str | None = None,
    notify_emails: list[str] | None = None,
    notify_webhook: str | None = None,
) -> str:
    """Create a schedule (at most one run in flight: a tick while a run is active is skipped); returns its name.
    The preflight runs first, as for ``submit_pipeline``.

    ``tensorboard``: as for ``submit_pipeline``, for every run. ``experiment``: every run joins this Vertex AI
    Experiment. A schedule's runs carry no experiment of their own (tpustream/vertex/experiments.py says why): the
    name becomes the ``experiment`` pipeline parameter, which a step of each run joins; the experiment is got
    or created now, so that a refused one is reported before the schedule exists. ``notify_emails``/
    ``notify_webhook``: as for ``submit_pipeline``, for every run."""
    check_cron(cron)
    if experiment:
        check_experiment_name(experiment)
        parameters = {**parameters, "experiment": experiment}
    job = _job(
        template,
        project=project,
        region=region,
        pipeline_root=pipeline_root,
        parameters=with_notifications(
            template, _with_tensorboard(parameters, tensorboard), notify_emails, notify_webhook
        ),
        labels=labels,
        no_cache=True,
        api_endpoint=api_endpoint,
        service_account=service_account,
        schedule=True,
        skip_preflight=skip_preflight,
        preflight_endpoints=preflight_endpoints,
    )
    if experiment:
        from google.cloud import aiplatform  # as _job's _init configured it

        _warn_unless_read(template, "experiment")
        get_or_create_experiment(aiplatform, experiment)
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
