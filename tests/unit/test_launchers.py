"""The components' launchers (tpustream/launchers/), called as the KFP components call them, with KFP artifact
objects built here instead of by kfp.local: each maps the component's parameters onto tpustream, records its
outputs on the artifacts, and records its own failure (its task name) for the run's notification."""

from __future__ import annotations

import pytest
from google_cloud_pipeline_components.types.artifact_types import VertexEndpoint, VertexModel
from kfp.dsl import HTML, ClassificationMetrics, Dataset, Markdown, Metrics, Model, PipelineTaskFinalStatus

from tests.common.report import model_card
from tests.common.sources import make_image_folder
from tests.fakes.webhook_receiver import WebhookReceiver
from tpustream.errors import ConfigError
from tpustream.launchers.check import launch_check_source
from tpustream.launchers.check_data import launch_check_data
from tpustream.launchers.deploy import _deployed_line, launch_deploy
from tpustream.launchers.evaluate import launch_evaluate
from tpustream.launchers.experiment import launch_join_experiment
from tpustream.launchers.notify import launch_notify_webhook
from tpustream.launchers.promote import launch_promote
from tpustream.launchers.shards import launch_finalize_shards, launch_plan_shards, launch_write_shards
from tpustream.launchers.train import _record_card, launch_train
from tpustream.launchers.validate_serving import launch_validate_serving
from tpustream.launchers.weights import launch_resolve_weights
from tpustream.release.deploy import DeployOutcome
from tpustream.run.outcome import read_failures, read_outcome, record_outcome

# The shard parameters as the pipeline passes them (its stand-ins: 0 shards = auto, val_fraction -1 = the source's
# own split, max_side 0 = keep the size); the image folder has no split of its own, so a fraction is given.
SHARDS = dict(
    num_shards=2,
    val_fraction=0.25,
    upsample=1,
    seed=0,
    max_side=0,
    strict=False,
    train_hosts=1,
    loader_workers=1,
    test_fraction=0.0,
)
# The train step's parameters at the pipeline's defaults (the stand-ins: lr 0, input_size 0, "" = None).
TRAIN = dict(
    model_name="tiny",
    epochs=2,
    batch_size=16,
    lr=0.0,
    bf16=False,
    workers=2.0,  # an integer parameter can reach the executor as a float
    input_size=0,
    init_from="",
    pretrained="",
    freeze_epochs=0,
    backbone_lr_scale=1.0,
    head_lr_scale=-1.0,
    class_weights="none",
    recipe="auto",
    augment="",
    random_erasing=-1.0,
    mixup_alpha=-1.0,
    cutmix_alpha=-1.0,
    ema_decay=-1.0,
    layer_decay=-1.0,
    registry="",
    patience=0,
    early_stop_min_delta=0.0,
    compile_cache="",
    pipeline_root="",
)
POLICY = dict(
    metric="top1",
    min_delta=0.0,
    max_class_drop=-1.0,
    min_metric=-1.0,
    min_class_recall=-1.0,
    max_p_value=-1.0,
    beat_majority_baseline=True,
    min_class_support=10,
)


@pytest.fixture
def run_outcome(tmp_path) -> str:
    return str(tmp_path / "run" / "outcome.json")


def _failed_tasks(run_outcome: str) -> list[str]:
    return [failure.task for failure in read_failures(run_outcome)]


def test_check_plan_write_finalize_and_check_data_make_a_dataset_from_a_source(tmp_path, run_outcome):
    """The check step points its Dataset at the content-addressed location and records "training"; the shard
    steps plan, write and finalize there; the finalized Dataset carries the splits, the classes and the check
    step's fingerprint; the data check writes its report and names what it found."""
    source = str(make_image_folder(tmp_path / "images", per_class=6))
    checked = Dataset(uri="")
    decision = launch_check_source(
        source=source,
        **SHARDS,
        datasets_root="",
        registry=str(tmp_path / "registry"),
        model_name="tiny",
        epochs=1,
        batch_size=16,
        lr=0.0,
        bf16=False,
        retrain=False,
        dataset=checked,
        run_outcome=run_outcome,
    )
    assert decision == "train"
    assert checked.uri.startswith(str(tmp_path / "registry" / "datasets"))  # "" = under the registry
    assert checked.metadata["fingerprint"]
    assert read_outcome(run_outcome).decision == "training"
    ranges = launch_plan_shards(
        source=source, **SHARDS, shards_per_task=1, dataset=checked, run_outcome=run_outcome
    )
    assert ranges and all(end - start == 1 for start, end in ranges)
    written = [
        launch_write_shards(
            source=source,
            **SHARDS,
            shard_range=[float(start), float(end)],  # as KFP may hand the plan's numbers over
            dataset=checked,
            run_outcome=run_outcome,
        )
        for start, end in ranges
    ]
    assert sum(written) == len(ranges)
    dataset = Dataset(uri="")
    launch_finalize_shards(source=source, **SHARDS, planned=checked, dataset=dataset, run_outcome=run_outcome)
    assert dataset.uri == checked.uri
    assert dataset.metadata["classes"] == ["cat", "dog"]
    assert dataset.metadata["train"] + dataset.metadata["val"] == 12
    assert dataset.metadata["fingerprint"] == checked.metadata["fingerprint"]
    report = Markdown(uri=str(tmp_path / "data-check.md"))
    launch_check_data(
        dataset=dataset,
        registry=str(tmp_path / "registry"),
        data_check="warn",
        max_duplicate_fraction=0.01,
        max_leaked_images=0.0,  # as KFP may hand an integer over
        max_skipped_rate=0.01,
        max_class_share_shift=0.15,
        max_skipped_rate_increase=0.01,
        min_class_train_samples=1.0,
        near_duplicate_distance=8.0,  # as KFP may hand an integer over
        report=report,
        run_outcome=run_outcome,
        class_weights="none",
    )
    assert (tmp_path / "data-check.md").read_text().strip()
    assert report.metadata["data_check"] == "warn"
    assert isinstance(report.metadata["anomalies"], list) and isinstance(report.metadata["warnings"], list)
    assert _failed_tasks(run_outcome) == []


def test_a_write_records_its_own_range_as_the_failed_task(tmp_path, run_outcome):
    with pytest.raises(Exception, match="no-such-source"):
        launch_write_shards(
            source=str(tmp_path / "no-such-source"),
            **SHARDS,
            shard_range=[2.0, 3.0],
            dataset=Dataset(uri=str(tmp_path / "dataset")),
            run_outcome=run_outcome,
        )
    assert _failed_tasks(run_outcome) == ["write-shards-2-3"]


def test_resolve_weights_passes_no_weights_through_and_names_a_missing_weights_file(tmp_path, run_outcome):
    root = str(tmp_path / "root")
    assert launch_resolve_weights(pretrained="", model_name="tiny", pipeline_root=root, run_outcome="") == ""
    missing = str(tmp_path / "missing.pth")
    with pytest.raises(Exception, match="missing.pth"):
        launch_resolve_weights(
            pretrained=missing, model_name="tiny", pipeline_root=root, run_outcome=run_outcome
        )
    assert _failed_tasks(run_outcome) == ["resolve-weights"]


def test_train_from_the_champion_without_a_registry_names_the_parameter_and_records_the_task(
    tmp_path, run_outcome
):
    with pytest.raises(ConfigError, match="init_from=champion needs the registry parameter"):
        launch_train(
            dataset=Dataset(uri=str(tmp_path / "dataset")),
            model=Model(uri=str(tmp_path / "model")),
            metrics=Metrics(),
            **{**TRAIN, "init_from": "champion"},
            run_outcome=run_outcome,
        )
    assert _failed_tasks(run_outcome) == ["train-model"]


# The parameters' decoding (stand-ins, the run root's caches, init_from=champion): TrainConfig.from_pipeline,
# tests/unit/test_train_config.py.


def test_a_cards_numbers_become_kfp_metrics_and_the_model_artifacts_metadata():
    card = model_card(
        {"arch": "tiny", "classes": ["a", "b"], "metrics": {"val_top1": 0.75, "epochs": 2, "note": "x"}}
    )
    model, metrics = Model(uri="gs://b/model"), Metrics()
    _record_card(card, model=model, metrics=metrics)
    assert metrics.metadata == {"val_top1": 0.75, "epochs": 2.0}  # numbers only
    assert model.metadata == {"arch": "tiny", "input_size": 32, "val_top1": 0.75}


def _evaluate_artifacts(tmp_path) -> dict[str, object]:
    return dict(
        model=Model(uri=str(tmp_path / "model")),
        dataset=Dataset(uri=str(tmp_path / "dataset")),
        evaluation=Metrics(uri=str(tmp_path / "evaluation")),
        data_check=Markdown(uri=str(tmp_path / "data-check.md")),
        report=HTML(uri=str(tmp_path / "report.html")),
        summary=Markdown(uri=str(tmp_path / "summary.md")),
    )


def test_evaluate_refuses_a_metric_the_policy_does_not_know_before_evaluating(tmp_path, run_outcome):
    with pytest.raises(Exception, match="top2"):
        launch_evaluate(
            **_evaluate_artifacts(tmp_path),
            registry="",
            **{**POLICY, "metric": "top2"},
            metrics=Metrics(),
            confusion=ClassificationMetrics(),
            run_outcome=run_outcome,
        )
    assert _failed_tasks(run_outcome) == ["evaluate-model"]
    assert not (tmp_path / "evaluation").exists()


def test_promote_moves_nothing_without_the_validate_steps_report(tmp_path, run_outcome):
    registry = tmp_path / "registry"
    vertex_model = VertexModel(name="vertex_model", uri="", metadata={})
    with pytest.raises(Exception, match="validate-serving"):
        launch_promote(
            **_evaluate_artifacts(tmp_path),
            validation=Metrics(uri=str(tmp_path / "no-validation")),
            registry=str(registry),
            **POLICY,
            vertex_model=vertex_model,
            vertex_model_name="",
            serving_image="",
            project="",
            location="",
            run_outcome=run_outcome,
        )
    assert _failed_tasks(run_outcome) == ["promote-model"]
    assert not registry.exists() and vertex_model.metadata == {}


def test_validate_serving_refuses_no_samples_naming_the_option(tmp_path, run_outcome):
    with pytest.raises(Exception, match="--samples 0"):
        launch_validate_serving(
            model=Model(uri=str(tmp_path / "model")),
            dataset=Dataset(uri=str(tmp_path / "dataset")),
            validation=Metrics(uri=str(tmp_path / "validation")),
            samples=0.0,  # as KFP may hand an integer over
            run_outcome=run_outcome,
        )
    assert _failed_tasks(run_outcome) == ["validate-serving"]


def test_deploy_without_an_endpoint_or_a_vertex_model_deploys_nothing_and_keeps_the_outcome(run_outcome):
    record_outcome(run_outcome, step="promote", decision="promoted", reason="version 1")
    settings = dict(traffic_percent=10, machine_type="n1-standard-4", min_replicas=1, max_replicas=1)
    published = VertexModel(name="vertex_model", uri="", metadata={"resourceName": "projects/p/models/1@1"})
    endpoint = VertexEndpoint(name="vertex_endpoint", uri="", metadata={})
    line = launch_deploy(
        vertex_model=published, endpoint="", vertex_endpoint=endpoint, **settings, run_outcome=run_outcome
    )
    assert line == "not deployed: no endpoint given"
    unpublished = VertexModel(name="vertex_model", uri="", metadata={})
    line = launch_deploy(
        vertex_model=unpublished, endpoint="e", vertex_endpoint=endpoint, **settings, run_outcome=run_outcome
    )
    assert line == "not deployed: promote published no Vertex AI model"
    assert endpoint.metadata == {} and read_outcome(run_outcome).decision == "promoted"


def test_the_deploy_line_names_the_split_and_what_was_undeployed():
    outcome = DeployOutcome(
        endpoint="projects/p/locations/europe-west4/endpoints/9",
        created_endpoint=False,
        model="4200@2",
        deployed_model_id="7",
        deployed=True,
        traffic_split={"7": 100, "6": 0},
        previous_split={"6": 100},
        undeployed={"6": "4200@1"},
    )
    assert _deployed_line("projects/p/models/4200@2", outcome) == (
        "deployed projects/p/models/4200@2 to projects/p/locations/europe-west4/endpoints/9 as 7 "
        "(traffic 7: 100%, 6: 0%); undeployed 6 (4200@1)"
    )


def test_join_experiment_joins_nothing_without_one_and_names_a_bad_name(run_outcome):
    place = dict(project="p", location="europe-west4", pipeline_job_id="job-1")
    assert launch_join_experiment(experiment="", **place, run_outcome=run_outcome) == ""
    with pytest.raises(Exception, match="experiment"):
        launch_join_experiment(experiment="Not A Name!", **place, run_outcome=run_outcome)
    assert _failed_tasks(run_outcome) == ["join-experiment"]


def test_notify_posts_the_runs_state_and_outcome_and_without_a_webhook_posts_nothing(run_outcome):
    record_outcome(run_outcome, step="evaluate", decision="kept", reason="below the champion")
    status = PipelineTaskFinalStatus(
        state="SUCCEEDED",
        pipeline_job_resource_name="projects/p/locations/l/pipelineJobs/job-1",
        pipeline_task_name="exit-handler-1",
        error_code=None,
        error_message=None,
    )
    with WebhookReceiver() as hook:
        launch_notify_webhook(
            webhook="", run_outcome=run_outcome, pipeline="tpustream-training", status=status, run="r"
        )
        assert hook.bodies == []
        launch_notify_webhook(
            webhook=hook.url, run_outcome=run_outcome, pipeline="tpustream-training", status=status, run="r"
        )
        (body,) = hook.bodies
    assert body["pipeline"] == "tpustream-training" and "below the champion" in body["text"]
