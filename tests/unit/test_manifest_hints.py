"""A path that is not a dataset: the error says what is there instead and what to run."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from tpustream.cli.main import app
from tpustream.dataset.manifest import ShardError, read_manifest


def _photo(path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(path)


def test_raw_images_are_named_as_such_with_the_command_that_makes_shards(tmp_path) -> None:
    _photo(tmp_path / "photos" / "cat" / "1.jpg")
    with pytest.raises(ShardError, match=r"holds images, not shards.*tpustream shards create --source"):
        read_manifest(str(tmp_path / "photos"))


def test_a_relative_path_says_where_it_was_looked_for(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ShardError, match=f"nothing is there, relative to {tmp_path}"):
        read_manifest("datasets/digits")


def test_unfinished_shards_create_and_foreign_tars_are_told_apart(tmp_path) -> None:
    (tmp_path / "ours" / "_records").mkdir(parents=True)
    (tmp_path / "ours" / "_records" / "train-000000.json").write_text("{}")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "shard-000000.tar").write_bytes(b"")
    with pytest.raises(ShardError, match="unfinished `shards create`.*re-run it to resume"):
        read_manifest(str(tmp_path / "ours"))
    with pytest.raises(ShardError, match="shards from another tool are re-sharded"):
        read_manifest(str(tmp_path / "theirs"))


def test_train_on_raw_images_is_one_line_with_the_hint(tmp_path) -> None:
    _photo(tmp_path / "photos" / "cat" / "1.png")
    result = CliRunner().invoke(
        app, ["train", "--data", str(tmp_path / "photos"), "--output", str(tmp_path / "m")]
    )
    assert result.exit_code == 2
    assert "holds images, not shards" in result.output and "Traceback" not in result.output


@pytest.mark.integration
def test_raw_images_in_a_bucket_get_the_same_hint(gcs_bucket) -> None:
    from tpustream.storage import io as storage

    for i in range(3):
        storage.write_bytes(f"{gcs_bucket}/photos/cat/{i}.jpg", b"not read")
    with pytest.raises(ShardError, match="holds images, not shards"):
        read_manifest(f"{gcs_bucket}/photos")
    assert len(storage.sample_objects(f"{gcs_bucket}/photos", limit=2)) == 2
