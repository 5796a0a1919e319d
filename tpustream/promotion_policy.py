"""When a candidate replaces the champion: the promotion rules, pure (no storage, no clock).

``decide`` compares two sets of evaluation numbers; ``decide_for_metrics`` applies it to an evaluate run's
metrics.json against the current champion pointer, refusing first what must never be promoted: an
incomplete evaluation, a champion the run could not measure, non-finite numbers.
``tpustream.promote`` acts on the decision (registry, compare-and-swap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tpustream.artifacts import EvalReport
from tpustream.errors import TpustreamError

__all__ = [
    "METRICS",
    "Decision",
    "RegistryError",
    "decide",
    "decide_for_metrics",
    "champion_to_compare",
    "is_finite_number",
]

METRICS = {"top1": True, "top5": True, "loss": False}  # name -> higher is better


class RegistryError(TpustreamError, ValueError):
    """The registry or the inputs to a promotion are unusable; the message says what and the repair."""


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str


def is_finite_number(value: Any) -> bool:
    """A finite int or float; NaN compares false with everything, so it can neither win nor lose."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _shown(value: Any) -> str:
    return "null" if value is None else str(value)


def decide(
    candidate: dict[str, Any],
    champion: dict[str, Any] | None,
    *,
    candidate_digest: str,
    champion_digest: str | None,
    metric: str = "top1",
    min_delta: float = 0.0,
    max_class_drop: float | None = None,
) -> Decision:
    """Promote when there is no champion, or the candidate beats it on ``metric`` by more than zero and at
    least ``min_delta`` on the same dataset digest, with no class dropping more than ``max_class_drop``.
    Ties never promote. Pure: no storage, no clock.

    Non-finite numbers (NaN, ±inf, or null as files store them) never decide a promotion: a candidate
    with a non-finite top1, top5 or loss is a diverged model and is refused, even into an empty registry;
    a champion with a non-finite ``metric`` is kept, since no candidate can be said to beat it on that
    metric (the reason says to decide on another ``--metric``); its other metrics still compare normally.
    """
    if metric not in METRICS:
        raise RegistryError(f"unknown metric {metric!r}: choose one of {', '.join(METRICS)}")
    broken = [
        f"{name} {_shown(candidate.get(name))}"
        for name in METRICS
        if not is_finite_number(candidate.get(name))
    ]
    if broken:
        return Decision(
            False,
            f"candidate {', '.join(broken)} is not a finite number: a diverged model is never promoted "
            "(retrain it, e.g. with a lower learning rate)",
        )
    if champion is None:
        return Decision(True, "no champion yet")
    if champion_digest != candidate_digest:
        return Decision(
            False,
            f"champion was measured on dataset {str(champion_digest)[:12]}, the candidate on {candidate_digest[:12]}: "
            "evaluate both on the same shards (tpustream evaluate --registry)",
        )
    if not is_finite_number(champion.get(metric)):
        return Decision(
            False,
            f"champion {metric} {_shown(champion.get(metric))} is not a finite number, so no candidate can be "
            f"said to beat it: keeping the champion; decide on another --metric (e.g. top1), or replace a "
            "broken champion by hand",
        )
    higher_better = METRICS[metric]
    gain = candidate[metric] - champion[metric] if higher_better else champion[metric] - candidate[metric]
    if gain <= 0 or gain < min_delta:
        return Decision(
            False,
            f"candidate {metric} {candidate[metric]:.4f} vs champion {champion[metric]:.4f}: "
            f"improvement {gain:+.4f} is not above 0 and at least --min-delta {min_delta}",
        )
    if max_class_drop is not None:
        drops = [
            (i, champ - cand)
            for i, (cand, champ) in enumerate(
                zip(candidate["per_class_accuracy"], champion["per_class_accuracy"], strict=True)
            )
            if cand is not None and champ is not None  # a class without val samples is not measured
        ]
        worst = max(drops, key=lambda d: d[1], default=(None, 0.0))
        if worst[1] > max_class_drop:
            return Decision(
                False,
                f"class {worst[0]} accuracy drops by {worst[1]:.4f}, more than --max-class-drop {max_class_drop}",
            )
    return Decision(
        True,
        f"candidate {metric} {candidate[metric]:.4f} beats champion {champion[metric]:.4f} by {gain:+.4f}",
    )


def decide_for_metrics(
    metrics: EvalReport,
    current: dict[str, Any] | None,
    *,
    metric: str,
    min_delta: float,
    max_class_drop: float | None = None,
) -> Decision:
    """What `promote` decides for a metrics.json document against the current champion pointer (None:
    no champion), once the candidate is known not to be the champion already."""
    refusal = _incomplete(metrics) or _not_comparable(metrics, current)
    if refusal is not None:
        return refusal
    champion, champion_digest = champion_to_compare(metrics, current)
    return decide(
        metrics.candidate,
        champion,
        candidate_digest=metrics.dataset.manifest_digest,
        champion_digest=champion_digest,
        metric=metric,
        min_delta=min_delta,
        max_class_drop=max_class_drop,
    )


def _incomplete(metrics: EvalReport) -> Decision | None:
    """A refusal when the evaluation did not count every val sample: its numbers describe part of the data."""
    candidate, dataset = metrics.candidate, metrics.dataset
    if candidate.get("complete") is True:
        return None
    counted, expected = candidate.get("num_samples"), dataset.val_samples
    gap = ""
    if isinstance(counted, int) and isinstance(expected, int) and counted != expected:
        gap = f" ({expected - counted} missing)" if counted < expected else f" ({counted - expected} extra)"
    return Decision(
        False,
        f"the evaluation is incomplete: it counted {counted} of the dataset's {expected} val samples{gap}, so "
        f"it cannot be promoted; find the damaged shards with `tpustream shards verify {dataset.uri or None}`, "
        "fix or re-create them, then evaluate again",
    )


def _not_comparable(metrics: EvalReport, current: dict[str, Any] | None) -> Decision | None:
    """A refusal when the evaluate run could not measure the champion (``champion_note`` says why, e.g. a
    different class set): its recorded numbers are from other data, so the candidate must not win by default."""
    note = metrics.champion_note
    if current is None or metrics.champion is not None or not note:
        return None
    return Decision(
        False,
        f"{note}. Keeping champion version {current['version']}: a candidate is never promoted over a champion "
        "it was not compared with. For the new class set start a new registry (promote with another "
        "--registry), or evaluate on a dataset with the champion's classes",
    )


def champion_to_compare(
    metrics: EvalReport, current: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, str | None]:
    """The champion numbers to compare with: measured in the same evaluate run when that run saw the
    current champion (and counted every sample), else the ones recorded at its promotion (with their
    own dataset digest, which `decide` checks)."""
    if current is None:
        return None, None
    measured = metrics.champion
    if measured and measured.get("version") == current["version"] and measured.get("complete", True):
        return measured, metrics.dataset.manifest_digest
    return current["metrics"], current["dataset_digest"]
