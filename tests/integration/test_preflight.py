"""`tpustream pipeline preflight` and the checks submit/schedule run first: parameters against the compiled
template, TPU region, IAM, buckets and TPU quota, through the real clients to loopback fakes (the GCS-API
server; tests/fakes/google_apis.py for IAM, Resource Manager and Cloud Quotas; tests/fakes/vertex/ for Vertex)."""

import time

import pytest
from tpustream.pipelines.compile import compile_pipeline
from tpustream.pipelines.preflight import (
    FAIL,
    OK,
    WARN,
    ApiEndpoints,
    PreflightFailed,
    bucket_serves_region,
    check_parameters,
    parse_parameters,
    preflight,
)
from tpustream.pipelines.submit import submit_pipeline
from tpustream.pipelines.template import load_template, template_parameters
from typer.testing import CliRunner

from tests.fakes.google_apis import GoogleApisFake, cpu_quota_info, tpu_quota_info

pytestmark = pytest.mark.integration

DIGEST = "@sha256:" + "b" * 64
CPU_IMAGE = "europe-docker.pkg.dev/proj/tpustream/cpu" + DIGEST
TPU_IMAGE = "europe-docker.pkg.dev/proj/tpustream/tpu" + DIGEST
SA = "trainer@proj.iam.gserviceaccount.com"
MEMBER = f"serviceAccount:{SA}"
SOURCE = "gs://images/cats-and-dogs"  # submit and schedule require --param source (never read here)


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    """Compiled once per module: a v3-8 (single host) and a v5e-16 (4 hosts) pipeline."""
    root = tmp_path_factory.mktemp("templates")
    out = {}
    for tpu in ("v3-8", "v5e-16"):
        out[tpu] = str(root / f"{tpu}.yaml")
        compile_pipeline(out[tpu], tpu=tpu, cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE)
    return out


@pytest.fixture
def google():
    """A project where everything a first run needs is granted (the GCS server holds the buckets, which
    fake-gcs-server places in US-CENTRAL1 whatever location they are created with)."""
    fake = GoogleApisFake()
    fake.service_accounts[SA] = {
        "caller": {"iam.serviceAccounts.actAs"},
        "policy": {"bindings": [{"role": "roles/iam.serviceAccountUser", "members": [MEMBER]}]},
    }
    fake.project_permissions["proj"] = {"aiplatform.pipelineJobs.create", "aiplatform.schedules.create"}
    fake.project_policies["proj"] = {
        "bindings": [
            {"role": "roles/aiplatform.user", "members": [MEMBER, "user:me@example.com"]},
            {"role": "roles/storage.objectAdmin", "members": [MEMBER]},
        ]
    }
    fake.quota_infos["proj"] = [
        tpu_quota_info("v3", {"us-central1": 8, "europe-west4": 8}),
        tpu_quota_info("v3", {"us-central1": 0}, spot=True),  # on-demand runs count the on-demand quota only
        tpu_quota_info("v5e", {"us-central1": 16}),
        cpu_quota_info({"us-central1": 24, "europe-west4": 24}),
    ]
    yield fake
    fake.close()
    assert fake.rejected == []  # every body parsed as the API would parse it


def _run(template, google, bucket, **overrides):
    kwargs = dict(
        project="proj",
        region="us-central1",
        pipeline_root=f"{bucket}/runs",
        registry=f"{bucket}/registry",
        service_account=SA,
        parameters={"registry": f"{bucket}/registry", "epochs": 3},
        api_endpoints=ApiEndpoints(**google.endpoints()),
        timeout=5.0,
    )
    kwargs.update(overrides)
    findings = preflight(template, **kwargs)
    return {f.check: f for f in findings}, findings


def test_a_ready_project_passes_every_check(templates, google, gcs_bucket):
    by_check, findings = _run(templates["v3-8"], google, gcs_bucket, schedule=True)
    assert [f.status for f in findings] == [OK] * len(findings), "\n".join(f.line() for f in findings)
    every_check = (
        "parameters tpu-region act-as project-permissions service-account-act-as service-account-roles"
    )
    quotas = {"tpu-quota", "cpu-quota"}
    assert set(by_check) == {*every_check.split(), "bucket pipeline-root", "bucket registry", *quotas}
    assert findings[0].check == "parameters"  # free, first
    paths = [r["path"] for r in google.requests]
    assert f"/v1/projects/-/serviceAccounts/{SA}:testIamPermissions" in paths
    tested = next(r for r in google.requests if r["path"] == "/v3/projects/proj:testIamPermissions")
    assert tested["body"]["permissions"] == ["aiplatform.pipelineJobs.create", "aiplatform.schedules.create"]
    quota_pages = [r for r in google.requests if r["path"].endswith("/quotaInfos")]
    assert len(quota_pages) == 6  # 8 quotas in pages of 3: every page read, by each quota check
    assert "(8)" in by_check["tpu-quota"].message and "(16)" in by_check["cpu-quota"].message


def test_missing_act_as_fails_naming_the_role(templates, google, gcs_bucket):
    google.service_accounts[SA]["caller"] = set()
    by_check, _ = _run(templates["v3-8"], google, gcs_bucket)
    act_as = by_check["act-as"]
    assert act_as.status == FAIL
    assert "iam.serviceAccounts.actAs" in act_as.message and "roles/iam.serviceAccountUser" in act_as.message
    assert SA in act_as.message
    # The account itself without actAs on itself (its training job runs as it): seen in no policy.
    google.service_accounts[SA]["policy"] = {}
    by_check, _ = _run(templates["v3-8"], google, gcs_bucket)
    assert by_check["service-account-act-as"].status == WARN
    assert (
        f"--member={MEMBER} --role=roles/iam.serviceAccountUser" in by_check["service-account-act-as"].message
    )


def test_unknown_service_account_and_missing_project_role(templates, google, gcs_bucket):
    google.project_permissions["proj"] = set()
    by_check, _ = _run(
        templates["v3-8"], google, gcs_bucket, service_account="typo@proj.iam.gserviceaccount.com"
    )
    assert by_check["act-as"].status == FAIL and "does not exist" in by_check["act-as"].message
    permissions = by_check["project-permissions"]
    assert permissions.status == FAIL
    assert "aiplatform.pipelineJobs.create (grant roles/aiplatform.user)" in permissions.message


def test_registry_bucket_outside_the_region(templates, google, gcs_bucket):
    """europe-west4 offers v3 and has quota; the buckets are in US-CENTRAL1."""
    vertex = {"registry": f"{gcs_bucket}/registry", "vertex_model": "flowers"}
    by_check, _ = _run(templates["v3-8"], google, gcs_bucket, region="europe-west4", parameters=vertex)
    registry = by_check["bucket registry"]
    assert registry.status == FAIL
    assert (
        "US-CENTRAL1, not in europe-west4" in registry.message
        and "model-registry/import-model" in registry.message
    )
    assert (
        by_check["bucket pipeline-root"].status == WARN
        and "egress" in by_check["bucket pipeline-root"].message
    )
    assert by_check["tpu-region"].status == OK and by_check["tpu-quota"].status == OK
    # Without a Model Registry upload the registry is only GCS: a warning.
    by_check, _ = _run(templates["v3-8"], google, gcs_bucket, region="europe-west4")
    assert by_check["bucket registry"].status == WARN


def test_missing_bucket_fails_with_the_command_to_create_it(templates, google, gcs_bucket):
    by_check, _ = _run(templates["v3-8"], google, gcs_bucket, pipeline_root="gs://no-such-bucket-e/runs")
    root = by_check["bucket pipeline-root"]
    assert root.status == FAIL
    assert "gcloud storage buckets create gs://no-such-bucket-e --location=us-central1" in root.message


def test_tpu_type_not_in_the_region_table_warns_with_the_pages_to_check(templates, google, gcs_bucket):
    """The table goes stale (Google adds TPU regions and zones): a region it lacks is a warning naming the
    pages to check, not a failure that blocks a run Vertex would accept."""
    by_check, _ = _run(templates["v3-8"], google, gcs_bucket, region="us-west1")
    region = by_check["tpu-region"]
    assert region.status == WARN
    assert (
        "has TPU v3 for Vertex AI custom training in europe-west4, us-central1, not us-west1"
        in region.message
    )
    assert "https://cloud.google.com/tpu/docs/regions-zones" in region.message


TENSORBOARD = "projects/proj/locations/us-central1/tensorboards/42"


def test_tensorboard_needs_a_regional_log_bucket_in_the_run_region(
    templates, google, gcs_server, monkeypatch
):
    """ "Set up Vertex AI TensorBoard": the log bucket (under the pipeline root) must be regional and in the
    job's and the instance's region. fake-gcs-server reports every bucket as US-CENTRAL1: a proxy in front of
    it answers the bucket's metadata as a multi-region US bucket, as GCS would for one created so."""
    from tests.fakes.gcs import FaultProxy, make_bucket

    make_bucket(gcs_server.url, "tb-regional")
    make_bucket(gcs_server.url, "tb-multi")
    proxy = FaultProxy(gcs_server.url, fault_rate=0.0)

    def multi_region(method: str, path: str, body: bytes) -> bytes:
        if method == "GET" and path.split("?")[0].endswith("/b/tb-multi"):
            return body.replace(b'"location":"US-CENTRAL1"', b'"location":"US"').replace(
                b'"locationType":"region"', b'"locationType":"multi-region"'
            )
        return body

    proxy.rewrite = multi_region
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    try:
        params = {"registry": "gs://tb-regional/registry", "epochs": 3, "tensorboard": TENSORBOARD}
        run = dict(registry="gs://tb-regional/registry", parameters=params)
        ok, _ = _run(templates["v3-8"], google, "gs://tb-regional", **run)
        assert ok["tensorboard-bucket"].status == OK, ok["tensorboard-bucket"].line()
        multi, _ = _run(templates["v3-8"], google, "gs://tb-multi", **run)
        finding = multi["tensorboard-bucket"]
        assert finding.status == FAIL and "gs://tb-multi is a multi-region bucket (US)" in finding.message
        assert "--location=us-central1" in finding.message and "tensorboard-setup" in finding.message
        assert multi["bucket pipeline-root"].status == OK  # a US bucket serves us-central1, for reading
        elsewhere, _ = _run(templates["v3-8"], google, "gs://tb-regional", region="europe-west4", **run)
        assert elsewhere["tensorboard-bucket"].status == FAIL
        assert "is in US-CENTRAL1, the training job and TensorBoard in europe-west4" in (
            elsewhere["tensorboard-bucket"].message
        )
        without, _ = _run(templates["v3-8"], google, "gs://tb-multi")  # no instance: no rule
        assert "tensorboard-bucket" not in without
    finally:
        proxy.close()


def test_tpu_quota_zero_or_too_small_fails_unreadable_warns(templates, google, gcs_bucket):
    google.quota_infos["proj"][0] = tpu_quota_info("v3", {"us-central1": 0})
    by_check, _ = _run(templates["v3-8"], google, gcs_bucket)
    quota = by_check["tpu-quota"]
    assert (
        quota.status == FAIL
        and "is 0 in us-central1" in quota.message
        and "JOB_STATE_QUEUED" in quota.message
    )
    google.quota_infos["proj"][2] = tpu_quota_info("v5e", {"us-central1": 8})
    by_check, _ = _run(templates["v5e-16"], google, gcs_bucket)
    assert by_check["tpu-quota"].status == FAIL and "v5e-16 needs 16" in by_check["tpu-quota"].message
    google.quota_status = 403
    by_check, _ = _run(templates["v5e-16"], google, gcs_bucket)
    unreadable = by_check["tpu-quota"]
    assert unreadable.status == WARN and "iam-admin/quotas?project=proj" in unreadable.message
    assert "roles/cloudquotas.viewer" in unreadable.message


def test_a_tuning_job_needs_quota_for_its_parallel_trials(tmp_path, google, gcs_bucket):
    """The tune switch runs parallel_trials slices at once: the default space's 2 of v5e-16 need 32 chips."""
    from tpustream.storage import io as storage

    template = str(tmp_path / "tune.yaml")
    compile_pipeline(template, tpu="v5e-16", cpu_image=CPU_IMAGE, tpu_image=TPU_IMAGE, tune=True)
    by_check, _ = _run(template, google, gcs_bucket)  # v5e quota 16 in us-central1
    quota = by_check["tpu-quota"]
    assert quota.status == FAIL and "2 parallel trials of v5e-16 need 32" in quota.message
    assert "lower parallel_trials" in quota.message
    space = f"{gcs_bucket}/spaces/one-at-a-time.yaml"
    storage.write_bytes(space, b"parallel_trials: 1\nparameters: {lr: {min: 0.01, max: 0.1, scale: log}}\n")
    parameters = {"registry": f"{gcs_bucket}/registry", "tune_space": space}
    by_check, _ = _run(template, google, gcs_bucket, parameters=parameters)
    assert by_check["tpu-quota"].status == "ok", by_check["tpu-quota"].message


def test_cpu_quota_below_the_largest_cpu_step_fails_naming_it(templates, google, gcs_bucket):
    """Evaluate asks Vertex for 16 vCPUs (pipelines/resources.py StepResources.eval_cpu): a region whose
    custom-training CPU quota is below that cannot place the step; no CPU quota listed is a warning."""
    google.quota_infos["proj"][3] = cpu_quota_info({"us-central1": 8})
    by_check, _ = _run(templates["v3-8"], google, gcs_bucket)
    quota = by_check["cpu-quota"]
    assert quota.status == FAIL and "is 8 in us-central1" in quota.message and "16 vCPUs" in quota.message
    assert "--eval-cpu" in quota.message and "iam-admin/quotas?project=proj" in quota.message
    del google.quota_infos["proj"][3]
    by_check, _ = _run(templates["v3-8"], google, gcs_bucket)
    assert (
        by_check["cpu-quota"].status == WARN
        and "no Vertex AI training CPU quota" in by_check["cpu-quota"].message
    )


def test_a_slow_quota_api_is_a_warning_not_a_hang(templates, google, gcs_bucket):
    google.quota_delay = 3.0
    started = time.monotonic()
    by_check, _ = _run(templates["v3-8"], google, gcs_bucket, timeout=0.5)
    assert time.monotonic() - started < 2.5
    assert (
        by_check["tpu-quota"].status == WARN and "could not read TPU quota" in by_check["tpu-quota"].message
    )


def test_parameters_mistyped_name_and_wrong_type(templates):
    """No credentials, no server: the template alone."""
    declared = template_parameters(load_template(templates["v3-8"]))
    findings = check_parameters(declared, {"registry": "gs://b/r", "epoch": 3})
    assert [f.status for f in findings] == [FAIL]
    assert "--param epoch: no such pipeline parameter; did you mean epochs?" in findings[0].message
    given = parse_parameters(declared, {"registry": "gs://b/r", "epochs": "three", "bf16": "yes"})
    messages = [f.message for f in check_parameters(declared, given)]
    assert "--param epochs=three: epochs takes an integer (NUMBER_INTEGER) (default 10)" in messages
    assert any(m.startswith("--param bf16=yes: bf16 takes true or false") for m in messages)
    assert any("needs --param registry" in f.message for f in check_parameters(declared, {}))
    unrelated = check_parameters(declared, {"registry": "gs://b/r", "zzzzzz": 1})[0].message
    assert "the pipeline's parameters: " in unrelated and "epochs" in unrelated


def test_param_values_take_the_template_types(templates):
    declared = template_parameters(load_template(templates["v3-8"]))
    typed = parse_parameters(
        declared,
        {"source": "123", "epochs": "3", "lr": "0.5", "bf16": "False", "epoch": "3", "registry": "gs://b"},
    )
    assert typed == {"source": "123", "epochs": 3, "lr": 0.5, "bf16": False, "epoch": 3, "registry": "gs://b"}
    assert [
        f.status for f in check_parameters(declared, {k: v for k, v in typed.items() if k != "epoch"})
    ] == [OK]


@pytest.mark.parametrize(
    ("location", "region", "data_locations", "serves"),
    [
        ("US-CENTRAL1", "us-central1", (), True),
        ("EUROPE-WEST4", "us-central1", (), False),
        ("US", "us-central1", (), True),
        ("US", "europe-west4", (), False),
        ("EU", "europe-west4", (), True),
        ("EU", "europe-west2", (), False),  # London is in Europe, not in the EU multi-region
        ("NAM4", "us-east1", (), True),
        ("NAM4", "us-west1", (), False),
        # a configurable dual-region (location US) names its regions
        ("US", "us-east5", ("US-CENTRAL1", "US-EAST1"), False),
        ("US", "us-east1", ("US-CENTRAL1", "US-EAST1"), True),
    ],
)
def test_bucket_location_serves_region(location, region, data_locations, serves):
    assert bucket_serves_region(location, region, data_locations) is serves


def _vertex_recorder(monkeypatch):
    from google.cloud.aiplatform.utils import gcs_utils

    from tests.fakes.vertex import VertexRecorder

    # Patched as in test_pipeline.py: PipelineJob.submit checks the bucket's owner through Cloud Resource
    # Manager's v1 API, which the aiplatform SDK calls at Google only.
    monkeypatch.setattr(
        gcs_utils,
        "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist",
        lambda output_artifacts_gcs_dir=None, **kw: output_artifacts_gcs_dir,
    )
    return VertexRecorder()


def test_submit_refuses_before_any_vertex_call_when_preflight_fails(
    templates, google, gcs_bucket, monkeypatch
):
    google.service_accounts[SA]["caller"] = set()
    recorder = _vertex_recorder(monkeypatch)
    endpoints = ApiEndpoints(**google.endpoints())
    common = dict(
        project="proj",
        region="us-central1",
        pipeline_root=f"{gcs_bucket}/runs",
        service_account=SA,
        api_endpoint=recorder.url,
        preflight_endpoints=endpoints,
    )
    try:
        with pytest.raises(
            PreflightFailed, match=r"act-as: you lack iam.serviceAccounts.actAs.*--skip-preflight"
        ):
            submit_pipeline(
                templates["v3-8"], parameters={"registry": f"{gcs_bucket}/r", "source": SOURCE}, **common
            )
        assert recorder.requests == [] and google.requests  # refused after asking Google, before Vertex
        # --skip-preflight: no IAM, bucket or quota call; the parameter check still runs, first.
        google.requests.clear()
        with pytest.raises(PreflightFailed, match="did you mean epochs"):
            submit_pipeline(
                templates["v3-8"],
                parameters={"registry": f"{gcs_bucket}/r", "source": SOURCE, "epoch": 3},
                skip_preflight=True,
                **common,
            )
        assert recorder.requests == [] and google.requests == []
        name = submit_pipeline(
            templates["v3-8"],
            parameters={"registry": f"{gcs_bucket}/r", "source": SOURCE, "epochs": 3},
            skip_preflight=True,
            **common,
        )
        assert name.startswith("projects/proj/locations/us-central1/pipelineJobs/") and google.requests == []
        # Everything granted: the preflight passes and the run goes to Vertex.
        google.service_accounts[SA]["caller"] = {"iam.serviceAccounts.actAs"}
        submit_pipeline(
            templates["v3-8"], parameters={"registry": f"{gcs_bucket}/r", "source": SOURCE}, **common
        )
    finally:
        recorder.close()
    jobs = [r for r in recorder.requests if r["method"] == "POST" and r["path"].endswith("/pipelineJobs")]
    assert len(jobs) == 2 and recorder.rejected == []
    assert jobs[0]["body"]["runtimeConfig"]["parameterValues"]["epochs"] == 3


def test_cli_preflight_submit_and_help(templates, google, gcs_bucket, monkeypatch):
    from tpustream.cli.main import app

    runner = CliRunner()
    recorder = _vertex_recorder(monkeypatch)
    monkeypatch.setenv("TPUSTREAM_VERTEX_ENDPOINT", recorder.url)
    for api in ("IAM", "RESOURCE_MANAGER", "CLOUD_QUOTAS"):
        monkeypatch.setenv(f"TPUSTREAM_{api}_ENDPOINT", google.url)
    common = f"--project proj --pipeline-root {gcs_bucket}/runs --registry {gcs_bucket}/registry".split()
    common += ["--template", templates["v3-8"], "--service-account", SA, "--param", f"source={SOURCE}"]
    try:
        ok = runner.invoke(app, ["pipeline", "preflight", *common, "--param", "epochs=3", "--schedule"])
        assert ok.exit_code == 0, ok.output
        lines = ok.output.strip().splitlines()
        assert len(lines) == 10 and all(line.startswith("ok   ") for line in lines), ok.output
        bad = runner.invoke(
            app, ["pipeline", "preflight", *common, "--param", "epoch=3", "--region", "us-west1"]
        )
        assert bad.exit_code == 1
        assert (
            "fail parameters: --param epoch: no such pipeline parameter; did you mean epochs?" in bad.output
        )
        assert "warn tpu-region:" in bad.output and "Traceback" not in bad.output
        google.quota_infos["proj"][0] = tpu_quota_info("v3", {"us-central1": 0})  # a failing check
        refused = runner.invoke(app, ["pipeline", "submit", *common])
        assert refused.exit_code == 2 and "preflight failed: tpu-quota" in refused.output
        assert recorder.requests == []
        skipped = runner.invoke(
            app, ["pipeline", "submit", *common, "--region", "us-west1", "--skip-preflight"]
        )
        assert skipped.exit_code == 0 and "submitted: projects/proj/locations/us-west1/" in skipped.output
        schedule = ["pipeline", "schedule", *common, "--cron", "0 3 * * 1", "--skip-preflight"]
        typo = runner.invoke(app, [*schedule, "--param", "epoch=3"])
        assert typo.exit_code == 2 and "did you mean epochs" in typo.output
    finally:
        recorder.close()
    help_text = " ".join(runner.invoke(app, ["pipeline", "submit", "--help"]).output.replace("│", "").split())
    assert "registry (string, required)" in help_text and "epochs (int, default 10)" in help_text
    assert "--skip-preflight" in help_text
    assert runner.invoke(app, ["pipeline", "preflight", "--help"]).exit_code == 0
