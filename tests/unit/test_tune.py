"""The search space file, the Vertex HyperparameterTuningJob built from it (proto-valid), a Vizier trial's
command line and its metric file, and the record the report reads."""

import json

import pytest
from google.cloud.aiplatform_v1.types import HyperparameterTuningJob
from google.protobuf import json_format
from tpustream.pipelines.tpu import tpu_spec, worker_pool_spec

from tpustream.errors import ConfigError
from tpustream.train.config import TrainConfig
from tpustream.tune.hypertune import HypertuneReporter
from tpustream.tune.record import read_tuning
from tpustream.tune.space import DEFAULT_SPACE, SearchSpace, SpaceError, read_space
from tpustream.tune.trial import trainer_fields
from tpustream.tune.vertex import trial_pools, tuning_job_body
from tpustream.tune.vertex_trial import parse_trial

SPACE = """
max_trials: 6
parallel_trials: 2
parameters:
  lr: {min: 0.001, max: 0.3, scale: log}
  weight_decay: {min: 1.0e-5, max: 1.0e-3, scale: log}
  epochs: {min: 5, max: 20, type: int}
  freeze_epochs: {values: [0, 1, 2]}
  label_smoothing: {values: [0.0, 0.1]}
  class_weights: {values: [none, auto]}
  mixup_alpha: {min: 0.0, max: 0.4, optional: true}
"""


def _space(tmp_path, text=SPACE, name="space.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return read_space(str(path))


def test_the_space_file_reads_and_the_default_space_searches_what_the_issue_names(tmp_path):
    space = _space(tmp_path)
    assert [p.name for p in space.parameters][:3] == ["lr", "weight_decay", "epochs"]
    assert space.parameter("lr").scale == "log" and space.parameter("epochs").kind == "int"
    assert space.parameter("class_weights").kind == "categorical"
    assert (space.max_trials, space.parallel_trials, space.metric, space.goal) == (
        6,
        2,
        "val_top1",
        "maximize",
    )
    assert read_space(None) is DEFAULT_SPACE
    assert {p.name for p in DEFAULT_SPACE.parameters} == {
        "lr",
        "weight_decay",
        "epochs",
        "freeze_epochs",
        "augment_strength",
        "mixup_alpha",
    }
    # JSON is a space file too
    as_json = _space(tmp_path, json.dumps(space.to_json()), "space.json")
    assert as_json.parameters == space.parameters


def test_a_run_searches_what_its_trainer_and_start_allow(tmp_path):
    fields = trainer_fields()
    fitted = DEFAULT_SPACE.for_run(fields, trained_start=False)
    names = {p.name for p in fitted.parameters}
    assert {"lr", "weight_decay", "epochs"} <= names and "freeze_epochs" not in names
    assert "freeze_epochs" in fitted.left_out
    for optional in ("augment_strength", "mixup_alpha"):  # until the recipe's fields land
        assert (optional in names) == (optional in fields) and (optional in fitted.left_out) != (
            optional in fields
        )
    assert "freeze_epochs" in {p.name for p in DEFAULT_SPACE.for_run(fields, trained_start=True).parameters}


@pytest.mark.parametrize(
    "text, says",
    [
        ("parameters: {lr: {min: 0.3, max: 0.001}}", "min <= max"),
        ("parameters: {lr: {min: 0, max: 0.1, scale: log}}", "log scale needs min > 0"),
        ("parameters: {lr: {min: 0.1, max: 0.2, step: 1}}", "unknown keys ['step']"),
        ("max_trials: 2\nparallel_trials: 3\nparameters: {lr: {min: 0.1, max: 0.2}}", "parallel_trials 3"),
        ("metric: val_loss\nparameters: {lr: {min: 0.1, max: 0.2}}", "metric must be val_top1"),
        ("parameters: [lr]", "a mapping with parameters"),
        ("lr: [", "not YAML or JSON"),
    ],
)
def test_a_bad_space_file_is_a_clear_error_naming_it(tmp_path, text, says):
    with pytest.raises(SpaceError, match="space.yaml") as info:
        _space(tmp_path, text)
    assert says in str(info.value)


def test_a_parameter_the_trainer_lacks_is_an_error_unless_optional(tmp_path):
    space = _space(tmp_path, "parameters: {learning_rate: {min: 0.1, max: 0.2}}")
    with pytest.raises(SpaceError, match="'learning_rate' is not a trainer option"):
        space.for_run(trainer_fields(), trained_start=False)


def _job(space):
    config = TrainConfig(
        data="gs://b/data", output="AIP_MODEL_DIR", model="resnet18", epochs=10, pretrained="resnet18.DEFAULT"
    )
    pool = {k: v for k, v in worker_pool_spec(tpu_spec("v5e-16"), {}).items() if k != "container_spec"}
    pools = trial_pools(pool, "us-docker.pkg.dev/p/r/tpu@sha256:abc", config, space)
    return tuning_job_body(
        display_name="tpustream-tune",
        space=space,
        pools=pools,
        base_output_directory="gs://b/root/run/tune-job",
    )


def test_the_tuning_job_is_proto_valid_with_early_stopping_and_the_slice_pool(tmp_path):
    space = _space(tmp_path).for_run(trainer_fields(), trained_start=True)
    body = _job(space)
    job = HyperparameterTuningJob.pb(HyperparameterTuningJob())
    json_format.ParseDict(body, job)  # raises on any field the v1 proto lacks or a wrong type
    spec = job.study_spec
    assert spec.metrics[0].metric_id == "val_top1" and spec.metrics[0].goal == 1  # MAXIMIZE
    assert (
        spec.HasField("decay_curve_stopping_spec") and not spec.decay_curve_stopping_spec.use_elapsed_duration
    )
    params = {p.parameter_id: p for p in spec.parameters}
    assert params["lr"].scale_type == 2 and params["lr"].double_value_spec.max_value == 0.3  # UNIT_LOG_SCALE
    assert params["epochs"].integer_value_spec.min_value == 5
    assert list(params["freeze_epochs"].discrete_value_spec.values) == [0.0, 1.0, 2.0]
    assert list(params["class_weights"].categorical_value_spec.values) == ["none", "auto"]
    assert (job.max_trial_count, job.parallel_trial_count) == (6, 2)
    pool = job.trial_job_spec.worker_pool_specs[0]
    assert pool.machine_spec.machine_type == "ct5lp-hightpu-4t" and pool.machine_spec.tpu_topology == "4x4"
    assert pool.replica_count == 1  # a slice is one replica
    assert list(pool.container_spec.command) == ["python3", "-m", "tpustream.tune.vertex_trial"]
    no_stopping = _job(SearchSpace(parameters=space.parameters[:1], early_stopping=False))
    assert "decay_curve_stopping_spec" not in no_stopping["study_spec"]


def test_a_vertex_trial_trains_the_values_vertex_appends_into_aip_model_dir(tmp_path):
    space = _space(tmp_path).for_run(trainer_fields(), trained_start=True)
    args = list(_job(space)["trial_job_spec"]["worker_pool_specs"][0]["container_spec"]["args"])
    env = {"AIP_MODEL_DIR": "gs://b/root/run/tune-job/3/model/"}
    config = parse_trial(
        [*args, "--lr=0.05", "--epochs=7.0", "--freeze_epochs=2", "--class_weights=auto"], env
    )
    assert (config.lr, config.epochs, config.freeze_epochs, config.class_weights) == (0.05, 7, 2, "auto")
    assert config.output == "gs://b/root/run/tune-job/3/model" and config.model == "resnet18"
    with pytest.raises(ConfigError, match=r"\['momentum'\] are not parameters"):
        parse_trial([*args, "--momentum=0.5"], env)
    with pytest.raises(ConfigError, match="AIP_MODEL_DIR is not set"):
        parse_trial(args, {})


def test_the_metric_file_is_cloudml_hypertunes(tmp_path):
    path = tmp_path / "hypertune" / "output.metrics"
    reporter = HypertuneReporter({"CLOUD_ML_HP_METRIC_FILE": str(path), "CLOUD_ML_TRIAL_ID": "4"})
    reporter.report("val_top1", 0.5, 1)
    reporter.report("val_top1", 0.75, 2)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line["val_top1"], line["global_step"], line["trial"]) for line in lines] == [
        ("0.5", "1", "4"),
        ("0.75", "2", "4"),
    ]
    assert set(lines[0]) == {"timestamp", "trial", "val_top1", "global_step", "checkpoint_path"}
    assert path.read_text().splitlines()[0].startswith('{"checkpoint_path": ""')  # sort_keys, as it writes


def test_vizier_trials_become_the_record_and_the_best_model_is_the_candidate(tmp_path):
    from tpustream.artifacts import ModelCard

    space = SearchSpace(parameters=_space(tmp_path).parameters[:2], max_trials=3)
    base = str(tmp_path / "tune-job")
    for trial in ("1", "2"):
        ModelCard(arch="tiny", classes=["a", "b"], input_size=16).write(f"{base}/{trial}/model/model.json")

    def trial(trial_id, state, lr, value):
        return {
            "id": trial_id,
            "state": state,
            "parameters": [
                {"parameterId": "lr", "value": lr},
                {"parameterId": "weight_decay", "value": 1e-4},
            ],
            "finalMeasurement": {"stepCount": "3", "metrics": [{"metricId": "val_top1", "value": value}]},
        }

    from tpustream.tune.vertex import tuning_record

    record = tuning_record(
        [
            trial("1", "SUCCEEDED", 0.1, 0.8),
            trial("2", "SUCCEEDED", 0.05, 0.9),
            trial("3", "SUCCEEDED", 1e-3, 0.2),
        ],
        base,
        space,
    )
    assert record.best == "2" and record.model == f"{base}/2/model" and record.engine == "vertex-vizier"
    assert [t.state for t in record.trials] == ["complete", "complete", "pruned"]  # 3 wrote no model
    card = ModelCard.read(f"{base}/2/model")
    assert card.tuning["trial"] == "2" and card.tuning["parameters"] == {"lr": 0.05, "weight_decay": 1e-4}
    assert read_tuning(base).best == "2" and read_tuning(f"{base}/2/model").trials == record.trials


def test_the_report_shows_every_trial_and_marks_the_chosen_one(tmp_path):
    from tpustream.report.trials import trial_rows, trials_html
    from tpustream.tune.record import TrialRecord, TuningRecord

    record = TuningRecord(
        engine="optuna",
        metric="val_top1",
        space={"parameters": {"lr": {"min": 0.001, "max": 0.3, "scale": "log"}}, "early_stopping": True},
        trials=(
            TrialRecord(
                id="1", parameters={"lr": 0.1}, state="complete", metric=0.8, epochs_run=3, model="m1"
            ),
            TrialRecord(
                id="2", parameters={"lr": 1e-6}, state="pruned", metric=0.1, epochs_run=1, reason="<low>"
            ),
        ),
        best="1",
        model="m1",
    )
    header, rows = trial_rows(record)
    assert header == ["trial", "lr", "val_top1", "epochs", "end"]
    assert rows == [["1", "0.1", "0.8000", "3", "chosen"], ["2", "1e-06", "0.1000", "1", "pruned: <low>"]]
    page = trials_html(record)
    assert "lr 0.001..0.3 (log)" in page and "&lt;low&gt;" in page and '<tr class="best">' in page
