"""The run report's Markdown: the summary it writes, and the data check's Markdown it reads for the page.

The summary holds the page's facts as text; it is what the KFP UI shows as a Markdown artifact: the decision
and headline numbers, the 20 largest per-class drops (and every class beyond max_class_drop), the training in
one line, the data set (with the label fixes it was written with), the data check's own Markdown (its headings
moved under this one's), the near-duplicates across splits (val/test key -> train key, distance), the likely
label errors (key, given and suggested class, score; the first 20 with their count) and the 10 newest history
events. Every user string is escaped for Markdown and for HTML (the KFP UI renders HTML in Markdown).
``markdown_html`` turns the data check's report (headings, paragraphs, tables, lists, **bold**, `code`) into
HTML for the page's data check section, every character escaped first.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tpustream.report.facts import ReportFacts, history_oldest_first
from tpustream.report.formatting import (
    NOT_MEASURED,
    baseline_line,
    champion_heading,
    decimal,
    headline,
    label_edits_line,
    metric_value,
    no_champion_text,
    percent,
    points,
    policy_line,
)
from tpustream.report.page import table
from tpustream.report.recipe import loss_alarm, recipe_rows
from tpustream.report.verdict import ClassRow, Verdict, shown_rows, support_note, too_few_text

if TYPE_CHECKING:
    from tpustream.report.label_issues import LabelErrorsGallery
    from tpustream.report.near_leaks import NearLeaksGallery

__all__ = ["markdown_html", "render_markdown"]

_E = html.escape
MARKDOWN_CLASS_ROWS = 20
MARKDOWN_HISTORY_ROWS = 10
MARKDOWN_NEAR_LEAK_ROWS = 20  # pairs, the surest first
MARKDOWN_LABEL_ERROR_ROWS = 20  # the most contradicted first

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#])")


def _md(text: Any) -> str:
    """A user string in Markdown: Markdown's markup escaped, HTML's too (the KFP UI renders HTML in Markdown)."""
    return _MD_SPECIAL.sub(r"\\\1", html.escape(str(text), quote=False)).replace("\n", " ")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return (
        ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        + ["| " + " | ".join(row) + " |" for row in rows]
        + [""]
    )


def render_markdown(facts: ReportFacts, verdict: Verdict, rows: list[ClassRow]) -> str:
    """The summary for ``facts``.

    Args:
        facts: what the summary shows.
        verdict: the decision it states (``tpustream.report.verdict.verdict_of``).
        rows: the per-class rows (``tpustream.report.verdict.class_rows``).

    Returns:
        The summary: Markdown, every user string escaped for Markdown and HTML.
    """
    champion = facts.champion
    lines = [
        f"# Run report: {verdict.title}",
        "",
        f"**{_md(verdict.sentence)}**",
        "",
    ]
    alarm = loss_alarm(facts.model_card.history)
    if alarm:
        lines += [f"> **Warning:** {_md(alarm)}", ""]
    lines += [
        policy_line(facts),
        "",
    ]
    if (baseline := baseline_line(facts)) is not None:
        lines += [_md(baseline), ""]
    lines += _md_table(
        ["", "candidate", _md(champion_heading(facts)), "change"],
        [[_md(c) for c in row[:4]] for row in headline(facts)],
    )
    if champion is None:
        lines += [f"No champion numbers: {_md(no_champion_text(facts))}.", ""]

    listed = shown_rows(rows, MARKDOWN_CLASS_ROWS)
    lines += ["## Per-class accuracy", ""]
    limit = (
        f"max_class_drop {points(facts.policy.max_class_drop)}"
        if facts.policy.max_class_drop is not None
        else "no max_class_drop was set"
    )
    lines += [f"{_md(support_note(facts, rows))} Largest drops first; {limit}.", ""]
    cells = []
    for row in listed:
        name = f"**{_md(row.name)}**" if row.exceeds else _md(row.name)
        drop = f"{100 * row.drop:+.1f}" if row.drop is not None else NOT_MEASURED
        cells.append(
            [
                name,
                percent(row.candidate),
                percent(row.champion) if champion else "none",
                drop,
                "**yes**" if row.exceeds else "",
                _md(too_few_text(row)),
            ]
        )
    split = _md(facts.metrics.split)
    header = ["class", "candidate", "champion", "drop (points)", "beyond max_class_drop", f"{split} samples"]
    lines += _md_table(header, cells)
    if len(listed) < len(rows):
        lines += [f"{len(rows) - len(listed)} more classes, with smaller drops, are not listed.", ""]

    history = facts.model_card.history
    lines += ["## Training", ""]
    if history:
        first, last = history[0], history[-1]
        lines += [
            f"{_md(facts.model_card.arch)}, {len(history)} epochs: train loss {decimal(first.get('train_loss'))} → "
            f"{decimal(last.get('train_loss'))}, val top-1 {percent(first.get('val_top1'), 2)} → {percent(last.get('val_top1'), 2)}.",
            "",
        ]
    else:
        lines += ["No per-epoch history in the model card.", ""]

    lines += ["## Training recipe", ""]
    lines += _md_table(
        ["", "from the candidate's model.json"], [[_md(a), _md(b)] for a, b in recipe_rows(facts.model_card)]
    )
    lines += _markdown_dataset(facts)
    if facts.data_check_markdown is not None:
        lines += ["## Data check", ""]
        lines += [
            re.sub(r"^(#{1,4}) ", r"\1## ", line) for line in facts.data_check_markdown.splitlines()
        ] + [""]
    if facts.near_leaks is not None:
        lines += _markdown_near_leaks(facts.near_leaks)
    if facts.label_errors is not None:
        lines += _markdown_label_errors(facts.label_errors)
    if facts.history is not None:
        lines += _markdown_history(facts)
    return "\n".join(lines).rstrip("\n") + "\n"


def _markdown_dataset(facts: ReportFacts) -> list[str]:
    lines = ["## Data set", "", f"`{(facts.metrics.dataset.uri or '?').replace('`', '')}`", ""]
    if facts.manifest is None:
        return lines + ["The manifest was not given.", ""]
    splits, classes = facts.manifest.splits, facts.manifest.classes
    shown = ", ".join(_md(name) for name in classes[:MARKDOWN_CLASS_ROWS])
    lines += [f"{len(classes)} classes: {shown}{', …' if len(classes) > MARKDOWN_CLASS_ROWS else ''}", ""]
    lines += _md_table(["split", "samples"], [[_md(name), str(s.num_samples)] for name, s in splits.items()])
    skipped = facts.manifest.skipped
    reasons = ", ".join(
        f"{_md(reason)} {count}" for reason, count in sorted(skipped.by_reason.items(), key=lambda r: -r[1])
    )
    lines += [f"Skipped: {skipped.count or 'none'}{f' ({reasons})' if reasons else ''}.", ""]
    if facts.manifest.label_edits is not None:
        lines += [_md(label_edits_line(facts.manifest.label_edits)), ""]
    return lines


def _markdown_near_leaks(gallery: NearLeaksGallery) -> list[str]:
    """The page's near-duplicates section as a table: each held-out image's key and source beside its train
    image's, and the distance."""
    listed = gallery.pairs[:MARKDOWN_NEAR_LEAK_ROWS]
    splits = " and ".join(f"{count} {_md(split)}" for split, count in gallery.leaked.items() if count)
    more = f"; the {len(listed)} closest listed" if gallery.total > len(listed) else ""
    lines = [
        "## Near-duplicates across splits",
        "",
        f"{gallery.total} held-out image(s) ({splits}) within {gallery.max_distance} bits of a train image's "
        f"perceptual hash without being byte copies{more}. Exclude them (the `exclude_keys` parameter) or move "
        "them to train.",
        "",
    ]
    cells = [
        [
            _md(pair["split"]),
            _md(pair["key"]),
            _md(pair["source"]),
            _md(pair["train_key"]),
            _md(pair["train_source"]),
            str(pair["distance"]),
        ]
        for pair in listed
    ]
    return lines + _md_table(["split", "key", "source", "train key", "train source", "bits"], cells)


def _markdown_label_errors(gallery: LabelErrorsGallery) -> list[str]:
    """The page's likely label errors as a table: key, source, given and suggested class, and the score (the
    probability the candidate gives the given label)."""
    lines = ["## Likely label errors", ""]
    split = _md(gallery.split)
    if not gallery.issues:
        return lines + [
            f"No likely label error: the candidate contradicts no given label among the {gallery.num_samples} "
            f"{split} samples with confidence.",
            "",
        ]
    listed = gallery.issues[:MARKDOWN_LABEL_ERROR_ROWS]
    more = f"; the first {len(listed)} listed" if gallery.total > len(listed) else ""
    lines += [
        f"{gallery.total} of {gallery.num_samples} {split} samples whose given label the candidate contradicts "
        f"most confidently (confident learning on its out-of-sample scores{more}, the least probable label "
        "first). Fix them on the next run: their sources in a file for the `exclude_keys` parameter (`shards "
        "create --exclude-keys`), corrections as source,class rows for `relabel`.",
        "",
    ]
    cells = [
        [
            _md(issue.key),
            _md(issue.source) if issue.source else "",
            _md(issue.given_class),
            _md(issue.suggested_class),
            f"{issue.self_confidence:.3f}",
        ]
        for issue in listed
    ]
    header = ["key", "source", "given class", "suggested class", "score (p of given)"]
    return lines + _md_table(header, cells)


def _markdown_history(facts: ReportFacts) -> list[str]:
    events = history_oldest_first(facts)
    lines = [f"## Champion history (last {MARKDOWN_HISTORY_ROWS})", ""]
    if not events:
        return lines + ["No registry events yet.", ""]
    cells = [
        [
            _md(event.get("time", "")),
            _md(event.get("event", "")),
            _md(event.get("version") if event.get("version") is not None else ""),
            f"{_md(event.get('metric', ''))} {metric_value(event)}",
            _md(event.get("reason", "")),
        ]
        for event in list(reversed(events))[:MARKDOWN_HISTORY_ROWS]
    ]
    return lines + _md_table(["time", "event", "version", "value", "reason"], cells)


# --------------------------------------------------------------------------- the data check's Markdown, as HTML

_MD_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
_MD_SEPARATOR = re.compile(r"^:?-+:?$")


def markdown_html(text: str) -> str:
    """The Markdown the data check writes (headings, paragraphs, tables, lists, **bold**, `code`) as HTML,
    every character of it escaped first; headings move two levels down, under the page's section."""
    out: list[str] = []
    paragraph: list[str] = []
    table_rows: list[list[str]] = []
    items: list[str] = []

    def flush() -> None:
        if paragraph:
            out.append(f"<p>{_md_inline(' '.join(paragraph))}</p>")
            paragraph.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{_md_inline(item)}</li>" for item in items) + "</ul>")
            items.clear()
        if table_rows:
            body = [
                row for row in table_rows[1:] if not all(_MD_SEPARATOR.match(cell.strip()) for cell in row)
            ]
            header = [_md_inline(cell) for cell in table_rows[0]]
            out.append(table(header, [[_md_inline(cell) for cell in row] for row in body], css="text"))
            table_rows.clear()

    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        heading = _MD_HEADING.match(stripped)
        kind = "table" if stripped.startswith("|") else "item" if stripped.startswith("- ") else "text"
        if not stripped or heading or kind != current:
            flush()
            current = kind
        if kind == "table":
            row = stripped[1:]
            if row.endswith("|") and not row.endswith("\\|"):
                row = row[:-1]
            table_rows.append([cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", row)])
        elif kind == "item":
            items.append(stripped[2:])
        elif heading:
            level = min(6, len(heading.group(1)) + 2)
            out.append(f"<h{level}>{_md_inline(heading.group(2))}</h{level}>")
        elif stripped:
            paragraph.append(stripped)
    flush()
    return "".join(out)


def _md_inline(text: str) -> str:
    parts = re.split(r"`([^`]*)`", text)  # odd parts are code spans
    out = []
    for position, part in enumerate(parts):
        escaped = _E(part)
        out.append(
            f"<code>{escaped}</code>"
            if position % 2
            else re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)
        )
    return "".join(out)
