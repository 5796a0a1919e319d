"""The loader's configuration: what a caller decides. Torch-free, so ``--help`` and config checks import no
torch. The input side taken when the caller gives none is the dataset's (``tpustream.dataset.input_size``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tpustream.errors import ConfigError
from tpustream.image.codec import DEFAULT_MAX_PIXELS
from tpustream.image.transforms import AugmentPolicy

__all__ = ["LoaderConfig", "SplitName"]


SplitName = Literal["train", "val", "test"]  # test: read only by evaluation, like val


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """One replica's view of a split. ``batch_size`` is this replica's batch (SPMD: per-device batch x
    local devices; replicas strategy: per-device batch)."""

    data: str
    batch_size: int
    split: SplitName = "train"
    input_size: int = 224
    num_replicas: int | None = None  # default: torch_xla process_count (1 without XLA)
    replica_index: int | None = None  # default: torch_xla process_index (0 without XLA)
    workers: int = 2
    seed: int = 0
    shuffle_buffer: int = 1024
    min_crop_scale: float | None = None  # default: transforms.default_min_crop_scale(input_size)
    prefetch_factor: int = 4
    max_pixels: int = DEFAULT_MAX_PIXELS  # images whose header claims more are skipped as undecodable
    val_crop_fraction: float = (
        0.875  # the val centre crop's share of the shorter side (model.json's preprocessing)
    )
    sample_keys: bool = False  # val only: each batch also carries "key", its samples' keys ("" for padding)
    # train: the epoch's last global batch padded to full size (copies of its samples, mask False) rather than
    # its remainder left out; off: the floor of whole global batches (how epochs were cut before issue 46)
    pad_last_batch: bool = True
    # train only: a torchvision.transforms.v2 policy and RandomErasing's probability, after the crop and flip
    augment_policy: AugmentPolicy = "none"
    random_erasing: float = 0.0

    def __post_init__(self) -> None:
        if self.split not in ("train", "val", "test"):  # test: read only by evaluation, like val
            raise ConfigError(f"split must be 'train', 'val' or 'test', got {self.split!r}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.workers < 0:
            raise ConfigError(f"workers must be >= 0, got {self.workers}")
        if self.input_size < 1:
            raise ConfigError(f"input_size must be positive, got {self.input_size}")
        if self.shuffle_buffer < 1:
            raise ConfigError(f"shuffle_buffer must be at least 1, got {self.shuffle_buffer}")
        if self.sample_keys and self.split == "train":
            raise ConfigError("sample_keys applies to evaluation splits only, not to the train split")
        if self.max_pixels < 1:
            raise ConfigError(f"max_pixels must be at least 1, got {self.max_pixels}")
        if (self.num_replicas is None) != (self.replica_index is None):
            raise ConfigError("give both num_replicas and replica_index, or neither")
        if self.num_replicas is not None and not 0 <= (self.replica_index or 0) < self.num_replicas:
            raise ConfigError(
                f"replica_index {self.replica_index} out of range for {self.num_replicas} replicas"
            )
