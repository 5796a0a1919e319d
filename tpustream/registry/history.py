"""The champion's history: every promotion decision the registry logged, oldest first, and a table of it.

``tpustream.release.promote`` appends one event per decision to the registry's log (``tpustream.registry.store``:
``REGISTRY/events/``; "promoted", "refused", "already-champion"); this module reads them back as uniform
entries. Events written before they carried ``metric``/``value``/``dataset_digest`` still read: a promoted
event's numbers come from its champion pointer, a refused event's from the key named after its metric
(``"top1": 0.93``); what an old event never recorded is None (its decision ``code`` too: events before codes
have none). "vertex-upload-failed" events are left out:
they are not decisions on the champion (the version they name was promoted, and its "promoted" event is in
the history); ``promote`` repairs them.
An event file that cannot be read or parsed is skipped with a warning naming it: one bad file never
hides the rest of the history. No torch: ``tpustream champion history --help`` stays fast.
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any, TypedDict

from tpustream.artifacts import EvalReport
from tpustream.errors import ConfigError
from tpustream.registry.errors import RegistryError
from tpustream.registry.events import list_events, read_event
from tpustream.registry.policy import DECISION_CODES, METRICS, DecisionCode
from tpustream.registry.store import missing_registry
from tpustream.storage import io as storage

__all__ = ["DECISIONS", "HistoryEntry", "champion_history", "format_history_table"]

log = logging.getLogger(__name__)

DECISIONS = ("promoted", "refused", "already-champion")  # the event kinds a history holds
DEFAULT_METRIC = "top1"  # promote's default: what an old event that names no metric was decided on
READERS = 16  # concurrent event reads: on GCS each event is a small object, one round trip each
REASON_WIDTH = 72  # a table's reason column; the full reason is in the entry (and --json)


class HistoryEntry(TypedDict):
    """One decision on the champion, as ``champion_history`` returns it (JSON-ready)."""

    time: str  # ISO-8601, UTC ("2024-05-01T12:03:04.123456Z"; events before microseconds: no fraction)
    event: str  # one of DECISIONS
    version: int | None  # the version promoted; for already-champion, the champion's; refused: None
    candidate: str  # the candidate model's URI
    dataset_digest: str | None  # the manifest digest of the shards the candidate was evaluated on
    dataset: str | None  # those shards' URI
    metric: str  # the metric ``value`` and ``champion_value`` are in
    value: float | None  # the candidate's
    champion_value: float | None  # the champion's on the same data, when the decision had it
    reason: str
    code: DecisionCode | None  # what the decision was (``Decision.code``); None: an event before codes
    class_index: int | None  # the class a class-drop or below-class-recall decision is about; else None
    champion_version: int | None  # the champion when the decision was taken (None: there was none)


def champion_history(registry: str, *, metric: str | None = None) -> list[HistoryEntry]:
    """Every decision logged in ``registry``, oldest first.

    Args:
        registry: the registry URI (a local directory or ``gs://bucket/prefix``).
        metric: report this metric's values (where the event has them: a promoted event has all three, a
            refused one only the metric it was decided on); where the event lacks the candidate's or the
            champion's value of it, they are read from the decision's evaluation (its ``metrics_uri``: evaluate
            measured both on the candidate's data). None reports each decision's own metric.

    Returns:
        One ``HistoryEntry`` per promoted, refused and already-champion event; [] for an empty registry.

    Raises:
        RegistryError: the registry does not exist, or ``metric`` is not one promote decides on.
    """
    if metric is not None and metric not in METRICS:
        raise RegistryError(f"unknown metric {metric!r}: choose one of {', '.join(METRICS)}")
    registry = storage.check_uri(registry).rstrip("/")
    problem = missing_registry(registry)
    if problem:
        raise RegistryError(problem)
    uris = list_events(registry)
    if not uris:
        return []
    with ThreadPoolExecutor(min(READERS, len(uris))) as pool:
        read = list(pool.map(_read_event, uris))
    dated = []
    for uri, event in zip(uris, read, strict=True):
        if event is None or event.get("event") not in DECISIONS:
            continue  # unreadable (warned), or not a decision (vertex-upload-failed, a future kind)
        try:
            when = _parse_time(event["time"])
            entry = _entry(event, when, metric)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("skipping event %s: not a tpustream event (%s: %s)", uri, type(exc).__name__, exc)
            continue
        dated.append((when, uri, entry))
    dated.sort(key=lambda item: item[:2])  # equal times (events from before microseconds): by file name
    entries = [entry for _, _, entry in dated]
    if metric is not None:
        _fill_from_evaluations(dated, dict(zip(uris, read, strict=True)), metric)
    return entries


def _fill_from_evaluations(
    dated: list[tuple[datetime, str, HistoryEntry]],
    events: dict[str, dict[str, Any] | None],
    metric: str,
) -> None:
    """Where an event decided on another metric lacks the candidate's or the champion's ``metric``, take it from
    the evaluation the decision read (the event's ``metrics_uri``): its candidate, and the champion evaluate
    measured on the same samples. One that cannot be read is warned about and leaves the value unknown."""
    wanted = []
    for _, uri, entry in dated:
        event = events.get(uri) or {}
        source = event.get("metrics_uri")
        missing = entry["value"] is None or entry["champion_value"] is None
        if missing and event.get("metric") != metric and isinstance(source, str) and source:
            wanted.append((entry, source))
    if not wanted:
        return
    with ThreadPoolExecutor(min(READERS, len(wanted))) as pool:
        evaluations = list(pool.map(_read_evaluation, [source for _, source in wanted]))
    for (entry, _), evaluation in zip(wanted, evaluations, strict=True):
        if evaluation is None:
            continue
        if entry["value"] is None:
            entry["value"] = _number(evaluation.candidate.metric(metric))
        champion = evaluation.champion
        if entry["champion_value"] is None and champion is not None and champion.complete is not False:
            entry["champion_value"] = _number(champion.metric(metric))


def _read_evaluation(uri: str) -> EvalReport | None:
    """The decision's metrics.json, or None (with a warning naming it) when it cannot be read."""
    try:
        return EvalReport.read(uri)
    except (
        Exception
    ) as exc:  # gone, unreadable, not metrics.json: the value stays unknown, the history goes on
        log.warning("champion history: cannot read the evaluation %s (%s: %s)", uri, type(exc).__name__, exc)
        return None


def _read_event(uri: str) -> dict[str, Any] | None:
    """The event in ``uri``, or None (with a warning naming the file) when it cannot be read as one."""
    try:
        event = read_event(uri)
    except (storage.StorageError, ValueError) as exc:  # ValueError: not JSON, not UTF-8
        log.warning("skipping event %s: cannot read it (%s: %s)", uri, type(exc).__name__, exc)
        return None
    if not isinstance(event, dict):
        log.warning("skipping event %s: not a JSON object", uri)
        return None
    return event


def _parse_time(text: str) -> datetime:
    """An event's ``time`` as an aware UTC datetime ("...Z" and "+00:00" both; Python 3.10 lacks "Z")."""
    if not isinstance(text, str):
        raise TypeError(f"time {text!r} is not a string")
    parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    if parsed.tzinfo is None:  # promote writes UTC
        return parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


def _entry(event: dict[str, Any], when: datetime, metric: str | None) -> HistoryEntry:
    """One event as a history entry, new keys first, else what the older format recorded."""
    kind = event["event"]
    pointer = event["pointer"] if isinstance(event.get("pointer"), dict) else {}
    decided_on = event.get("metric") or next((name for name in METRICS if name in event), DEFAULT_METRIC)
    reported = metric or decided_on
    if event.get("metric") == reported:
        value, champion_value = event.get("value"), event.get("champion_value")
    else:  # an old event, or another metric: a refused event names its metric's value, a pointer all three
        value = event.get(reported, (pointer.get("metrics") or {}).get(reported))
        champion_value = None
    version = _version(event.get("version"))
    if kind == "promoted":
        champion_version = _version(event.get("previous_version"))
    elif kind == "refused":
        version, champion_version = None, _version(event.get("champion_version"))
    else:  # already-champion: the candidate is the champion
        champion_version = version
    return {
        "time": when.isoformat().replace("+00:00", "Z"),
        "event": kind,
        "version": version,
        "candidate": str(event.get("candidate") or ""),
        "dataset_digest": _text(event.get("dataset_digest") or pointer.get("dataset_digest")),
        "dataset": _text(event.get("dataset")),
        "metric": reported,
        "value": _number(value),
        "champion_value": _number(champion_value),
        "reason": str(event.get("reason") or ""),
        "code": event.get("code") if event.get("code") in DECISION_CODES else None,
        "class_index": _index(event.get("class_index")),
        "champion_version": champion_version,
    }


def _version(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"version {value!r} is not a number")
    return int(value)  # a str that is not a number raises ValueError: a corrupt event


def _index(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    """A finite float, or None: files store a non-finite number as null (a legacy file as NaN)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def format_history_table(entries: list[HistoryEntry], *, limit: int | None = None) -> str:
    """A fixed-width text table of ``entries`` (as ``champion_history`` returns them: oldest first), one
    line per decision under a header, newest last.

    Args:
        entries: the history, oldest first.
        limit: keep only the newest ``limit`` entries (None: all).

    Returns:
        The table, lines joined by newlines, no trailing newline; just the header when there are no entries.
    """
    if limit is not None:
        if limit < 0:
            raise ConfigError(f"limit must be >= 0, not {limit}")
        entries = entries[-limit:] if limit else []
    metrics = {entry["metric"] for entry in entries}
    single = next(iter(metrics)) if len(metrics) == 1 else None
    header = ["DATE", "DECISION", "DATASET", (single or "value").upper(), "CHAMPION", "REASON"]
    rows = [header]
    for entry in entries:
        value = _shown(entry["value"])
        rows.append(
            [
                _parse_time(entry["time"]).strftime("%Y-%m-%d %H:%M UTC"),
                _decision(entry),
                (entry["dataset_digest"] or "-")[:12],
                value if single else f"{entry['metric']} {value}",
                _shown(entry["champion_value"]),
                _shortened(entry["reason"]) or "-",
            ]
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)), row[-1]])
        for row in rows
    )


def _decision(entry: HistoryEntry) -> str:
    if entry["event"] == "promoted":
        return f"promoted v{entry['version']}"
    if entry["event"] == "already-champion":
        return "already champion"
    return entry["event"]


def _shortened(reason: str) -> str:
    """``reason`` on one line, cut at a word boundary to fit the column (a long URI is cut mid-word)."""
    line = " ".join(reason.split())
    if len(line) <= REASON_WIDTH:
        return line
    cut = line[: REASON_WIDTH - 4]
    if " " in cut[REASON_WIDTH // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:") + " ..."


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
