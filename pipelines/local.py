"""Run the whole DAG here, on CPU, through kfp.local (SubprocessRunner without a venv: this Python)."""

import contextlib
import io
import logging
import os
import re
import shutil
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from tpustream.pipelines.training import build_pipeline

__all__ = ["run_local"]

# What a person watching `make demo` needs from kfp.local's output; everything goes to the log file.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SHOWN = (
    (re.compile(r"Task '([\w-]+)' finished with status (\w+)"), "  {0}: {1}"),
    (re.compile(r"Skipping conditional task ([\w-]+)"), "  {0}: skipped (condition not met)"),
    (re.compile(r"INFO\]: (no new data since .*?;|new data: .*)"), "  {0}"),
    (re.compile(r"INFO\]: (epoch \d+/\d+: .*?val top-1 [0-9.]+)"), "    {0}"),
    (re.compile(r"INFO\]: (decision: .*)"), "  {0}"),
)


class _Summary(io.TextIOBase):
    """A stdout that writes everything to ``log`` and the few lines in _SHOWN to ``terminal``."""

    def __init__(self, log: TextIO, terminal: TextIO) -> None:
        self.log, self.terminal, self.pending = log, terminal, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.log.write(text)
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            plain = _ANSI.sub("", line)
            for pattern, template in _SHOWN:
                match = pattern.search(plain)
                if match:
                    self.terminal.write(template.format(*match.groups()) + "\n")
                    self.terminal.flush()
                    break
        return len(text)

    def flush(self) -> None:
        self.log.flush()


@contextlib.contextmanager
def _quiet(log_path: str) -> Iterator[None]:
    """kfp.local prints every task's full executor log to stdout: send it to ``log_path`` instead."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "w") as log:
        summary = _Summary(log, sys.stdout)
        logging.getLogger().handlers.clear()  # they hold the terminal's stderr (restored by _root_logging)
        with contextlib.redirect_stdout(summary), contextlib.redirect_stderr(log):
            yield


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
    *, root: str, registry: str | None = None, log_path: str | None = None, **parameters: Any
) -> dict[str, Any]:
    """Run every step locally under ``root`` (pipeline root); returns where things landed.

    Training runs on XLA CPU with 4 virtual devices (SPMD), as on a 4-chip TPU host. With ``log_path``,
    the executors' full logs go to that file and only task outcomes, epochs and decisions are printed.
    """
    from kfp import local

    os.environ.setdefault("PJRT_DEVICE", "CPU")
    os.environ.setdefault("CPU_NUM_DEVICES", "4")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tpustream import storage

    root = os.path.abspath(storage.check_uri(root))  # file:///x is /x, never a directory named "file:"
    registry = registry or os.path.join(root, "registry")
    local.init(
        runner=local.SubprocessRunner(use_venv=False), pipeline_root=os.path.join(root, "pipeline-root")
    )
    pipeline_root = os.path.join(root, "pipeline-root")
    earlier = set(os.listdir(pipeline_root)) if os.path.isdir(pipeline_root) else set()
    pipeline = build_pipeline(tpu=None)
    with _root_logging(), _quiet(log_path) if log_path else contextlib.nullcontext():
        run = pipeline(registry=registry, **parameters)
    # this run's directory (kfp.local names it after the pipeline and the time); not xla-cache and the like
    runs = sorted(
        name
        for name in set(os.listdir(pipeline_root) if os.path.isdir(pipeline_root) else ()) - earlier
        if name.startswith("tpustream-training-")
    )
    return {
        "pipeline_root": pipeline_root,
        "registry": registry,
        "data": run.output,
        "report": _report_of(pipeline_root, runs[-1], os.path.join(root, "reports")) if runs else None,
    }


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
