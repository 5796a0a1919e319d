"""Tell people how a pipeline run ended: the recipients and webhook a run is given, and the webhook's POST.

Email is Vertex's own (GCPC's ``VertexNotificationEmailOp`` in an exit handler, pipelines/training.py: Vertex
sends the run's state and a link); the webhook is ours: one JSON POST with the run's name and state, what it
decided (tpustream/run/outcome.py: the run's ``decision`` and, once a candidate was decided on, the
promotion decision's ``code`` and ``class_index``, which a receiver branches on; ``reason`` is for people), the task that failed and its error line (what the steps recorded:
neither runner's final status says), the run report's URI and the console link. The body carries ``text``, the whole
story in one line, so that a Slack incoming webhook posts it as is; other receivers read the fields.

A webhook URL often carries its secret in the path or query (Slack, Google Chat): only ``redact_url``'s form
is ever logged. A receiver that is down never fails the run: one retry, then a warning.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import TypedDict

from tpustream.errors import ConfigError
from tpustream.registry.policy import DecisionCode
from tpustream.run.outcome import RunFailure, RunOutcome

__all__ = [
    "EMAIL_DOC",
    "MAX_EMAIL_RECIPIENTS",
    "check_emails",
    "check_webhook",
    "console_link",
    "post_webhook",
    "redact_url",
    "webhook_body",
    "WebhookBody",
]

log = logging.getLogger(__name__)

EMAIL_DOC = "https://cloud.google.com/vertex-ai/docs/pipelines/email-notifications"
# "Configure email notifications" (EMAIL_DOC): RECIPIENTS_LIST is "up to 3" addresses. GCPC's own docstring
# (google_cloud_pipeline_components/v1/vertex_notification_email/component.py, 2.22) states no bound.
MAX_EMAIL_RECIPIENTS = 3
_EMAIL = re.compile(r"^[^@\s,;<>]+@[^@\s,;<>]+\.[^@\s,;<>]+$")
_JOB = re.compile(r"^projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/pipelineJobs/(?P<job>[^/]+)$")


def check_emails(value: list[str] | tuple[str, ...] | str | None, flag: str = "--notify") -> list[str]:
    """The recipients of ``value`` (repeated options and/or comma lists), deduplicated in order; refuses one
    that is not an address, or more than Vertex emails (``MAX_EMAIL_RECIPIENTS``), naming ``flag``. An empty
    list is returned as is: whether none is right depends on the template (pipelines/run_checks.py)."""
    items = [value] if isinstance(value, str) else list(value or [])
    emails: list[str] = []
    for item in items:
        for email in (part.strip() for part in str(item).split(",")):
            if not email:
                continue
            if not _EMAIL.match(email):
                raise ConfigError(
                    f"{flag} {email!r} is not an email address: give NAME@DOMAIN (repeat the option or "
                    "separate addresses with commas)"
                )
            if email not in emails:
                emails.append(email)
    if len(emails) > MAX_EMAIL_RECIPIENTS:
        raise ConfigError(
            f"{flag} names {len(emails)} recipients ({', '.join(emails)}); Vertex AI Pipelines emails at most "
            f'{MAX_EMAIL_RECIPIENTS} ("Configure email notifications", {EMAIL_DOC}): give at most '
            f"{MAX_EMAIL_RECIPIENTS}, e.g. a group address for the rest"
        )
    return emails


def check_webhook(url: str, flag: str = "--notify-webhook") -> str:
    """Refuse what is not an http(s) URL with a host (naming ``flag``, never the URL's secret part)."""
    if not url:
        return url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{flag} {redact_url(url)}: not an http(s) URL; give the receiver's full URL "
            "(https://HOST/PATH, e.g. a Slack incoming webhook)"
        )
    if parts.scheme == "http" and parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        log.warning("%s %s is plain http: the run's outcome travels unencrypted", flag, redact_url(url))
    return url


def redact_url(url: str) -> str:
    """``https://hooks.slack.com/…``: the scheme and host only (a webhook's path or query is its secret)."""
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme or not parts.hostname:
        return "<a URL that is not http(s)>"
    port = f":{parts.port}" if parts.port else ""
    hidden = "/…" if parts.path.strip("/") or parts.query else ""
    return f"{parts.scheme}://{parts.hostname}{port}{hidden}"


def console_link(job_resource_name: str) -> str:
    """The run's page in the Google Cloud console; "" when ``job_resource_name`` is not a Vertex pipeline job
    (kfp.local's runs)."""
    match = _JOB.match(job_resource_name or "")
    if match is None:
        return ""
    return (
        f"https://console.cloud.google.com/vertex-ai/locations/{match['location']}/pipelines/runs/"
        f"{match['job']}?project={match['project']}"
    )


class WebhookBody(TypedDict):
    """The JSON a webhook receives: ``text`` (one line for a chat channel) and its parts."""

    text: str
    pipeline: str
    run: str  # the run's name (Vertex: the pipeline job's ID; kfp.local: PIPELINE-TIMESTAMP)
    job: str  # the Vertex pipeline job's resource name; the run's name outside Vertex
    state: str  # KFP's final state of the run's DAG
    decision: str  # RunOutcome.decision; "" when no step recorded one
    code: DecisionCode | None  # the promotion decision's code (Decision.code); None: no candidate decided on
    class_index: int | None  # the class a class-drop or below-class-recall decision is about; else None
    reason: str  # the decision in words, for people: branch on ``decision`` and ``code``
    step: str
    report: str
    failed_task: str  # the task that failed first ("" when the run succeeded or no step recorded one)
    error: str  # that task's error line, else the runner's final-status message; "" when the run succeeded
    console: str  # the run's page in the Vertex AI console ("" outside Vertex)
    metric: str  # what the candidate was decided on ("" when no candidate was evaluated)
    candidate_value: float | None  # the candidate's value of ``metric``
    baseline_value: float | None  # the majority-class baseline's, on the same split (None: not measured)


def webhook_body(
    *,
    pipeline: str,
    job: str,
    state: str,
    outcome: RunOutcome | None,
    error: str = "",
    run: str = "",
    failures: Sequence[RunFailure] = (),
) -> WebhookBody:
    """The JSON a webhook gets. ``job``: the final status's ``pipeline_job_resource_name`` (a Vertex job's
    resource name; kfp.local makes one up); ``run``: the run's name; ``state``: KFP's final state of the run's
    DAG (SUCCEEDED, FAILED, CANCELLED); ``outcome``: what the run decided last (None: no step got that far);
    ``error``: the final status's error message, which names no task (Vertex: "The DAG failed because some
    tasks failed."; kfp.local: "Task exit-handler-1 failed."); ``failures``: what the steps recorded
    (outcome.read_failures, first first): the first is the task the message names."""
    link = console_link(job)
    failed = failures[0] if failures and state != "SUCCEEDED" else None
    if outcome is None:
        story = "no step recorded an outcome"
    elif state == "SUCCEEDED" or outcome.decision == "refused":
        story = outcome.line()
    else:  # a step after the last decision failed: say where the run had got to
        story = f"after {outcome.step} ({outcome.line()})"
    text = f"{pipeline} {state.lower()}: {story}"
    if failed is not None:
        # The step that refused failed with its refusal as its error: said once. Told by the task, not by
        # comparing sentences: a refusing step's task is its name hyphenated ("check data": check-data).
        said = (
            outcome is not None
            and outcome.decision == "refused"
            and failed.task == outcome.step.replace(" ", "-")
        )
        if not said:
            text += f"; {failed.line()}"
        others = [failure.task for failure in failures[1:]]
        if others:
            text += f" (then {', '.join(others)} failed too)"
    elif state != "SUCCEEDED" and error:
        text += f"; error: {error}"
    if outcome is not None and outcome.metric and outcome.candidate_value is not None:
        text += f"; candidate {outcome.metric} {outcome.candidate_value:.4f}"
        if outcome.baseline_value is not None:
            text += f" (majority-class baseline {outcome.baseline_value:.4f})"
    if run:
        text += f"; run: {run}"
    if outcome is not None and outcome.report:
        text += f"; report: {outcome.report}"
    if link:
        text += f"; {link}"
    return {
        "text": text,
        "pipeline": pipeline,
        "run": run,
        "job": job if link or not run else run,
        "state": state,
        "decision": outcome.decision if outcome else "",
        "code": outcome.code if outcome else None,
        "class_index": outcome.class_index if outcome else None,
        "reason": outcome.reason if outcome else "",
        "step": outcome.step if outcome else "",
        "report": outcome.report if outcome else "",
        "failed_task": failed.task if failed else "",
        "error": (failed.error if failed else error) if state != "SUCCEEDED" else "",
        "console": link,
        "metric": outcome.metric if outcome else "",
        "candidate_value": outcome.candidate_value if outcome else None,
        "baseline_value": outcome.baseline_value if outcome else None,
    }


def post_webhook(
    url: str, body: WebhookBody, *, timeout: float = 10.0, retries: int = 1, retry_after: float = 5.0
) -> bool:
    """POST ``body`` as JSON to ``url``; True when the receiver answered 2xx. A connection error, a timeout or
    a 5xx is retried ``retries`` times after ``retry_after`` seconds; a 4xx is not (the same body would be
    refused again). Never raises: a notification must not fail the run it reports."""
    data = json.dumps(body).encode()
    shown = redact_url(url)
    for attempt in range(retries + 1):
        request = urllib.request.Request(
            url, data=data, method="POST", headers={"Content-Type": "application/json; charset=utf-8"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                log.info("notified %s (HTTP %d)", shown, response.status)
                return True
        except urllib.error.HTTPError as exc:
            problem, retry = f"HTTP {exc.code}", exc.code >= 500
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            problem, retry = f"{type(reason).__name__}: {reason}", True
        if not retry or attempt == retries:
            log.warning("webhook %s not notified (%s): the run's outcome is in its logs", shown, problem)
            return False
        log.info("webhook %s: %s, retrying in %.0f s", shown, problem, retry_after)
        time.sleep(retry_after)
    return False
