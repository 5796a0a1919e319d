"""The loader's configuration and its default input size: what a caller decides, and the rule that picks
the input side from the dataset when the caller does not. Torch-free, so ``--help`` and config checks
import no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tpustream.artifacts import Manifest
from tpustream.dataset.tario import iter_tar_samples
from tpustream.errors import ConfigError
from tpustream.image.codec import DEFAULT_MAX_PIXELS, image_member
from tpustream.loader.epoch_plan import LoaderError
from tpustream.storage import io as storage

__all__ = [
    "LoaderConfig",
    "SplitName",
    "InputSizeRule",
    "MIN_INPUT_SIZE",
    "MAX_DEFAULT_INPUT_SIZE",
    "input_size_rule",
    "median_short_side",
    "default_input_size",
]


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


# The default training input side (docs/ARCHITECTURE.md, "Input size"): the median shorter side of the
# dataset's images, rounded down to a multiple of 8, within [16, 224]. 224 is ResNet's ImageNet side (more
# costs TPU time quadratically for little accuracy); 16 is the least the small-input stem trains on (8x8
# digits are upscaled); no image is upscaled otherwise. A median, not one image: the same photos gave 120,
# 80, 79 or 224 px from their first sample, by seed and split.
MIN_INPUT_SIZE = 16
MAX_DEFAULT_INPUT_SIZE = 224
SIDE_SAMPLES = 256  # images measured when the manifest has no size statistics (datasets before them)


@dataclass(frozen=True, kw_only=True)
class InputSizeRule:
    """The default input side for images whose median shorter side is ``side`` px (docs/ARCHITECTURE.md, "Input
    size"): rounded down to a multiple of 8, within [``smallest``, ``largest``]. ``largest`` is the model's
    ImageNet side (more costs TPU time quadratically for little accuracy); ``smallest`` the least its stem
    trains on (smaller images are upscaled to it); no other image is upscaled."""

    smallest: int = 16
    largest: int = 224

    def __post_init__(self) -> None:
        if not 1 <= self.smallest <= self.largest:
            raise ConfigError(f"an input size rule needs 1 <= smallest <= largest, got {self}")

    def __call__(self, side: int) -> int:
        return min(self.largest, max(self.smallest, side // 8 * 8))

    def __str__(self) -> str:
        return f"multiple of 8 in [{self.smallest}, {self.largest}]"


# The rule of every model that states none (``ModelSpec.input_size``), and of the loader's benchmarks.
input_size_rule = InputSizeRule(smallest=MIN_INPUT_SIZE, largest=MAX_DEFAULT_INPUT_SIZE)


def median_short_side(dataset: str, manifest: Manifest) -> tuple[int, str]:
    """The median shorter side of the dataset's train images and where it was read: the manifest's statistics
    (every train image: ``splits.train.stats.short_side``), else, for a dataset written before them, the
    headers of up to 256 images of the first train shard (a shuffled sample)."""
    train = manifest.split("train")
    if train is None:
        raise LoaderError(f"dataset {dataset} has no train split to measure: give the input size")
    median = train.stats.short_side.median if train.stats and train.stats.short_side else None
    if isinstance(median, int | float) and median > 0:
        return int(median), f"the {train.num_samples} train images (manifest statistics)"
    if not train.shards:
        raise LoaderError(f"dataset {dataset} has no train shard to measure: give the input size")
    import io
    import statistics

    from PIL import Image

    shard = train.shards[0]
    sides: list[int] = []
    with storage.open_read(storage.join(dataset, shard.path)) as stream:
        for _, fields in iter_tar_samples(stream, shard.num_bytes):
            ext = image_member(fields)
            if ext is not None:
                with Image.open(io.BytesIO(fields[ext])) as img:  # the header only
                    sides.append(min(img.size))
            if len(sides) == SIDE_SAMPLES:
                break
    if not sides:
        raise LoaderError(f"no image in {storage.join(dataset, shard.path)}")
    return int(statistics.median_low(sides)), f"{len(sides)} images of {shard.path}"


def default_input_size(
    dataset: str, manifest: Manifest, rule: InputSizeRule = input_size_rule
) -> tuple[int, str]:
    """The training input side when none is given (``rule`` applied to the dataset's median shorter side), and
    a line saying how it was chosen (model.json)."""
    side, measured = median_short_side(dataset, manifest)
    size = rule(side)
    return size, f"median shorter side {side} px over {measured} -> {size} px ({rule})"
