"""Numbers about predictions: ``masked`` loss/top-1/top-5 over a loader's batches, ``scores`` the per-sample scores,
``classification`` precision/recall/thresholds from them, ``paired_test`` how sure a comparison of two models is.

The names below are the package's public API, imported on first use so that importing the package loads nothing
heavy (``tpustream --help`` stays torch-free); the modules themselves are imported by their full path inside tpustream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from tpustream.metrics.classification import ClassificationMetrics, classification_metrics
    from tpustream.metrics.masked import masked_sums, summarize
    from tpustream.metrics.paired_test import PairedTest, mcnemar_exact_p
    from tpustream.metrics.scores import SampleScore, read_scores, write_scores

_HOMES = {
    "masked_sums": "masked",
    "summarize": "masked",
    "SampleScore": "scores",
    "read_scores": "scores",
    "write_scores": "scores",
    "ClassificationMetrics": "classification",
    "classification_metrics": "classification",
    "PairedTest": "paired_test",
    "mcnemar_exact_p": "paired_test",
}
__all__ = [
    "masked_sums",
    "summarize",
    "SampleScore",
    "read_scores",
    "write_scores",
    "ClassificationMetrics",
    "classification_metrics",
    "PairedTest",
    "mcnemar_exact_p",
]

__getattr__, __dir__ = lazy_front(__name__, _HOMES)
