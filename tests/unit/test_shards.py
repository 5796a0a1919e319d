import json
import os
from collections import Counter

import pytest

from tests.common.shards import Crash as _Crash
from tests.common.shards import crashing_source as _crashing
from tests.common.shards import shard_config as _config
from tests.common.sources import make_image_folder
from tpustream.dataset import write as shards
from tpustream.dataset.manifest import MANIFEST_FORMAT, ShardError, read_manifest, verify_shards
from tpustream.dataset.plan import plan_dataset
from tpustream.dataset.tario import iter_tar_samples
from tpustream.sources.dispatch import open_source
from tpustream.sources.types import Item, Source
from tpustream.storage import io as storage


def _samples(path):
    with open(path, "rb") as f:
        return list(iter_tar_samples(f))


def test_plan_is_deterministic_balanced_and_mixed():
    source = open_source("digits")
    plan = plan_dataset(source, _config("/unused", num_shards=7, val_fraction=0.2, seed=3))
    again = plan_dataset(source, _config("/unused", num_shards=7, val_fraction=0.2, seed=3))
    assert [s.fingerprint for s in plan.shards] == [s.fingerprint for s in again.shards]
    other = plan_dataset(source, _config("/unused", num_shards=7, val_fraction=0.2, seed=4))
    assert [s.fingerprint for s in plan.shards] != [s.fingerprint for s in other.shards]
    train = plan.shards_of("train")
    assert len(train) == 7
    sizes = [len(s.items) for s in train]
    assert max(sizes) - min(sizes) <= 1
    for spec in plan.shards:  # classes mixed within every shard
        assert len({source.items[i].label for i in spec.items}) == 10
    # the split is stratified and disjoint, and covers every item exactly once
    val_items = [i for s in plan.shards_of("val") for i in s.items]
    train_items = [i for s in train for i in s.items]
    assert sorted(val_items + train_items) == list(range(1797))
    val_classes = Counter(source.items[i].label for i in val_items)
    assert all(30 <= n <= 42 for n in val_classes.values())


def test_upsample_repeats_train_only_and_spreads_copies():
    source = open_source("synthetic-cifar:1000")
    plan = plan_dataset(source, _config("/u", source="synthetic-cifar:1000", num_shards=10, upsample=5))
    train = [i for s in plan.shards_of("train") for i in s.items]
    assert len(train) == 900 * 5 and set(Counter(train).values()) == {5}
    assert plan.split_counts["val"] == 100
    for spec in plan.shards_of("train"):  # copies land in different shards, not next to each other
        assert len(set(spec.items)) >= 0.95 * len(spec.items)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_shards": 5000}, "cannot fill 5000 shards"),
        ({"val_shards": 1000, "val_fraction": 0.1}, "cannot fill 1000 shards"),
    ],
)
def test_plan_errors(kwargs, message):
    with pytest.raises(ShardError, match=message):
        plan_dataset(open_source("digits"), _config("/u", **kwargs))


@pytest.mark.parametrize(
    "kwargs", [{"num_shards": 0}, {"upsample": 0}, {"val_fraction": 1.0}, {"workers": 0}, {"max_side": 2}]
)
def test_config_validation(kwargs):
    with pytest.raises(ValueError):
        _config("/u", **kwargs)


def test_create_writes_exact_shards_and_manifest_last(tmp_path):
    out = tmp_path / "ds"
    manifest, summary = shards.create_shards(_config(out, num_shards=4, workers=2), progress=False)
    assert summary.num_samples == 1797 and summary.skipped == 0
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == manifest.to_json() and on_disk["format"] == MANIFEST_FORMAT
    train = manifest.splits["train"]
    assert [s.path for s in train.shards] == [f"train/train-{i:06d}.tar" for i in range(4)]
    assert sum(s.num_samples for s in train.shards) == train.num_samples
    for shard in manifest.all_shards():
        samples = _samples(out / shard.path)
        assert len(samples) == shard.num_samples
        assert os.path.getsize(out / shard.path) == shard.num_bytes
        assert all(set(f) == {"ppm", "cls"} for _, f in samples)
    assert sum(train.class_counts) == train.num_samples
    assert not (out / "_records").exists()  # records removed once the manifest is committed
    assert verify_shards(str(out), progress=False) == (len(train.shards) + 1, [])


def test_existing_dataset_refused_then_overwritten(tmp_path):
    out = tmp_path / "ds"
    shards.create_shards(_config(out, num_shards=5), progress=False)
    with pytest.raises(ShardError, match="--overwrite"):
        shards.create_shards(_config(out, num_shards=3), progress=False)
    manifest, _ = shards.create_shards(_config(out, num_shards=3, overwrite=True), progress=False)
    assert len(manifest.splits["train"].shards) == 3
    assert sorted(os.listdir(out / "train")) == [f"train-{i:06d}.tar" for i in range(3)]  # stale shards gone
    assert verify_shards(str(out), progress=False)[1] == []


def test_crash_leaves_no_manifest_and_rerun_resumes(tmp_path):
    out = tmp_path / "ds"
    config = _config(out, num_shards=6, workers=1)
    source = open_source("digits")
    with pytest.raises(_Crash):
        shards.create_shards(config, progress=False, source=_crashing(source, after=700))
    assert not (out / "manifest.json").exists()
    finished = sorted(os.listdir(out / "train"))
    assert finished == [f"train-{i:06d}.tar" for i in range(len(finished))] and 0 < len(finished) < 6
    mtimes = {f: os.stat(out / "train" / f).st_mtime_ns for f in finished}
    with pytest.raises(ShardError, match="no dataset"):
        read_manifest(str(out))
    manifest, summary = shards.create_shards(config, progress=False)
    assert summary.reused_shards == len(finished)
    assert {f: os.stat(out / "train" / f).st_mtime_ns for f in finished} == mtimes  # kept, not rewritten
    fresh, _ = shards.create_shards(_config(tmp_path / "fresh", num_shards=6), progress=False)
    assert [s.sha256 for s in manifest.splits["train"].shards] == [
        s.sha256 for s in fresh.splits["train"].shards
    ]


def test_changed_plan_rewrites_instead_of_reusing(tmp_path):
    out = tmp_path / "ds"
    source = open_source("digits")
    with pytest.raises(_Crash):
        shards.create_shards(
            _config(out, num_shards=6, seed=1), progress=False, source=_crashing(source, 700)
        )
    _, summary = shards.create_shards(_config(out, num_shards=6, seed=2), progress=False)
    assert summary.reused_shards == 0


def test_verify_reports_corrupt_and_missing_shards(tmp_path):
    out = tmp_path / "ds"
    shards.create_shards(_config(out, num_shards=4), progress=False)
    data = bytearray((out / "train/train-000001.tar").read_bytes())
    data[5000] ^= 0xFF
    (out / "train/train-000001.tar").write_bytes(bytes(data))
    (out / "train/train-000002.tar").write_bytes(bytes(data[:20000]))
    os.unlink(out / "train/train-000003.tar")
    checked, problems = verify_shards(str(out), progress=False)
    assert checked == 5
    assert [p.split(":")[0] for p in problems] == [f"train/train-00000{i}.tar" for i in (1, 2, 3)]
    assert "sha256" in problems[0] and "missing" in problems[2]


def test_corrupt_images_skipped_and_recorded_or_strict(tmp_path):
    root = make_image_folder(tmp_path / "img", per_class=6)
    (root / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    (root / "dog" / "notes.txt").write_text("hello")
    manifest, summary = shards.create_shards(
        _config(tmp_path / "ds", source=str(root), num_shards=2), progress=False
    )
    assert summary.skipped == 1 and manifest.skipped.count == 1
    assert "broken.jpg" in manifest.skipped.examples[0]
    assert manifest.ignored_files.examples == ["dog/notes.txt"]
    total = sum(s.num_samples for s in manifest.splits.values())
    assert total == 12
    with pytest.raises(ShardError, match="strict"):
        shards.create_shards(
            _config(tmp_path / "ds2", source=str(root), num_shards=2, strict=True), progress=False
        )
    assert not (tmp_path / "ds2" / "manifest.json").exists()


def test_output_that_is_a_file_and_bad_schemes(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(storage.StorageError, match="is a file"):
        shards.create_shards(_config(a_file), progress=False)
    for uri in ("pipe:cat > x", "s3://bucket/x", "http://example/x"):
        with pytest.raises(storage.StorageError):
            shards.create_shards(_config(uri), progress=False)


def test_fewer_samples_than_shards_message(tmp_path):
    with pytest.raises(
        ShardError, match="10 training samples cannot fill 19 shards: use --num-shards 10 or fewer"
    ):
        shards.create_shards(
            _config(tmp_path / "d", source="synthetic-cifar:20", num_shards=19), progress=False
        )
    assert not (tmp_path / "d").exists()


def test_max_side_shrinks_images(tmp_path):
    manifest, _ = shards.create_shards(
        _config(tmp_path / "d", source="synthetic-imagenet:12", num_shards=2, max_side=100), progress=False
    )
    from io import BytesIO

    from PIL import Image

    (key, fields), *_ = _samples(tmp_path / "d" / manifest.splits["train"].shards[0].path)
    assert max(Image.open(BytesIO(fields["jpg"])).size) == 100


def test_source_items_custom_source_labels_roundtrip(tmp_path):
    items = [Item(i, i % 3) for i in range(30)]
    source = Source("custom", "test", ["a", "b", "c"], items, lambda item, _: (b"P6\n1 1\n255\nabc", "ppm"))
    manifest, _ = shards.create_shards(
        _config(tmp_path / "d", source="custom", num_shards=3), source=source, progress=False
    )
    labels = Counter()
    for shard in manifest.all_shards():
        labels.update(int(f["cls"]) for _, f in _samples(tmp_path / "d" / shard.path))
    assert labels == Counter({0: 10, 1: 10, 2: 10})


def test_upsampled_corrupt_images_are_counted_once(tmp_path):
    """Each --upsample copy of a corrupt image is a missing sample, but it is one bad image."""
    root = make_image_folder(tmp_path / "img", per_class=6)
    (root / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    (root / "dog" / "broken.png").write_bytes(b"not a png")
    manifest, summary = shards.create_shards(
        _config(tmp_path / "ds", source=str(root), num_shards=3, upsample=3, val_fraction=0.0), progress=False
    )
    assert manifest.skipped.count == 2 and manifest.skipped.sample_slots == 6
    examples = manifest.skipped.examples
    assert sorted(os.path.basename(e.split(":")[0]) for e in examples) == ["broken.jpg", "broken.png"]
    assert manifest.num_samples("train") == 3 * 12
    assert (summary.skipped, summary.skipped_slots) == (2, 6)
    assert "2 skipped images (6 samples with their upsampled copies)" in summary.line()
    assert "0 skipped," in shards.CreateSummary(output=str(tmp_path)).line()


def test_train_folder_alone_still_gets_a_val_split(tmp_path):
    make_image_folder(tmp_path / "img" / "train", per_class=10)
    manifest, summary = shards.create_shards(
        _config(tmp_path / "ds", source=str(tmp_path / "img"), num_shards=2), progress=False
    )
    assert manifest.classes == ["cat", "dog"]
    assert summary.split_samples == {"train": 18, "val": 2}  # --val-fraction's default 0.1, per class


def test_test_fraction_carves_a_stratified_seeded_test_split_of_its_own():
    source = open_source("digits")
    config = _config("/unused", num_shards=4, val_fraction=0.1, test_fraction=0.2, seed=5)
    plan = plan_dataset(source, config)
    assert [s.fingerprint for s in plan_dataset(source, config).shards] == [
        s.fingerprint for s in plan.shards
    ]
    items = {split: [i for s in plan.shards_of(split) for i in s.items] for split in ("train", "val", "test")}
    assert sorted(items["train"] + items["val"] + items["test"]) == list(range(1797))  # disjoint, complete
    assert plan.split_counts == {split: len(found) for split, found in items.items()}
    assert 350 <= len(items["test"]) <= 370 and 170 <= len(items["val"]) <= 190  # both shares of every item
    assert all(30 <= n <= 42 for n in Counter(source.items[i].label for i in items["test"]).values())
    other = plan_dataset(
        source, _config("/unused", num_shards=4, val_fraction=0.1, test_fraction=0.2, seed=6)
    )
    assert {i for s in other.shards_of("test") for i in s.items} != set(items["test"])
    # 0 (the default) draws nothing: the plan of a dataset without test is the one it always had
    before = plan_dataset(source, _config("/unused", num_shards=4, val_fraction=0.1, seed=5))
    assert "test" not in before.split_counts and not before.shards_of("test")
    unchanged = plan_dataset(
        source, _config("/unused", num_shards=4, val_fraction=0.1, test_fraction=0.0, seed=5)
    )
    assert [s.fingerprint for s in unchanged.shards] == [s.fingerprint for s in before.shards]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"test_fraction": 1.0}, r"--test-fraction must be in \[0, 1\), got 1.0"),
        ({"test_fraction": -0.1}, r"--test-fraction must be in \[0, 1\)"),
        ({"test_fraction": 0.5, "val_fraction": 0.5}, "leave no training samples: their sum must be below 1"),
    ],
)
def test_test_fraction_is_checked(kwargs, message):
    from tpustream.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        _config("/unused", **kwargs)


def test_shards_with_a_test_split_are_written_verified_and_listed_in_the_manifest(tmp_path):
    manifest, summary = shards.create_shards(
        _config(tmp_path / "ds", num_shards=2, val_fraction=0.1, test_fraction=0.1), progress=False
    )
    assert set(manifest.splits) == {"train", "val", "test"} and manifest.test_fraction == 0.1
    test = manifest.splits["test"]
    # 0.1 of each class, rounded
    assert summary.split_samples["test"] == test.num_samples == sum(test.class_counts) == 179
    assert all(shard.path.startswith("test/test-") for shard in test.shards)
    assert read_manifest(str(tmp_path / "ds"))["test_fraction"] == 0.1
    assert verify_shards(str(tmp_path / "ds"), progress=False)[1] == []
    keys = [key for shard in test.shards for key, _ in _samples(tmp_path / "ds" / shard.path)]
    assert len(set(keys)) == 179  # every test sample is in the test shards
    index = {
        split: [
            json.loads(line)["source"]
            for shard in manifest.splits[split].shards
            for line in (tmp_path / "ds" / shard.sample_index).read_text().splitlines()
        ]
        for split in ("train", "val", "test")
    }
    assert not set(index["test"]) & (set(index["train"]) | set(index["val"]))  # no source image in two splits


def test_a_manifest_written_before_the_test_split_reads_and_writes_back_unchanged(tmp_path):
    manifest, _ = shards.create_shards(_config(tmp_path / "ds", num_shards=2), progress=False)
    document = manifest.to_json()
    del document["test_fraction"]  # what every writer before the test split wrote
    from tpustream.artifacts import Manifest

    old = Manifest.from_json(json.loads(json.dumps(document)))
    assert old.test_fraction == 0.0 and old.split("test") is None and old.num_samples("test") == 0
    assert old.to_json() == document  # the key it lacked is not added back
    assert set(old.splits) == {"train", "val"}


def test_a_test_folder_is_the_test_split_and_val_is_drawn_from_train_without_a_val_folder(tmp_path, caplog):
    make_image_folder(tmp_path / "img" / "train", per_class=10)
    make_image_folder(
        tmp_path / "img" / "test", per_class=3, classes=("dog", "cat")
    )  # other pixels than train's
    with caplog.at_level("WARNING"):
        manifest, summary = shards.create_shards(
            _config(tmp_path / "ds", source=str(tmp_path / "img"), num_shards=2, test_fraction=0.3),
            progress=False,
        )
    assert summary.split_samples == {"train": 18, "val": 2, "test": 6}  # val: 0.1 of train, per class
    assert "has its own test split (6 items): --test-fraction 0.3 is not applied" in caplog.text
    sources = [
        json.loads(line)["source"]
        for shard in manifest.splits["test"].shards
        for line in (tmp_path / "ds" / shard.sample_index).read_text().splitlines()
    ]
    assert sorted(os.path.relpath(s, tmp_path / "img").split("/")[0] for s in sources) == ["test"] * 6
    # --val-fraction re-splits train and val, never the curated test set
    plan = plan_dataset(
        open_source(str(tmp_path / "img")),
        _config("/u", source=str(tmp_path / "img"), val_fraction=0.5, num_shards=1),
    )
    assert plan.split_counts == {"train": 10, "val": 10, "test": 6}
