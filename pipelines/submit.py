"""Send the compiled pipeline to Vertex AI Pipelines: one run (``submit_pipeline``) or a schedule for
retraining (``schedule_pipeline``), after the free checks of pipelines/run_checks.py and the preflight's cloud
checks (pipelines/preflight/). The service account is set here, never compiled in (pipelines/compile.py)."""

import logging
import os
import re
from typing import Any

from tpustream.errors import ConfigError
from tpustream.vertex.experiments import ExperimentError, check_experiment_name, get_or_create_experiment

from .preflight.clients import ApiEndpoints
from .preflight.cloud import check_cloud
from .preflight.findings import FAIL, OK, WARN, raise_on_failure
from .run_checks import check_run, warn_unless_read, with_notifications, with_tensorboard
from .template import RunParameters, load_template

log = logging.getLogger(__name__)

__all__ = ["check_cron", "schedule_pipeline", "submit_pipeline"]


def _init(project: str, region: str, api_endpoint: str | None) -> Any:
    from google.cloud import aiplatform

    # aiplatform.init only adds to a process-wide config: start each call from the defaults, so one
    # call's endpoint or anonymous credentials never carry into the next (notebooks, tests).
    aiplatform.initializer.global_config.__init__()  # type: ignore[misc]
    if not api_endpoint:
        aiplatform.init(project=project, location=region)
    elif api_endpoint.startswith("http://"):  # a loopback endpoint (tests): REST, no credentials
        from google.auth.credentials import AnonymousCredentials

        aiplatform.init(
            project=project,
            location=region,
            api_endpoint=api_endpoint,
            api_transport="rest",
            credentials=AnonymousCredentials(),
        )
    else:
        aiplatform.init(project=project, location=region, api_endpoint=api_endpoint)
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


def _run_preflight(
    template: str,
    *,
    project: str,
    region: str,
    pipeline_root: str,
    parameters: RunParameters,
    service_account: str | None,
    schedule: bool,
    endpoints: ApiEndpoints | None = None,
) -> None:
    """The cloud checks of pipelines/preflight/, logged one line each; raises PreflightFailed on a failure,
    before anything is sent to Vertex AI."""
    findings = check_cloud(
        load_template(template),
        project=project,
        region=region,
        pipeline_root=pipeline_root,
        registry=None,
        service_account=service_account,
        parameters=parameters,
        schedule=schedule,
        api_endpoints=endpoints,
    )
    levels = {OK: logging.INFO, WARN: logging.WARNING, FAIL: logging.ERROR}
    for finding in findings:
        log.log(levels[finding.status], "preflight %s", finding.line())
    if any(f.check == "credentials" and f.status == FAIL for f in findings):
        # the run is sent with the same credentials: skipping the checks would only fail later
        raise_on_failure(findings, "submitting needs them too: --skip-preflight would not help")
    raise_on_failure(findings, "fix them, or pass --skip-preflight to submit anyway")


def _job(
    template: str,
    *,
    project: str,
    region: str,
    pipeline_root: str,
    parameters: RunParameters,
    labels: dict[str, str] | None,
    no_cache: bool,
    api_endpoint: str | None,
    service_account: str | None,
    schedule: bool,
    skip_preflight: bool,
    preflight_endpoints: ApiEndpoints | None,
) -> Any:
    # The free checks first (template, parameters, slice), then the cloud's, then Vertex: a mistake is
    # reported before the first credential or TPU is needed.
    check_run(template, parameters, region=region, pipeline_root=pipeline_root)
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
    parameters: RunParameters,
    service_account: str | None = None,
    labels: dict[str, str] | None = None,
    no_cache: bool = False,
    api_endpoint: str | None = None,
    skip_preflight: bool = False,
    preflight_endpoints: ApiEndpoints | None = None,
    tensorboard: str | None = None,
    experiment: str | None = None,
    notify_emails: list[str] | None = None,
    notify_webhook: str | None = None,
) -> str:
    """Submit one run; returns its resource name. The service account is set here, never compiled in.

    The preflight (pipelines/preflight/) runs first; ``skip_preflight`` skips all of it but the
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
            template, with_tensorboard(parameters, tensorboard), notify_emails, notify_webhook
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
    parameters: RunParameters,
    service_account: str | None = None,
    labels: dict[str, str] | None = None,
    api_endpoint: str | None = None,
    skip_preflight: bool = False,
    preflight_endpoints: ApiEndpoints | None = None,
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
            template, with_tensorboard(parameters, tensorboard), notify_emails, notify_webhook
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

        warn_unless_read(template, "experiment")
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
