"""A run tells people how it ended (issue 35, item 5): the compiled DAG's exit handlers (Vertex's email op with
the recipients only when asked; our webhook step always), submit/schedule's ``--notify``, and the webhook step
through the real kfp.local on a tiny DAG, for a run that succeeds and one that fails. The receiver is
tests/fakes/webhook_receiver.py on loopback, standing in for Slack or Google Chat."""

import pytest
import yaml
from tpustream.pipelines.run_checks import with_notifications
from tpustream.pipelines.template import CompiledTemplate, reads_parameter
from tpustream.pipelines.training import OUTCOME_PATH
from typer.testing import CliRunner

from tests.fakes.webhook_receiver import WebhookReceiver
from tpustream.cli.main import app
from tpustream.errors import ConfigError

pytestmark = pytest.mark.integration

DIGEST = "@sha256:" + "c" * 64
IMAGES = ("--image", "europe-docker.pkg.dev/proj/tpustream/cpu" + DIGEST)
EMAIL_COMPONENT = "comp-vertex-pipelines-notification-email"


def _compile(tmp_path, *flags):
    path = str(tmp_path / "pipeline.yaml")
    result = CliRunner().invoke(app, ["pipeline", "compile", "--output", path, "--tpu", "", *IMAGES, *flags])
    assert result.exit_code == 0, result.output
    with open(path) as f:
        return path, yaml.safe_load(f), result.stdout


def _exit_tasks(spec):
    """The exit tasks of the compiled pipeline, in any DAG: the tasks that run once their upstream is done,
    however it ended (``ALL_UPSTREAM_TASKS_COMPLETED``), by their DAG's component ("root" for the root DAG)."""
    dags = {"root": spec["root"]["dag"], **{n: c["dag"] for n, c in spec["components"].items() if "dag" in c}}
    return {
        (dag_name, name): task
        for dag_name, dag in dags.items()
        for name, task in dag.get("tasks", {}).items()
        if task.get("triggerPolicy", {}).get("strategy")
    }


def test_notify_compiles_in_vertex_email_with_its_recipients_and_the_webhook_exit_step(tmp_path):
    url = "https://hooks.slack.com/services/T0/B0/s3cr3t"
    path, spec, printed = _compile(
        tmp_path, "--notify", "ml@x.org", "--notify", "oncall@x.org,ml@x.org", "--notify-webhook", url
    )
    assert "email ml@x.org, oncall@x.org; webhook https://hooks.slack.com/…" in printed
    assert "s3cr3t" not in printed
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["notify_emails"]["defaultValue"] == ["ml@x.org", "oncall@x.org"]
    assert params["notify_webhook"]["defaultValue"] == url
    # ONE exit handler (issue 43, item 5): no exit handler inside a sub-pipeline, which no Google page shows;
    # Vertex's email op and our webhook step are both exit tasks of the root DAG's one handler group, each
    # given that group's final status
    exits = _exit_tasks(spec)
    assert sorted(exits) == [("root", "notify-webhook"), ("root", "vertex-pipelines-notification-email")]
    (group,) = [
        name for name, task in spec["root"]["dag"]["tasks"].items() if name.startswith("exit-handler")
    ]
    for task in exits.values():
        assert task["dependentTasks"] == [group]
        assert task["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    email, webhook = exits["root", "vertex-pipelines-notification-email"], exits["root", "notify-webhook"]
    assert email["componentRef"]["name"] == EMAIL_COMPONENT
    assert (
        email["inputs"]["parameters"]["pipeline_task_final_status"]["taskFinalStatus"]["producerTask"]
        == group
    )
    assert webhook["inputs"]["parameters"]["status"]["taskFinalStatus"]["producerTask"] == group
    assert email["inputs"]["parameters"]["recipients"]["componentInputParameter"] == "notify_emails"
    executor = spec["deploymentSpec"]["executors"]["exec-vertex-pipelines-notification-email"]["container"]
    assert executor["command"][-1].endswith("vertex_notification_email.executor")
    assert webhook["inputs"]["parameters"]["webhook"]["componentInputParameter"] == "notify_webhook"
    outcome = webhook["inputs"]["parameters"]["run_outcome"]["runtimeValue"]["constant"]
    # the run's job ID, not its display name (issue 43, item 8); every step records at the same path
    assert outcome == "{{$.pipeline_root}}/{{$.pipeline_job_uuid}}/run-outcome.json" == OUTCOME_PATH
    group_tasks = spec["components"][spec["root"]["dag"]["tasks"][group]["componentRef"]["name"]]["dag"][
        "tasks"
    ]
    assert (
        group_tasks["check-source"]["inputs"]["parameters"]["run_outcome"]["runtimeValue"]["constant"]
        == outcome
    )
    compiled = CompiledTemplate(spec)
    assert reads_parameter(compiled, "notify_emails") and reads_parameter(compiled, "notify_webhook")
    # submit/schedule --notify: recipients checked and set as the parameter; a conflict is refused
    assert with_notifications(path, {}, ["a@x.org"], None) == {"notify_emails": ["a@x.org"]}
    assert with_notifications(path, {"notify_emails": "a@x.org,b@x.org"}, None, None) == {
        "notify_emails": ["a@x.org", "b@x.org"]}  # fmt: skip
    with pytest.raises(ConfigError, match="--notify-webhook and --param notify_webhook=the URL disagree"):
        with_notifications(path, {"notify_webhook": "https://a.example/x"}, None, "https://b.example/y")
    # a value that is no address list is a one-line error, not a TypeError from deep inside
    with pytest.raises(ConfigError, match=r"--param notify_emails=5: give email addresses"):
        with_notifications(path, {"notify_emails": 5}, None, None)


def test_without_notify_there_is_no_email_step_and_notify_is_refused_for_that_template(tmp_path):
    path, spec, _ = _compile(tmp_path)
    with open(path) as f:
        text = f.read()
    assert EMAIL_COMPONENT not in spec["components"] and "VertexNotificationEmail" not in text
    assert spec["root"]["inputDefinitions"]["parameters"]["notify_emails"]["defaultValue"] == []
    # the webhook step is always there ("" URL: it only logs), the one handler's exit task
    assert list(_exit_tasks(spec)) == [("root", "notify-webhook")]
    compiled = CompiledTemplate(spec)
    assert not reads_parameter(compiled, "notify_emails") and reads_parameter(compiled, "notify_webhook")
    with pytest.raises(ConfigError, match="recompile it with `tpustream pipeline compile --notify EMAIL`"):
        with_notifications(path, {}, ["ml@x.org"], None)
    assert with_notifications(path, {}, None, "https://hooks.example/x") == {
        "notify_webhook": "https://hooks.example/x"
    }


def _tiny_dag(fail: bool):
    """A step that records an outcome as the deciding steps do, then fails or not; the real webhook step as
    the exit task, wired as build_pipeline wires it."""
    from kfp import dsl
    from tpustream.pipelines.steps import LOCAL_IMAGE, build_components
    from tpustream.pipelines.training import OUTCOME_PATH, PIPELINE_NAME

    def decide(run_outcome: str, fail: bool) -> None:
        from tpustream.run.outcome import failure_recorded, record_outcome

        with failure_recorded(run_outcome, "decide"):
            if fail:
                record_outcome(
                    run_outcome, step="check data", decision="refused", reason="train-val-leak: 1 image"
                )
                raise RuntimeError("data check failed")
            record_outcome(
                run_outcome, step="promote", decision="promoted", reason="version 3", report="r.html"
            )

    decide_op = dsl.component(decide, base_image=LOCAL_IMAGE, install_kfp_package=False)
    notify_op = build_components(LOCAL_IMAGE, LOCAL_IMAGE, None).notify

    @dsl.pipeline(name=PIPELINE_NAME)
    def tiny(notify_webhook: str = "") -> None:
        notify = notify_op(
            webhook=notify_webhook,
            run_outcome=OUTCOME_PATH,
            pipeline=PIPELINE_NAME,
            run=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
        )
        with dsl.ExitHandler(notify):
            decide_op(run_outcome=OUTCOME_PATH, fail=fail)

    return tiny


def test_the_webhook_step_posts_the_outcome_of_a_run_that_succeeds_and_of_one_that_fails(tmp_path):
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    with WebhookReceiver() as hook:
        _tiny_dag(fail=False)(notify_webhook=hook.url)
        with pytest.raises(RuntimeError, match="decide"):
            _tiny_dag(fail=True)(notify_webhook=hook.url)
    promoted, refused = hook.bodies
    assert promoted["state"] == "SUCCEEDED" and promoted["decision"] == "promoted"
    run = promoted["run"]  # kfp.local's run name, PIPELINE-TIMESTAMP: the job it reports is that run
    assert run.startswith("tpustream-training-") and promoted["job"] == run
    assert (
        promoted["text"] == f"tpustream-training succeeded: promoted: version 3; run: {run}; report: r.html"
    )
    assert promoted["pipeline"] == "tpustream-training" and promoted["console"] == ""  # kfp.local: no console
    assert promoted["failed_task"] == promoted["error"] == ""
    assert refused["state"] == "FAILED" and refused["decision"] == "refused"
    assert refused["reason"] == "train-val-leak: 1 image" and refused["step"] == "check data"
    assert refused["text"].startswith("tpustream-training failed: refused: train-val-leak: 1 image")
    # the task that failed and its error line, not kfp.local's "Task exit-handler-1 failed." (issue 42)
    assert refused["failed_task"] == "decide" and refused["error"] == "RuntimeError: data check failed"
    assert "decide failed: RuntimeError: data check failed" in refused["text"]
    assert refused["run"] != run and refused["job"] == refused["run"] in refused["text"]


def test_on_vertex_the_exit_step_reads_the_outcome_from_the_pipeline_root_and_links_the_console(
    tmp_path, gcs_bucket
):
    """The compiled notify-webhook task run as Vertex runs it (tests/fakes/vertex/emulation.py): its container
    command, its placeholders resolved by the backend, the final status Vertex hands an exit task, and the
    outcome that check data recorded under a gs:// pipeline root (the GCS test server)."""
    from tests.fakes.vertex.emulation import run_container_task
    from tpustream.errors import TpustreamError
    from tpustream.run.outcome import failure_recorded, read_outcome, record_outcome

    path, _, _ = _compile(tmp_path)
    run_root, job = f"{gcs_bucket}/pipeline-root", "tpustream-training-20261128030000"
    reason = "data check of gs://b/datasets/x: 1 anomaly: train-val-leak"
    outcome_uri = f"{run_root}/{job}/run-outcome.json"
    record_outcome(outcome_uri, step="check data", decision="refused", reason=reason)
    with pytest.raises(TpustreamError), failure_recorded(outcome_uri, "check-data"):  # as the step records it
        raise TpustreamError(reason)
    failed = {"state": "FAILED", "pipeline_task_name": "exit-handler-1",
              "error": {"code": 9, "message": "The DAG failed because some tasks failed."}}  # fmt: skip
    with WebhookReceiver() as hook:
        done = run_container_task(
            path, "notify-webhook", pipeline_params={"notify_webhook": hook.url}, run_root=run_root,
            workdir=tmp_path, job_id=job, project="123", location="europe-west4", final_status=failed,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (told,) = hook.bodies
    assert told["state"] == "FAILED" and told["decision"] == "refused" and told["reason"] == reason
    assert told["failed_task"] == "check-data" and told["error"] == reason  # not Vertex's "some tasks failed"
    assert told["run"] == job and told["job"] == f"projects/123/locations/europe-west4/pipelineJobs/{job}"
    assert told["console"] == (
        f"https://console.cloud.google.com/vertex-ai/locations/europe-west4/pipelines/runs/{job}?project=123"
    )
    # our lines name the receiver by its host only (KFP's executor logs its whole input, the URL too: README)
    ours = [line for line in done.stdout.splitlines() if "notifying" in line]
    assert ours and not any("s3cr3t-token" in line for line in ours)
    assert read_outcome(f"{run_root}/{job}/run-outcome.json").decision == "refused"  # read, not changed


def test_on_vertex_a_failing_step_still_runs_both_notifications(tmp_path, gcs_bucket):
    """The DAG compiled with the email and the webhook, scheduled as Vertex schedules a PipelineSpec
    (tests/fakes/vertex/emulation.py ``tasks_reached``) while train fails: nothing after train starts, and both
    exit tasks do, each given the one handler's FAILED status; the webhook step, run as Vertex runs it with that
    status, reads what train recorded under the run's job ID and posts it."""
    from tests.fakes.vertex.emulation import run_container_task, tasks_reached
    from tpustream.errors import TpustreamError
    from tpustream.run.outcome import failure_recorded, record_outcome

    path, spec, _ = _compile(tmp_path, "--notify", "ml@x.org", "--notify-webhook", "https://hooks.example/x")
    reached = tasks_reached(spec, failing={"train-model"})
    assert "train-model" in reached and "evaluate-model" not in reached and "promote-model" not in reached
    handler = {"state": "FAILED", "pipeline_task_name": "exit-handler-1"}
    assert reached["vertex-pipelines-notification-email"] == reached["notify-webhook"] == handler
    succeeded = tasks_reached(spec, failing=set())
    assert (
        succeeded["vertex-pipelines-notification-email"]["state"]
        == "SUCCEEDED"
        == succeeded["notify-webhook"]["state"]
    )
    # what the steps record where the webhook step reads it: the same path, under the run's job ID
    run_root, job = f"{gcs_bucket}/pipeline-root", "tpustream-training-20261130030000"
    outcome_uri = OUTCOME_PATH.replace("{{$.pipeline_root}}", run_root).replace(
        "{{$.pipeline_job_uuid}}", job
    )
    record_outcome(outcome_uri, step="check source", decision="training", reason="300 new images")
    with pytest.raises(TpustreamError), failure_recorded(outcome_uri, "train-model"):
        raise TpustreamError("the slice was preempted 3 times")
    error = {"code": 9, "message": "The DAG failed because some tasks failed."}
    with WebhookReceiver() as hook:
        done = run_container_task(
            path, "notify-webhook", pipeline_params={"notify_webhook": hook.url}, run_root=run_root,
            workdir=tmp_path, job_id=job, final_status={**reached["notify-webhook"], "error": error},
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (told,) = hook.bodies
    assert told["state"] == "FAILED" and told["run"] == job and told["decision"] == "training"
    assert told["failed_task"] == "train-model" and told["error"] == "the slice was preempted 3 times"


def test_submit_and_schedule_carry_the_recipients_and_the_webhook_to_vertex(
    tmp_path, gcs_bucket, monkeypatch
):
    """Through the real aiplatform client to the recording endpoint (tests/fakes/vertex/), which parses each
    body as the aiplatform v1 proto: the run and a run the schedule makes carry both parameters, and the email
    exit handler is in the submitted spec."""
    from google.cloud.aiplatform.utils import gcs_utils
    from tpustream.pipelines.submit import schedule_pipeline, submit_pipeline

    from tests.fakes.vertex import VertexRecorder

    # Patched: PipelineJob.submit checks the pipeline-root bucket's owner through Cloud Resource Manager, a
    # Google service that cannot be reached from here.
    monkeypatch.setattr(
        gcs_utils, "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist",
        lambda output_artifacts_gcs_dir=None, **kw: output_artifacts_gcs_dir,
    )  # fmt: skip
    path, _, _ = _compile(tmp_path, "--notify", "ml@x.org")
    url = "https://hooks.slack.com/services/T0/B0/s3cr3t"
    common = dict(
        project="proj", region="europe-west4", pipeline_root=f"{gcs_bucket}/root", skip_preflight=True,
        parameters={"registry": f"{gcs_bucket}/registry", "source": f"{gcs_bucket}/images"},
        notify_emails=["oncall@x.org, ml@x.org"], notify_webhook=url,
    )  # fmt: skip
    recorder = VertexRecorder()
    try:
        submit_pipeline(path, api_endpoint=recorder.url, **common)
        schedule = schedule_pipeline(path, cron="0 3 * * 1", api_endpoint=recorder.url, **common)
        run = recorder.pipeline_jobs[recorder.scheduled_run(schedule)]
    finally:
        recorder.close()
    assert recorder.rejected == []
    (job,) = [
        r["body"] for r in recorder.requests if r["method"] == "POST" and r["path"].endswith("/pipelineJobs")
    ]
    for body in (job, run):
        values = body["runtimeConfig"]["parameterValues"]
        assert values["notify_emails"] == ["oncall@x.org", "ml@x.org"] and values["notify_webhook"] == url
    assert EMAIL_COMPONENT in job["pipelineSpec"]["components"]


def test_run_local_leaves_the_email_out_and_says_so_and_a_failed_run_still_notifies(tmp_path, caplog):
    """The real DAG through kfp.local, failing early (a source that does not exist fails at plan shards, after
    check source recorded "training"): the exit step runs anyway and tells the webhook where the run had got
    to and that it failed; the recipients cannot be emailed from here, which the run says."""
    import logging

    from tpustream.pipelines.local import PipelineFailed, run_local

    with (
        caplog.at_level(logging.WARNING),
        WebhookReceiver() as hook,
        pytest.raises(PipelineFailed, match="plan-shards failed: unknown source"),
    ):
        run_local(
            root=str(tmp_path / "run"), log_path=str(tmp_path / "run.log"), source=str(tmp_path / "missing"),
            pretrained="", notify_emails=["ml@x.org"], notify_webhook=hook.url,
        )  # fmt: skip
    assert "notify_emails: not sent by a local run" in caplog.text
    (told,) = hook.bodies
    assert told["state"] == "FAILED" and told["console"] == ""
    assert (told["step"], told["decision"]) == ("check source", "training")
    assert told["text"].startswith("tpustream-training failed: after check source (training: ")
    # the real DAG's step that failed, its error line and the run's name (issue 42)
    assert told["failed_task"] == "plan-shards" and told["error"].startswith("unknown source"), told
    assert f"; plan-shards failed: {told['error']}" in told["text"]
    assert told["run"].startswith("tpustream-training-") and told["job"] == told["run"]


def test_the_email_exit_task_and_the_webhook_step_are_compiled_with_caching_off(tmp_path):
    """Every task of the pipeline is compiled with caching off (pipelines/training.py): Vertex's email op and
    the webhook step beside it too (issue 43, item 1: they were ``enableCache: true``)."""
    _, spec, _ = _compile(tmp_path, "--notify", "ml@x.org")
    tasks = dict(spec["root"]["dag"]["tasks"])
    for component in spec["components"].values():
        tasks.update(component.get("dag", {}).get("tasks", {}))
    assert "vertex-pipelines-notification-email" in tasks and "notify-webhook" in tasks
    cached = [name for name, task in tasks.items() if task.get("cachingOptions", {}).get("enableCache")]
    assert cached == []


def test_compile_with_an_empty_notify_compiles_no_email_step_and_says_so(tmp_path):
    """``--notify ""`` names no one: no email step (Vertex refuses one without a recipient), said in the
    compile line rather than an empty "email" list."""
    path, spec, printed = _compile(tmp_path, "--notify", "", "--notify", " , ")
    assert EMAIL_COMPONENT not in spec["components"]
    assert spec["root"]["inputDefinitions"]["parameters"]["notify_emails"]["defaultValue"] == []
    assert "no email step: --notify gave no address" in printed and "; email" not in printed


def test_more_than_three_recipients_are_refused_naming_vertexs_limit_and_its_page(tmp_path):
    """Vertex emails at most three recipients ("Configure email notifications"): a fourth is refused at
    compile, submit and schedule (``--notify`` or ``--param notify_emails``), before anything reaches Vertex."""
    from tpustream.run.notify import EMAIL_DOC

    four = ["a@x.org", "b@x.org", "c@x.org,d@x.org"]
    result = CliRunner().invoke(
        app,
        ["pipeline", "compile", "--output", str(tmp_path / "p.yaml"), "--tpu", "", *IMAGES]
        + [arg for email in four for arg in ("--notify", email)],
    )
    assert result.exit_code != 0 and not (tmp_path / "p.yaml").exists()
    assert "--notify names 4 recipients" in result.output and "at most 3" in result.output
    assert EMAIL_DOC in result.output.replace("\n", "")
    path, _, _ = _compile(tmp_path, "--notify", "a@x.org,b@x.org", "--notify", "c@x.org")  # three is fine
    with pytest.raises(ConfigError, match=r"--notify names 4 recipients .*at most 3 .*email-notifications"):
        with_notifications(path, {}, four, None)
    with pytest.raises(ConfigError, match=r"--param notify_emails names 4 recipients .*at most 3"):
        with_notifications(path, {"notify_emails": four}, None, None)


def test_no_recipient_is_refused_for_a_template_with_the_email_step_before_vertex_hears_of_it(
    tmp_path, gcs_bucket, monkeypatch
):
    """``--notify ""`` or ``--param notify_emails=`` (``[]``) on a template compiled with the email step:
    Vertex refuses that step without a recipient and the run ends FAILED however it went (issue 43, item 1),
    so submit and schedule refuse it in one line, through the real aiplatform client to the recording
    endpoint, which hears nothing. On a template without the step an empty list is its default: submitted."""
    from google.cloud.aiplatform.utils import gcs_utils
    from tpustream.pipelines.submit import schedule_pipeline, submit_pipeline

    from tests.fakes.vertex import VertexRecorder

    # Patched: PipelineJob.submit checks the pipeline-root bucket's owner through Cloud Resource Manager, a
    # Google service that cannot be reached from here.
    monkeypatch.setattr(
        gcs_utils, "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist",
        lambda output_artifacts_gcs_dir=None, **kw: output_artifacts_gcs_dir,
    )  # fmt: skip
    with_email, _, _ = _compile(tmp_path, "--notify", "ml@x.org")
    (tmp_path / "plain").mkdir()
    plain, _, _ = _compile(tmp_path / "plain")
    source = {"registry": f"{gcs_bucket}/registry", "source": f"{gcs_bucket}/images"}
    common = dict(
        project="proj", region="europe-west4", pipeline_root=f"{gcs_bucket}/root", skip_preflight=True
    )
    recorder = VertexRecorder()
    try:
        for submit in (submit_pipeline, lambda *a, **kw: schedule_pipeline(*a, cron="0 3 * * 1", **kw)):
            for given, parameters, emails in (
                ("--notify ''", source, [""]),
                ("--param notify_emails=", {**source, "notify_emails": ""}, None),
                ("--param notify_emails=", {**source, "notify_emails": []}, None),
            ):
                with pytest.raises(ConfigError) as refused:
                    submit(
                        with_email, parameters=parameters, notify_emails=emails, api_endpoint=recorder.url,
                        **common,
                    )  # fmt: skip
                line = str(refused.value)
                assert "\n" not in line and line.startswith(
                    f"{given} gives no recipient, and {with_email} has"
                )
                assert "the run would end FAILED" in line and "(ml@x.org)" in line
                assert "recompile without --notify" in line
        assert [r for r in recorder.requests if r["method"] == "POST"] == []
        submit_pipeline(plain, parameters=source, notify_emails=[""], api_endpoint=recorder.url, **common)
    finally:
        recorder.close()
    assert recorder.rejected == []
    (job,) = [
        r["body"] for r in recorder.requests if r["method"] == "POST" and r["path"].endswith("/pipelineJobs")
    ]
    assert job["runtimeConfig"]["parameterValues"]["notify_emails"] == []
