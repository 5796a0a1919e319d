"""`tpustream tune` on PJRT CPU: real training trials of the tiny model on digits, each a `train()` in the tune
process (the XLA runtime is process-global, so each search is its own subprocess)."""

import json
import subprocess
import sys

import pytest

from tests.common.train import ENV
from tpustream.dataset import write as shards
from tpustream.dataset.plan import ShardConfig

pytestmark = pytest.mark.integration

BASE = ["--model", "tiny", "--batch-size", "16", "--workers", "2", "--log-steps", "50", "--epochs", "3"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("data") / "digits")
    shards.create_shards(ShardConfig(source="digits", output=out, num_shards=8), progress=False)
    return out


def test_tune_picks_the_best_trial_and_hands_its_model_on(digits, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(
        "max_trials: 3\nearly_stopping: false\nparameters:\n"
        "  lr: {min: 0.02, max: 0.3, scale: log}\n  weight_decay: {min: 1.0e-5, max: 1.0e-3, scale: log}\n"
    )
    output = tmp_path / "tune"
    command = [sys.executable, "-m", "tpustream.cli", "tune", "--data", digits, "--output", str(output)]
    result = subprocess.run(
        [*command, "--space", str(space), *BASE], env=ENV, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((output / "tuning.json").read_text())
    trials = record["trials"]
    assert [t["id"] for t in trials] == ["1", "2", "3"] and {t["state"] for t in trials} == {"complete"}
    assert len({t["parameters"]["lr"] for t in trials}) == 3  # three different trials
    best = max(trials, key=lambda t: t["metric"])
    assert record["best"] == best["id"] and record["model"] == str(output / "trials" / best["id"])
    # The candidate is that trial's model as it trained: its card's best epoch is the trial's metric
    card = json.loads((output / "trials" / best["id"] / "model.json").read_text())
    assert card["metrics"]["val_top1"] == best["metric"]
    assert card["tuning"]["trial"] == best["id"] and card["tuning"]["engine"] == "optuna"
    assert card["tuning"]["parameters"] == best["parameters"]
    assert card["training"]["lr"] == best["parameters"]["lr"]
    assert (output / "trials" / best["id"] / "tuning.json").exists()  # the report's view of the search
    assert f"model: {output / 'trials' / best['id']}" in result.stdout


PRUNE = """
import json, sys
from tpustream.train.config import TrainConfig
from tpustream.tune.space import SearchSpace, Parameter
from tpustream.tune.local import tune_locally
space = SearchSpace(parameters=(Parameter(name="lr", kind="double", low=1e-6, high=0.3, scale="log"),),
                    max_trials=3, min_trials=2, early_stopping=True)
config = TrainConfig(data=sys.argv[1], output=sys.argv[2], model="tiny", batch_size=16, workers=2, epochs=3,
                     log_steps=50)
record = tune_locally(config, space, first_trials=({"lr": 0.2}, {"lr": 0.1}, {"lr": 1e-6}))
print(json.dumps(record.to_json()))
"""


def test_a_trial_with_an_absurd_lr_is_stopped_before_its_last_epoch(digits, tmp_path):
    output = tmp_path / "tune"
    result = subprocess.run(
        [sys.executable, "-c", PRUNE, digits, str(output)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    trials = {t["id"]: t for t in json.loads(result.stdout.splitlines()[-1])["trials"]}
    assert trials["1"]["state"] == trials["2"]["state"] == "complete"
    absurd = trials["3"]
    assert absurd["parameters"] == {"lr": 1e-6} and absurd["state"] == "pruned"
    assert absurd["epochs_run"] < 3 and "below the median" in absurd["reason"]
    assert not (output / "trials" / "3" / "model.json").exists()  # stopped: no model
