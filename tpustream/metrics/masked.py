"""Masked classification metrics: the one definition of loss / top-1 / top-5 over a loader's batches.

``masked_mean`` is the training loss's reduction (tpustream/train/step.py): the padded last batch of a train
epoch counts its real samples only. The sums are used by training-time validation (``tpustream/train/trainer.py``, sums kept on the XLA device, one transfer per
epoch) and by ``tpustream evaluate`` (``tpustream/train/evaluate.py``). Padding samples (``mask`` 0, added so
every replica runs the same number of full batches) count nowhere.
"""

from __future__ import annotations

from typing import Any

__all__ = ["masked_mean", "masked_sums", "summarize"]


def masked_mean(values: Any, mask: Any) -> Any:
    """The mean of per-sample ``values`` over the samples with ``mask`` 1 (0 when there are none): padding
    weighs nothing, and a full batch's mean is the plain one."""
    weights = mask.to(values.dtype)
    return (values * weights).sum() / weights.sum().clamp(min=1)


def masked_sums(logits: Any, labels: Any, mask: Any, dtype: Any = None) -> tuple[Any, Any]:
    """One batch: ``[loss sum, top-1 hits, top-5 hits, valid count]`` over the samples with ``mask`` 1
    (a tensor in ``dtype``, default the logits'), and the top-1 predictions (for a confusion matrix)."""
    import torch
    import torch.nn.functional as F

    dtype = dtype or logits.dtype
    loss = F.cross_entropy(logits, labels, reduction="none")
    top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
    predicted = top5[:, 0]
    valid = mask.to(dtype)
    sums = torch.stack(
        [
            (loss.to(dtype) * valid).sum(),
            ((predicted == labels).to(dtype) * valid).sum(),
            ((top5 == labels[:, None]).any(dim=1).to(dtype) * valid).sum(),
            valid.sum(),
        ]
    )
    return sums, predicted


def summarize(sums: Any) -> dict[str, float]:
    """Totals from ``masked_sums`` (added over batches and replicas) -> mean loss, top-1, top-5, samples."""
    loss, top1, top5, count = (float(v) for v in sums.cpu().tolist())
    samples = max(count, 1.0)
    return {"loss": loss / samples, "top1": top1 / samples, "top5": top5 / samples, "samples": int(count)}
