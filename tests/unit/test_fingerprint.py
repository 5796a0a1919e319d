"""The source fingerprint: what makes scheduled retraining train on new data and only on new data."""

import os

import pytest

from tpustream.dataset.fingerprint import fingerprint, source_objects
from tpustream.dataset.plan import ShardConfig
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
