"""Training: ``config`` (``TrainConfig``, ``TrainError``), ``trainer`` (the driver: the epoch loop, its
checkpoints and preemption stop), ``run_inputs`` (the run's inputs, before its first step), ``run_start``
(resume or warm start), ``optimizer`` (LR schedule, fine-tuning groups), ``step`` (the compiled step,
validation), ``records`` (state, epoch records, TensorBoard), ``model_artifact``, ``checkpoint``,
``preemption``, ``warm_start``, ``pretrained`` weights (resolved and cached) and ``pretrained_load`` (loaded
into the backbone), ``compile_cache`` and ``evaluate`` (a model on the evaluation shards).

The names below are the package's public API, imported on first use so that importing the package loads nothing
heavy (``tpustream --help`` stays torch-free); the modules themselves are imported by their full path inside tpustream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from tpustream.train.config import TrainError
    from tpustream.train.evaluate import EvaluationError, evaluate_model
    from tpustream.train.trainer import train

_HOMES = {
    "train": "trainer",
    "TrainError": "config",
    "evaluate_model": "evaluate",
    "EvaluationError": "evaluate",
}
__all__ = ["TrainError", "train", "EvaluationError", "evaluate_model"]

# Old paths that keep working for one release (0.x), with a DeprecationWarning naming the new one.
_MOVED = {"TrainConfig": "tpustream.train.config"}

__getattr__, __dir__ = lazy_front(__name__, _HOMES, moved=_MOVED)
