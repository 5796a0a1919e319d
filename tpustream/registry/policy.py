"""When a candidate replaces the champion: the promotion rules, pure (no storage, no clock).

``decide`` compares two sets of evaluation numbers; ``decide_for_metrics`` applies it to an evaluate run's
metrics.json against the current champion pointer, refusing first what must never be promoted: an
incomplete evaluation, a champion the run could not measure, non-finite numbers.
``tpustream.release.promote`` acts on the decision (registry, compare-and-swap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, cast, get_args

from tpustream.artifacts import Baseline, EvalReport, Evaluation
from tpustream.metrics.paired_test import PairedTest
from tpustream.registry.errors import RegistryError

if TYPE_CHECKING:
    from tpustream.registry.store import ChampionPointer

__all__ = [
    "DEFAULT_POLICY",
    "METRICS",
    "Metric",
    "Decision",
    "DecisionCode",
    "DECISION_CODES",
    "PromotionPolicy",
    "QualityFloor",
    "RegistryError",  # defined in registry/errors.py (store raises it too); the policy's checks raise it
    "decide",
    "decide_for_metrics",
    "champion_to_compare",
    "is_finite_number",
    "metric_named",
]

# name -> higher is better. macro_f1 and balanced_accuracy (the mean F1 and the mean recall over the classes
# with val samples: tpustream/metrics/classification.py) weigh every class alike: for imbalanced classes.
Metric = Literal["top1", "top5", "loss", "macro_f1", "balanced_accuracy"]
METRICS: dict[Metric, bool] = {
    "top1": True,
    "top5": True,
    "loss": False,
    "macro_f1": True,
    "balanced_accuracy": True,
}
# every evaluation has these; a diverged model has a non-finite one
_ALWAYS = ("top1", "top5", "loss")


# What a decision is, for a reader to branch on (the report, the webhook, the history): every outcome
# ``decide``, ``decide_for_metrics`` and promote can reach has one; ``reason`` says it in words for people.
DecisionCode = Literal[
    "no-champion",  # promoted: the registry had no champion (and the candidate reaches any floor)
    "wins",  # promoted: beats the champion by the policy
    "already-champion",  # the candidate's model is the champion already: nothing to decide
    "missing-metric",  # the candidate's evaluation lacks the metric decided on
    "diverged",  # a candidate number (top1, top5, loss, the metric) is not finite
    "incomplete",  # the evaluation did not count every sample of its split
    "not-compared",  # the evaluate run could not measure the champion (e.g. another class set)
    "below-floor",  # the metric is below --min-metric
    "below-class-recall",  # a class's recall is below --min-class-recall (``class_index``: the worst)
    "below-baseline",  # the metric does not beat the majority-class baseline
    "other-dataset",  # the champion's numbers are from other shards
    "champion-not-finite",  # the champion's metric is not finite: no candidate can beat it
    "no-improvement",  # the gain is not above 0 and at least --min-delta
    "class-drop",  # a class's accuracy drops more than --max-class-drop (``class_index``: the worst)
    "not-paired",  # --max-p-value, but the champion was not scored on the same samples
    "not-significant",  # the gain's p-value is above --max-p-value
]
DECISION_CODES: tuple[DecisionCode, ...] = get_args(DecisionCode)


@dataclass(frozen=True)
class Decision:
    """Promote or not, why in words (``reason``, for people), what it is (``code``, for readers to branch on:
    never parse ``reason``), and the class it is about (``class_index``: class-drop, below-class-recall; else
    None)."""

    promote: bool
    reason: str
    code: DecisionCode
    class_index: int | None = None

    def __post_init__(self) -> None:
        if self.code not in DECISION_CODES:
            raise ValueError(f"decision code {self.code!r}: expected one of {', '.join(DECISION_CODES)}")


@dataclass(frozen=True, kw_only=True)
class QualityFloor:
    """What a candidate must reach to be promoted at all, with or without a champion (TFMA's absolute
    ``GenericValueThreshold``): without a floor, the first model of a registry is promoted whatever it scores.
    Each field's docstring is its ``--help`` (promote's, report's); None: no floor.
    """

    min_metric: float | None = None
    """Quality floor: refuse a candidate whose --metric is below this (for loss: above it), with or without a
    champion, so a poor first model is not promoted."""
    min_class_recall: float | None = None
    """Quality floor: refuse a candidate with any class's recall (the share of its samples classified as it,
    over the classes with samples) below this, with or without a champion."""

    def __post_init__(self) -> None:
        if self.min_class_recall is not None and not 0.0 <= self.min_class_recall <= 1.0:
            raise RegistryError(f"--min-class-recall {self.min_class_recall}: a fraction in [0, 1]")
        if self.min_metric is not None and not math.isfinite(self.min_metric):
            raise RegistryError(f"--min-metric {self.min_metric}: a finite number")

    def refusal(self, candidate: Evaluation, metric: Metric) -> Decision | None:
        """The refusal of a ``candidate`` below the floor (below-floor, below-class-recall), or None when it
        reaches it."""
        value = candidate.metric(metric)
        if self.min_metric is not None and isinstance(value, int | float) and is_finite_number(value):
            below = value < self.min_metric if METRICS[metric] else value > self.min_metric
            if below:
                bound = "at least" if METRICS[metric] else "at most"
                return Decision(
                    False,
                    f"candidate {metric} {value:.4f} is below the quality floor (--min-metric {self.min_metric}: "
                    f"{bound} that): not promoted, with or without a champion; train longer or on more data, or "
                    "lower the floor",
                    "below-floor",
                )
        if self.min_class_recall is not None:
            recalls = [
                (index, recall)
                for index, recall in enumerate(candidate.per_class_accuracy)
                if recall is not None  # a class without val samples is not measured
            ]
            worst = min(recalls, key=lambda item: item[1], default=None)
            if worst is not None and worst[1] < self.min_class_recall:
                failing = sum(recall < self.min_class_recall for _, recall in recalls)
                return Decision(
                    False,
                    f"class {worst[0]} recall {worst[1]:.4f} is below --min-class-recall {self.min_class_recall} "
                    f"({failing} of {len(recalls)} classes are): not promoted, with or without a champion",
                    "below-class-recall",
                    class_index=worst[0],
                )
        return None

    def described(self) -> str:
        parts = []
        if self.min_metric is not None:
            parts.append(f"min_metric {self.min_metric}")
        if self.min_class_recall is not None:
            parts.append(f"min_class_recall {self.min_class_recall}")
        return ", ".join(parts) or "no quality floor"

    @property
    def is_set(self) -> bool:
        """Whether there is a floor at all."""
        return self.min_metric is not None or self.min_class_recall is not None


def metric_named(name: str) -> Metric:
    """``name`` as a promotion metric; a RegistryError naming the choices when it is none."""
    if name in get_args(Metric):
        return cast(Metric, name)
    raise RegistryError(f"unknown metric {name!r}: choose one of {', '.join(METRICS)}")


@dataclass(frozen=True, kw_only=True)
class PromotionPolicy:
    """How a candidate is judged, built once where the user's options arrive (the CLI, a component) and passed
    whole to every step that decides or states the decision (evaluate's preview, promote, the report).
    Each field's docstring is its ``--help``: `promote` and `report` take these options (tpustream/cli/options.py),
    the floor's among them; the pipeline's parameters decode into it through ``from_pipeline``.
    """

    metric: Metric = "top1"
    """The metric the decision is taken on (macro_f1 and balanced_accuracy weigh every class alike)."""
    min_delta: float = 0.0
    """The least improvement over the champion's --metric that promotes."""
    max_class_drop: float | None = None
    """Refuse a candidate if any class's accuracy drops by more than this (0-1) from the champion's. Default:
    no per-class check."""
    floor: QualityFloor = field(default_factory=QualityFloor)
    max_p_value: float | None = None
    """Promote over a champion only if the gain is this unlikely by chance: McNemar's exact test on the samples
    both were scored on (evaluate --registry). Default: not required."""
    min_class_support: int = 10
    """A class with fewer samples than this on the deciding split (test, else val) is too few to judge: its
    accuracy drop is shown but does not refuse under --max-class-drop; 0: every class decides."""
    beat_majority_baseline: bool = True
    """Refuse a candidate whose --metric does not beat always answering the train split's most frequent class
    on the deciding split (evaluate's baseline), with or without a champion."""

    def __post_init__(self) -> None:
        metric_named(self.metric)
        if isinstance(self.min_class_support, bool) or not isinstance(self.min_class_support, int):
            raise RegistryError(f"--min-class-support {self.min_class_support!r}: a whole number of samples")
        if self.min_class_support < 0:
            raise RegistryError(
                f"--min-class-support {self.min_class_support}: at least 0 (0: every class decides)"
            )
        if self.max_p_value is not None and not 0.0 < self.max_p_value <= 1.0:
            raise RegistryError(f"--max-p-value {self.max_p_value}: a probability in (0, 1], e.g. 0.05")
        if self.max_class_drop is not None and not 0.0 <= self.max_class_drop <= 1.0:
            raise RegistryError(f"--max-class-drop {self.max_class_drop}: a fraction in [0, 1], or none")
        if not math.isfinite(self.min_delta):
            raise RegistryError(f"--min-delta {self.min_delta}: a finite number")

    @classmethod
    def from_options(
        cls,
        *,
        metric: str = "top1",
        min_delta: float = 0.0,
        max_class_drop: float | None = None,
        min_metric: float | None = None,
        min_class_recall: float | None = None,
        max_p_value: float | None = None,
        min_class_support: int | None = None,
        beat_majority_baseline: bool = True,
    ) -> PromotionPolicy:
        """From the command line's options (None: off, or for ``min_class_support`` the policy's default;
        ``metric`` checked against the choices)."""
        support = {} if min_class_support is None else {"min_class_support": min_class_support}
        return cls(
            metric=metric_named(metric),
            min_delta=min_delta,
            max_class_drop=max_class_drop,
            floor=QualityFloor(min_metric=min_metric, min_class_recall=min_class_recall),
            max_p_value=max_p_value,
            **support,
            beat_majority_baseline=beat_majority_baseline,
        )

    @classmethod
    def from_pipeline(
        cls,
        *,
        metric: str,
        min_delta: float,
        max_class_drop: float,
        min_metric: float,
        min_class_recall: float,
        max_p_value: float,
        beat_majority_baseline: bool = True,
        min_class_support: int | None = None,
    ) -> PromotionPolicy:
        """From the pipeline's parameters, where a negative value stands for None (off)."""

        def off(value: float) -> float | None:
            return value if value >= 0 else None

        return cls.from_options(
            metric=metric,
            min_delta=min_delta,
            max_class_drop=off(max_class_drop),
            min_metric=off(min_metric),
            min_class_recall=off(min_class_recall),
            max_p_value=off(max_p_value),
            beat_majority_baseline=beat_majority_baseline,
            min_class_support=min_class_support,
        )

    @property
    def higher_is_better(self) -> bool:
        return METRICS[self.metric]


def is_finite_number(value: Any) -> TypeGuard[float]:
    """A finite int or float; NaN compares false with everything, so it can neither win nor lose."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _shown(value: Any) -> str:
    return "null" if value is None else str(value)


DEFAULT_POLICY = PromotionPolicy()  # promote's defaults: decide on top1, any gain, no other check


def decide(
    candidate: Evaluation,
    champion: Evaluation | None,
    *,
    candidate_digest: str,
    champion_digest: str | None,
    policy: PromotionPolicy = DEFAULT_POLICY,
    baseline: Baseline | None = None,
) -> Decision:
    """Promote when the candidate reaches the ``policy``'s quality floor (if any) and there is no champion, or
    it beats the champion on the policy's metric by more than zero and at least ``min_delta`` on the same
    dataset digest, with no class dropping more than ``max_class_drop``. Ties never promote. Pure: no
    storage, no clock. Every decision has a ``code`` (``DecisionCode``) beside its reason.

    When evaluate scored both on the same samples (``champion.paired``), the reason says how sure the
    comparison is (McNemar's exact test on the samples one model gets right and the other wrong, and the
    sample count); ``max_p_value`` (None: off) refuses a gain whose p-value is above it, or that has no
    paired test to show it.

    With ``policy.beat_majority_baseline``, a candidate whose ``metric`` does not beat the majority-class
    ``baseline`` (evaluate's, on the same split; None: not measured, no check) is refused (``below-baseline``),
    even into an empty registry.

    Non-finite numbers (NaN, ±inf, or null as files store them) never decide a promotion: a candidate
    with a non-finite top1, top5 or loss is a diverged model and is refused, even into an empty registry;
    a champion with a non-finite ``metric`` is kept, since no candidate can be said to beat it on that
    metric (the reason says to decide on another ``--metric``); its other metrics still compare normally.
    """
    metric, min_delta, floor, max_p_value = policy.metric, policy.min_delta, policy.floor, policy.max_p_value
    if not candidate.has(metric):
        return Decision(
            False,
            f"the candidate's evaluation has no {metric} (its metrics.json was written before evaluate measured "
            f"it): re-run tpustream evaluate, or decide on --metric top1",
            "missing-metric",
        )
    broken = [
        f"{name} {_shown(candidate.metric(name))}"
        for name in dict.fromkeys((*_ALWAYS, metric))
        if not is_finite_number(candidate.metric(name))
    ]
    if broken:
        return Decision(
            False,
            f"candidate {', '.join(broken)} is not a finite number: a diverged model is never promoted "
            "(retrain it, e.g. with a lower learning rate)",
            "diverged",
        )
    below = floor.refusal(candidate, metric)
    if below is not None:
        return below
    if policy.beat_majority_baseline and baseline is not None:
        trivial = _baseline_refusal(candidate.metric(metric), baseline, metric)
        if trivial is not None:
            return trivial
    if champion is None:
        if floor.is_set:
            return Decision(
                True,
                f"no champion yet; the candidate reaches the quality floor ({floor.described()})",
                "no-champion",
            )
        return Decision(True, "no champion yet", "no-champion")
    if champion_digest != candidate_digest:
        return Decision(
            False,
            f"champion was measured on dataset {str(champion_digest)[:12]}, the candidate on {candidate_digest[:12]}: "
            "evaluate both on the same shards (tpustream evaluate --registry)",
            "other-dataset",
        )
    if not is_finite_number(champion.metric(metric)):
        return Decision(
            False,
            f"champion {metric} {_shown(champion.metric(metric))} is not a finite number, so no candidate can be "
            f"said to beat it: keeping the champion; decide on another --metric (e.g. top1), or replace a "
            "broken champion by hand",
            "champion-not-finite",
        )
    higher_better = METRICS[metric]
    mine, theirs = candidate.metric(metric), champion.metric(metric)
    gain = mine - theirs if higher_better else theirs - mine
    paired = PairedTest.from_json(champion.paired) if isinstance(champion.paired, dict) else None
    sureness = f" ({paired.described()})" if paired else ""
    if gain <= 0 or gain < min_delta:
        return Decision(
            False,
            f"candidate {metric} {mine:.4f} vs champion {theirs:.4f}: "
            f"improvement {gain:+.4f} is not above 0 and at least --min-delta {min_delta}{sureness}",
            "no-improvement",
        )
    few = ""  # drops beyond the limit on classes too small to judge: said, never decisive
    if policy.max_class_drop is not None:
        support = candidate.class_support()  # both were measured on the same data (the digests match)
        drops = [
            (i, champ - cand, support[i] if i < len(support) else None)
            for i, (cand, champ) in enumerate(
                zip(candidate.per_class_accuracy, champion.per_class_accuracy, strict=True)
            )
            if cand is not None and champ is not None  # a class without samples is not measured
        ]
        judged = [d for d in drops if d[2] is None or d[2] >= policy.min_class_support]
        worst = max(judged, key=lambda d: d[1], default=(None, 0.0, None))
        if worst[1] > policy.max_class_drop:
            return Decision(
                False,
                f"class {worst[0]} accuracy drops by {worst[1]:.4f}, more than --max-class-drop "
                f"{policy.max_class_drop}",
                "class-drop",
                class_index=worst[0],
            )
        small = [f"class {i} (n={n}) by {drop:.4f}" for i, drop, n in drops if drop > policy.max_class_drop]
        if small:
            few = (
                f"; not decisive, fewer samples than --min-class-support {policy.min_class_support}: "
                f"{', '.join(small)} beyond --max-class-drop"
            )
    beats = f"candidate {metric} {mine:.4f} beats champion {theirs:.4f} by {gain:+.4f}"
    if max_p_value is not None:
        if paired is None:
            return Decision(
                False,
                f"{beats}, but --max-p-value {max_p_value} needs both scored on the same samples and the "
                "champion was not (evaluate with --registry scores it): keeping the champion",
                "not-paired",
            )
        if paired.p_value > max_p_value:
            return Decision(
                False,
                f"{beats}, but that could be chance: {paired.described()} is above --max-p-value {max_p_value}; "
                "evaluate on more samples, or keep the champion",
                "not-significant",
            )
    return Decision(True, beats + sureness + few, "wins")


def _baseline_refusal(value: float, baseline: Baseline, metric: Metric) -> Decision | None:
    """A refusal when ``value`` does not beat the ``baseline``'s (a tie does not; an undefined one: no check)."""
    trivial = baseline.metric(metric)
    if not is_finite_number(trivial):
        return None
    beats = value > trivial if METRICS[metric] else value < trivial
    if beats and not math.isclose(value, trivial, rel_tol=1e-9, abs_tol=1e-12):
        return None
    return Decision(
        False,
        f"candidate {metric} {value:.4f} does not beat the majority-class baseline {trivial:.4f} (always "
        f"answering {baseline.answer!r}, the train split's most frequent class): not promoted, with or "
        "without a champion; train longer or on more data, or turn the check off "
        "(--no-beat-majority-baseline, pipeline parameter beat_majority_baseline=false)",
        "below-baseline",
    )


def decide_for_metrics(
    metrics: EvalReport,
    current: ChampionPointer | None,
    policy: PromotionPolicy,
) -> Decision:
    """What `promote` decides for a metrics.json document against the current champion pointer (None:
    no champion), once the candidate is known not to be the champion already. The numbers are those of the
    document's decision split (``metrics.split``: test when the dataset has one); a test decision says so in
    its reason."""
    if policy.metric == "top5" and len(metrics.classes) <= 5:
        raise RegistryError(
            f"--metric top5 with {len(metrics.classes)} classes: every top 5 holds the label, so top-5 is 100% "
            "for any model and cannot tell a better one; decide on top1, macro_f1 or balanced_accuracy"
        )
    decision = _decide_for_metrics(metrics, current, policy)
    if metrics.split == "test":  # val-decided reasons read as they always have
        return replace(decision, reason=f"{decision.reason} (on the held-out test split)")
    return decision


def _decide_for_metrics(
    metrics: EvalReport,
    current: ChampionPointer | None,
    policy: PromotionPolicy,
) -> Decision:
    refusal = _incomplete(metrics) or _not_comparable(metrics, current)
    if refusal is not None:
        return refusal
    champion, champion_digest = champion_to_compare(metrics, current)
    return decide(
        metrics.candidate,
        champion,
        candidate_digest=metrics.dataset.manifest_digest,
        champion_digest=champion_digest,
        policy=policy,
        baseline=metrics.baseline,
    )


def _incomplete(metrics: EvalReport) -> Decision | None:
    """A refusal when the evaluation did not count every sample of its split: its numbers describe part of the
    data."""
    candidate, dataset = metrics.candidate, metrics.dataset
    if candidate.complete is True:
        return None
    counted, expected = candidate.num_samples, dataset.samples(metrics.split)
    gap = ""
    if isinstance(counted, int) and isinstance(expected, int) and counted != expected:
        gap = f" ({expected - counted} missing)" if counted < expected else f" ({counted - expected} extra)"
    return Decision(
        False,
        f"the evaluation is incomplete: it counted {counted} of the dataset's {expected} {metrics.split} "
        f"samples{gap}, so "
        f"it cannot be promoted; find the damaged shards with `tpustream shards verify {dataset.uri or None}`, "
        "fix or re-create them, then evaluate again",
        "incomplete",
    )


def _not_comparable(metrics: EvalReport, current: ChampionPointer | None) -> Decision | None:
    """A refusal when the evaluate run could not measure the champion (``champion_note`` says why, e.g. a
    different class set): its recorded numbers are from other data, so the candidate must not win by default."""
    note = metrics.champion_note
    if current is None or metrics.champion is not None or not note:
        return None
    return Decision(
        False,
        f"{note}. Keeping champion version {current.version}: a candidate is never promoted over a champion "
        "it was not compared with. For the new class set start a new registry (promote with another "
        "--registry), or evaluate on a dataset with the champion's classes",
        "not-compared",
    )


def champion_to_compare(
    metrics: EvalReport, current: ChampionPointer | None
) -> tuple[Evaluation | None, str | None]:
    """The champion numbers to compare with: measured in the same evaluate run when that run saw the
    current champion (and counted every sample), else the ones recorded at its promotion (with their
    own dataset digest, which `decide` checks; a pointer without them compares with nothing and keeps
    the champion)."""
    if current is None:
        return None, None
    measured = metrics.champion
    if measured and measured.version == current.version and measured.complete is not False:
        return measured, metrics.dataset.manifest_digest
    return Evaluation.from_json(current.metrics, "champion.json: 'metrics'"), current.dataset_digest
