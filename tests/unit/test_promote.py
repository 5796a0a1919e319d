"""The refusals the pipeline's evaluate step logs (tpustream/release/promote.py ``decide_and_log_refusal``):
in the registry's history as promote logs them, once however often the step runs again."""

import json

from tpustream.artifacts import EvalReport
from tpustream.registry import events as event_log
from tpustream.registry.history import champion_history, format_history_table
from tpustream.registry.policy import PromotionPolicy
from tpustream.registry.store import ChampionPointer, replace_champion
from tpustream.release.promote import decide_and_log_refusal, preview_decision, promote


def _metrics(tmp_path, top1=0.1168):
    """A metrics.json as evaluate writes it: a weak candidate on the test split, and its baseline."""
    uri = str(tmp_path / "evaluation" / "metrics.json")
    EvalReport.from_json(
        {
            "dataset": {"uri": "/d", "manifest_digest": "d" * 64, "val_samples": 40, "test_samples": 35},
            "classes": ["circle", "square"],
            "split": "test",
            "candidate": {
                "model_sha256": "c" * 64,
                "top1": top1,
                "top5": 1.0,
                "loss": 2.0,
                "num_samples": 35,
                "complete": True,
                "per_class_accuracy": [0.2, 0.05],
            },
            "baseline": {"answer": "circle", "top1": 0.394},
        }
    ).write(uri)
    return uri


def _documents(registry):
    """The registry's event documents, ``time`` aside."""
    return [
        {key: value for key, value in event_log.read_event(uri).items() if key != "time"}
        for uri in event_log.list_events(str(registry))
    ]


def test_a_refusal_is_logged_once_however_often_the_step_runs_and_the_history_shows_it(tmp_path):
    metrics, candidate = _metrics(tmp_path), str(tmp_path / "model")
    registry = tmp_path / "registry"
    registry.mkdir()
    floor = PromotionPolicy.from_options(min_metric=0.99)
    for _attempt in range(3):  # the step, then two retries of it
        decision = decide_and_log_refusal(candidate, metrics, str(registry), floor)
        assert not decision.promote and "below the quality floor" in decision.reason
    (entry,) = champion_history(str(registry))
    assert entry["event"] == "refused" and entry["reason"] == decision.reason
    assert decision.code == entry["code"] == "below-floor"
    assert (entry["metric"], entry["value"], entry["candidate"]) == ("top1", 0.1168, candidate)
    assert entry["champion_version"] is None and entry["dataset_digest"] == "d" * 64
    assert "refused" in format_history_table([entry]).splitlines()[1]
    # promote then taking the same decision on the same candidate adds nothing: it is one decision
    outcome = promote(candidate, metrics, str(registry), floor)
    assert not outcome.promoted and outcome.reason == decision.reason
    assert outcome.code == "below-floor" and outcome.decision == decision
    assert len(champion_history(str(registry))) == 1
    # exactly the event promote logs on its own
    alone = tmp_path / "alone"
    alone.mkdir()
    promote(candidate, metrics, str(alone), floor)
    assert _documents(registry) == _documents(alone)
    assert (
        json.loads((tmp_path / "evaluation" / "metrics.json").read_text())["baseline"]["answer"] == "circle"
    )


def test_another_reason_or_another_champion_is_another_decision(tmp_path):
    metrics, candidate = _metrics(tmp_path), str(tmp_path / "model")
    registry = str(tmp_path / "registry")
    (tmp_path / "registry").mkdir()
    baseline = decide_and_log_refusal(candidate, metrics, registry, PromotionPolicy())
    assert baseline.code == "below-baseline" and "majority-class baseline 0.3940" in baseline.reason
    floor = decide_and_log_refusal(
        candidate, metrics, registry, PromotionPolicy.from_options(min_metric=0.99)
    )
    assert floor.reason != baseline.reason
    champion = ChampionPointer.from_json(
        {"version": 3, "model_sha256": "e" * 64, "dataset_digest": "d" * 64, "metrics": {"top1": 0.5}}
    )
    replace_champion(registry, champion, 0)
    against = decide_and_log_refusal(candidate, metrics, registry, PromotionPolicy())
    assert against.reason == baseline.reason  # the same words, refused against another champion
    decide_and_log_refusal(candidate, metrics, registry, PromotionPolicy())  # a retry: nothing more
    history = champion_history(registry)
    assert [entry["champion_version"] for entry in history] == [None, None, 3]
    assert [entry["event"] for entry in history] == ["refused"] * 3


def test_a_candidate_that_wins_or_is_the_champion_logs_nothing_here(tmp_path):
    metrics, candidate = _metrics(tmp_path, top1=0.9), str(tmp_path / "model")
    registry = str(tmp_path / "registry")
    (tmp_path / "registry").mkdir()
    wins = decide_and_log_refusal(candidate, metrics, registry, PromotionPolicy())
    assert wins.promote and wins.code == "no-champion"
    champion = ChampionPointer.from_json(
        {"version": 1, "model_sha256": "c" * 64, "dataset_digest": "d" * 64, "metrics": {"top1": 0.9}}
    )
    replace_champion(registry, champion, 0)
    again = decide_and_log_refusal(candidate, metrics, registry, PromotionPolicy())
    assert not again.promote and again.code == "already-champion"
    assert preview_decision(EvalReport.read(metrics), registry).code == "already-champion"
    assert champion_history(registry) == []  # promote logs a win; the champion's promotion was logged then
    # promote itself logs it: the outcome and the event carry the code
    outcome = promote(candidate, metrics, registry)
    assert (outcome.promoted, outcome.version, outcome.code) == (False, 1, "already-champion")
    (entry,) = champion_history(registry)
    assert (entry["event"], entry["code"], entry["class_index"]) == (
        "already-champion",
        "already-champion",
        None,
    )
