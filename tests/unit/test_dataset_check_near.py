"""The data check's near-duplicate side (tpustream/dataset/check.py, `near-leak`) on datasets made with
create_shards from scikit-image's photos: re-saved and resized copies of train photos placed in val and test are
found and named pair by pair; byte copies stay exact leaks; a dataset written before the perceptual hashes reads
and is checked exact-only; the hash the writer stores is the one ``perceptual_hash_bytes`` gives."""

import hashlib
import json
import os
import shutil

import pytest
from PIL import Image

from tests.common.photos import jpeg_bytes, photo_folder
from tpustream.dataset import write as shards
from tpustream.dataset.check import DataCheckThresholds, check_dataset
from tpustream.dataset.manifest import SampleIndexEntry, iter_sample_index, load_manifest
from tpustream.dataset.plan import ShardConfig
from tpustream.errors import ConfigError
from tpustream.image.phash import perceptual_hash_bytes


@pytest.fixture(scope="module")
def photos_dataset(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("near")
    root = photo_folder(tmp / "photos")
    out = tmp / "dataset"
    shards.create_shards(ShardConfig(source=str(root), output=str(out), num_shards=2), progress=False)
    return str(out), root


def test_resaved_and_resized_copies_in_val_and_test_are_near_leaks_named_pair_by_pair(photos_dataset):
    uri, root = photos_dataset
    report = check_dataset(uri)
    codes = [a.code for a in report.anomalies]
    assert codes == ["test-leak", "near-leak"], report.to_markdown()  # the byte copy is an exact leak only
    near = report.facts["near_duplicates"]
    assert near["status"] == "checked" and near["max_distance"] == 8
    assert near["leaked"] == {"val": 2, "test": 1}
    found = {
        (p["split"], os.path.basename(p["source"]), os.path.basename(p["train_source"]))
        for p in near["pairs"]
    }
    assert found == {
        ("val", "coffee-resaved.jpg", "coffee.jpg"),
        ("val", "rocket-small.png", "rocket.jpg"),
        ("test", "camera-bigger.jpg", "camera.jpg"),
    }
    assert all(0 <= p["distance"] <= 8 and p["key"] and p["train_key"] for p in near["pairs"])
    (anomaly,) = [a for a in report.anomalies if a.code == "near-leak"]
    assert anomaly.details["count"] == 3 and anomaly.reason.startswith(
        "3 val/test image(s) (2 val and 1 test)"
    )
    assert near["train_clusters"] == 0  # eight distinct photos
    markdown = report.to_markdown()
    assert (
        "| Val/test images near a train image (pHash within 8 bits; thumbnails' shifted windows within 4) "
        "| 3 (val 2, test 1) | 0 | **anomaly** |" in (markdown)
    )
    assert "| Near-duplicate clusters in train | 0 (0 images, largest 0) | - (a fact) | ok |" in markdown
    for split, image, train_image in found:  # the pairs, side by side in the Markdown's table
        assert any(
            line.startswith(f"| {split} | ") and image in line and train_image in line
            for line in markdown.splitlines()
        )
    # the same limit as exact leaks: three near copies pass under --max-leaked-images 3
    relaxed = check_dataset(uri, thresholds=DataCheckThresholds(max_leaked_images=3))
    assert relaxed.ok
    # -1: exact checks only; 0: equal hashes only (the re-saves move a few bits)
    off = check_dataset(uri, thresholds=DataCheckThresholds(near_duplicate_distance=-1))
    assert [a.code for a in off.anomalies] == ["test-leak"] and off.facts["near_duplicates"][
        "status"
    ] == "off"
    assert "off (near_duplicate_distance -1)" in off.to_markdown()


def test_the_writer_stores_the_hash_of_the_bytes_it_wrote(photos_dataset):
    uri, root = photos_dataset
    manifest = load_manifest(uri)
    by_name = {p.name: p for p in root.rglob("*") if p.is_file()}
    entries = [e for split in ("train", "val", "test") for e in iter_sample_index(uri, manifest, split)]
    assert len(entries) == len(by_name)
    for entry in entries:  # every file kept byte for byte: the JPEGs hashed from the check's own draft decode
        data = by_name[os.path.basename(entry.source)].read_bytes()
        assert entry.phash == f"{perceptual_hash_bytes(data):016x}", entry.source


def test_train_clusters_are_counted_not_failed(tmp_path):
    root = photo_folder(tmp_path / "photos")
    astronaut = Image.open(root / "train" / "a" / "astronaut.jpg")
    (root / "train" / "a" / "astronaut-again.jpg").write_bytes(jpeg_bytes(astronaut, quality=75))
    out = tmp_path / "dataset"
    shards.create_shards(ShardConfig(source=str(root), output=str(out), num_shards=2), progress=False)
    report = check_dataset(str(out), thresholds=DataCheckThresholds(max_leaked_images=10))
    assert report.ok
    near = report.facts["near_duplicates"]
    assert (near["train_clusters"], near["train_clustered_images"], near["train_largest_cluster"]) == (
        1,
        2,
        2,
    )


def test_an_index_without_hashes_reads_and_is_checked_exact_only(photos_dataset, tmp_path):
    """A dataset written before the perceptual hashes: its index lines have no "phash"; it reads, the byte
    copy is still found, and the report says the near check was exact-only."""
    uri, _ = photos_dataset
    old = tmp_path / "old"
    shutil.copytree(uri, old)
    manifest = load_manifest(str(old))
    for shard in manifest.all_shards():
        path = old / shard.sample_index
        lines = [
            SampleIndexEntry.from_json_line(line)._replace(phash=None)
            for line in path.read_text().splitlines()
        ]
        path.write_text("".join(entry.to_json_line() + "\n" for entry in lines))
        assert '"phash"' not in path.read_text()
    document = json.loads((old / "manifest.json").read_text())
    for split in document["splits"].values():
        for shard in split["shards"]:
            shard["sample_index_sha256"] = hashlib.sha256(
                (old / shard["sample_index"]).read_bytes()
            ).hexdigest()
    (old / "manifest.json").write_text(json.dumps(document))  # each index re-pinned in the manifest
    entries = list(iter_sample_index(str(old), load_manifest(str(old)), "train"))
    assert entries and all(entry.phash is None for entry in entries)
    report = check_dataset(str(old))
    assert [a.code for a in report.anomalies] == ["test-leak"]
    near = report.facts["near_duplicates"]
    assert near["status"] == "exact-only" and near["unhashed_splits"] == ["train", "val", "test"]
    markdown = report.to_markdown()
    assert "exact-only: no perceptual hashes in train, val, test" in markdown
    assert "Near-duplicate checks skipped (exact-only)" in markdown


def test_a_malformed_hash_and_a_distance_out_of_range_are_refused():
    line = SampleIndexEntry("k", "0" * 64, 1, 1, "png", "a.png", "cat", "ab").to_json_line()
    with pytest.raises(ValueError, match="phash 'ab' is not 16 hex digits"):
        SampleIndexEntry.from_json_line(line)
    with pytest.raises(ConfigError, match="near-duplicate-distance must be -1"):
        DataCheckThresholds(near_duplicate_distance=65)


def test_images_under_the_hash_input_size_are_checked_exact_only(tmp_path):
    """The bundled 8x8 digits: upscaled to the hash's 32x32 input, distinct digits of a class hash alike (~90
    val images within 8 bits of a train image): they are counted as too small, never near-leaks."""
    out = tmp_path / "digits"
    shards.create_shards(ShardConfig(source="digits", output=str(out), num_shards=2), progress=False)
    report = check_dataset(str(out))
    assert report.ok, report.to_markdown()
    near = report.facts["near_duplicates"]
    assert near["small_images"] == {"train": 1618, "val": 179} and near["leaked"] == {"val": 0}
    assert (
        "| Images too small for the perceptual hash (exact-only) | train 1618, val 179"
        in report.to_markdown()
    )


def test_shifted_copies_of_train_thumbnails_in_test_are_near_leaks_found_by_their_windows(tmp_path):
    """32 px digits: copies shifted by 1-4 px (which pHash does not find) placed in test stop the check with
    the pairs named; the sample index holds the thumbnails' window hashes."""
    import numpy as np

    from tpustream.bench.datacheck import _digit_originals, _shifted
    from tpustream.image.phash_windows import split_window_hex, window_hashes_bytes

    digits, _ = _digit_originals()
    root = tmp_path / "digits"
    for split, first, count in (("train", 0, 30), ("val", 100, 6), ("test", 200, 6)):
        for i in range(first, first + count):
            folder = root / split / "ab"[i % 2]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"digit{i}.png").write_bytes(digits[i])
    shifts = {3: (3, -2), 8: (-1, 4), 13: (4, 1)}
    for i, (dx, dy) in shifts.items():
        pixels = np.asarray(Image.open(root / "train" / "ab"[i % 2] / f"digit{i}.png"))
        Image.fromarray(_shifted(pixels, dx, dy)).save(root / "test" / "ab"[i % 2] / f"digit{i}-shifted.png")
    out = tmp_path / "dataset"
    shards.create_shards(ShardConfig(source=str(root), output=str(out), num_shards=1), progress=False)
    manifest = load_manifest(str(out))
    entries = list(iter_sample_index(str(out), manifest, "test"))
    assert all(e.phash_windows is not None and len(e.phash_windows) == 9 * 16 for e in entries)
    report = check_dataset(str(out))
    assert [a.code for a in report.anomalies] == ["near-leak"], report.to_markdown()
    near = report.facts["near_duplicates"]
    assert near["leaked"] == {"val": 0, "test": 3} and near["window_distance"] == 4
    found = {
        (os.path.basename(p["source"]), os.path.basename(p["train_source"]), p["match"])
        for p in near["pairs"]
    }
    assert found == {(f"digit{i}-shifted.png", f"digit{i}.png", "windows") for i in shifts}
    (anomaly,) = report.anomalies
    assert "digit" in anomaly.reason and "shifted windows" in anomaly.reason
    markdown = report.to_markdown()
    assert "perceptual hash within 8 bits; thumbnails' shifted windows within 4:" in markdown
    assert "| split | image | train image | bits | match |" in markdown
    assert markdown.count(" | shifted windows |") == 3
    train = list(iter_sample_index(str(out), manifest, "train"))
    assert all(e.phash_windows is not None and len(e.phash_windows) == 9 * 16 for e in train)
    # each split's role: train the base windows, test the query windows (image.phash_windows.window_role)
    # (from the check's own decode of the PNG, kept as is: the same as from its bytes)
    for entry, role in ((train[0], slice(0, 9)), (entries[0], slice(9, 18))):
        with open(entry.source, "rb") as f:
            expected = window_hashes_bytes(f.read())[role]
        assert np.array_equal(split_window_hex(entry.phash_windows or ""), expected)
