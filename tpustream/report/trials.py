"""The report's hyperparameter search section: every trial with its parameters, metric and end, the chosen one
marked, and the space searched, from the candidate's tuning.json (tpustream/tune/record.py)."""

from __future__ import annotations

from html import escape as _E
from typing import Any

from tpustream.report.page import note, table
from tpustream.storage import io as storage
from tpustream.tune.record import TUNING_FILE, TuningRecord, read_tuning

__all__ = ["read_candidate_tuning", "trial_rows", "trials_html"]


def read_candidate_tuning(model_uri: str) -> TuningRecord | None:
    """The search that chose the candidate: tuning.json in its model artifact; None when it was not tuned."""
    uri = storage.join(model_uri, TUNING_FILE)
    return read_tuning(uri) if storage.exists(uri) else None


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def trial_rows(record: TuningRecord) -> tuple[list[str], list[list[str]]]:
    """(header, rows): one row per trial in order, parameters in the space's order; text, not yet escaped."""
    names = list(record.space.get("parameters") or {})
    header = ["trial", *names, record.metric, "epochs", "end"]
    rows = []
    for trial in record.trials:
        metric = "" if trial.metric is None else f"{trial.metric:.4f}"
        end: str = "chosen" if trial.id == record.best else trial.state
        if trial.reason:
            end = f"{end}: {trial.reason}"
        rows.append(
            [
                trial.id,
                *(_value(trial.parameters.get(name, "")) for name in names),
                metric,
                str(trial.epochs_run),
                end,
            ]
        )
    return header, rows


def trials_html(record: TuningRecord) -> str:
    """The section: what was searched, how, and each trial (the chosen one highlighted)."""
    space = record.space
    searched = ", ".join(f"{name} {_range(entry)}" for name, entry in (space.get("parameters") or {}).items())
    left_out = space.get("left_out") or []
    summary = (
        f"{len(record.trials)} trial(s) on {record.engine} ({space.get('source', 'default')} space: {searched}"
        f"{'; left out: ' + ', '.join(left_out) if left_out else ''}), maximizing {record.metric}; early "
        f"stopping {'on' if space.get('early_stopping') else 'off'}. The candidate is trial {record.best}'s "
        "model as it trained (no retraining)."
    )
    header, rows = trial_rows(record)
    css = ["best" if row[0] == record.best else "" for row in rows]
    return note(summary) + table([_E(cell) for cell in header], [[_E(c) for c in row] for row in rows], css)


def _range(entry: dict[str, Any]) -> str:
    if "values" in entry:
        return "in {" + ", ".join(str(v) for v in entry["values"]) + "}"
    scale = " (log)" if entry.get("scale") == "log" else ""
    return f"{entry.get('min')}..{entry.get('max')}{scale}"
