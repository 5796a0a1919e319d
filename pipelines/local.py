"""Run the whole DAG here, on CPU, through kfp.local (SubprocessRunner without a venv: this Python)."""

import contextlib
import io
import logging
import os
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, TextIO

from tpustream.errors import TpustreamError
from tpustream.run.outcome import RunOutcome, read_outcome

from .template import JsonValue
from .training import GATES, PIPELINE_NAME, build_pipeline

__all__ = ["LocalRun", "PipelineFailed", "RunSummary", "Skipped", "condition_tasks", "run_local"]


class PipelineFailed(TpustreamError, RuntimeError):
    """A task of the local run failed: which, and its one-line reason (when the run's log was read)."""


# What a person watching `make demo` needs from kfp.local's output; everything goes to the log file.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SHOWN = (
    (re.compile(r"INFO\]: (no new data since .*?;|new data: .*)"), "  {0}"),
    (re.compile(r"INFO\]: (epoch \d+/\d+: .*?val top-1 [0-9.]+)"), "    {0}"),
    (re.compile(r"INFO\]: (decision: .*)"), "  {0}"),
)
_STARTED = re.compile(r"Executing task '([\w-]+)'")
_FINISHED = re.compile(r"Task '([\w-]+)' finished with status (\w+)")
_CONDITION_FALSE = re.compile(r"Skipping conditional task ([\w-]+)")
_UPSTREAM_FAILED = re.compile(r"Skipping task ([\w-]+): upstream task\(s\) \[(.*)\] failed")
# The data check's findings (tpustream/dataset/check.py logs one line each): a failed check's reason.
_FINDING = re.compile(r"data check (anomaly|warning) ([\w-]+): (.*)")
_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*)(?:: (.*))?$")  # the line ending a traceback: `module.Error: why`


@dataclass(frozen=True, kw_only=True)
class LocalRun:
    """Where a local run's things landed, and what it did.

    ``data``: "train", or "skip" when the source had nothing new; ``outcome``: what its deciding steps
    recorded (tpustream/run/outcome.py; None if no step got to record one); ``report``: its report page
    (None when nothing was trained)."""

    pipeline_root: str
    registry: str
    data: Literal["train", "skip"]
    outcome: RunOutcome | None
    report: str | None


@dataclass(frozen=True)
class Skipped:
    """A condition task of the compiled DAG: what is skipped when it is not run, and what its false condition
    means (``guards``, ``when_false``); ``quiet``: not worth a line (an option that was not given)."""

    guards: str
    when_false: str
    quiet: bool = False


def condition_tasks(spec: Any) -> dict[str, Skipped]:
    """The compiled ``spec``'s condition tasks (``condition-3``) by what they mean: their If's Gate
    (pipelines/training.py), or, for an If without one, the display names of the tasks inside and the
    condition itself."""
    components = spec.components

    def inside(component: str) -> list[str]:
        tasks = components[component].dag.tasks if component in components else {}
        names: list[str] = []
        for task in tasks.values():
            nested = components.get(task.component_ref.name)
            if nested is not None and nested.WhichOneof("implementation") == "dag":
                names += inside(task.component_ref.name)
            else:
                names.append(task.task_info.name)
        return names

    found: dict[str, Skipped] = {}
    dags = [spec.root.dag] + [c.dag for c in components.values() if c.WhichOneof("implementation") == "dag"]
    for dag in dags:
        for name, task in dag.tasks.items():
            condition = task.trigger_policy.condition
            if not condition:
                continue
            gate = GATES.get(task.task_info.name)
            if gate is not None:
                found[name] = Skipped(gate.guards, gate.when_false, gate.opt_in)
            else:
                found[name] = Skipped(
                    ", ".join(inside(task.component_ref.name)),
                    f"{task.task_info.name or name} not met ({condition})",
                )
    return found


class RunSummary(io.TextIOBase):
    """A stdout that writes everything to ``log`` and a summary to ``terminal``: each task's outcome (a
    failed task's reason under it), each skipped condition by what it means, epochs and decisions."""

    def __init__(self, log: TextIO, terminal: TextIO, conditions: dict[str, Skipped] | None = None) -> None:
        self.log, self.terminal, self.pending = log, terminal, ""
        self.conditions = conditions or {}
        self.findings: list[str] = []  # the data check's, since the last task started
        self.error: str | None = None  # the last exception line of a traceback
        self.traceback_indent: int | None = None
        self.failed: dict[str, str] = {}  # task -> its reason
        self.skipped_for: dict[str, set[str]] = {}  # task skipped after a failure -> the tasks that failed
        self.reported: set[str] = set()  # skipped tasks already said (a leftover kfp handler logs twice)

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.log.write(text)
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            for shown in self._summarize(_ANSI.sub("", line)):
                self.terminal.write(shown + "\n")
                self.terminal.flush()
        return len(text)

    def flush(self) -> None:
        self.log.flush()

    def _summarize(self, line: str) -> list[str]:
        """The terminal's lines for one line of the log (most: none)."""
        self._read_traceback(line)
        if match := _STARTED.search(line):
            self.findings, self.error = [], None
            return []
        if match := _FINDING.search(line):
            kind, code, reason = match.groups()
            self.findings.append(f"{kind} {code}: {reason}")
            return []
        if match := _FINISHED.search(line):
            task, status = match.groups()
            shown = [f"  {task}: {status}"]
            if status != "SUCCESS":
                self.failed[task] = self.error or (self.findings[0] if self.findings else "")
                shown += [f"    {finding}" for finding in self.findings]
                if self.error and not self.findings:
                    shown.append(f"    error: {self.error}")
            else:
                shown += [f"    {finding}" for finding in self.findings]  # data_check=warn, tiny classes
            self.findings, self.error = [], None
            return shown
        if match := _CONDITION_FALSE.search(line):
            return self._skipped(match.group(1), None)
        if match := _UPSTREAM_FAILED.search(line):
            task, upstream = match.groups()
            causes: set[str] = set()
            for name in re.findall(r"'([\w-]+)'", upstream):
                causes |= self.skipped_for.get(name, {name})
            self.skipped_for[task] = causes
            return self._skipped(task, ", ".join(sorted(causes)) + " failed")
        for pattern, template in _SHOWN:
            if match := pattern.search(line):
                return [template.format(*match.groups())]
        return []

    def _skipped(self, task: str, failure: str | None) -> list[str]:
        """``promotion skipped: candidate refused`` (a condition task), ``train-model: skipped (check-data
        failed)`` (a task after a failure)."""
        condition = self.conditions.get(task)
        if task in self.reported:
            return []
        self.reported.add(task)
        if condition is None:
            return [f"  {task}: skipped ({failure or 'condition not met'})"]
        if failure is None and condition.quiet:
            return []
        return [f"  {condition.guards} skipped: {failure or condition.when_false}"]

    def _read_traceback(self, line: str) -> None:
        """Keep the exception line that ends a task's traceback (``self.error``): its one-line reason."""
        indent = len(line) - len(line.lstrip())
        if line.strip() == _TRACEBACK:
            self.traceback_indent = indent
        elif self.traceback_indent is not None and line.strip():
            if indent < self.traceback_indent:
                self.traceback_indent = None
            elif indent == self.traceback_indent and (match := _EXCEPTION.match(line.strip())):
                name, message = match.groups()
                # our own errors (TpustreamError) say everything in their message; anything else, its type too
                short = name.rsplit(".", 1)[-1]
                if name.startswith("tpustream.") and message:
                    self.error = message
                else:
                    self.error = f"{short}: {message}" if message else short


@contextlib.contextmanager
def _quiet(log_path: str, conditions: dict[str, Skipped]) -> Iterator[RunSummary]:
    """kfp.local prints every task's full executor log to stdout: send it to ``log_path`` instead, and a
    summary to the terminal."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "w") as log:
        summary = RunSummary(log, sys.stdout, conditions)
        root_logger = logging.getLogger()
        root_logger.handlers.clear()  # they hold the terminal's stderr (restored by _root_logging)
        # kfp.local logs its skips between tasks at INFO on the root logger (its own handler is there only
        # while a task runs): without this one they would reach neither the log nor the summary
        handler = logging.StreamHandler(summary)
        handler.setFormatter(logging.Formatter("%(asctime)s - %(levelname)s - %(message)s", "%H:%M:%S"))
        root_logger.addHandler(handler)
        root_logger.setLevel(logging.INFO)
        with contextlib.redirect_stdout(summary), contextlib.redirect_stderr(log):
            yield summary


@contextlib.contextmanager
def _root_logging() -> Iterator[None]:
    """Put the root logger's handlers and level back after the run. kfp.local swaps them per task, and two
    tasks of a ParallelFor running in threads can restore each other's handler: a StreamHandler on a
    stdout that no longer exists would be left on the root logger."""
    root_logger = logging.getLogger()
    handlers, level = root_logger.handlers[:], root_logger.level
    try:
        yield
    finally:
        root_logger.handlers[:] = handlers
        root_logger.setLevel(level)


def run_local(
    *,
    root: str,
    registry: str | None = None,
    log_path: str | None = None,
    tune: bool = False,
    **parameters: JsonValue,
) -> LocalRun:
    """Run every step locally under ``root`` (pipeline root); returns where things landed.

    Training runs on XLA CPU with 4 virtual devices (SPMD), as on a 4-chip TPU host. With ``log_path``,
    the executors' full logs go to that file and only task outcomes, epochs and decisions are printed.
    The exit step notifies ``notify_webhook`` (a parameter) as on Vertex; ``notify_emails`` cannot be sent
    from here (Vertex's email component runs only on Vertex): it is logged and left out.
    ``tune``: the pipeline's tune switch (the candidate from a search of ``tune_space``, with optuna here).
    Returns where things landed and what the run did (``LocalRun``).
    """
    from kfp import local

    os.environ.setdefault("PJRT_DEVICE", "CPU")
    os.environ.setdefault("CPU_NUM_DEVICES", "4")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tpustream.storage import io as storage

    root = os.path.abspath(storage.check_uri(root))  # file:///x is /x, never a directory named "file:"
    registry = registry or os.path.join(root, "registry")
    local.init(
        runner=local.SubprocessRunner(use_venv=False), pipeline_root=os.path.join(root, "pipeline-root")
    )
    pipeline_root = os.path.join(root, "pipeline-root")
    earlier = set(os.listdir(pipeline_root)) if os.path.isdir(pipeline_root) else set()
    if parameters.get("notify_emails"):
        logging.getLogger("tpustream").warning(
            "notify_emails: not sent by a local run (Vertex's email notification runs only on Vertex AI "
            "Pipelines); the webhook, if any, is"
        )
    parameters.pop("notify_emails", None)
    pipeline = build_pipeline(tpu=None, tune=tune)
    conditions = condition_tasks(pipeline.pipeline_spec)
    summary: RunSummary | None = None
    try:
        quiet = _quiet(log_path, conditions) if log_path else contextlib.nullcontext()
        with _root_logging(), quiet as summary:
            pipeline(registry=registry, **parameters)
    except RuntimeError as exc:  # kfp.local: a task failed
        failed = summary.failed if summary is not None else {}
        if not failed:
            raise PipelineFailed(_ANSI.sub("", str(exc))) from exc
        raise PipelineFailed(
            "; ".join(f"{task} failed" + (f": {why}" if why else "") for task, why in failed.items())
        ) from exc
    # this run's directories: kfp.local's, named after the pipeline and the time (its tasks' outputs), and the
    # one named by the run's job ID (OUTCOME_PATH: the outcome its steps recorded); not xla-cache and the like
    new = set(os.listdir(pipeline_root) if os.path.isdir(pipeline_root) else ()) - earlier
    runs = sorted(name for name in new if name.startswith(f"{PIPELINE_NAME}-"))
    recorded = [name for name in new if os.path.isfile(os.path.join(pipeline_root, name, "run-outcome.json"))]
    # what the run did: its steps' outcome (a pipeline's output cannot leave its exit handler)
    outcome = read_outcome(os.path.join(pipeline_root, recorded[0], "run-outcome.json")) if recorded else None
    return LocalRun(
        pipeline_root=pipeline_root,
        registry=registry,
        data="skip" if outcome is not None and outcome.decision == "skipped" else "train",
        outcome=outcome,
        report=_report_of(pipeline_root, runs[-1], os.path.join(root, "reports")) if runs else None,
    )


def _report_of(pipeline_root: str, run: str, reports: str) -> str | None:
    """This run's report: promote's (the final decision) when promote ran, else evaluate's, copied to
    REPORTS/<run>.html (kfp.local keeps outputs as RUN/<task>/<output>, a file named ``report``, which a
    browser would not open as a page); None when nothing was trained."""
    for task in ("promote-model", "evaluate-model"):
        path = os.path.join(pipeline_root, run, task, "report")
        if os.path.isfile(path) and os.path.getsize(path):
            os.makedirs(reports, exist_ok=True)
            page = os.path.join(reports, f"{run}.html")
            shutil.copyfile(path, page)
            return page
    return None
