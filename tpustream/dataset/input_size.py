"""The dataset's input side: the rule that picks the training input side from the median shorter side of the
dataset's images when the run gives none, and the measurement it reads (the manifest's statistics, else the
first train shard's image headers). A fact of the dataset, read by the trainer, the model specs (each states
its rule) and the loader's benchmark; torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from tpustream.artifacts import Manifest
from tpustream.dataset.tario import iter_tar_samples
from tpustream.errors import ConfigError
from tpustream.image.codec import image_member
from tpustream.storage import io as storage

__all__ = [
    "InputSizeRule",
    "MIN_INPUT_SIZE",
    "MAX_DEFAULT_INPUT_SIZE",
    "input_size_rule",
    "median_short_side",
    "default_input_size",
]


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
        raise ConfigError(f"dataset {dataset} has no train split to measure: give the input size")
    median = train.stats.short_side.median if train.stats and train.stats.short_side else None
    if isinstance(median, int | float) and median > 0:
        return int(median), f"the {train.num_samples} train images (manifest statistics)"
    if not train.shards:
        raise ConfigError(f"dataset {dataset} has no train shard to measure: give the input size")
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
        raise ConfigError(f"no image in {storage.join(dataset, shard.path)} to measure: give the input size")
    return int(statistics.median_low(sides)), f"{len(sides)} images of {shard.path}"


def default_input_size(
    dataset: str, manifest: Manifest, rule: InputSizeRule = input_size_rule
) -> tuple[int, str]:
    """The training input side when none is given (``rule`` applied to the dataset's median shorter side), and
    a line saying how it was chosen (model.json)."""
    side, measured = median_short_side(dataset, manifest)
    size = rule(side)
    return size, f"median shorter side {side} px over {measured} -> {size} px ({rule})"
