"""`tpustream predict`: a model (or a registry's champion) on image files, directories, gs:// prefixes, shards
and datasets, with the classifier the serving container runs (``tpustream.serve.classifier``).

``config`` is the command's options (``PredictConfig``); ``inputs`` finds every image the inputs name;
``pool`` reads and decodes them in worker processes and classifies them here in batches (``predict_items``);
``parts`` and ``output`` write the results resumably to ``--output`` (``predict_to_output``). The command's
printing is the CLI's (``tpustream.cli.serve``).

The names below are imported on first use, so that importing the package loads nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from tpustream.serve.predict.config import PredictConfig, PredictError
    from tpustream.serve.predict.inputs import Item, Skipped, iter_items, val_items_of_model
    from tpustream.serve.predict.output import predict_to_output
    from tpustream.serve.predict.parts import PartRecord, PredictionSummary, read_summary
    from tpustream.serve.predict.pool import PredictResult, predict_items

_HOMES = {
    "PredictConfig": "config",
    "PredictError": "config",
    "Item": "inputs",
    "Skipped": "inputs",
    "iter_items": "inputs",
    "val_items_of_model": "inputs",
    "PredictResult": "pool",
    "predict_items": "pool",
    "PartRecord": "parts",
    "PredictionSummary": "parts",
    "read_summary": "parts",
    "predict_to_output": "output",
}
__all__ = [
    "Item",
    "PartRecord",
    "PredictConfig",
    "PredictError",
    "PredictResult",
    "PredictionSummary",
    "Skipped",
    "iter_items",
    "predict_items",
    "predict_to_output",
    "read_summary",
    "val_items_of_model",
]

__getattr__, __dir__ = lazy_front(__name__, _HOMES)
