"""What a pipeline run ended with, in words: one small JSON object per run that the deciding steps overwrite
as the run goes (check source, check data, evaluate, promote, deploy) and the notification exit step and
``pipeline run-local`` read.

Why a file and not a task output: KFP's exit task may take no other task's output (kfp 2.17 refuses it), and a
pipeline's outputs cannot come from inside an ``ExitHandler``. The file lives at a path every step can compute
from two placeholders that both Vertex and kfp.local resolve inside a longer string:
``{PIPELINE_ROOT}/{PIPELINE_JOB_NAME}/run-outcome.json`` (``OUTCOME_PATH``, pipelines/training.py).
The outcome decides nothing: writing it never fails a step (a warning is logged instead).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

from tpustream.artifacts import EvalReport
from tpustream.storage import io as storage

__all__ = ["FORMAT", "Decision", "RunOutcome", "read_outcome", "record_outcome", "write_outcome"]

log = logging.getLogger(__name__)

FORMAT = "tpustream.run-outcome/1"
# training: new data, the run goes on (a later step overwrites this); skipped: no new data; refused: the data
# check stopped the run; kept: the candidate was not promoted; promoted / deployed: a new champion (on an
# endpoint).
Decision = Literal["training", "skipped", "refused", "kept", "promoted", "deployed"]


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    """A run's outcome so far: the ``step`` that decided it, the ``decision``, its one-line ``reason``, the
    run report's URI (``report``; "" when the run made none) and, once a candidate was evaluated, the
    ``metric`` it was decided on, its value (``candidate_value``) and the majority-class baseline's on the
    same split (``baseline_value``; None: not measured)."""

    step: str
    decision: Decision
    reason: str
    report: str = ""
    metric: str = ""
    candidate_value: float | None = None
    baseline_value: float | None = None

    def __post_init__(self) -> None:
        if self.decision not in get_args(Decision):
            raise ValueError(f"decision {self.decision!r}: expected one of {', '.join(get_args(Decision))}")

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
    report: str = "",
    evaluation: EvalReport | None = None,
    metric: str = "",
) -> None:
    """``write_outcome`` for a pipeline step: nothing when ``uri`` is "" (the step ran outside the pipeline),
    and a failure to write is logged, never raised (the outcome decides nothing). ``evaluation`` and
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
        write_outcome(uri, RunOutcome(step=step, decision=decision, reason=reason, report=report, **numbers))
    except Exception:
        log.warning("the run outcome could not be written to %s (the step goes on)", uri, exc_info=True)


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None
