"""The run report's HTML page: the decision in a header, then one section per concern, in one file.

Sections, in order: the decision with headline numbers, training curves, confusion matrices, per-class
accuracy, the data set, the data check (when given), the champion's history (when given). Above 30 classes
(PLOTTED_CLASSES) tick labels would be unreadable: the heatmaps show the 30 classes with the most errors, the
per-class bars the 30 largest drops, and the captions say so; the per-class table lists 100 classes, and every
class beyond max_class_drop wherever it ranks.

The page fetches nothing: plots are SVG (``tpustream.report.plots``) inlined as ``data:`` images, the CSS is
inline, there is no script, and a Content-Security-Policy allows only ``data:`` images and the inline style.
Every string from the user's data (class names, URIs, reasons) is escaped; the data check's Markdown becomes
HTML in ``tpustream.report.markdown``, escaped there before its markup is.
"""

from __future__ import annotations

from html import escape as _E
from typing import Any

from tpustream.report import plots as report_plots
from tpustream.report.facts import ReportFacts, history_oldest_first, shows_top5
from tpustream.report.formatting import (
    NOT_MEASURED,
    champion_heading,
    decimal,
    label_edits_line,
    metric_value,
    no_champion_text,
    percent,
    points,
)
from tpustream.report.label_issues import label_errors_html
from tpustream.report.markdown import markdown_html
from tpustream.report.near_leaks import near_leaks_html
from tpustream.report.page import code, figure, note, render_page, table
from tpustream.report.recipe import recipe_rows
from tpustream.report.trials import trials_html
from tpustream.report.verdict import ClassRow, Verdict, shown_rows, support_note, too_few_text

__all__ = ["PLOTTED_CLASSES", "render_html"]

PLOTTED_CLASSES = 30  # above this many classes, plots show the 30 with the most errors (or largest drops)
HTML_CLASS_ROWS = 100  # per-class table rows in the page (every class beyond max_class_drop is always listed)
HTML_DATASET_CLASS_ROWS = 50
HTML_HISTORY_ROWS = 50


def render_html(facts: ReportFacts, verdict: Verdict, rows: list[ClassRow]) -> str:
    """The page for ``facts``.

    Args:
        facts: what the page shows.
        verdict: the decision it states (``tpustream.report.verdict.verdict_of``).
        rows: the per-class rows (``tpustream.report.verdict.class_rows``).

    Returns:
        The page: one self-contained HTML document.
    """
    sections = [
        ("training", "Training", _training_html(facts)),
        ("recipe", "Training recipe", _recipe_html(facts)),
        *([("tuning", "Hyperparameter search", trials_html(facts.tuning))] if facts.tuning else []),
        ("confusion", "Confusion matrices", _confusion_html(facts)),
        ("per-class", "Per-class accuracy", _per_class_html(facts, rows)),
        ("dataset", "Data set", _dataset_html(facts)),
    ]
    if facts.data_check_markdown is not None:
        sections.append(("data-check", "Data check", markdown_html(facts.data_check_markdown)))
    if facts.near_leaks is not None:
        sections.append(("near-leaks", "Near-duplicates across splits", near_leaks_html(facts.near_leaks)))
    if isinstance(facts.metrics.candidate.per_class, dict):  # evaluated with per-sample scores
        sections.append(
            ("precision-recall", "Precision, recall and thresholds", _precision_recall_html(facts))
        )
    if facts.mistakes is not None:
        sections.append(("mistakes", "Mistakes", _mistakes_html(facts)))
    if facts.label_errors is not None:
        sections.append(("label-errors", "Likely label errors", label_errors_html(facts.label_errors)))
    if facts.history is not None:
        sections.append(("history", "Champion history", _history_html(facts)))
    return render_page(facts, verdict, sections)


SHOWN_THRESHOLDS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)  # the table's rows; the plot draws every one


def _precision_recall_html(facts: ReportFacts) -> str:
    """Per-class precision, recall, F1 and support (worst F1 first), macro-F1, balanced accuracy and AU-PRC,
    and what acting only on predictions above a confidence threshold gives (table and curve)."""
    candidate = facts.metrics.candidate
    per_class = candidate.per_class or {}
    classes = facts.metrics.classes
    counted = "" if candidate.num_samples is None else candidate.num_samples
    summary = (
        f"Macro-F1 {decimal(candidate.macro_f1)}, balanced accuracy "
        f"{percent(candidate.balanced_accuracy)} (the mean of the classes' recalls: every class "
        f"counts the same, however many samples it has), AU-PRC {decimal(candidate.auprc)} "
        f"(micro, one-vs-rest), on {counted} {facts.metrics.split} samples."
    )
    parts = [note(summary)]

    def column(name: str) -> list[Any]:
        values = per_class.get(name)
        return list(values) if isinstance(values, list) else [None] * len(classes)

    precision, recall, f1 = column("precision"), column("recall"), column("f1")
    support, auprc = column("support"), column("auprc")
    order = sorted(
        range(len(classes)), key=lambda i: (f1[i] is None, f1[i] if f1[i] is not None else 0.0, classes[i])
    )
    listed = order[:HTML_CLASS_ROWS]
    cells = [
        [
            _E(classes[i]),
            percent(precision[i]),
            percent(recall[i]),
            decimal(f1[i], 3),
            _E(str(support[i] if support[i] is not None else "")),
            decimal(auprc[i], 3),
        ]
        for i in listed
    ]
    parts.append(table(["class", "precision", "recall", "F1", "support", "AU-PRC"], cells))
    if len(listed) < len(order):
        parts.append(note(f"The {len(listed)} classes with the lowest F1 of {len(order)}."))
    thresholds = candidate.thresholds
    if isinstance(thresholds, list) and thresholds:
        parts.append(
            figure(
                "plot-thresholds",
                report_plots.thresholds_svg(thresholds),
                f"precision, recall and coverage on the {facts.metrics.split} split against the confidence "
                "threshold",
                f"On the {facts.metrics.split} split: acting only on predictions at or above a confidence "
                "threshold trades coverage for precision; with no prediction acted on (0% coverage) precision "
                "is undefined and not drawn.",
            )
        )
        shown = [row for row in thresholds if round(float(row.get("threshold", -1)), 2) in SHOWN_THRESHOLDS]
        rows = [
            [
                _E(f"{float(row['threshold']):.2f}"),
                _threshold_precision(row),
                percent(row.get("recall")),
                percent(row.get("coverage")),
            ]
            for row in shown
        ]
        parts.append(table(["threshold", "precision", "recall", "coverage"], rows))
    return "".join(parts)


def _threshold_precision(row: dict[str, Any]) -> str:
    """A threshold row's precision: "n/a" where nothing is acted on (0% coverage), a share of no predictions."""
    coverage = row.get("coverage")
    if isinstance(coverage, int | float) and not isinstance(coverage, bool) and coverage <= 0:
        return "n/a"
    return percent(row.get("precision"))


def _mistakes_html(facts: ReportFacts) -> str:
    """The candidate's most confident wrong predictions, a few per true class, each with its thumbnail."""
    mistakes = facts.mistakes or []
    if not mistakes:
        return note("No mistakes: the candidate classified every evaluated sample correctly.")
    cells = []
    for mistake in mistakes:
        thumbnail = facts.thumbnails.get(mistake.key)
        picture = (
            f'<img src="{thumbnail}" alt="{_E(mistake.key)}" loading="lazy">'
            if thumbnail and thumbnail.startswith("data:image/jpeg;base64,")
            else '<div class="nopic">no picture</div>'
        )
        cells.append(
            f'<figure class="mistake">{picture}<figcaption><b>{_E(mistake.true_class)}</b> taken for '
            f"<b>{_E(mistake.predicted_class)}</b> ({100 * mistake.confidence:.1f}%)<br>"
            f"{code(mistake.source or mistake.key)}</figcaption></figure>"
        )
    intro = note(
        f"The {len(mistakes)} most confident wrong predictions, at most "
        f"{max(_per_class_count(mistakes), 1)} per true class, surest first: the images a confidence "
        f"threshold would not catch. Each is the image evaluated (from the {facts.metrics.split} shards), "
        "with its source file."
    )
    return intro + '<div class="mistakes">' + "".join(cells) + "</div>"


def _per_class_count(mistakes: list[Any]) -> int:
    counts: dict[str, int] = {}
    for mistake in mistakes:
        counts[mistake.true_class] = counts.get(mistake.true_class, 0) + 1
    return max(counts.values(), default=0)


def _training_html(facts: ReportFacts) -> str:
    card = facts.model_card
    history = card.history
    best = card.metrics.get("epoch")
    top5 = shows_top5(len(card.classes))
    init, pretrained = card.init, card.pretrained
    if isinstance(init, dict):
        start = f"warm start from {code(init.get('from'))} ({_E(str(init.get('kind', '')))}, {_E(str(init.get('weights', '')))} weights)"
    elif isinstance(pretrained, dict):
        sha = str(pretrained.get("sha256") or "")
        start = (
            f"fine-tuned from pretrained weights {code(pretrained.get('name') or pretrained.get('uri'))}"
            + (f" (sha256 {_E(sha[:12])}…)" if sha else "")
            + ", the head new"
        )
    else:
        start = "random initialisation"
    parts = [
        f"<p>{code(card.arch)}, {len(history)} epoch{'s' if len(history) != 1 else ''}"
        f"{f', best epoch {_E(str(best))}' if best is not None else ''}"
        f"{', stopped early' if card.stopped_early else ''}; {start}.</p>"
    ]
    if len(history) >= 2:
        parts.append(
            figure(
                "plot-curves",
                report_plots.curves_svg(history, top5=top5),
                "loss and validation accuracy per epoch",
                "Per epoch: the loss on the train split, loss and accuracy on the val split (val chose the "
                "best epoch; the decision's numbers above are on the "
                f"{facts.metrics.split} split).",
            )
        )
    elif history:
        parts.append(note("One epoch only: there is no curve to draw; its numbers are below."))
    else:
        parts.append(note("No per-epoch history in the model card: nothing to draw."))
    seen = any("train_samples_seen" in row for row in history)  # cards written before have none
    if history:
        header = [
            "epoch",
            "train loss",
            "val loss",
            "val top-1",
            *(["val top-5"] if top5 else []),
            "val samples",
            *(["train samples seen / left out / repeated"] if seen else []),
            "seconds",
            "samples/s",
            "data wait",
            "XLA compiles",
        ]
        cells = [
            [
                _E(str(row.get("epoch", ""))),
                decimal(row.get("train_loss")),
                decimal(row.get("val_loss")),
                percent(row.get("val_top1"), 2),
                *([percent(row.get("val_top5"), 2)] if top5 else []),
                _E(str(row.get("val_samples", ""))),
                *([_E(_samples_seen(row))] if seen else []),
                decimal(row.get("epoch_seconds"), 1),
                decimal(row.get("samples_per_s"), 0),
                percent(row.get("data_wait_fraction")),
                _E(str(row.get("compiles", ""))),
            ]
            for row in history
        ]
        parts.append(table(header, cells))
    return "".join(parts)


def _recipe_html(facts: ReportFacts) -> str:
    """How the candidate was trained: peak LR and how it was chosen, schedule, fine-tuning, weights."""
    rows = [[_E(what), _E(how)] for what, how in recipe_rows(facts.model_card)]
    return table(["", "from the candidate's model.json"], rows, css="text")


def _samples_seen(row: dict[str, Any]) -> str:
    """An epoch's train samples: seen once, left out by the equal-batches rule, repeated to fill batches."""
    if "train_samples_seen" not in row:
        return ""
    return " / ".join(
        str(row.get(key, ""))
        for key in ("train_samples_seen", "train_samples_left_out", "train_samples_repeated")
    )


def _confusion_html(facts: ReportFacts) -> str:
    classes = facts.metrics.classes
    shown = _confusion_classes(facts)
    parts = [
        note(
            "Rows: the true class; columns: the predicted class; colour: the share of the true class's "
            f"{facts.metrics.split} samples"
            + (", with counts in the cells." if len(shown) <= report_plots.ANNOTATE_CELLS else ".")
            + (
                f" {len(shown)} of {len(classes)} classes are shown: those with the most errors, candidate's "
                "and champion's together."
                if len(shown) < len(classes)
                else ""
            )
        )
    ]
    figures = []
    for plot_id, who, result in (
        ("plot-confusion-candidate", "candidate", facts.metrics.candidate),
        ("plot-confusion-champion", champion_heading(facts), facts.champion),
    ):
        if result is None:
            figures.append(note(f"No {who} matrix: {no_champion_text(facts)}."))
        elif not _is_square(result.confusion_matrix, len(classes)):
            figures.append(note(f"No {who} matrix: metrics.json holds none for its {len(classes)} classes."))
        else:
            title = f"{who.capitalize()}, {facts.metrics.split} split"
            svg = report_plots.confusion_svg(result.confusion_matrix, classes, shown, title)
            figures.append(figure(plot_id, svg, f"{who} confusion matrix on the {facts.metrics.split} split"))
    parts.append(f'<div class="plots">{"".join(figures)}</div>')
    return "".join(parts)


def _per_class_html(facts: ReportFacts, rows: list[ClassRow]) -> str:
    champion = facts.champion
    if facts.policy.max_class_drop is None:
        limit = "No max_class_drop was set: no class's drop can refuse the candidate."
    else:
        limit = f"max_class_drop is {points(facts.policy.max_class_drop)}: classes whose accuracy drops by more are in red."
    no_champion = "" if champion else f" No champion numbers: {no_champion_text(facts)}."
    parts = [note(f"{support_note(facts, rows)} {limit}{no_champion}")]
    plotted = rows[:PLOTTED_CLASSES]
    caption = (
        f"The {len(plotted)} classes with the largest drops, of {len(rows)}."
        if len(plotted) < len(rows)
        else ""
    )
    svg = report_plots.per_class_svg(
        [row.name for row in plotted],
        [row.candidate for row in plotted],
        [row.champion for row in plotted] if champion else None,
        [row.exceeds for row in plotted],
        split=facts.metrics.split,
    )
    alt = f"per-class accuracy on the {facts.metrics.split} split, candidate and champion"
    parts.append(figure("plot-per-class", svg, alt, caption))
    listed = shown_rows(rows, HTML_CLASS_ROWS)
    cells = [
        [
            _E(row.name),
            percent(row.candidate),
            percent(row.champion) if champion else "none",
            f"{100 * row.drop:+.1f}" if row.drop is not None else NOT_MEASURED,
            "yes" if row.exceeds else "",
            _E(too_few_text(row)),
        ]
        for row in listed
    ]
    header = [
        "class",
        f"candidate ({_E(facts.metrics.split)})",
        _E(champion_heading(facts)),
        "drop (points, + is worse)",
        "beyond max_class_drop",
        f"{_E(facts.metrics.split)} samples",
    ]
    css = ["exceeds" if row.exceeds else "few" if row.too_few else "" for row in listed]
    parts.append(table(header, cells, css))
    if len(listed) < len(rows):
        parts.append(note(f"{len(rows) - len(listed)} more classes, with smaller drops, are not listed."))
    return "".join(parts)


def _dataset_html(facts: ReportFacts) -> str:
    dataset = facts.metrics.dataset
    digest = dataset.manifest_digest[:12]
    parts = [f"<p>{code(dataset.uri or '?')}{f', manifest {code(digest)}' if digest else ''}.</p>"]
    manifest = facts.manifest
    if manifest is None:
        return "".join(parts) + note("The manifest was not given: no per-split facts.")
    classes, splits = manifest.classes, manifest.splits
    parts.append(
        f"<p>Source {code(manifest.source or '?')}; {len(classes)} classes; created {_E(manifest.created or '?')}.</p>"
    )
    parts.append(
        table(
            ["split", "samples", "bytes", "shards"],
            [
                [
                    _E(name),
                    _E(str(s.num_samples)),
                    _E(f"{s.num_bytes:,}"),
                    _E(str(len(s.shards))),
                ]
                for name, s in splits.items()
            ],
        )
    )
    shown = classes[:HTML_DATASET_CLASS_ROWS]
    counts = {name: s.class_counts for name, s in splits.items()}
    rows = [
        [_E(name)] + [_E(str(counts[split][i])) if i < len(counts[split]) else "0" for split in splits]
        for i, name in enumerate(shown)
    ]
    parts.append(table(["class", *(f"{_E(split)} samples" for split in splits)], rows))
    if len(shown) < len(classes):
        parts.append(note(f"The first {len(shown)} of {len(classes)} classes."))
    skipped = manifest.skipped
    if skipped.count:
        reasons = [
            [_E(reason), _E(str(count))]
            for reason, count in sorted(skipped.by_reason.items(), key=lambda r: -r[1])
        ]
        rows_refused = (
            f"{skipped.rejected_rows} row{'' if skipped.rejected_rows == 1 else 's'} refused while listing"
        )
        parts.append(f"<p>{skipped.count} images or rows skipped ({rows_refused}).</p>")
        if reasons:
            parts.append(table(["skipped because", "count"], reasons))
        if skipped.examples:
            parts.append(
                "<p>For example:</p><ul>"
                + "".join(f"<li>{code(e)}</li>" for e in skipped.examples[:5])
                + "</ul>"
            )
    else:
        parts.append("<p>Skipped images: none.</p>")
    if manifest.label_edits is not None:
        parts.append(f"<p>{_E(label_edits_line(manifest.label_edits))}</p>")
    return "".join(parts)


def _when(time: Any) -> str:
    """An event's ISO-8601 UTC time as ``YYYY-mm-dd HH:MM UTC`` (as ``champion history`` prints it)."""
    text = str(time or "")
    return f"{text[:10]} {text[11:16]} UTC" if len(text) >= 16 and text[10] == "T" else text


def _history_html(facts: ReportFacts) -> str:
    events = history_oldest_first(facts)
    if not events:
        return note("No registry events yet: this registry has no history.")
    same = [event for event in events if event.get("metric") == facts.policy.metric]
    parts = []
    if same:
        svg = report_plots.history_svg(same, facts.policy.metric, facts.policy.higher_is_better)
        notes = []
        if report_plots.history_on_different_data(same):
            notes.append(
                "The decisions were measured on different data (each on its own run's shards): compare a "
                "candidate with the hollow champion marker joined to it, which is the champion on the same "
                "data, not with the points of other decisions."
            )
        if len(same) < len(events):
            notes.append(f"{len(events) - len(same)} events decided on another metric are not drawn.")
        caption = " ".join(notes)
        parts.append(
            figure("plot-history", svg, f"champion {facts.policy.metric} over the registry's events", caption)
        )
    else:
        parts.append(note(f"No event was decided on {facts.policy.metric}: nothing to draw."))
    newest = list(reversed(events))[:HTML_HISTORY_ROWS]
    cells = [
        [
            _E(_when(event.get("time"))),
            _E(str(event.get("event", ""))),
            _E(str(event.get("version") if event.get("version") is not None else "")),
            f"{_E(str(event.get('metric', '')))} {metric_value(event)}",
            _E(str(event.get("champion_version") if event.get("champion_version") is not None else "")),
            code(event.get("candidate", "")),
            _E(str(event.get("reason", ""))),
        ]
        for event in newest
    ]
    header = ["time", "event", "version", "value", "champion then", "candidate", "reason"]
    parts.append(table(header, cells, [str(event.get("event", "")) for event in newest], css="events"))
    if len(newest) < len(events):
        parts.append(note(f"The newest {len(newest)} of {len(events)} events."))
    return "".join(parts)


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
    champion = facts.champion
    if champion is not None:
        errors = [
            a + b for a, b in zip(errors, _errors_per_class(champion.confusion_matrix, size), strict=True)
        ]
    return sorted(sorted(range(size), key=lambda i: (-errors[i], i))[:PLOTTED_CLASSES])
