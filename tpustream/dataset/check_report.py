"""The data check's report as Markdown: the anomalies first (with file names from the sample index), then a
table of the checks against their limits, the dataset's statistics and its classes. What the pipeline's
"check data" step shows in the KFP UI and ``tpustream shards check --report`` writes; and ``percents``, how the
check and its report print a rate beside its limit."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from tpustream.dataset.check_result import (
        DataCheckReport,
        DuplicateGroup,
        LeakExample,
        NearDuplicateFacts,
        SizeKey,
        SplitFacts,
    )

__all__ = ["percents", "render_markdown"]

CLASS_ROWS = 20  # the class table: every class up to this many, else the ones that moved most


def percents(value: float, limit: float, unit: str = "%", decimals: int = 1) -> tuple[str, str]:
    """``value`` and ``limit`` (fractions) as percentages with ``decimals`` decimals, or as many more as it
    takes for a value past its limit to differ from it by more than rounding: 5.05% against 5% is ``5.05%``
    and ``5.00%``, never ``5.0% ... above 5.0%`` (nor ``5.1%``). ``unit``: what follows the numbers."""

    def shown(fraction: float, places: int) -> str:
        return f"{fraction * 100:.{places}f}"

    def toward_limit(places: int) -> str:
        scaled = value * 100 * 10**places
        # the epsilon: 0.29 * 100 is 28.999999999999996, which is 29.0, not 28.9
        whole = math.floor(scaled + 1e-6) if value > limit else math.ceil(scaled - 1e-6)
        return f"{whole / 10**places:.{places}f}"

    while (
        decimals < 9
        and value != limit
        and shown(limit, decimals) in (shown(value, decimals), toward_limit(decimals))
    ):
        decimals += 1
    return shown(value, decimals) + unit, shown(limit, decimals) + unit


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _code(text: object) -> str:
    return f"`{_cell(text).replace('`', '')}`"


def _sizes(facts: SplitFacts, key: SizeKey) -> str:
    size = facts.get(key)
    return f"{size['min']} / {size['median']} / {size['max']}" if size else "-"


def render_markdown(report: DataCheckReport) -> str:
    """The report as a Markdown page."""
    facts, limits = report.facts, report.thresholds
    splits = list(facts["splits"])
    lines = [f"# Data check: {_code(report.dataset)}", ""]
    count = len(report.anomalies)
    lines.append(f"**{count} anomal{'y' if count == 1 else 'ies'}**" if count else "**No anomalies.**")
    lines.append("")
    note = f" ({_cell(facts['baseline_note'])})" if facts["baseline_note"] else ""
    lines += [f"Baseline: {_code(report.baseline) if report.baseline else 'none'}{note}", ""]
    if report.anomalies:
        lines += ["## Anomalies", "", "| Check | Reason |", "|---|---|"]
        lines += [f"| {_code(a.code)} | {_cell(a.reason)} |" for a in report.anomalies]
        lines.append("")
        lines += _examples(report)
    if report.warnings:
        lines += ["## Warnings", "", "Reported, never a failure.", "", "| Check | Reason |", "|---|---|"]
        lines += [f"| {_code(w.code)} | {_cell(w.reason)} |" for w in report.warnings]
        lines.append("")

    lines += ["## Checks", "", "| Check | Value | Limit | Result |", "|---|---|---|---|"]

    def row(check: str, value: str, limit: str, bad: bool, warn: bool = False) -> None:
        result = "**anomaly**" if bad else "**warning**" if warn else "ok"
        lines.append(f"| {check} | {_cell(value)} | {limit} | {result} |")

    codes = {a.code for a in report.anomalies}
    row("Splits with samples", ", ".join(splits) or "none", "train, val", "missing-split" in codes)
    row("Class/split pairs without samples", str(len(facts["empty_classes"])), "0", "empty-class" in codes)
    if limits.min_class_train_samples and "train" in facts["splits"]:
        tiny = facts.get("tiny_classes", [])
        row(
            f"Classes with fewer than {limits.min_class_train_samples} train images",
            str(len(tiny)),
            "0 (a warning)",
            False,
            warn=bool(tiny),
        )
    if facts["hash_checks"]:
        leaked = facts.get("leaked_images", 0)
        row(
            "Images in both train and val",
            str(leaked),
            str(limits.max_leaked_images),
            "train-val-leak" in codes,
        )
        if "test_leaked_images" in facts:
            row(
                "Test images also in train or val",
                str(facts["test_leaked_images"]),
                str(limits.max_leaked_images),
                "test-leak" in codes,
            )
        for split in splits:
            s = facts["splits"][split]
            bad = "duplicate-images" in codes and s["duplicate_fraction"] > limits.max_duplicate_fraction
            fraction, limit = percents(s["duplicate_fraction"], limits.max_duplicate_fraction, decimals=2)
            value = f"{fraction} ({s['duplicate_copies']} copies of {s['images']})"
            row(f"Exact duplicates in {split}", value, limit, bad)
        _near_rows(facts.get("near_duplicates"), limits.max_leaked_images, "near-leak" in codes, row)
    else:
        row("Exact duplicates, train/val leakage", "not checked (no sample index)", "-", False)
    skipped = facts["skipped"]
    reasons = ", ".join(f"{reason} {n}" for reason, n in skipped["by_reason"].items())
    rate, limit = percents(skipped["rate"], limits.max_skipped_rate, decimals=2)
    row(
        "Skipped images and rejected rows",
        f"{rate} ({skipped['count']}{': ' + reasons if reasons else ''})",
        limit,
        "skipped-rate" in codes,
    )
    base = facts.get("baseline")
    if base:
        row("New classes vs baseline", str(len(base["new_classes"])), "0", "new-classes" in codes)
        row(
            "Vanished classes vs baseline",
            str(len(base["vanished_classes"])),
            "0",
            "vanished-classes" in codes,
        )
        top = base["share_shifts"][0] if base["share_shifts"] else None
        shift = f"{top['change'] * 100:+.1f} points ({top['class']})" if top else "-"
        share_limit = f"{limits.max_class_share_shift * 100:.1f} points"
        row("Largest class share change", shift, share_limit, "class-share-shift" in codes)
        change = f"{(skipped['rate'] - base['skipped_rate']) * 100:+.1f} points"
        rate_limit = f"{limits.max_skipped_rate_increase * 100:.1f} points"
        row("Skipped rate change", change, rate_limit, "skipped-rate-increase" in codes)
    lines.append("")

    lines += ["## Dataset", "", f"Source: {_code(facts.get('source'))}; {facts['classes']} classes.", ""]
    lines += ["| | " + " | ".join(splits) + " |", "|---" * (len(splits) + 1) + "|"]
    per_split = [facts["splits"][split] for split in splits]
    lines.append("| samples | " + " | ".join(str(s["samples"]) for s in per_split) + " |")
    if facts["hash_checks"]:
        lines.append("| source images | " + " | ".join(str(s["images"]) for s in per_split) + " |")
    formats = [", ".join(f"{ext} {n}" for ext, n in s["formats"].items()) or "-" for s in per_split]
    lines.append("| formats | " + " | ".join(formats) + " |")
    labels: tuple[tuple[SizeKey, str], ...] = (
        ("width", "width"),
        ("height", "height"),
        ("short_side", "shorter side"),
    )
    for key, label in labels:
        lines.append(
            f"| {label} min / median / max | " + " | ".join(_sizes(s, key) for s in per_split) + " |"
        )
    lines.append("")
    lines += _near_pairs(facts.get("near_duplicates"))
    lines += _class_table(report)
    if skipped["examples"]:
        lines += ["Skipped, e.g.:", ""] + [f"- {_code(e)}" for e in skipped["examples"]] + [""]
    if report.notes:
        lines += ["## Notes", ""] + [f"- {note}" for note in report.notes] + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _near_rows(
    near: NearDuplicateFacts | None, limit: int, bad: bool, row: Callable[[str, str, str, bool], None]
) -> None:
    """The near-duplicate check's rows: near copies of train images in val/test, clusters inside train."""
    if near is None:
        return
    if near["status"] != "checked":
        why = (
            "off (near_duplicate_distance -1)"
            if near["status"] == "off"
            else f"exact-only: no perceptual hashes in {', '.join(near['unhashed_splits']) or 'train'}"
        )
        row("Val/test images near a train image", why, "-", False)
        return
    leaked = near.get("leaked", {})
    shown = ", ".join(f"{split} {n}" for split, n in leaked.items()) or "no val or test split"
    row(
        f"Val/test images near a train image (pHash within {near['max_distance']} bits{_windows_said(near)})",
        f"{sum(leaked.values())} ({shown})",
        str(limit),
        bad,
    )
    small = near["small_images"]
    if small:
        row(
            "Images too small for the perceptual hash (exact-only)",
            ", ".join(f"{split} {n}" for split, n in small.items()) + " (a side under 32 px)",
            "-",
            False,
        )
    clusters = near.get("train_clusters", 0)
    row(
        "Near-duplicate clusters in train",
        f"{clusters} ({near.get('train_clustered_images', 0)} images, largest "
        f"{near.get('train_largest_cluster', 0)})",
        "- (a fact)",
        False,
    )


def _windows_said(near: NearDuplicateFacts) -> str:
    """How thumbnails are also matched (image.phash_windows), when the check said (absent in older JSON)."""
    window_distance = near.get("window_distance")
    return "" if window_distance is None else f"; thumbnails' shifted windows within {window_distance}"


def _near_pairs(near: NearDuplicateFacts | None) -> list[str]:
    """Each val/test image near a train image, beside that train image, the closest first."""
    pairs = near.get("pairs", []) if near else []
    if not near or not pairs:
        return []
    total = sum(near.get("leaked", {}).values())
    more = f" (the {len(pairs)} closest of {total})" if total > len(pairs) else ""
    lines = [
        f"Near copies of train images{more}: perceptual hash within {near['max_distance']} bits"
        f"{_windows_said(near)}:",
        "",
        "| split | image | train image | bits | match |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {p['split']} | {_code(p['source'])} | {_code(p['train_source'])} | {p['distance']} | "
        f"{'shifted windows' if p.get('match') == 'windows' else 'pHash'} |"
        for p in pairs
    ]
    return [*lines, ""]


def _examples(report: DataCheckReport) -> list[str]:
    lines: list[str] = []
    for anomaly in report.anomalies:
        examples = anomaly.details.get("examples") or []
        leaks = cast("list[LeakExample]", examples)  # what each code's details hold
        if anomaly.code == "train-val-leak":
            lines += [f"Images in both splits (at most {report.max_examples}):", ""]
            lines += [
                f"- {e['sha256'][:12]}: train {', '.join(map(_code, e['train']))}; val {', '.join(map(_code, e['val']))}"
                for e in leaks
            ]
            lines.append("")
        elif anomaly.code == "test-leak":
            lines += [f"Test images also in train or val (at most {report.max_examples}):", ""]
            lines += [
                f"- {e['sha256'][:12]}: "
                + "; ".join(
                    f"{split} {', '.join(map(_code, e[split]))}"
                    for split in ("test", "train", "val")
                    if split in e
                )
                for e in leaks
            ]
            lines.append("")
        elif anomaly.code == "duplicate-images":
            lines += [f"Copies in {anomaly.details['split']} (at most {report.max_examples} groups):", ""]
            groups = cast("list[DuplicateGroup]", examples)
            lines += [f"- {e['sha256'][:12]}: {', '.join(map(_code, e['sources']))}" for e in groups]
            lines.append("")
    return lines


def _class_table(report: DataCheckReport) -> list[str]:
    facts = report.facts
    splits = list(facts["splits"])
    names = list(next(iter(facts["splits"].values()))["class_counts"]) if splits else []
    base = facts.get("baseline")
    shifts = {s["class"]: s for s in base["share_shifts"]} if base else {}
    if len(names) > CLASS_ROWS:  # the classes that moved most (or, without a baseline, the smallest)
        if base:
            names = [s["class"] for s in base["share_shifts"][:CLASS_ROWS]]
        else:
            totals = {n: sum(facts["splits"][s]["class_counts"][n] for s in splits) for n in names}
            names = sorted(names, key=lambda n: (totals[n], n))[:CLASS_ROWS]
    header = "| class | " + " | ".join(splits) + (" | baseline share | share | change |" if base else " |")
    shown = "all" if len(names) == facts["classes"] else f"{len(names)} of {facts['classes']}"
    lines = [
        f"Classes ({shown}):",
        "",
        header,
        "|---" * (len(splits) + 1 + (3 if base else 0)) + "|",
    ]
    for name in names:
        counts = " | ".join(str(facts["splits"][s]["class_counts"][name]) for s in splits)
        if base:
            s = shifts.get(name)
            extra = (
                f" | {s['baseline']:.1%} | {s['share']:.1%} | {s['change'] * 100:+.1f} |"
                if s
                else " | - | - | new |"
            )
        else:
            extra = " |"
        lines.append(f"| {_cell(name)} | {counts}{extra}")
    return [*lines, ""]
