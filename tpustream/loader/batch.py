"""The batch contract between the loader and its consumers (trainer, evaluation, benchmarks).

``ShardLoader.epoch()`` (tpustream/loader/shard_loader.py) yields one ``Batch`` per step: a dict, so that torch_xla's
``MpDeviceLoader`` moves it to the device and shards it per key (tpustream/xla_runtime.py), typed here so
that every reader agrees on the keys. Every replica gets the same number of full batches; the samples
added to fill the last one carry ``mask`` False and count in no metric (tpustream/metrics/masked.py).
"""

# No ``from __future__ import annotations``: ``Batch``'s optional key must be NotRequired at run time too
# (``Batch.__optional_keys__``), which string annotations would hide from ``TypedDict``.
from typing import TYPE_CHECKING, Literal, NotRequired, TypedDict

if TYPE_CHECKING:
    import torch

__all__ = ["Batch", "BATCH_KEYS"]


class Batch(TypedDict):
    image: "torch.Tensor"  # uint8 [B, 3, S, S]; normalised on the device (transforms.normalize)
    label: "torch.Tensor"  # int64 [B]
    mask: "torch.Tensor"  # bool [B]: False for padding samples
    # evaluation only (``LoaderConfig.sample_keys``): the samples' keys in their shards, "" for padding; stays
    # on the host (``device_loader`` moves the tensors)
    key: NotRequired[list[str]]


# The tensors every batch has: what moves to the device (and is sharded there).
BATCH_KEYS: tuple[Literal["image"], Literal["label"], Literal["mask"]] = ("image", "label", "mask")
