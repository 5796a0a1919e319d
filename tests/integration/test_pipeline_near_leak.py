"""The pipeline's "check data" step through the real kfp.local DAG, for near copies: a source whose test split
holds JPEG re-saves of train photos (no byte copy anywhere) stops the run before training, the near-leak named
in `pipeline run-local`'s own lines and every pair listed in the step's Markdown report."""

import io
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tpustream.cli.main import app

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRAIN = ["astronaut", "coffee", "chelsea", "rocket", "camera", "moon", "brick", "retina"]
VAL = ["hubble_deep_field", "coins"]
TEST = ["page", "clock"]


def _photos_with_split(root):
    """scikit-image's photos as 240x180 JPEGs in train/ (each also mirrored), val/ and test/, two classes;
    test also holds q70 re-saves of two train photos."""
    import skimage.data
    from PIL import Image

    def save(image, path, quality=90):
        path.parent.mkdir(parents=True, exist_ok=True)
        out = io.BytesIO()
        image.save(out, format="JPEG", quality=quality)
        path.write_bytes(out.getvalue())

    photos = {}
    for split, names in (("train", TRAIN), ("val", VAL), ("test", TEST)):
        for i, name in enumerate(names):
            pixels = getattr(skimage.data, name)()
            photo = Image.fromarray(pixels[..., :3] if pixels.ndim == 3 else pixels).convert("RGB")
            photos[name] = photo = photo.resize((240, 180))
            save(photo, root / split / "ab"[i % 2] / f"{name}.jpg")
            if split == "train":
                save(
                    photo.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
                    root / split / "ab"[i % 2] / f"{name}-m.jpg",
                )
    for name in ("coffee", "camera"):
        label = "ab"[TRAIN.index(name) % 2]
        resaved = Image.open(root / "train" / label / f"{name}.jpg")
        save(resaved, root / "test" / label / f"{name}-resaved.jpg", quality=70)


def test_a_test_split_with_resaved_train_photos_stops_at_the_data_check_naming_the_pairs(tmp_path):
    source = tmp_path / "images"
    _photos_with_split(source)
    root = str(tmp_path / "run")
    result = CliRunner().invoke(
        app,
        [
            *("pipeline", "run-local", "--root", root, "--source", str(source), "--model", "tiny"),
            *("--epochs", "1", "--batch-size", "4", "--num-shards", "2", "--param", "shards_per_task=2"),
        ],
    )
    assert result.exit_code == 2, result.output
    printed = result.stdout.splitlines()
    failed = printed.index("  check-data: FAILURE")
    anomaly = printed[failed + 1]
    assert anomaly.startswith(
        "    anomaly near-leak: 2 val/test image(s) (2 test) are near copies of train images"
    )
    assert "-resaved.jpg (test) ~ " in anomaly
    assert "  train-model: skipped (check-data failed)" in printed[failed:]
    pipeline_root = os.path.join(root, "pipeline-root")
    assert not [path for path, _, files in os.walk(pipeline_root) if "model.json" in files]  # no training
    (report,) = Path(pipeline_root).glob("*/check-data/report")  # the Markdown artifact names every pair
    rows = [line for line in report.read_text().splitlines() if line.startswith("| test | ")]
    for name in ("coffee", "camera"):
        assert any(
            f"{name}-resaved.jpg" in row and "/train/" in row and f"{name}.jpg`" in row for row in rows
        ), rows
