"""What a pipeline run ended with, in words: one small JSON object per run that the deciding steps overwrite
as the run goes (check source, check data, evaluate, promote, deploy) and the notification exit step and
``pipeline run-local`` read.

Why a file and not a task output: KFP's exit task may take no other task's output (kfp 2.17 refuses it), and a
pipeline's outputs cannot come from inside an ``ExitHandler``. The file lives at a path every step can compute
from two placeholders that both Vertex and kfp.local resolve inside a longer string:
``{PIPELINE_ROOT}/{PIPELINE_JOB_ID}/run-outcome.json`` (``OUTCOME_PATH``, pipelines/training.py: the run's job
ID, one value for every task of a run).
The outcome decides nothing: writing it never fails a step (a warning is logged instead).

What failed is recorded beside it, because neither runner says: the final status an exit task gets names no
task and no error (Vertex: "The DAG failed because some tasks failed."; kfp.local: "Task exit-handler-1
failed.", kfp/local/orchestrator/orchestrator_utils.py). Each step runs its body inside ``failure_recorded``,
which writes the task's name and its error line to ``failures/<task>.json`` under the outcome's folder when the
body raises; an attempt that succeeds removes what an earlier attempt of the same task wrote (KFP retries
write, train, promote and deploy), so only what failed last stays. ``read_failures`` lists them, first first.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, Literal, get_args

from tpustream.artifacts import EvalReport
from tpustream.errors import TpustreamError
from tpustream.registry.policy import DECISION_CODES, DecisionCode, is_finite_number
from tpustream.storage import io as storage

__all__ = [
    "FAILURE_FORMAT",
    "FORMAT",
    "Decision",
    "RunFailure",
    "RunOutcome",
    "error_line",
    "failure_recorded",
    "read_failures",
    "read_outcome",
    "record_outcome",
    "write_outcome",
]

log = logging.getLogger(__name__)

FORMAT = "tpustream.run-outcome/1"
FAILURE_FORMAT = "tpustream.run-failure/1"
_MAX_ERROR_CHARS = 500  # of an error line: a chat message, not a traceback
# training: new data, the run goes on (a later step overwrites this); skipped: no new data; refused: the data
# check stopped the run; kept: the candidate was not promoted; promoted / deployed: a new champion (on an
# endpoint).
Decision = Literal["training", "skipped", "refused", "kept", "promoted", "deployed"]


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    """A run's outcome so far: the ``step`` that decided it, the ``decision``, its one-line ``reason``, once a
    candidate was decided on the promotion decision's ``code`` and ``class_index``
    (``tpustream.registry.policy.Decision``'s: what a reader branches on; None: no promotion decision yet, or
    an outcome written before codes), the run report's URI (``report``; "" when the run made none) and, once a candidate was evaluated, the
    ``metric`` it was decided on, its value (``candidate_value``) and the majority-class baseline's on the
    same split (``baseline_value``; None: not measured)."""

    step: str
    decision: Decision
    reason: str
    code: DecisionCode | None = None
    class_index: int | None = None
    report: str = ""
    metric: str = ""
    candidate_value: float | None = None
    baseline_value: float | None = None

    def __post_init__(self) -> None:
        if self.decision not in get_args(Decision):
            raise ValueError(f"decision {self.decision!r}: expected one of {', '.join(get_args(Decision))}")
        if self.code is not None and self.code not in DECISION_CODES:
            raise ValueError(f"code {self.code!r}: expected one of {', '.join(DECISION_CODES)}")

    def line(self) -> str:
        """``kept: candidate top1 0.81 does not beat champion 0.83`` (the notification's one line)."""
        return f"{self.decision}: {self.reason}" if self.reason else self.decision


def write_outcome(uri: str, outcome: RunOutcome) -> None:
    """Replace the run's outcome at ``uri``."""
    storage.write_bytes(
        uri,
        json.dumps({"format": FORMAT, **asdict(outcome)}, indent=1).encode(),
        content_type="application/json",
    )


def read_outcome(uri: str) -> RunOutcome | None:
    """The run's outcome at ``uri``; None when no step wrote one (the run failed before check source decided)
    or it is not one (another format: logged)."""
    if not uri or not storage.exists(uri):
        return None
    try:
        record = json.loads(storage.read_text(uri))
        if record.pop("format", None) != FORMAT:
            raise ValueError(f"not {FORMAT}")
        return RunOutcome(**record)
    except (ValueError, TypeError) as exc:
        log.warning("run outcome %s is unreadable (%s): ignored", uri, exc)
        return None


def record_outcome(
    uri: str,
    *,
    step: str,
    decision: Decision,
    reason: str,
    code: DecisionCode | None = None,
    class_index: int | None = None,
    report: str = "",
    evaluation: EvalReport | None = None,
    metric: str = "",
) -> None:
    """``write_outcome`` for a pipeline step: nothing when ``uri`` is "" (the step ran outside the pipeline),
    and a failure to write is logged, never raised (the outcome decides nothing). ``code``, ``class_index``:
    the promotion decision's (evaluate's, promote's; None for the steps before it). ``evaluation`` and
    ``metric``: the candidate's metrics.json and the metric it was decided on, whose candidate and baseline
    values the outcome carries."""
    if not uri:
        return
    numbers: dict[str, Any] = {}
    if evaluation is not None and metric:
        baseline = evaluation.baseline.metric(metric) if evaluation.baseline is not None else None
        numbers = {
            "metric": metric,
            "candidate_value": _finite(evaluation.candidate.metric(metric)),
            "baseline_value": _finite(baseline),
        }
    try:
        outcome = RunOutcome(
            step=step,
            decision=decision,
            reason=reason,
            code=code,
            class_index=class_index,
            report=report,
            **numbers,
        )
        write_outcome(uri, outcome)
    except Exception:
        log.warning("the run outcome could not be written to %s (the step goes on)", uri, exc_info=True)


@dataclass(frozen=True, kw_only=True)
class RunFailure:
    """A step of the run that failed: its ``task`` (the DAG's task name, ``evaluate-model``), its ``error`` line
    and when (``at``, ISO 8601 UTC)."""

    task: str
    error: str
    at: str = ""

    def line(self) -> str:
        """``evaluate-model failed: model.pt does not match its model.json`` (the notification's words)."""
        return f"{self.task} failed: {self.error}"


def error_line(exc: BaseException) -> str:
    """The one line that says what went wrong: a TpustreamError's message (written for the user), anything
    else's type and message (``KeyError: 'x'``), as a traceback's last line says it; first line only."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    line = message if isinstance(exc, TpustreamError) and message else f"{type(exc).__name__}: {message}"
    line = line.rstrip(": ")
    return line if len(line) <= _MAX_ERROR_CHARS else line[: _MAX_ERROR_CHARS - 1] + "…"


def _failures_dir(run_outcome: str) -> str:
    return storage.join(run_outcome.rsplit("/", 1)[0], "failures")


def _failure_uri(run_outcome: str, task: str) -> str:
    return storage.join(_failures_dir(run_outcome), f"{task}.json")


@contextlib.contextmanager
def failure_recorded(run_outcome: str, task: str) -> Iterator[None]:
    """Run a step's body; if it raises, record ``task`` and the error line under ``run_outcome``'s folder for the
    exit step's notification, then let the error fail the step. ``task``: the step's name in the DAG, and one
    name per fan-out item (``write-shards-0-8``) so that one item's success does not erase another's failure.
    Nothing is recorded when ``run_outcome`` is "" (the step ran outside the pipeline); recording never fails
    the step (a warning is logged instead)."""
    try:
        yield
    except Exception as exc:
        if run_outcome:
            _write_failure(run_outcome, RunFailure(task=task, error=error_line(exc), at=_now()))
        raise
    if run_outcome:  # this attempt succeeded: an earlier attempt's failure is not the run's
        try:
            storage.delete(_failure_uri(run_outcome, task), missing_ok=True)
        except Exception:
            log.warning("could not clear %s's earlier failure under %s", task, run_outcome, exc_info=True)


def _now() -> str:
    # microseconds: two steps that fail within one millisecond (the same process, a fast fan-out) kept the
    # list's name order, not the order they failed in
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _write_failure(run_outcome: str, failure: RunFailure) -> None:
    uri = _failure_uri(run_outcome, failure.task)
    try:
        record = {"format": FAILURE_FORMAT, **asdict(failure)}
        storage.write_bytes(uri, json.dumps(record, indent=1).encode(), content_type="application/json")
    except Exception:
        log.warning(
            "the failure of %s could not be recorded at %s (the step fails anyway)",
            failure.task,
            uri,
            exc_info=True,
        )


def read_failures(run_outcome: str) -> list[RunFailure]:
    """The run's recorded failures, the first to fail first ([] when none, or ``run_outcome`` is ""); a record
    that is not one is logged and left out."""
    if not run_outcome:
        return []
    folder = _failures_dir(run_outcome)
    try:
        objects = storage.list_objects(folder)
    except storage.NotFound:
        return []
    failures = []
    for obj in objects:
        try:
            record = json.loads(storage.read_text(obj.uri))
            if record.pop("format", None) != FAILURE_FORMAT:
                raise ValueError(f"not {FAILURE_FORMAT}")
            failures.append(RunFailure(**record))
        except (ValueError, TypeError) as exc:
            log.warning("run failure record %s is unreadable (%s): ignored", obj.uri, exc)
    return sorted(failures, key=lambda failure: failure.at)


def _finite(value: Any) -> float | None:
    return float(value) if is_finite_number(value) else None
