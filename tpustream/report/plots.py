"""The run report's plots: matplotlib figures rendered to SVG text, for ``tpustream.report.build`` to place in its page.

Figures are built with ``matplotlib.figure.Figure`` directly, never pyplot: no global figure registry, no
backend to select, nothing to close. Text is drawn as paths (``svg.fonttype`` "path"), so an SVG needs no font
and the page stays self-contained; the XML prolog (its DTD is a URL) and matplotlib's metadata (its creator is
a URL) are left out, so the only URLs left are the SVG and XLink namespace names, which nothing fetches.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator, PercentFormatter

if TYPE_CHECKING:
    from tpustream.registry.history import HistoryEntry

__all__ = [
    "ALARM",
    "CANDIDATE",
    "CHAMPION",
    "confusion_svg",
    "curves_svg",
    "history_on_different_data",
    "history_svg",
    "per_class_figure",
    "per_class_svg",
]

CANDIDATE = "#1f6fb4"
CHAMPION = "#8c8c8c"
ALARM = "#c62828"  # a class beyond max_class_drop, a refused candidate
LABEL_CHARS = 24  # class names longer than this are cut on the axes (the tables give them whole)
ANNOTATE_CELLS = 12  # confusion matrices up to this many classes show their counts in the cells

_NO_METADATA = {"Creator": None, "Date": None, "Format": None, "Type": None}


def _svg(fig: Figure) -> str:
    buffer = io.StringIO()
    # A fixed salt makes matplotlib's element ids (random otherwise) repeatable: the same facts, the same page.
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "tpustream-report"}):
        fig.savefig(buffer, format="svg", metadata=_NO_METADATA)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _number(value: Any) -> float:
    """A plotted value: missing or non-finite numbers become NaN, which matplotlib leaves as a gap."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return math.nan


def _short(name: str) -> str:
    return name if len(name) <= LABEL_CHARS else name[: LABEL_CHARS - 1] + "…"


def curves_svg(history: Sequence[dict[str, Any]], *, top5: bool = True) -> str:
    """Loss (train and val) and val accuracy (top-1, top-5) per epoch, side by side.

    Args:
        history: the model card's ``history``, one dict per epoch (``epoch``, ``train_loss``, ``val_loss``,
            ``val_top1``, ``val_top5``); a missing or non-finite value is a gap in its line.
        top5: draw val top-5 (``report.facts.shows_top5``: not with 5 classes or fewer, where it is 100%).
    """
    epochs = [int(row.get("epoch", i + 1)) for i, row in enumerate(history)]

    def series(key: str, scale: float = 1.0) -> list[float]:
        return [_number(row.get(key)) * scale for row in history]

    fig = Figure(figsize=(10, 3.4), layout="constrained")
    loss, accuracy = fig.subplots(1, 2)
    loss.plot(epochs, series("train_loss"), marker="o", color=CANDIDATE, label="train loss")
    loss.plot(epochs, series("val_loss"), marker="s", color="#e08a00", label="val loss")
    loss.set_title("Loss")
    accuracy.plot(epochs, series("val_top1", 100), marker="o", color=CANDIDATE, label="val top-1")
    if top5:
        accuracy.plot(epochs, series("val_top5", 100), marker="^", color="#2e7d32", label="val top-5")
    accuracy.set_title("Validation accuracy")
    accuracy.yaxis.set_major_formatter(PercentFormatter(decimals=0))
    for ax in (loss, accuracy):
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _svg(fig)


def confusion_svg(
    matrix: Sequence[Sequence[int]], classes: Sequence[str], shown: Sequence[int], title: str
) -> str:
    """A confusion matrix as a heatmap: rows are the true class, columns the predicted one.

    Args:
        matrix: the full ``confusion_matrix`` of metrics.json (counts, classes in order).
        classes: every class name, in the matrix's order.
        shown: the indices of the classes to draw (``tpustream.report.build`` picks them for many classes); a cell's
            colour is its share of the true class's samples on the evaluated split, all classes counted.
        title: the heading above the heatmap.
    """
    full = np.asarray(matrix, dtype=np.int64)
    totals = full.sum(axis=1)
    counts = full[np.ix_(shown, shown)]
    share = counts / np.maximum(totals[list(shown)], 1)[:, None]
    side = min(11.0, max(4.2, 2.4 + 0.3 * len(shown)))
    fig = Figure(figsize=(side + 1.0, side), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(share, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    fig.colorbar(
        image, ax=ax, shrink=0.8, format=PercentFormatter(xmax=1.0, decimals=0), label="share of true class"
    )
    labels = [_short(classes[i]) for i in shown]
    ticks = range(len(shown))
    ax.set_xticks(ticks, labels, rotation=90, fontsize=8 if len(shown) <= 30 else 6)
    ax.set_yticks(ticks, labels, fontsize=8 if len(shown) <= 30 else 6)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title)
    if len(shown) <= ANNOTATE_CELLS:
        for (row, column), count in np.ndenumerate(counts):
            colour = "white" if share[row, column] > 0.55 else "#333333"
            ax.text(column, row, str(count), ha="center", va="center", fontsize=8, color=colour)
    return _svg(fig)


def per_class_svg(
    classes: Sequence[str],
    candidate: Sequence[float | None],
    champion: Sequence[float | None] | None,
    exceeds: Sequence[bool],
    *,
    split: str,
) -> str:
    """``per_class_figure`` as SVG text."""
    return _svg(per_class_figure(classes, candidate, champion, exceeds, split=split))


def per_class_figure(
    classes: Sequence[str],
    candidate: Sequence[float | None],
    champion: Sequence[float | None] | None,
    exceeds: Sequence[bool],
    *,
    split: str,
) -> Figure:
    """Per-class accuracy, candidate beside champion, as horizontal bars (class names stay readable).

    Args:
        classes: the class names to draw, top to bottom.
        candidate: the candidate's accuracy per class (None: not measured, drawn as no bar).
        champion: the champion's, in the same order; None when there is no champion to compare with.
        exceeds: per class, whether its drop is beyond ``max_class_drop``: its candidate bar and name are red.
        split: the split the accuracies were measured on (metrics.json's ``split``), named on the axis.
    """
    rows = len(classes)
    fig = Figure(figsize=(9, min(16.0, max(2.4, 0.42 * rows + 1.2))), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(rows)
    height = 0.4 if champion is not None else 0.7
    colours = [ALARM if bad else CANDIDATE for bad in exceeds]
    ax.barh(
        y - (height / 2 if champion is not None else 0),
        [_number(v) * 100 for v in candidate],
        height,
        color=colours,
    )
    legend = [Patch(color=CANDIDATE, label="candidate")]
    if any(exceeds):
        legend.append(Patch(color=ALARM, label="candidate, beyond max_class_drop"))
    if champion is not None:
        ax.barh(y + height / 2, [_number(v) * 100 for v in champion], height, color=CHAMPION)
        legend.append(Patch(color=CHAMPION, label="champion"))
    ax.set_yticks(y, [_short(name) for name in classes], fontsize=8)
    for label, bad in zip(ax.get_yticklabels(), exceeds, strict=True):
        if bad:
            label.set_color(ALARM)
            label.set_fontweight("bold")
    ax.invert_yaxis()  # the first class (the largest drop) on top, as in the table
    ax.set_xlim(0, 100)
    ax.xaxis.set_major_formatter(PercentFormatter(decimals=0))
    ax.set_xlabel(f"accuracy on the class's {split} samples")
    ax.grid(axis="x", alpha=0.3)
    # beside the axes, not over them: a legend inside hides the bottom classes' bars
    ax.legend(handles=legend, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


HISTORY_DATE_TICKS = 12  # up to this many decisions, the history's ticks are their dates


def history_svg(events: Sequence[HistoryEntry], metric: str, higher_is_better: bool) -> str:
    """The champion's ``metric`` over the registry's events: promoted versions joined by a step line,
    refused candidates as red crosses, re-promotions of the champion as grey diamonds. Where a decision
    measured the champion of the time on the candidate's data, a hollow grey circle marks that value and a
    segment joins it to the candidate's: the comparison the decision made, on one dataset. Values of
    different decisions may come from different data (``history_on_different_data`` says when).

    Args:
        events: history entries (``tpustream.registry.history.champion_history``), oldest first, all for ``metric``.
        metric: the metric's name, for the axis (top1/top5 are drawn as percentages).
        higher_is_better: whether a larger ``metric`` is better (only said on the axis label).
    """
    percent = metric in ("top1", "top5")
    scale = 100.0 if percent else 1.0
    fig = Figure(figsize=(10, 3.4), layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(1, len(events) + 1)
    values = np.array([_number(e.get("value")) * scale for e in events])
    kinds = np.array([str(e.get("event")) for e in events])
    promoted = kinds == "promoted"
    if promoted.any():  # the champion's value holds from each promotion until the next one
        champion_x = np.append(x[promoted], x[-1])
        champion_y = np.append(values[promoted], values[promoted][-1])
        ax.step(champion_x, champion_y, where="post", color=CANDIDATE, alpha=0.5, label="champion")
        ax.scatter(x[promoted], values[promoted], color=CANDIDATE, zorder=3, label="promoted")
        for position, value, event in zip(
            x[promoted], values[promoted], _events_where(events, promoted), strict=True
        ):
            if math.isfinite(value) and event.get("version") is not None:
                ax.annotate(
                    f"v{event['version']}",
                    (position, value),
                    textcoords="offset points",
                    xytext=(0, 7),
                    ha="center",
                    fontsize=8,
                )
    champion_then = np.array([_number(e.get("champion_value")) * scale for e in events])
    paired = np.isfinite(champion_then) & np.isfinite(values)
    if paired.any():  # each decision's own comparison: both models on that decision's data
        ax.vlines(x[paired], champion_then[paired], values[paired], color=CHAMPION, alpha=0.6, linewidth=1)
        ax.scatter(
            x[paired],
            champion_then[paired],
            facecolors="none",
            edgecolors=CHAMPION,
            zorder=3,
            label="champion then, same data",
        )
    refused = kinds == "refused"
    if refused.any():
        ax.scatter(x[refused], values[refused], color=ALARM, marker="x", s=50, zorder=3, label="refused")
    again = kinds == "already-champion"
    if again.any():
        ax.scatter(x[again], values[again], color=CHAMPION, marker="D", zorder=3, label="already champion")
    ax.set_xlabel("decision (oldest to newest)")
    ax.set_ylabel(f"{metric} ({'higher' if higher_is_better else 'lower'} is better)")
    if percent:  # decimals as the range needs them: 94.4% and 96.1% are not both "96%"
        ax.yaxis.set_major_formatter(PercentFormatter(decimals=None))
    ax.margins(y=0.15)  # room for the version labels above the points
    ax.set_xlim(0.5, len(events) + 0.5)  # one decision alone sits in the middle, on a tick of its own
    if len(events) <= HISTORY_DATE_TICKS:  # few decisions: each tick says the day it was taken
        ax.set_xticks(x, [str(e.get("time", ""))[:10] for e in events], fontsize=8)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _svg(fig)


def thresholds_svg(thresholds: Sequence[dict[str, Any]]) -> str:
    """Precision, recall and coverage of the top-1 prediction against the confidence threshold at which a
    prediction is acted on (evaluate's threshold table: ``threshold``, ``precision``, ``recall``,
    ``coverage`` per row): where to set the threshold for the precision a use needs, and what it costs.
    Precision where nothing is acted on (0% coverage) is undefined: a gap, not 100%."""
    fig = Figure(figsize=(7, 3.4), layout="constrained")
    ax = fig.add_subplot()
    x = [_number(row.get("threshold")) for row in thresholds]
    for key, colour, label in (
        ("precision", CANDIDATE, "precision (right when acted on)"),
        ("recall", ALARM, "recall (of all samples, right and acted on)"),
        ("coverage", CHAMPION, "coverage (acted on)"),
    ):
        values = [
            math.nan if key == "precision" and not _number(row.get("coverage")) > 0 else _number(row.get(key))
            for row in thresholds
        ]
        ax.plot(x, [value * 100 for value in values], color=colour, label=label)
    ax.set_xlabel("confidence threshold on the top-1 probability")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 102)
    ax.yaxis.set_major_formatter(PercentFormatter(decimals=0))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return _svg(fig)


def history_on_different_data(events: Sequence[HistoryEntry]) -> bool:
    """Whether the decisions in ``events`` were measured on more than one dataset (manifest digests), so
    that values of different decisions are not comparable on the plot's axis."""
    return len({e.get("dataset_digest") for e in events if e.get("dataset_digest")}) > 1


def _events_where(events: Sequence[HistoryEntry], mask: np.ndarray) -> list[HistoryEntry]:
    return [event for event, keep in zip(events, mask, strict=True) if keep]
