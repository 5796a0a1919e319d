"""How the run report writes numbers and the lines both its documents print: counts, percents, decimals and
points (with "not measured" and "not finite" said in words), a history event's value, the champion's heading,
why there are no champion numbers, the policy and baseline lines and the headline table's rows.

The page (``tpustream.report.html``, ``tpustream.report.page``) and the summary (``tpustream.report.markdown``)
print these the same way; each escapes them for its own format.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpustream.artifacts import LabelEditsApplied
from tpustream.registry.history import HistoryEntry
from tpustream.registry.policy import METRICS, Metric, is_finite_number
from tpustream.report.facts import ReportFacts, shows_top5

__all__ = [
    "NOT_MEASURED",
    "baseline_line",
    "champion_heading",
    "decimal",
    "headline",
    "label_edits_line",
    "metric_value",
    "no_champion_text",
    "percent",
    "points",
    "policy_line",
]

NOT_MEASURED = "not measured"


def _count(value: int | None) -> str:
    return NOT_MEASURED if value is None else str(value)


def percent(value: Any, digits: int = 1) -> str:
    """A fraction as a percent with ``digits`` decimals; "not measured" for None, "not finite" for NaN or inf."""
    if value is None:
        return NOT_MEASURED
    if not is_finite_number(value):
        return "not finite"
    return f"{100 * value:.{digits}f}%"


def decimal(value: Any, digits: int = 4) -> str:
    """A float with ``digits`` decimals (an int as it is); "not measured" for None, "not finite" for NaN or inf."""
    if value is None:
        return NOT_MEASURED
    if not is_finite_number(value):
        return "not finite"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def points(fraction: float) -> str:
    """A difference of fractions in percentage points (0.05: "5.0 points")."""
    return f"{100 * fraction:.1f} points"


def metric_value(event: HistoryEntry) -> str:
    """A history event's value: a percent for top-1/top-5, a decimal for the others."""
    value = event.get("value")
    return percent(value, 2) if event.get("metric") in ("top1", "top5") else decimal(value)


def label_edits_line(edits: LabelEditsApplied) -> str:
    """What the dataset's manifest says was left out and relabelled when it was written (its label fixes)."""
    files = ", ".join(
        f"{option} {uri}"
        for option, uri in (("exclude_keys", edits.exclude_keys), ("relabel", edits.relabel))
        if uri
    )
    return (
        f"Label fixes applied when it was written: {len(edits.excluded)} sample(s) left out, "
        f"{len(edits.relabelled)} relabelled ({files})."
    )


def champion_heading(facts: ReportFacts) -> str:
    """The champion's column heading: with its version when metrics.json records it."""
    champion = facts.champion
    if champion is not None and champion.version is not None:
        return f"champion (version {champion.version})"
    return "champion"


def no_champion_text(facts: ReportFacts) -> str:
    """Why there are no champion numbers: not measured (with evaluate's note), or no champion at all."""
    note = facts.metrics.champion_note
    return f"the champion was not measured: {note}" if note else "there is no champion to compare with"


_BALANCED: tuple[tuple[Metric, str], ...] = (
    ("macro_f1", "macro-F1"),
    ("balanced_accuracy", "balanced accuracy"),
)  # metrics' rows


def policy_line(facts: ReportFacts) -> str:
    """The promotion policy the decision was taken with, as one sentence."""
    limit = (
        points(facts.policy.max_class_drop)
        if facts.policy.max_class_drop is not None
        else "none (no per-class check)"
    )
    better = "higher" if facts.policy.higher_is_better else "lower"
    return (
        f"Policy: decide on {facts.policy.metric} ({better} is better) on the {facts.metrics.split} split, "
        f"min_delta {facts.policy.min_delta}, max_class_drop {limit}, min_class_support "
        f"{facts.policy.min_class_support}."
    )


def baseline_line(facts: ReportFacts) -> str | None:
    """The majority-class baseline beside the candidate on the decided metric; None: not measured (an
    evaluation before it)."""
    baseline, metric = facts.metrics.baseline, facts.policy.metric
    if baseline is None:
        return None
    show: Callable[[Any], str] = decimal if metric in ("loss", "macro_f1") else lambda v: percent(v, 2)
    checked = (
        "the candidate must beat it"
        if facts.policy.beat_majority_baseline
        else "not required (beat_majority_baseline off)"
    )
    return (
        f"Majority-class baseline: always answering “{baseline.answer}” (the train split's most frequent class) "
        f"scores {metric} {show(baseline.metric(metric))} on the {facts.metrics.split} split, the candidate "
        f"{show(facts.metrics.candidate.metric(metric))}: {checked}."
    )


def headline(facts: ReportFacts) -> list[tuple[str, str, str, str, str]]:
    """(label, candidate, champion, change, css class of the change) for top-1, top-5 (with more than 5
    classes), loss, samples."""
    candidate, champion = facts.metrics.candidate, facts.champion
    missing = "none" if champion is None and not facts.metrics.champion_note else NOT_MEASURED
    rows = []
    # decided on it: still shown
    top5 = shows_top5(len(facts.metrics.classes)) or facts.policy.metric == "top5"
    top5_row: list[tuple[Metric, str]] = [("top5", "top-5")] if top5 else []
    shown: list[tuple[Metric, str]] = [("top1", "top-1"), *top5_row, ("loss", "loss")]
    # per-sample scores' class-balanced metrics (evaluations before them have none)
    shown += [
        (name, label) for name, label in _BALANCED if candidate.has(name) or name == facts.policy.metric
    ]
    for name, label in shown:
        as_decimal = name in ("loss", "macro_f1")  # an F1 is a score, not a share of samples
        show: Callable[[Any], str] = decimal if as_decimal else lambda v: percent(v, 2)
        mine: Any = candidate.metric(name)
        theirs: Any = champion.metric(name) if champion else None
        change, tone = "", ""
        if is_finite_number(mine) and is_finite_number(theirs):
            delta = mine - theirs
            change = f"{delta:+.4f}" if as_decimal else f"{100 * delta:+.2f} points"
            if delta:
                tone = "better" if (delta > 0) == METRICS[name] else "worse"
        decides = " (decides)" if name == facts.policy.metric else ""
        rows.append((label + decides, show(mine), show(theirs) if champion else missing, change, tone))
    theirs_count = _count(champion.num_samples) if champion else missing
    samples = f"{facts.metrics.split} samples"  # test when the dataset has one: what decides
    rows.append((samples, _count(candidate.num_samples), theirs_count, "", ""))
    return rows
