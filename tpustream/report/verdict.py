"""What a run report states about the decision, the same way on the page and in the summary: the verdict
(promoted, wins, already the champion, refused, and why, a per-class refusal told by class name) and the
per-class rows (largest drop first) it is told with.

``class_rows`` makes the rows and ``verdict_of`` the verdict from a ``ReportFacts``;
``tpustream.report.build.render_report`` hands both to ``tpustream.report.html.render_html`` and
``tpustream.report.markdown.render_markdown``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tpustream.registry.policy import is_finite_number
from tpustream.report.facts import ReportFacts
from tpustream.report.formatting import percent, points

__all__ = [
    "ClassRow",
    "Verdict",
    "VerdictKind",
    "class_rows",
    "shown_rows",
    "support_note",
    "too_few_text",
    "verdict_of",
]

VerdictKind = Literal["promoted", "wins", "champion", "refused"]


@dataclass(frozen=True)
class ClassRow:
    """One class's accuracy, candidate beside champion, and whether its drop refuses the candidate.

    Attributes:
        index: the class's index in ``metrics.json``'s ``classes``.
        name: the class's name.
        candidate: the candidate's accuracy on the class; None: not measured (no sample of it).
        champion: the champion's; None: not measured, or no champion.
        drop: champion minus candidate, positive is worse; None when either is not measured.
        exceeds: the drop is beyond ``max_class_drop`` on a class with enough samples to judge: it refuses.
        support: the class's samples on the deciding split; None: not recorded.
        too_few: fewer samples than the policy's ``min_class_support``: shown, never decisive.
    """

    index: int
    name: str
    candidate: float | None
    champion: float | None
    drop: float | None  # champion minus candidate: positive is worse
    exceeds: bool  # beyond max_class_drop, on a class with enough samples to judge: it refuses
    support: int | None = None  # the class's samples on the deciding split; None: not recorded
    too_few: bool = False  # under the policy's min_class_support: shown, never decisive


@dataclass(frozen=True)
class Verdict:
    """The decision as the report's header states it.

    Attributes:
        kind: which decision: the header's CSS class (promoted, wins, champion, refused).
        title: the page's title and the summary's heading ("Promoted as version 3").
        sentence: the decision and why, one sentence.
    """

    kind: VerdictKind  # the header's CSS class: promoted, wins, champion, refused
    title: str
    sentence: str


def too_few_text(row: ClassRow) -> str:
    """A class's sample count, and the mark of one too small to judge (``PromotionPolicy.min_class_support``)."""
    if row.support is None:
        return ""
    return f"n={row.support}, too few to judge" if row.too_few else str(row.support)


def class_rows(facts: ReportFacts) -> list[ClassRow]:
    """One row per class, the largest drop first (unmeasured classes last)."""
    classes = facts.metrics.classes
    candidate = facts.metrics.candidate.per_class_accuracy or [None] * len(classes)
    champion = facts.champion
    theirs = (champion.per_class_accuracy if champion else []) or [None] * len(classes)
    support = facts.metrics.candidate.class_support()
    rows = []
    for index, name in enumerate(classes):
        mine: Any = candidate[index] if index < len(candidate) else None
        held: Any = theirs[index] if index < len(theirs) else None
        drop = float(held) - float(mine) if is_finite_number(mine) and is_finite_number(held) else None
        samples = support[index] if index < len(support) else None
        too_few = samples is not None and samples < facts.policy.min_class_support
        exceeds = (
            drop is not None
            and facts.policy.max_class_drop is not None
            and drop > facts.policy.max_class_drop
            and not too_few
        )
        rows.append(ClassRow(index, name, mine, held, drop, exceeds, samples, too_few))
    return sorted(rows, key=lambda r: (r.drop is None, -(r.drop or 0.0), r.index))


def shown_rows(rows: list[ClassRow], limit: int) -> list[ClassRow]:
    """The first ``limit`` rows, and every row beyond max_class_drop whatever its place."""
    return [row for position, row in enumerate(rows) if position < limit or row.exceeds]


def verdict_of(facts: ReportFacts, rows: list[ClassRow]) -> Verdict:
    """The decision ``facts`` hold (the promote outcome's when there is one) as the report states it.

    Args:
        facts: the run's facts.
        rows: its per-class rows (``class_rows``): a per-class refusal names its class and accuracies.

    Returns:
        The verdict the page's header and the summary's first lines state.
    """
    outcome = facts.outcome
    # what was decided is told by its code (and class), never by the reason's words
    decision = outcome.decision if outcome is not None else facts.decision
    reason = str(decision.reason or facts.decision.reason).rstrip(".")
    if outcome is not None and outcome.promoted:
        previous = outcome.previous_version
        before = f"replacing version {previous}" if previous is not None else "the registry's first champion"
        return Verdict(
            "promoted",
            f"Promoted as version {outcome.version}",
            f"Promoted: the candidate is now champion version {outcome.version} ({before}): {reason}.",
        )
    if decision.code == "already-champion":
        version = outcome.version if outcome else None
        which = f" (version {version})" if version is not None else ""
        return Verdict(
            "champion",
            "Already the champion",
            f"Nothing to promote: the candidate is already the champion{which}.",
        )
    if facts.decision.promote and not facts.outcome:
        return Verdict("wins", "Candidate wins", f"The candidate wins and may be promoted: {reason}.")
    dropped = decision.class_index if decision.code == "class-drop" else None
    refusal = _refusal(reason, dropped, facts, rows)
    return Verdict("refused", "Refused", f"Refused, the champion stays: {refusal}.")


def _refusal(reason: str, dropped: int | None, facts: ReportFacts, rows: list[ClassRow]) -> str:
    """The policy's reason, with a per-class refusal (``dropped``: the class a class-drop decision names) told by
    class name and accuracies."""
    worst = next((row for row in rows if dropped is not None and row.index == dropped), None)
    if worst is None or worst.drop is None or facts.policy.max_class_drop is None:
        return reason
    others = sum(1 for row in rows if row.exceeds and row is not worst)
    more = (
        f"; {others} more class{'es' if others > 1 else ''} also drop{'' if others > 1 else 's'} beyond it"
        if others
        else ""
    )
    return (
        f"class “{worst.name}” accuracy drops by {points(worst.drop)} ({percent(worst.champion)} → "
        f"{percent(worst.candidate)}), more than max_class_drop allows ({points(facts.policy.max_class_drop)}){more}"
    )


def support_note(facts: ReportFacts, rows: list[ClassRow]) -> str:
    """What the per-class numbers are measured on, and which classes are too small to judge."""
    split = facts.metrics.split
    few = [row for row in rows if row.too_few]
    text = f"Accuracy on each class's {split} samples."
    if few:
        limit = facts.policy.min_class_support
        text += (
            f" {len(few)} class{'es have' if len(few) > 1 else ' has'} fewer than {limit} {split} samples "
            f"(min_class_support): too few to judge, {'their drops do' if len(few) > 1 else 'its drop does'} "
            "not refuse the candidate (min_class_support 0 makes every class decide)."
        )
    return text
