"""What a run report states, shared by the page and the summary: the facts, and the verdict and rows they make.

``ReportFacts`` holds the run's documents as their files hold them (``tpustream.report.build.build_report_facts``
reads them). The functions below turn them into what both documents say the same way: the verdict (promoted,
wins, already the champion, refused, and why, a per-class refusal told by class name), the per-class rows
(largest drop first), the headline numbers, the policy line, the classes the heatmaps show and the history
oldest first; and the two HTML helpers the page and the data check's conversion share (``_E``, ``_table``).
Their names keep the underscore: they are the vocabulary of ``tpustream.report.build``,
``tpustream.report.html`` and ``tpustream.report.markdown``, not an API.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tpustream.artifacts import EvalReport, Evaluation, Manifest, ModelCard
from tpustream.registry.history import HistoryEntry
from tpustream.registry.policy import METRICS, Decision, Metric, PromotionPolicy, is_finite_number
from tpustream.release.promote import ALREADY_CHAMPION, PromotionOutcome

if TYPE_CHECKING:
    from tpustream.report.mistakes import Mistake

__all__ = ["NOT_MEASURED", "PLOTTED_CLASSES", "ReportFacts", "shows_top5"]

PLOTTED_CLASSES = 30  # above this many classes, plots show the 30 with the most errors (or largest drops)
NOT_MEASURED = "not measured"


def shows_top5(num_classes: int) -> bool:
    """Whether top-5 accuracy says anything: only with more than 5 classes. With 5 or fewer every top 5 holds
    the label, so top-5 is 100% by construction; metrics.json keeps it (the contract), the report, the KFP
    metrics and `tpustream evaluate` do not show it."""
    return num_classes > 5


@dataclass(frozen=True, kw_only=True)
class ReportFacts:
    """Everything a run report shows, as plain data: the documents as their files hold them.

    Attributes:
        model_card: the candidate's model card (``tpustream.train.evaluate.load_model_card``): ``arch``,
            ``classes``, ``history`` (one dict per epoch: ``epoch``, ``train_loss``, ``val_loss``, ``val_top1``,
            ``val_top5``, ``val_samples``, ``epoch_seconds``, ``samples_per_s``, ``data_wait_fraction``,
            ``compiles``), ``metrics`` (the best epoch), ``init`` (a warm start's origin, None: random).
        metrics: evaluate's ``metrics.json``: ``classes``, ``candidate`` and ``champion`` (None when not
            measured) each with ``top1``, ``top5``, ``loss``, ``num_samples``, ``per_class_accuracy`` (None per
            class: no val sample), ``confusion_matrix``; ``champion_note``; ``dataset``.
        decision: promote or keep, and why (``tpustream.release.promote.preview_decision``, or the promote outcome's).
        policy: the promotion policy the decision was taken with (its metric, min_delta, max_class_drop).
        outcome: what ``tpustream.release.promote.promote`` returned when the promote step ran; None when it
            did not run.
        manifest: the dataset's manifest (``tpustream.dataset.manifest.load_manifest``); None: not shown.
        data_check_markdown: the check data step's Markdown report (``DataCheckReport.to_markdown()``, the
            step's ``report`` artifact), shown as its own section; None: no section.
        history: the champion's history (``tpustream.registry.history.champion_history``): dicts with ``time``,
            ``event`` ("promoted", "refused", "already-champion"), ``version``, ``candidate``,
            ``dataset_digest``, ``metric``, ``value``, ``reason``, ``champion_version``; None: no section.
        mistakes: the candidate's most confident wrong predictions (``report.mistakes.pick_mistakes``) and
            ``thumbnails`` (key -> JPEG data URI) for them; None: no per-sample scores, no section.
    """

    model_card: ModelCard
    metrics: EvalReport
    decision: Decision
    policy: PromotionPolicy = field(default_factory=PromotionPolicy)
    outcome: PromotionOutcome | None = None
    manifest: Manifest | None = None
    data_check_markdown: str | None = None
    history: list[HistoryEntry] | None = None
    mistakes: list[Mistake] | None = None
    thumbnails: dict[str, str] = field(default_factory=dict)


def _count(value: int | None) -> str:
    return NOT_MEASURED if value is None else str(value)


def _percent(value: Any, digits: int = 1) -> str:
    if value is None:
        return NOT_MEASURED
    if not is_finite_number(value):
        return "not finite"
    return f"{100 * value:.{digits}f}%"


def _decimal(value: Any, digits: int = 4) -> str:
    if value is None:
        return NOT_MEASURED
    if not is_finite_number(value):
        return "not finite"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _points(fraction: float) -> str:
    return f"{100 * fraction:.1f} points"


@dataclass(frozen=True)
class _ClassRow:
    index: int
    name: str
    candidate: float | None
    champion: float | None
    drop: float | None  # champion minus candidate: positive is worse
    exceeds: bool  # beyond max_class_drop, on a class with enough samples to judge: it refuses
    support: int | None = None  # the class's samples on the deciding split; None: not recorded
    too_few: bool = False  # under the policy's min_class_support: shown, never decisive


def _too_few_text(row: _ClassRow) -> str:
    """A class's sample count, and the mark of one too small to judge (``PromotionPolicy.min_class_support``)."""
    if row.support is None:
        return ""
    return f"n={row.support}, too few to judge" if row.too_few else str(row.support)


def _class_rows(facts: ReportFacts) -> list[_ClassRow]:
    """One row per class, the largest drop first (unmeasured classes last)."""
    classes = facts.metrics.classes
    candidate = facts.metrics.candidate.per_class_accuracy or [None] * len(classes)
    champion = _champion(facts)
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
        rows.append(_ClassRow(index, name, mine, held, drop, exceeds, samples, too_few))
    return sorted(rows, key=lambda r: (r.drop is None, -(r.drop or 0.0), r.index))


def _shown_rows(rows: list[_ClassRow], limit: int) -> list[_ClassRow]:
    """The first ``limit`` rows, and every row beyond max_class_drop whatever its place."""
    return [row for position, row in enumerate(rows) if position < limit or row.exceeds]


def _champion(facts: ReportFacts) -> Evaluation | None:
    return facts.metrics.champion


def _champion_heading(facts: ReportFacts) -> str:
    champion = _champion(facts)
    if champion is not None and champion.version is not None:
        return f"champion (version {champion.version})"
    return "champion"


def _no_champion_text(facts: ReportFacts) -> str:
    """Why there are no champion numbers: not measured (with evaluate's note), or no champion at all."""
    note = facts.metrics.champion_note
    return f"the champion was not measured: {note}" if note else "there is no champion to compare with"


@dataclass(frozen=True)
class _Verdict:
    kind: str  # the header's CSS class: promoted, wins, champion, refused
    title: str
    sentence: str


_BALANCED: tuple[tuple[Metric, str], ...] = (
    ("macro_f1", "macro-F1"),
    ("balanced_accuracy", "balanced accuracy"),
)  # metrics' rows
_CLASS_DROP = re.compile(r"^class (\d+) accuracy drops by")  # registry.policy.decide's per-class refusal


def _verdict(facts: ReportFacts, rows: list[_ClassRow]) -> _Verdict:
    outcome = facts.outcome
    reason = str((outcome.reason if outcome else "") or facts.decision.reason).rstrip(".")
    if outcome is not None and outcome.promoted:
        previous = outcome.previous_version
        before = f"replacing version {previous}" if previous is not None else "the registry's first champion"
        return _Verdict(
            "promoted",
            f"Promoted as version {outcome.version}",
            f"Promoted: the candidate is now champion version {outcome.version} ({before}): {reason}.",
        )
    if reason == ALREADY_CHAMPION:
        version = outcome.version if outcome else None
        which = f" (version {version})" if version is not None else ""
        return _Verdict(
            "champion",
            "Already the champion",
            f"Nothing to promote: the candidate is already the champion{which}.",
        )
    if facts.decision.promote and not facts.outcome:
        return _Verdict("wins", "Candidate wins", f"The candidate wins and may be promoted: {reason}.")
    return _Verdict("refused", "Refused", f"Refused, the champion stays: {_refusal(reason, facts, rows)}.")


def _refusal(reason: str, facts: ReportFacts, rows: list[_ClassRow]) -> str:
    """The policy's reason, with a per-class refusal told by class name and accuracies."""
    match = _CLASS_DROP.match(reason)
    worst = next((row for row in rows if match and row.index == int(match.group(1))), None)
    if worst is None or worst.drop is None or facts.policy.max_class_drop is None:
        return reason
    others = sum(1 for row in rows if row.exceeds and row is not worst)
    more = (
        f"; {others} more class{'es' if others > 1 else ''} also drop{'' if others > 1 else 's'} beyond it"
        if others
        else ""
    )
    return (
        f"class “{worst.name}” accuracy drops by {_points(worst.drop)} ({_percent(worst.champion)} → "
        f"{_percent(worst.candidate)}), more than max_class_drop allows ({_points(facts.policy.max_class_drop)}){more}"
    )


def _policy_line(facts: ReportFacts) -> str:
    limit = (
        _points(facts.policy.max_class_drop)
        if facts.policy.max_class_drop is not None
        else "none (no per-class check)"
    )
    better = "higher" if facts.policy.higher_is_better else "lower"
    return (
        f"Policy: decide on {facts.policy.metric} ({better} is better) on the {facts.metrics.split} split, "
        f"min_delta {facts.policy.min_delta}, max_class_drop {limit}, min_class_support "
        f"{facts.policy.min_class_support}."
    )


def _support_note(facts: ReportFacts, rows: list[_ClassRow]) -> str:
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


def _baseline_line(facts: ReportFacts) -> str | None:
    """The majority-class baseline beside the candidate on the decided metric; None: not measured (an
    evaluation before it)."""
    baseline, metric = facts.metrics.baseline, facts.policy.metric
    if baseline is None:
        return None
    show: Callable[[Any], str] = _decimal if metric in ("loss", "macro_f1") else lambda v: _percent(v, 2)
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


def _headline(facts: ReportFacts) -> list[tuple[str, str, str, str, str]]:
    """(label, candidate, champion, change, css class of the change) for top-1, top-5 (with more than 5
    classes), loss, samples."""
    candidate, champion = facts.metrics.candidate, _champion(facts)
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
        show: Callable[[Any], str] = _decimal if as_decimal else lambda v: _percent(v, 2)
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


def _errors_per_class(matrix: Any, size: int) -> list[int]:
    if not _is_square(matrix, size):
        return [0] * size
    return [sum(row) - row[i] for i, row in enumerate(matrix)]


def _is_square(matrix: Any, size: int) -> bool:
    return (
        isinstance(matrix, list)
        and len(matrix) == size
        and all(isinstance(r, list) and len(r) == size for r in matrix)
    )


def _confusion_classes(facts: ReportFacts) -> list[int]:
    """The classes the heatmaps show: all of them up to PLOTTED_CLASSES, else the ones with the most errors
    (candidate's and champion's together), in class order; the rest would be unreadable ticks."""
    size = len(facts.metrics.classes)
    if size <= PLOTTED_CLASSES:
        return list(range(size))
    errors = _errors_per_class(facts.metrics.candidate.confusion_matrix, size)
    champion = _champion(facts)
    if champion is not None:
        errors = [
            a + b for a, b in zip(errors, _errors_per_class(champion.confusion_matrix, size), strict=True)
        ]
    return sorted(sorted(range(size), key=lambda i: (-errors[i], i))[:PLOTTED_CLASSES])


def _events(facts: ReportFacts) -> list[HistoryEntry]:
    """The history oldest first (ISO-8601 times sort as text)."""
    return sorted(facts.history or [], key=lambda event: str(event.get("time") or ""))


def _metric_value(event: HistoryEntry) -> str:
    value = event.get("value")
    return _percent(value, 2) if event.get("metric") in ("top1", "top5") else _decimal(value)


# --------------------------------------------------------------------------- HTML the page and the data check share

_E = html.escape


def _table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    row_classes: Sequence[str] | None = None,
    css: str = "",
) -> str:
    """An HTML table from cells that are already HTML (escaped before); ``row_classes``: a CSS class per row."""
    head = "".join(f"<th>{cell}</th>" for cell in header)
    body = []
    for position, row in enumerate(rows):
        row_css = row_classes[position] if row_classes else ""
        attribute = f' class="{row_css}"' if row_css else ""
        body.append(f"<tr{attribute}>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>")
    attribute = f' class="{css}"' if css else ""
    return f"<table{attribute}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
