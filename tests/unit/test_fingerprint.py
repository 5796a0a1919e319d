"""The source fingerprint: what makes scheduled retraining train on new data and only on new data."""

import os

import pytest

from tpustream.dataset.fingerprint import fingerprint, source_objects
from tpustream.dataset.plan import ShardConfig
from tpustream.errors import ConfigError
from tpustream.registry.store import record_trained
from tpustream.run.new_data import check_source
from tpustream.storage import io as storage

SETTINGS = {"model_name": "tiny", "epochs": 3}


def _folder(root, names):
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"image " + name.encode())


def _fp(source, **options):
    config = ShardConfig(source=str(source), output="unused", **options)
    return fingerprint(config, source_objects(config.source))


def test_fingerprint_changes_with_the_source_and_the_shard_parameters_only(tmp_path):
    source = tmp_path / "images"
    _folder(source, ["cat/1.png", "dog/2.png"])
    first = _fp(source)
    assert _fp(source) == first  # listing again: same answer
    assert _fp(source, seed=1) != first and _fp(source, num_shards=9) != first
    _folder(source, ["dog/3.png"])  # a new image
    added = _fp(source)
    assert added != first
    path = source / "cat" / "1.png"
    stat = os.stat(path)
    path.write_bytes(b"image cat/9.png")  # same size, new bytes
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert _fp(source) != added  # a replaced image (new mtime; on GCS a new generation)
    assert _fp("digits") == _fp("digits") != _fp("synthetic-cifar:10")


def test_check_source_trains_once_per_dataset_and_settings(tmp_path):
    source = tmp_path / "images"
    _folder(source, ["cat/1.png", "dog/2.png"])
    config = ShardConfig(source=str(source), output="unused")
    registry, datasets = str(tmp_path / "registry"), str(tmp_path / "datasets")
    first = check_source(config, datasets_root=datasets, registry=registry, settings=SETTINGS)
    assert first.train and first.dataset.startswith(datasets) and "new data" in first.reason
    storage.write_bytes(storage.join(first.dataset, "manifest.json"), b"{}")  # the shards were written
    assert check_source(
        config, datasets_root=datasets, registry=registry, settings=SETTINGS
    ).train  # not trained yet
    record_trained(first.marker, dataset=first.dataset, model="m1", decision="promoted")
    again = check_source(config, datasets_root=datasets, registry=registry, settings=SETTINGS)
    assert not again.train and again.dataset == first.dataset and "no new data since" in again.reason
    assert check_source(
        config, datasets_root=datasets, registry=registry, settings=SETTINGS, retrain=True
    ).train
    other = check_source(
        config, datasets_root=datasets, registry=registry, settings={**SETTINGS, "epochs": 9}
    )
    assert other.train and other.dataset == first.dataset  # same shards, new training settings
    _folder(source, ["cat/3.png"])
    new = check_source(config, datasets_root=datasets, registry=registry, settings=SETTINGS)
    assert new.train and new.dataset != first.dataset


def test_a_new_list_of_label_fixes_is_new_data_to_train_on(tmp_path):
    """The retrain-nothing-new gate: a run whose only change is an exclude_keys/relabel file trains (on a new
    dataset); the fingerprint holds what the files do, not their bytes, so a comment changes nothing."""
    source = tmp_path / "images"
    _folder(source, ["cat/1.png", "dog/2.png"])
    registry, datasets = str(tmp_path / "registry"), str(tmp_path / "datasets")
    plain = ShardConfig(source=str(source), output="unused")
    first = check_source(plain, datasets_root=datasets, registry=registry, settings=SETTINGS)
    storage.write_bytes(storage.join(first.dataset, "manifest.json"), b"{}")
    record_trained(first.marker, dataset=first.dataset, model="m1", decision="promoted")
    assert not check_source(plain, datasets_root=datasets, registry=registry, settings=SETTINGS).train

    drop, fix = tmp_path / "drop.txt", tmp_path / "fix.csv"
    drop.write_text("cat/1.png\n")
    fix.write_text("dog/2.png,cat\n")
    excluded = ShardConfig(source=str(source), output="unused", exclude_keys=str(drop))
    edited = check_source(excluded, datasets_root=datasets, registry=registry, settings=SETTINGS)
    assert edited.train and edited.dataset != first.dataset and "new data" in edited.reason
    relabelled = ShardConfig(source=str(source), output="unused", relabel=str(fix))
    both = ShardConfig(source=str(source), output="unused", exclude_keys=str(drop), relabel=str(fix))
    fingerprints = {_fp(source), _fp(source, exclude_keys=str(drop)), _fp(source, relabel=str(fix))}
    assert len(fingerprints | {_fp(source, exclude_keys=str(drop), relabel=str(fix))}) == 4
    assert check_source(relabelled, datasets_root=datasets, registry=registry, settings=SETTINGS).train
    assert check_source(both, datasets_root=datasets, registry=registry, settings=SETTINGS).train

    before = _fp(source, exclude_keys=str(drop))
    drop.write_text("# checked by hand\n\n cat/1.png \n")  # the same edit, written otherwise
    assert _fp(source, exclude_keys=str(drop)) == before
    drop.write_text("# nothing to drop after all\n")
    assert _fp(source, exclude_keys=str(drop)) == first.fingerprint  # no edit: the dataset as it was


def test_a_missing_or_malformed_label_fixes_file_fails_the_check_naming_the_parameter(tmp_path):
    source = tmp_path / "images"
    _folder(source, ["cat/1.png"])
    with pytest.raises(ConfigError, match=r"exclude_keys .*none\.txt does not exist"):
        _fp(source, exclude_keys=str(tmp_path / "none.txt"))
    (tmp_path / "fix.csv").write_text("cat/1.png\n")
    with pytest.raises(ConfigError, match=r"relabel .*fix\.csv:1: 'cat/1.png' is not a CSV row key,class"):
        _fp(source, relabel=str(tmp_path / "fix.csv"))


@pytest.mark.integration
def test_gcs_source_fingerprint_sees_a_reupload(gcs_bucket):
    root = f"{gcs_bucket}/images"
    storage.write_bytes(f"{root}/cat/1.png", b"one")
    storage.write_bytes(f"{root}/dog/2.png", b"two")
    first = _fp(root)
    assert _fp(root) == first
    storage.write_bytes(f"{root}/dog/2.png", b"owt")  # same name and size, new generation
    assert _fp(root) != first
    archive = f"{gcs_bucket}/raw/cifar-10-python.tar.gz"
    storage.write_bytes(archive, b"x")
    assert [o.uri for o in source_objects(f"cifar10:{archive}")] == [archive]
