"""The checks submit and schedule run on a run before anything costs: the template exists, the run's parameters
have the names and types it declares, can train on its compiled TPU slice, name a TensorBoard instance in the
run's region and a source; and the options that set parameters (``--tensorboard``, ``--notify``,
``--notify-webhook``) merged into them. No credentials needed: they run even with ``--skip-preflight``.
"""

import logging
import os

from tpustream.errors import ConfigError
from tpustream.run.notify import EMAIL_DOC, MAX_EMAIL_RECIPIENTS, check_emails, check_webhook
from tpustream.storage import io as storage

from .compile import check_tensorboard
from .preflight.findings import WARN, raise_on_failure
from .preflight.parameters import check_parameters
from .template import (
    JsonValue,
    RunParameters,
    compiled_slice,
    has_email_step,
    load_template,
    reads_parameter,
    template_parameters,
)

log = logging.getLogger(__name__)

__all__ = [
    "check_run",
    "check_slice_parameters",
    "check_source_parameter",
    "check_template_file",
    "check_template_parameters",
    "check_tensorboard_parameter",
    "warn_unless_read",
    "with_notifications",
    "with_tensorboard",
]


def with_tensorboard(parameters: RunParameters, tensorboard: str | None) -> RunParameters:
    """The run's parameters with ``--tensorboard`` as the ``tensorboard`` parameter (None: as given)."""
    if tensorboard is None:
        return parameters
    given = parameters.get("tensorboard")
    if given not in (None, tensorboard):
        raise ConfigError(
            f"--tensorboard {tensorboard} and --param tensorboard={given} disagree: give one of them"
        )
    return {**parameters, "tensorboard": tensorboard}


def _emails(value: JsonValue) -> list[str] | str | None:
    """``--param notify_emails``'s value as check_emails takes it: a JSON list of addresses, or a comma list."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return [str(item) for item in value]
    raise ConfigError(
        f"--param notify_emails={value!r}: give email addresses, a JSON list "
        "(--param notify_emails='[\"a@example.com\"]') or A,B"
    )


def with_notifications(
    template: str, parameters: RunParameters, emails: list[str] | None, webhook: str | None
) -> RunParameters:
    """The run's parameters with ``--notify`` as ``notify_emails`` and ``--notify-webhook`` as
    ``notify_webhook`` (None: as given). Recipients need a template compiled with ``--notify``: the email
    step is Vertex's own component, compiled in or not (pipelines/training.py)."""
    parameters = dict(parameters)
    options: tuple[tuple[str, str, JsonValue], ...] = (
        ("--notify", "notify_emails", list(check_emails(emails)) if emails is not None else None),
        ("--notify-webhook", "notify_webhook", check_webhook(webhook) if webhook is not None else None),
    )
    for flag, name, value in options:
        if value is None:
            continue
        given = parameters.get(name)
        if given not in (None, value):
            shown = "the URL" if name == "notify_webhook" else given
            raise ConfigError(f"{flag} and --param {name}={shown} disagree: give one of them")
        parameters[name] = value
    if "notify_emails" in parameters:
        recipients = check_emails(_emails(parameters["notify_emails"]), flag="--param notify_emails")
        parameters["notify_emails"] = list(recipients)
    if "notify_webhook" in parameters:
        check_webhook(str(parameters["notify_webhook"]), flag="notify_webhook")
    if parameters.get("notify_emails"):
        spec = load_template(template)
        if spec is not None and not has_email_step(spec):
            raise ConfigError(
                f"--notify: {template} has no email notification step (Vertex's, {EMAIL_DOC}), so no one "
                "would be emailed: recompile it with `tpustream pipeline compile --notify EMAIL`"
            )
    elif "notify_emails" in parameters:
        _refuse_no_recipient(template, "--notify ''" if emails is not None else "--param notify_emails=")
    return parameters


def _refuse_no_recipient(template: str, given: str) -> None:
    """Refuse an empty ``notify_emails`` for a template with Vertex's email step (or one not readable here to
    tell): Vertex refuses that step without a recipient, so a run that trained and deployed would end FAILED.
    For a template without the step an empty list is its default and changes nothing."""
    spec = load_template(template)
    if spec is not None and not has_email_step(spec):
        return
    declared = template_parameters(spec).get("notify_emails") if spec is not None else None
    own = declared.default if declared is not None and isinstance(declared.default, list) else []
    compiled = f" ({', '.join(str(email) for email in own)})" if own else ""
    step = (
        "has Vertex's email step" if spec is not None else "may have Vertex's email step (not readable here)"
    )
    raise ConfigError(
        f"{given} gives no recipient, and {template} {step}, which Vertex refuses without one: the run would "
        f"end FAILED however it went ({EMAIL_DOC}). Give 1 to {MAX_EMAIL_RECIPIENTS} addresses, leave it out "
        f"for the template's recipients{compiled}, or recompile without --notify to email no one"
    )


def warn_unless_read(template: str, parameter: str) -> None:
    """Warn when no step of a local or gs:// template takes ``parameter``: its value would do nothing."""
    spec = load_template(template)
    if spec is not None and not reads_parameter(spec, parameter):
        log.warning(
            "--%s: no step of %s reads the %r parameter, so its runs will not act on it: recompile the "
            "template with a tpustream whose pipeline does",
            parameter,
            template,
            parameter,
        )


def check_template_file(template: str) -> None:
    """A local template exists (a gs:// or https:// one is Vertex's to read)."""
    if storage.is_gcs(template) or template.startswith("https://"):
        return  # Vertex reads these itself
    if not os.path.isfile(template):
        raise ConfigError(
            f"--template {template}: no such file; compile one first: tpustream pipeline compile --output {template}"
        )


def check_slice_parameters(template: str, parameters: RunParameters) -> None:
    """Refuse parameters that cannot train on the template's compiled TPU slice, before anything is written
    or rented: every host needs a train shard of its own (tpustream/loader/epoch_plan.py). A local template is
    read here; a gs:// or https:// one is Vertex's to read."""
    if not os.path.isfile(template):
        return
    spec = load_template(template)
    if spec is None:
        return
    tpu, hosts = compiled_slice(spec)
    declared = template_parameters(spec)

    def value(name: str) -> int:
        default = declared[name].default if name in declared else None
        raw = parameters.get(name, 0 if default is None else default)
        try:
            if isinstance(raw, list | dict) or raw is None:
                raise TypeError(raw)
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


def check_tensorboard_parameter(template: str, parameters: RunParameters, region: str) -> None:
    """The run's ``tensorboard`` (given, or the template's default): an instance in the run's region, for a
    template whose train step is a Vertex custom job. A local or gs:// template is read here."""
    spec = load_template(template)
    if spec is None:
        return  # https://: Vertex reads it
    declared = template_parameters(spec)
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


def check_template_parameters(template: str, parameters: RunParameters) -> None:
    """Refuse ``--param`` names and types the template does not declare: free, no credentials, so it runs
    even with --skip-preflight (pipelines/preflight/)."""
    spec = load_template(template)
    findings = check_parameters(template_parameters(spec) if spec else None, parameters)
    for finding in findings:
        if finding.status == WARN:
            log.warning("preflight %s", finding.line())
    raise_on_failure(findings, "`tpustream pipeline submit --help` lists the parameters")


def check_source_parameter(parameters: RunParameters) -> None:
    """Refuse a Vertex run without ``--param source``: the pipeline's default source is the bundled digits
    (what `pipeline run-local` demonstrates on), and a scheduled run that quietly trains on them instead of the
    user's bucket is a mistake found weeks later. Digits on purpose is ``--param source=digits``."""
    if not str(parameters.get("source", "")).strip():
        raise ConfigError(
            "--param source is required for a Vertex AI run: without it the run trains on the pipeline's default, "
            "the bundled digits. Give your images, e.g. --param source=gs://BUCKET/images "
            "(--param source=digits to train on the digits on purpose)"
        )


def check_run(template: str, parameters: RunParameters, *, region: str, pipeline_root: str) -> None:
    """Every check above, in the order a mistake is cheapest to report: the template, the parameters' names
    and types, the slice, the TensorBoard instance, the source, the pipeline root."""
    check_template_file(template)
    check_template_parameters(template, parameters)
    check_slice_parameters(template, parameters)
    check_tensorboard_parameter(template, parameters, region)
    check_source_parameter(parameters)
    if not storage.is_gcs(pipeline_root):
        raise ConfigError(f"--pipeline-root must be a gs:// URI for Vertex AI, got {pipeline_root!r}")
