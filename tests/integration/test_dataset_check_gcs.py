"""The sample index and the data check on the GCS test server: images fetched in parallel from a bucket,
their gs:// names in the index, a leak found and the report written back to the bucket."""

import io
import json

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from tpustream.artifacts import SizeSummary
from tpustream.cli.main import app
from tpustream.dataset.manifest import iter_sample_index, verify_shards
from tpustream.dataset.plan import ShardConfig
from tpustream.dataset.write import create_shards
from tpustream.storage import io as storage

pytestmark = pytest.mark.integration


def _png(seed):
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (9, 11, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def test_a_dataset_from_a_bucket_is_indexed_by_object_and_its_leak_reported_there(gcs_bucket):
    images = f"{gcs_bucket}/images"
    for c, name in enumerate(("cat", "dog")):
        for i in range(10):
            split = "val" if i < 3 else "train"
            storage.write_bytes(f"{images}/{split}/{name}/{i}.png", _png(100 * c + i))
    storage.write_bytes(f"{images}/train/dog/from-val.png", _png(100 + 1))  # dog val/1.png, again in train
    dataset = f"{gcs_bucket}/datasets/pets"
    manifest, _ = create_shards(
        ShardConfig(source=images, output=dataset, num_shards=2, workers=2), progress=False
    )
    assert verify_shards(dataset, progress=False)[1] == []
    entries = [e for split in ("train", "val") for e in iter_sample_index(dataset, manifest, split)]
    assert len(entries) == 21 and all(e.source.startswith(f"{images}/") for e in entries)
    for entry in entries:  # each names the object it came from, with its size
        assert (entry.width, entry.height, entry.format) == (11, 9, "png")
    assert manifest.splits["train"].stats.short_side == SizeSummary(min=9, median=9, max=9)

    report = f"{gcs_bucket}/reports/pets.md"
    result = CliRunner().invoke(app, ["shards", "check", dataset, "--report", report, "--json"])
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert f"report: {report}" in result.stderr
    assert [a["code"] for a in document["anomalies"]] == ["train-val-leak"]
    (leak,) = document["anomalies"][0]["details"]["examples"]
    assert leak["train"] == [f"{images}/train/dog/from-val.png"] and leak["val"] == [
        f"{images}/val/dog/1.png"
    ]
    assert f"{images}/train/dog/from-val.png" in storage.read_bytes(report).decode()
