"""The default training input side: the median shorter side of the dataset's images (documented rule)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tpustream.artifacts import Manifest
from tpustream.dataset import write as shards
from tpustream.dataset.input_size import default_input_size, input_size_rule
from tpustream.dataset.manifest import load_manifest, read_manifest
from tpustream.dataset.plan import ShardConfig


@pytest.mark.parametrize(
    "side, size",
    [(8, 16), (16, 16), (32, 32), (79, 72), (120, 120), (223, 216), (224, 224), (3024, 224)],
)
def test_rule_is_the_median_side_rounded_down_to_8_within_16_and_224(side: int, size: int) -> None:
    assert input_size_rule(side) == size


def _photos(root, sides_by_class: dict[str, list[int]]) -> str:
    rng = np.random.default_rng(0)
    for name, sides in sides_by_class.items():
        (root / name).mkdir(parents=True)
        for i, side in enumerate(sides):
            pixels = rng.integers(0, 255, (side, side + 17, 3), dtype=np.uint8)  # landscape: short = side
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return str(root)


def test_the_same_photos_get_the_same_size_whatever_the_seed(tmp_path) -> None:
    # one odd image first in some orders: the old rule (the first sample's side) gave 40 or 120 by seed
    source = _photos(tmp_path / "photos", {"a": [120] * 9 + [40], "b": [120] * 9 + [300]})
    sizes = set()
    for seed in range(4):
        out = str(tmp_path / f"ds{seed}")
        shards.create_shards(
            ShardConfig(source=source, output=out, num_shards=2, val_fraction=0.2, seed=seed), progress=False
        )
        size, reason = default_input_size(out, load_manifest(out))
        sizes.add(size)
        assert "median shorter side 120 px" in reason and "train images (manifest statistics)" in reason
    assert sizes == {120}


def test_the_manifest_statistics_decide_without_reading_a_shard(tmp_path) -> None:
    source = _photos(tmp_path / "photos", {"a": [48] * 5 + [200] * 2, "b": [48] * 5})
    out = tmp_path / "ds"
    shards.create_shards(ShardConfig(source=source, output=str(out), num_shards=2), progress=False)
    manifest = load_manifest(str(out))
    for tar in (out / "train").iterdir():
        tar.unlink()  # nothing left to measure: the statistics of every train image must answer
    size, reason = default_input_size(str(out), manifest)
    assert size == 48 and "median shorter side 48 px over the" in reason


def test_a_manifest_without_statistics_is_measured_on_its_first_shard(tmp_path) -> None:
    source = _photos(tmp_path / "photos", {"a": [64] * 6, "b": [64] * 6})
    out = str(tmp_path / "ds")
    shards.create_shards(ShardConfig(source=source, output=out, num_shards=2), progress=False)
    manifest = read_manifest(out)
    del manifest["splits"]["train"]["stats"]  # as written before the statistics existed
    size, reason = default_input_size(out, Manifest.from_json(manifest))
    assert size == 64 and "images of train/train-000000.tar" in reason
