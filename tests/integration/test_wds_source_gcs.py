"""Another tool's WebDataset shards on the GCS test server: listed by streaming each tar, re-sharded with one
ranged GET per image into a gs:// dataset; the directory and the pattern forms read the same samples."""

import pytest

from tests.common.sources import write_stock_shards
from tpustream.dataset import fingerprint
from tpustream.dataset.manifest import verify_shards
from tpustream.dataset.plan import ShardConfig
from tpustream.dataset.write import create_shards
from tpustream.sources.dispatch import open_source
from tpustream.storage import io as storage

pytestmark = pytest.mark.integration


def test_shards_on_gcs_are_resharded_into_a_gcs_dataset(gcs_bucket, tmp_path):
    write_stock_shards(str(tmp_path))
    for tar in sorted(tmp_path.glob("*.tar")):
        storage.upload_file(str(tar), f"{gcs_bucket}/theirs/{tar.name}")
    directory, pattern = f"{gcs_bucket}/theirs", f"{gcs_bucket}/theirs/*.tar"
    by_directory, by_pattern = open_source(directory), open_source(pattern)
    assert [i.ref for i in by_directory.items] == [i.ref for i in by_pattern.items]
    assert len(by_directory.items) == 36 and by_directory.classes == ["0", "1", "2"]
    assert by_directory.locate(by_directory.items[0]).startswith(f"{gcs_bucket}/theirs/train-0000.tar#")

    output = f"{gcs_bucket}/datasets/resharded"
    manifest, summary = create_shards(
        ShardConfig(source=pattern, output=output, num_shards=2), progress=False
    )
    assert manifest.splits["train"].class_counts == [6, 6, 6]
    assert manifest.splits["val"].class_counts == [6, 6, 6]
    assert manifest.skipped.count == 0 and manifest.source == pattern
    verify_shards(output)

    config = ShardConfig(source=pattern, output=output)
    before = fingerprint.fingerprint(config, fingerprint.source_objects(pattern))
    storage.upload_file(
        str(tmp_path / "val-0000.tar"), f"{gcs_bucket}/theirs/val-0000.tar"
    )  # a new generation
    assert fingerprint.fingerprint(config, fingerprint.source_objects(pattern)) != before


def test_gzip_shards_on_gcs_are_read_by_ranged_reads_through_their_index(gcs_bucket, tmp_path, monkeypatch):
    from tests.common.sources import gzip_shards
    from tpustream.sources import gzip_index

    monkeypatch.setattr(gzip_index, "CHECKPOINT_SPACING", 4096)
    write_stock_shards(str(tmp_path))
    gzip_shards(tmp_path)
    for tar in sorted(tmp_path.glob("*.tar.gz")):
        storage.upload_file(str(tar), f"{gcs_bucket}/packed/{tar.name}")
    source = open_source(f"{gcs_bucket}/packed")
    assert len(source.items) == 36 and source.classes == ["0", "1", "2"] and not source.rejected
    output = f"{gcs_bucket}/datasets/from-gz"
    manifest, _ = create_shards(ShardConfig(source=f"{gcs_bucket}/packed", output=output, num_shards=2))
    assert manifest.splits["train"].class_counts == [6, 6, 6]
    assert manifest.splits["val"].class_counts == [6, 6, 6] and manifest.skipped.count == 0
    verify_shards(output)
