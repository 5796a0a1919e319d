"""The run report: ``build`` gathers a run's facts and writes it, ``facts`` the facts, ``verdict`` the decision and
per-class rows both documents state, ``formatting`` how they write numbers, ``html`` (its frame and elements in
``page``) and ``markdown`` the two renderings, ``plots`` its SVG plots, ``recipe`` the training recipe,
``mistakes`` the gallery of wrong predictions.

The names below are the package's public API, imported on first use so that importing the package loads nothing
heavy (``tpustream --help`` stays torch-free); the modules themselves are imported by their full path inside tpustream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from tpustream.report.build import ReportError, write_report, write_run_report
    from tpustream.report.facts import ReportFacts

_HOMES = {
    "write_report": "build",
    "write_run_report": "build",
    "ReportError": "build",
    "ReportFacts": "facts",
}
__all__ = ["ReportError", "write_report", "write_run_report", "ReportFacts"]

__getattr__, __dir__ = lazy_front(__name__, _HOMES)
