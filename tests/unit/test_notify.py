"""Who hears how a run ended (tpustream/run/notify.py): recipients and webhook URLs checked up front, the JSON a
webhook gets, and its POST to a receiver on loopback (tests/fakes/webhook_receiver.py stands in for Slack, Google
Chat and the like): a receiver that is down or refuses never fails the run, and its secret is never logged."""

import logging

import pytest

from tests.fakes.webhook_receiver import WebhookReceiver
from tpustream.errors import ConfigError
from tpustream.run.notify import (
    check_emails,
    check_webhook,
    console_link,
    post_webhook,
    redact_url,
    webhook_body,
)
from tpustream.run.outcome import RunFailure, RunOutcome

JOB = "projects/123/locations/europe-west4/pipelineJobs/tpustream-training-20261128"


def test_recipients_come_repeated_or_as_comma_lists_and_a_bad_one_is_named():
    assert check_emails(["ml@x.org", "a@x.org, b@y.org", "ml@x.org"]) == ["ml@x.org", "a@x.org", "b@y.org"]
    assert check_emails("a@x.org,b@y.org") == ["a@x.org", "b@y.org"]
    assert check_emails(None) == []
    with pytest.raises(ConfigError, match=r"--notify 'ml-team' is not an email address"):
        check_emails(["a@x.org", "ml-team"])


def test_a_webhook_url_is_checked_and_only_its_host_is_ever_shown(caplog):
    secret = "https://hooks.slack.com/services/T0/B0/s3cr3t?token=abc"
    assert redact_url(secret) == "https://hooks.slack.com/…"
    assert check_webhook(secret) == secret
    with pytest.raises(ConfigError) as refused:
        check_webhook("hooks.slack.com/services/T0/B0/s3cr3t")
    assert "s3cr3t" not in str(refused.value) and "http(s)" in str(refused.value)
    with caplog.at_level(logging.WARNING):
        check_webhook("http://relay.example.com/in/s3cr3t")
    assert "unencrypted" in caplog.text and "s3cr3t" not in caplog.text


def test_the_body_says_what_the_run_decided_and_where_to_look():
    kept = RunOutcome(
        step="evaluate", decision="kept", reason="top1 0.80 does not beat 0.85", report="gs://b/r"
    )
    body = webhook_body(pipeline="tpustream-training", job=JOB, state="SUCCEEDED", outcome=kept)
    link = "https://console.cloud.google.com/vertex-ai/locations/europe-west4/pipelines/runs/tpustream-training-20261128?project=123"
    assert console_link(JOB) == link and console_link("local-pipeline-exit-handler-1") == ""
    assert body["console"] == link and body["state"] == "SUCCEEDED" and body["error"] == ""
    assert (body["decision"], body["reason"], body["report"]) == ("kept", kept.reason, "gs://b/r")
    assert body["text"].startswith("tpustream-training succeeded: kept: top1 0.80 does not beat 0.85")
    # a step after the last decision failed: where the run had got to, and the error
    training = RunOutcome(step="check source", decision="training", reason="new data")
    failed = webhook_body(pipeline="p", job=JOB, state="FAILED", outcome=training, error="quota exceeded")
    assert failed["text"].startswith(
        "p failed: after check source (training: new data); error: quota exceeded"
    )
    nothing = webhook_body(pipeline="p", job="", state="FAILED", outcome=None, error="")
    assert nothing["text"] == "p failed: no step recorded an outcome" and nothing["decision"] == ""


def test_a_failed_run_names_the_task_that_failed_its_error_line_and_the_run():
    """The final status names no task (kfp.local: "Task exit-handler-1 failed.", and a made-up job name): the
    body names the first task the steps recorded as failed, its error line, and the run (issue 42)."""
    training = RunOutcome(step="check source", decision="training", reason="new data: 120 images")
    failures = [
        RunFailure(
            task="evaluate-model", error="model.pt does not match its model.json", at="2026-12-06T10:00"
        ),
        RunFailure(task="write-shards-0-4", error="OSError: disk full", at="2026-12-06T10:01"),
    ]
    body = webhook_body(
        pipeline="tpustream-training",
        job="local-pipeline-exit-handler-1",
        state="FAILED",
        outcome=training,
        error="Task exit-handler-1 failed.",
        run="tpustream-training-20261206-100000",
        failures=failures,
    )
    assert (
        body["failed_task"] == "evaluate-model" and body["error"] == "model.pt does not match its model.json"
    )
    assert (
        body["run"] == body["job"] == "tpustream-training-20261206-100000"
    )  # kfp.local's job name is no run's
    assert body["text"] == (
        "tpustream-training failed: after check source (training: new data: 120 images); evaluate-model failed: "
        "model.pt does not match its model.json (then write-shards-0-4 failed too); "
        "run: tpustream-training-20261206-100000"
    )
    # on Vertex the job is its resource name; a refusal's reason is not said twice; a success names no failure
    leak = RunOutcome(step="check data", decision="refused", reason="train-val-leak: 1 image")
    refused = webhook_body(
        pipeline="p",
        job=JOB,
        state="FAILED",
        outcome=leak,
        run="r1",
        failures=[RunFailure(task="check-data", error="train-val-leak: 1 image")],
    )
    assert refused["job"] == JOB and refused["failed_task"] == "check-data"
    assert refused["text"].startswith("p failed: refused: train-val-leak: 1 image; run: r1; https://")
    ok = webhook_body(pipeline="p", job="", state="SUCCEEDED", outcome=leak, run="r2", failures=failures)
    assert ok["failed_task"] == ok["error"] == "" and "failed" not in ok["text"]


def test_a_post_is_json_and_a_5xx_is_retried_once():
    body = {"text": "p succeeded: skipped: no new data", "state": "SUCCEEDED"}
    with WebhookReceiver(statuses=[503]) as hook:
        assert post_webhook(hook.url, body, timeout=5, retry_after=0)
    assert hook.bodies == [body, body]
    assert hook.requests[0]["content_type"].startswith("application/json")


def test_a_receiver_that_refuses_or_is_down_never_fails_the_run_nor_leaks_the_token(caplog):
    with caplog.at_level(logging.INFO), WebhookReceiver(statuses=[400, 200]) as hook:
        assert not post_webhook(hook.url, {"text": "x"}, timeout=5, retry_after=0)
    assert len(hook.requests) == 1  # a 4xx is not retried: the same body would be refused again
    down = hook.url  # its server is closed now
    assert not post_webhook(down, {"text": "x"}, timeout=5, retry_after=0)
    assert "HTTP 400" in caplog.text and "not notified" in caplog.text
    assert "s3cr3t-token" not in caplog.text and "127.0.0.1" in caplog.text


def test_the_body_shows_the_candidate_beside_the_majority_class_baseline(tmp_path):
    from tpustream.artifacts import EvalReport
    from tpustream.run.outcome import read_outcome, record_outcome

    evaluation = EvalReport.from_json(
        {
            "dataset": {"uri": "/d", "manifest_digest": "d" * 64, "val_samples": 40},
            "classes": ["circle", "square"],
            "candidate": {"top1": 0.1095, "top5": 1.0, "loss": 2.0},
            "baseline": {"answer": "circle", "top1": 0.394},
        }
    )
    uri = str(tmp_path / "run-outcome.json")
    record_outcome(
        uri, step="evaluate", decision="kept", reason="below", evaluation=evaluation, metric="top1"
    )
    kept = read_outcome(uri)
    body = webhook_body(pipeline="p", job=JOB, state="SUCCEEDED", outcome=kept)
    assert (body["metric"], body["candidate_value"], body["baseline_value"]) == ("top1", 0.1095, 0.394)
    assert "; candidate top1 0.1095 (majority-class baseline 0.3940)" in body["text"]
    # an outcome written before the numbers (or by a step that evaluated nothing) has none
    skipped = webhook_body(
        pipeline="p",
        job=JOB,
        state="SUCCEEDED",
        outcome=RunOutcome(step="check", decision="skipped", reason=""),
    )
    assert (skipped["metric"], skipped["candidate_value"], skipped["baseline_value"]) == ("", None, None)
    assert "baseline" not in skipped["text"]


def test_at_most_three_recipients_as_vertex_emails():
    assert check_emails(["a@x.org", "b@x.org,c@x.org", "a@x.org"]) == ["a@x.org", "b@x.org", "c@x.org"]
    with pytest.raises(ConfigError, match=r"--notify names 4 recipients .* at most 3 .*email-notifications"):
        check_emails("a@x.org,b@x.org,c@x.org,d@x.org")
    assert check_emails(["", " , "]) == []  # none: the caller decides (pipelines/run_checks.py)


def test_the_body_carries_the_decisions_code_and_class_for_a_receiver_to_branch_on():
    """A receiver reads what was decided from ``decision`` and ``code`` (and ``class_index``), never from the
    reason's words; a run that decided on no candidate has no code."""
    dropped = RunOutcome(
        step="evaluate",
        decision="kept",
        reason="class 2 accuracy drops by 0.3000, more than --max-class-drop 0.1",
        code="class-drop",
        class_index=2,
    )
    body = webhook_body(pipeline="p", job=JOB, state="SUCCEEDED", outcome=dropped)
    assert (body["decision"], body["code"], body["class_index"]) == ("kept", "class-drop", 2)
    promoted = RunOutcome(step="promote", decision="promoted", reason="version 2", code="wins")
    assert webhook_body(pipeline="p", job=JOB, state="SUCCEEDED", outcome=promoted)["code"] == "wins"
    skipped = RunOutcome(step="check source", decision="skipped", reason="no new data")
    assert webhook_body(pipeline="p", job=JOB, state="SUCCEEDED", outcome=skipped)["code"] is None
    assert webhook_body(pipeline="p", job=JOB, state="FAILED", outcome=None)["class_index"] is None


def test_a_refusal_is_said_once_whatever_the_failure_line_says():
    """The data check's refusal is the failed step's error: the body says it once, told by the outcome's
    ``decision``, not by comparing the two sentences (the error line is cut to one line, the reason is not)."""
    reason = "data check of gs://b/d: 1 anomaly, train-val-leak: 1 image\nseen in shard 3"
    leak = RunOutcome(step="check data", decision="refused", reason=reason)
    body = webhook_body(
        pipeline="p",
        job=JOB,
        state="FAILED",
        outcome=leak,
        failures=[
            RunFailure(task="check-data", error="data check of gs://b/d: 1 anomaly, train-val-leak: 1 image")
        ],
    )
    assert body["failed_task"] == "check-data" and "check-data failed" not in body["text"]


def test_after_a_refusal_another_tasks_failure_is_still_named():
    """Only the step that refused has its refusal as its error: a failure of another task is said too."""
    leak = RunOutcome(step="check data", decision="refused", reason="train-val-leak: 1 image")
    body = webhook_body(
        pipeline="p",
        job=JOB,
        state="FAILED",
        outcome=leak,
        failures=[RunFailure(task="notify-webhook", error="RuntimeError: boom")],
    )
    assert "notify-webhook failed: RuntimeError: boom" in body["text"]
