"""The promotion decision table (pure: no storage)."""

import pytest

from tpustream.artifacts import Evaluation
from tpustream.registry.policy import PromotionPolicy, QualityFloor, RegistryError, decide
from tpustream.registry.store import ChampionPointer


def decide_on(candidate, champion, **kwargs):
    """``decide`` on two evaluations given as metrics.json holds them."""
    return decide(
        Evaluation.from_json(candidate),
        None if champion is None else Evaluation.from_json(champion),
        **kwargs,
    )


def m(top1, loss=1.0, per_class=(0.9, 0.9)):
    return {"top1": top1, "top5": min(1.0, top1 + 0.05), "loss": loss, "per_class_accuracy": list(per_class)}


@pytest.mark.parametrize(
    "candidate, champion, kwargs, promote, reason",
    [
        (m(0.5), None, {}, True, "no champion"),
        (m(0.91), m(0.90), {}, True, "beats"),
        (m(0.90), m(0.90), {}, False, "not above 0"),  # a tie never promotes
        (m(0.89), m(0.90), {}, False, "not above 0"),
        (m(0.905), m(0.90), {"min_delta": 0.01}, False, "min-delta"),
        (m(0.92), m(0.90), {"min_delta": 0.01}, True, "beats"),
        (m(0.5, loss=0.4), m(0.9, loss=0.5), {"metric": "loss"}, True, "beats"),  # lower loss wins
        (m(0.9, loss=0.6), m(0.9, loss=0.5), {"metric": "loss"}, False, "not above 0"),
        (
            m(0.95, per_class=(1.0, 0.80)),
            m(0.90, per_class=(0.85, 0.95)),
            {"max_class_drop": 0.1},
            False,
            "class 1",
        ),
        (
            m(0.95, per_class=(1.0, 0.90)),
            m(0.90, per_class=(0.85, 0.95)),
            {"max_class_drop": 0.1},
            True,
            "beats",
        ),
        (  # class 1 has no val sample (not measured): no drop is judged on it
            m(0.95, per_class=(1.0, None)),
            m(0.90, per_class=(0.85, None)),
            {"max_class_drop": 0.1},
            True,
            "beats",
        ),
        # the quality floor: applied with and without a champion (TFMA's absolute thresholds)
        (m(0.5), None, {"floor": QualityFloor(min_metric=0.8)}, False, "below the quality floor"),
        (m(0.85), None, {"floor": QualityFloor(min_metric=0.8)}, True, "reaches the quality floor"),
        (m(0.8), None, {"floor": QualityFloor(min_metric=0.8)}, True, "no champion yet"),  # at it is enough
        (
            m(0.75),
            m(0.70),
            {"floor": QualityFloor(min_metric=0.8)},
            False,
            "--min-metric 0.8",
        ),  # beats, too low
        (m(0.9, loss=0.7), None, {"metric": "loss", "floor": QualityFloor(min_metric=0.5)}, False, "at most"),
        (m(0.9, loss=0.4), None, {"metric": "loss", "floor": QualityFloor(min_metric=0.5)}, True, "floor"),
        (
            m(0.95, per_class=(1.0, 0.55, None)),
            None,
            {"floor": QualityFloor(min_class_recall=0.6)},
            False,
            "class 1 recall 0.5500 is below --min-class-recall 0.6 (1 of 2 classes are)",
        ),
        (
            m(0.95, per_class=(1.0, 0.6, None)),
            None,
            {"floor": QualityFloor(min_class_recall=0.6)},
            True,
            "floor",
        ),
        (  # ... while a measured class still is
            m(0.95, per_class=(0.70, None)),
            m(0.90, per_class=(0.85, None)),
            {"max_class_drop": 0.1},
            False,
            "class 0",
        ),
    ],
)
def test_decision_table(candidate, champion, kwargs, promote, reason):
    decision = decide_on(
        candidate,
        champion,
        candidate_digest="d1",
        champion_digest="d1" if champion else None,
        policy=PromotionPolicy(**kwargs),
    )
    assert decision.promote is promote
    assert reason in decision.reason


def test_different_datasets_are_never_compared():
    decision = decide_on(m(0.99), m(0.1), candidate_digest="aaaa", champion_digest="bbbb")
    assert not decision.promote and "same shards" in decision.reason


def test_macro_f1_and_balanced_accuracy_decide_when_asked():
    """The class-balanced metrics of the per-sample scores: a candidate better on top-1 but worse on a rare
    class loses on macro-F1; an evaluation written before them cannot be decided on them."""
    candidate = {**m(0.92), "macro_f1": 0.70, "balanced_accuracy": 0.72}
    champion = {**m(0.90), "macro_f1": 0.80, "balanced_accuracy": 0.81}
    same = {"candidate_digest": "d1", "champion_digest": "d1"}
    assert decide_on(candidate, champion, **same).promote  # top1
    for metric in ("macro_f1", "balanced_accuracy"):
        refused = decide_on(candidate, champion, policy=PromotionPolicy(metric=metric), **same)
        assert not refused.promote and f"candidate {metric} 0.7" in refused.reason
        assert decide_on(champion, candidate, policy=PromotionPolicy(metric=metric), **same).promote
    floor = QualityFloor(min_metric=0.75)
    by_f1 = PromotionPolicy(metric="macro_f1", floor=floor)
    assert "below the quality floor" in decide_on(candidate, None, policy=by_f1, **same).reason
    old = decide_on(m(0.95), champion, policy=PromotionPolicy(metric="macro_f1"), **same)
    assert not old.promote and "has no macro_f1" in old.reason and "re-run tpustream evaluate" in old.reason
    assert decide_on(m(0.95), champion, **same).promote  # the old evaluation still decides on top1


def test_unknown_metric():
    with pytest.raises(RegistryError, match="unknown metric 'f1'"):
        PromotionPolicy(metric="f1")  # type: ignore[arg-type]
    with pytest.raises(RegistryError, match="unknown metric 'f1': choose one of top1, top5, loss"):
        PromotionPolicy.from_options(metric="f1")


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "candidate, metric",
    [
        (m(0.95, loss=NAN), "loss"),  # the reviewer's case: NaN loss "beat" the champion by +nan
        (m(0.95, loss=NAN), "top1"),  # a diverged model is refused whatever metric decides
        (m(NAN), "top1"),
        (m(0.95, loss=INF), "loss"),
        (m(0.95, loss=None), "loss"),  # how metrics.json stores a non-finite number
    ],
)
def test_a_candidate_with_a_non_finite_number_is_never_promoted(candidate, metric):
    for champion in (m(0.5, loss=2.0), None):
        decision = decide_on(
            candidate,
            champion,
            candidate_digest="d1",
            champion_digest="d1" if champion else None,
            policy=PromotionPolicy(metric=metric),
        )
        assert not decision.promote and "not a finite number" in decision.reason


@pytest.mark.parametrize("value", [NAN, None, INF])
def test_a_champion_with_a_non_finite_number_is_kept_not_beaten(value):
    champion = m(0.9, loss=value)
    for candidate in (m(0.95, loss=0.1), m(0.1, loss=5.0)):  # neither better nor worse can be told
        decision = decide_on(
            candidate,
            champion,
            candidate_digest="d1",
            champion_digest="d1",
            policy=PromotionPolicy(metric="loss"),
        )
        assert not decision.promote
        assert "champion loss" in decision.reason and "--metric" in decision.reason
    # the other metrics are still compared normally
    assert decide_on(m(0.95), champion, candidate_digest="d1", champion_digest="d1").promote


def test_a_promoted_versions_vertex_evaluation_is_its_metrics_in_the_classification_schema():
    """What promote imports into the Vertex AI Model Registry (pure: the conversion of a metrics.json)."""
    from tests.fakes.vertex import classification_metrics_problem
    from tpustream.artifacts import EvalReport
    from tpustream.vertex.evaluation import EVALUATION_SCHEMA, classification_evaluation

    document = {
        "classes": ["cat", "dog", "owl"],
        "dataset": {"uri": "gs://b/data", "manifest_digest": "ab" * 32},
        "candidate": {
            "model_sha256": "cd" * 32,
            "num_samples": 10,
            "complete": True,
            "top1": 0.7,
            "top5": 1.0,
            "loss": 0.6,
            "confusion_matrix": [[3, 1, 0], [1, 2, 0], [0, 1, 2]],
        },
    }
    evaluation = classification_evaluation(EvalReport.from_json(document), "gs://b/eval/metrics.json")
    assert evaluation["metrics_schema_uri"] == EVALUATION_SCHEMA
    metrics = evaluation["metrics"]
    assert metrics["confusionMatrix"] == {
        "annotationSpecs": [
            {"id": "0", "displayName": "cat"},
            {"id": "1", "displayName": "dog"},
            {"id": "2", "displayName": "owl"},
        ],
        "rows": [[3, 1, 0], [1, 2, 0], [0, 1, 2]],  # rows[truth][predicted], as evaluate counts
    }
    assert metrics["logLoss"] == 0.6 and "auPrc" not in metrics  # no per-sample scores: no curve
    (every_class,) = metrics["confidenceMetrics"]  # 3 classes: no separate top-5 point
    assert (every_class["recall"], every_class["precision"]) == (1.0, pytest.approx(1 / 3))
    assert every_class["f1Score"] == pytest.approx(0.5)
    assert every_class["recallAt1"] == every_class["precisionAt1"] == every_class["f1ScoreAt1"] == 0.7
    assert classification_metrics_problem(metrics) is None  # the recorder's schema check accepts it
    assert "accuracy" in classification_metrics_problem({**metrics, "accuracy": 0.7})
    diverged = {**document, "candidate": {**document["candidate"], "loss": None}}  # NaN is stored as null
    assert "logLoss" not in classification_evaluation(EvalReport.from_json(diverged))["metrics"]


def test_a_quality_floor_refuses_impossible_values():
    with pytest.raises(RegistryError, match="--min-class-recall 1.5"):
        QualityFloor(min_class_recall=1.5)
    with pytest.raises(RegistryError, match="--min-metric nan"):
        QualityFloor(min_metric=float("nan"))


def test_the_pipelines_parameters_make_one_policy_a_negative_value_meaning_off():
    off = {"max_class_drop": -1.0, "min_metric": -1.0, "min_class_recall": -1.0, "max_p_value": -1.0}
    assert PromotionPolicy.from_pipeline(metric="top1", min_delta=0.0, **off) == PromotionPolicy()
    assert PromotionPolicy.from_pipeline(
        metric="loss",
        min_delta=0.01,
        max_class_drop=0.1,
        min_metric=0.9,
        min_class_recall=0.0,
        max_p_value=0.05,
    ) == PromotionPolicy(
        metric="loss",
        min_delta=0.01,
        max_class_drop=0.1,
        floor=QualityFloor(min_metric=0.9, min_class_recall=0.0),
        max_p_value=0.05,
    )
    with pytest.raises(RegistryError, match="--max-class-drop 1.5"):
        PromotionPolicy(max_class_drop=1.5)
    with pytest.raises(RegistryError, match="unknown metric 'auc'"):
        PromotionPolicy.from_pipeline(metric="auc", min_delta=0.0, **off)


def test_top5_cannot_decide_between_models_of_five_classes_or_fewer():
    from tpustream.artifacts import EvalReport
    from tpustream.registry.policy import RegistryError, decide_for_metrics

    def report(classes):
        candidate = {"top1": 0.8, "top5": 1.0, "loss": 0.5, "num_samples": 10, "complete": True}
        return EvalReport.from_json({
            "format": "tpustream.metrics/v1", "classes": classes, "candidate": candidate, "champion": None,
            "champion_note": None, "created": "2026-11-28T00:00:00Z",
            "dataset": {"uri": "gs://b/d", "manifest_digest": "ab" * 32, "val_samples": 10},
        })  # fmt: skip

    with pytest.raises(RegistryError, match="top-5 is 100% for any model") as error:
        decide_for_metrics(report(list("abcde")), None, PromotionPolicy(metric="top5"))
    assert "\n" not in str(error.value) and "5 classes" in str(error.value)
    assert decide_for_metrics(report(list("abcdef")), None, PromotionPolicy(metric="top5")).promote
    assert decide_for_metrics(report(list("abcde")), None, PromotionPolicy()).promote


def _report(split, *, complete=True, **document):
    from tpustream.artifacts import EvalReport

    candidate = m(0.9) | {"model_sha256": "c" * 64, "complete": complete, "num_samples": 30}
    return EvalReport.from_json(
        {
            "dataset": {"uri": "/d", "manifest_digest": "d" * 64, "val_samples": 40, "test_samples": 35},
            "classes": ["a", "b"],
            "candidate": candidate,
            "champion": m(0.8) | {"version": 1, "complete": True},
        }
        | ({"split": split} if split else {})
        | document
    )


def test_a_test_split_decision_says_so_and_counts_against_the_test_split():
    from tpustream.registry.policy import decide_for_metrics

    champion = ChampionPointer.from_json(
        {"version": 1, "model_sha256": "e" * 64, "dataset_digest": "d" * 64, "metrics": m(0.8)}
    )
    decision = decide_for_metrics(_report("test"), champion, PromotionPolicy())
    assert decision.promote and decision.reason.endswith("by +0.1000 (on the held-out test split)")
    refused = decide_for_metrics(_report("test", complete=False), champion, PromotionPolicy())
    assert not refused.promote and "counted 30 of the dataset's 35 test samples (5 missing)" in refused.reason
    # a dataset without test (and every metrics.json written before it): val decides, reasons as before
    for old in (_report(None), _report("val")):
        assert old.split == "val"
        decision = decide_for_metrics(old, champion, PromotionPolicy())
        assert decision.reason == "candidate top1 0.9000 beats champion 0.8000 by +0.1000"
        refused = decide_for_metrics(_report(None, complete=False), champion, PromotionPolicy())
        assert "counted 30 of the dataset's 40 val samples" in refused.reason


def test_metrics_json_keeps_its_split_and_val_numbers_and_an_old_one_reads_back_unchanged():
    from tpustream.artifacts import ArtifactError, EvalReport

    new = _report("test", val=m(0.95) | {"split": "val"})
    assert new.val is not None and new.val.top1 == 0.95 and new.val.split == "val"
    assert EvalReport.from_json(new.to_json()) == new and new.to_json()["split"] == "test"
    old = _report(None)
    assert "split" not in old.to_json() and "val" not in old.to_json()  # written back as it was read
    assert old.dataset.samples("test") == 35 and old.dataset.samples("val") == 40
    with pytest.raises(ArtifactError, match="'split' is 'train', expected 'val' or 'test'"):
        _report("train")


def test_a_drop_on_a_class_with_too_few_samples_is_said_but_does_not_refuse():
    """Issue 42: a class with 2 test samples dropped 100 points and refused a better model. Under
    min_class_support samples on the deciding split (the confusion matrix's row, or the scores' support) a
    drop is not decisive, and the reason says so; min_class_support 0 makes every class decide."""
    candidate = {**m(0.95, per_class=(1.0, 0.0)), "confusion_matrix": [[38, 0], [2, 0]]}
    champion = {**m(0.90, per_class=(0.9, 1.0)), "confusion_matrix": [[34, 4], [0, 2]]}
    policy = PromotionPolicy(max_class_drop=0.1)
    assert policy.min_class_support == 10
    decision = decide_on(candidate, champion, candidate_digest="d", champion_digest="d", policy=policy)
    assert decision.promote, decision.reason
    assert (
        "not decisive, fewer samples than --min-class-support 10: class 1 (n=2) by 1.0000" in decision.reason
    )
    every = PromotionPolicy(max_class_drop=0.1, min_class_support=0)
    decision = decide_on(candidate, champion, candidate_digest="d", champion_digest="d", policy=every)
    assert not decision.promote and decision.reason.startswith("class 1 accuracy drops by 1.0000")
    scored = {**candidate, "per_class": {"support": [38, 12]}}  # the scores' support wins over the matrix
    decision = decide_on(scored, champion, candidate_digest="d", champion_digest="d", policy=policy)
    assert not decision.promote and "class 1 accuracy drops" in decision.reason
    assert PromotionPolicy.from_options(min_class_support=0).min_class_support == 0
    assert PromotionPolicy.from_options().min_class_support == 10
    with pytest.raises(RegistryError, match="--min-class-support -1"):
        PromotionPolicy(min_class_support=-1)


def _baseline_report(candidate_top1, *, split="val", baseline=True, loss=1.0):
    from tpustream.artifacts import EvalReport

    document = {
        "dataset": {"uri": "/d", "manifest_digest": "d" * 64, "val_samples": 40, "test_samples": 35},
        "classes": ["circle", "square"],
        "split": split,
        "candidate": m(candidate_top1, loss=loss) | {"model_sha256": "c" * 64, "complete": True},
    }
    if baseline:
        document["baseline"] = {"answer": "circle", "top1": 0.394, "loss": 0.67, "macro_f1": 0.28}
    return EvalReport.from_json(document)


@pytest.mark.parametrize("split", ["val", "test"])
def test_a_candidate_that_does_not_beat_the_majority_class_is_refused_first_model_included(split):
    from tpustream.registry.policy import decide_for_metrics

    champion = ChampionPointer.from_json(
        {"version": 1, "model_sha256": "e" * 64, "dataset_digest": "d" * 64, "metrics": m(0.10)}
    )
    for current in (None, champion):  # a first model too: no champion to beat, the baseline still
        refused = decide_for_metrics(_baseline_report(0.1095, split=split), current, PromotionPolicy())
        assert not refused.promote and refused.code == "below-baseline"
        assert refused.reason.startswith(
            "candidate top1 0.1095 does not beat the majority-class baseline 0.3940 (always answering 'circle'"
        )
        assert "--no-beat-majority-baseline" in refused.reason
    tie = decide_for_metrics(_baseline_report(0.394), None, PromotionPolicy())
    assert tie.code == "below-baseline"  # equal is not better
    assert decide_for_metrics(_baseline_report(0.40), None, PromotionPolicy()).promote
    # the explicit switch turns it off; the floor refuses first, with its own code
    off = PromotionPolicy(beat_majority_baseline=False)
    assert decide_for_metrics(_baseline_report(0.1095), None, off).promote
    floor = PromotionPolicy.from_options(min_metric=0.99)
    assert decide_for_metrics(_baseline_report(0.1095), None, floor).code == "below-floor"
    # lower loss is better: the baseline's loss is beaten from below
    loss = PromotionPolicy(metric="loss")
    assert decide_for_metrics(_baseline_report(0.9, loss=0.5), None, loss).promote
    assert decide_for_metrics(_baseline_report(0.9, loss=0.8), None, loss).code == "below-baseline"


def test_a_metrics_json_without_a_baseline_is_decided_as_before():
    from tpustream.registry.policy import decide_for_metrics

    old = _baseline_report(0.1095, baseline=False)
    assert old.baseline is None and decide_for_metrics(old, None, PromotionPolicy()).promote


def test_the_baseline_switch_is_one_field_that_every_door_takes():
    assert PromotionPolicy().beat_majority_baseline is True
    piped = dict(metric="top1", min_delta=0.0, max_class_drop=-1, min_metric=-1, min_class_recall=-1)
    assert PromotionPolicy.from_pipeline(**piped, max_p_value=-1).beat_majority_baseline
    assert not PromotionPolicy.from_pipeline(
        **piped, max_p_value=-1, beat_majority_baseline=False
    ).beat_majority_baseline
    assert not PromotionPolicy.from_options(beat_majority_baseline=False).beat_majority_baseline


PAIRED = {"num_samples": 40, "candidate_only_correct": 6, "champion_only_correct": 2}
# (candidate, champion (None: no champion), the champion's digest, policy options, the metrics.json's other keys)
# -> the decision's code and class index: one row per way the policy decides
CODE_PATHS = {
    "no-champion": (m(0.9), None, None, {}, {}, "no-champion", None),
    "no-champion above a floor": (m(0.9), None, None, {"min_metric": 0.5}, {}, "no-champion", None),
    "wins": (m(0.9), m(0.8), "d", {}, {}, "wins", None),
    "wins, a small class's drop said": (
        m(0.9, per_class=(1.0, 0.0)) | {"per_class": {"support": [38, 2]}},
        m(0.8, per_class=(0.8, 1.0)),
        "d",
        {"max_class_drop": 0.1},
        {},
        "wins",
        None,
    ),
    "missing-metric": (m(0.9), m(0.8), "d", {"metric": "macro_f1"}, {}, "missing-metric", None),
    "diverged": (m(0.9, loss=None), m(0.8), "d", {}, {}, "diverged", None),
    "below-floor": (m(0.6), None, None, {"min_metric": 0.7}, {}, "below-floor", None),
    "below-class-recall": (
        m(0.9, per_class=(0.95, 0.4)),
        None,
        None,
        {"min_class_recall": 0.5},
        {},
        "below-class-recall",
        1,
    ),
    "below-baseline": (
        m(0.3),
        None,
        None,
        {},
        {"baseline": {"answer": "a", "top1": 0.5, "loss": 0.7}},
        "below-baseline",
        None,
    ),
    "other-dataset": (m(0.9), m(0.8), "e", {}, {}, "other-dataset", None),
    "champion-not-finite": (
        m(0.9),
        m(0.8, loss=None),
        "d",
        {"metric": "loss"},
        {},
        "champion-not-finite",
        None,
    ),
    "no-improvement": (m(0.8), m(0.8), "d", {}, {}, "no-improvement", None),
    "no-improvement below min-delta": (m(0.81), m(0.8), "d", {"min_delta": 0.05}, {}, "no-improvement", None),
    "class-drop": (
        m(0.9, per_class=(1.0, 0.5)),
        m(0.8, per_class=(0.7, 0.9)),
        "d",
        {"max_class_drop": 0.1},
        {},
        "class-drop",
        1,
    ),
    "not-paired": (m(0.9), m(0.8), "d", {"max_p_value": 0.05}, {}, "not-paired", None),
    "not-significant": (
        m(0.9),
        m(0.8) | {"paired": PAIRED | {"p_value": 0.29}},
        "d",
        {"max_p_value": 0.05},
        {},
        "not-significant",
        None,
    ),
    "wins, significant": (
        m(0.9),
        m(0.8) | {"paired": PAIRED | {"p_value": 0.01}},
        "d",
        {"max_p_value": 0.05},
        {},
        "wins",
        None,
    ),
    "incomplete": (m(0.9) | {"complete": False}, m(0.8), "d", {}, {}, "incomplete", None),
    "not-compared": (
        m(0.9),
        None,
        "d",
        {},
        {"champion_note": "the champion has other classes"},
        "not-compared",
        None,
    ),
}


def _decided(candidate, champion, digest, options, document):
    """``decide_for_metrics`` on a metrics.json of ``candidate`` (and ``champion`` measured in the same run,
    on shards of ``digest``: "d" the candidate's), against a champion pointer (none without a champion)."""
    from tpustream.artifacts import EvalReport
    from tpustream.registry.policy import decide_for_metrics

    report = EvalReport.from_json(
        {
            "dataset": {"uri": "/d", "manifest_digest": "d" * 64, "val_samples": 40},
            "classes": ["a", "b"],
            "candidate": {"model_sha256": "c" * 64, "complete": True, "num_samples": 40} | candidate,
            "champion": None if champion is None or digest != "d" else champion | {"version": 1},
        }
        | document
    )
    pointer = (
        None
        if digest is None
        else ChampionPointer.from_json(
            {
                "version": 1,
                "model_sha256": "e" * 64,
                "dataset_digest": digest * 64,
                "metrics": champion or m(0.8),
            }
        )
    )
    return decide_for_metrics(report, pointer, PromotionPolicy.from_options(**options))


@pytest.mark.parametrize("path", list(CODE_PATHS))
def test_every_decision_of_the_policy_has_a_code_and_a_class_where_one_applies(path):
    *inputs, code, class_index = CODE_PATHS[path]
    decision = _decided(*inputs)
    assert (decision.code, decision.class_index) == (code, class_index), decision.reason
    assert decision.promote is (code in ("no-champion", "wins"))
    # decided on the test split: the reason says so, the code and the class are the same
    on_test = {"split": "test", "dataset": {"uri": "/d", "manifest_digest": "d" * 64, "test_samples": 40}}
    test_split = _decided(*inputs[:-1], inputs[-1] | on_test)
    assert (test_split.code, test_split.class_index) == (code, class_index)
    assert test_split.reason.endswith("(on the held-out test split)")


def test_the_code_paths_cover_every_code_the_policy_has():
    """A code added to DecisionCode gets a path here (already-champion is promote's: tests/unit/test_promote.py)."""
    from tpustream.registry.policy import DECISION_CODES

    covered = {row[-2] for row in CODE_PATHS.values()}
    assert covered == set(DECISION_CODES) - {"already-champion"}


def test_a_decision_refuses_a_code_it_does_not_know():
    from tpustream.registry.policy import Decision

    with pytest.raises(ValueError, match="decision code 'won': expected one of no-champion, wins"):
        Decision(True, "beats", "won")  # type: ignore[arg-type]
