"""Shard creation straight to the GCS test server: create, verify, resume, faults, bad buckets."""

import json

import pytest

from tests.common.shards import crashing_source as _crashing
from tests.common.sources import make_image_folder
from tpustream.dataset import finalize
from tpustream.dataset import write as shards
from tpustream.dataset.manifest import ShardError, verify_shards
from tpustream.dataset.plan import ShardConfig
from tpustream.dataset.tario import iter_tar_samples
from tpustream.sources.dispatch import open_source
from tpustream.storage import io as storage

pytestmark = pytest.mark.integration


def _config(output, **kw):
    kw.setdefault("source", "digits")
    return ShardConfig(output=output, **kw)


def test_create_on_gcs_matches_local_byte_for_byte(gcs_bucket, tmp_path):
    out = f"{gcs_bucket}/datasets/digits"
    manifest, summary = shards.create_shards(_config(out, num_shards=4, workers=2), progress=False)
    local, _ = shards.create_shards(_config(str(tmp_path / "d"), num_shards=4), progress=False)
    assert manifest.splits == local.splits
    names = [o.uri[len(out) + 1 :] for o in storage.list_objects(out)]
    assert names == [
        *(f"index/train-{i:06d}.jsonl" for i in range(4)),
        "index/val-000000.jsonl",
        "manifest.json",
        *(f"train/train-{i:06d}.tar" for i in range(4)),
        "val/val-000000.tar",
    ]
    assert verify_shards(out, progress=False) == (5, [])
    with storage.open_read(f"{out}/train/train-000000.tar") as f:
        assert sum(1 for _ in iter_tar_samples(f)) == manifest.splits["train"].shards[0].num_samples


def test_resume_on_gcs_after_crash(gcs_bucket):
    out = f"{gcs_bucket}/ds"
    config = _config(out, num_shards=6)
    with pytest.raises(RuntimeError, match="power cut"):
        shards.create_shards(config, progress=False, source=_crashing(open_source("digits"), after=900))
    assert not storage.exists(f"{out}/manifest.json")
    written = [o for o in storage.list_objects(f"{out}/train")]
    assert 0 < len(written) < 6
    manifest, summary = shards.create_shards(config, progress=False)
    assert summary.reused_shards == len(written)
    assert storage.list_objects(f"{out}/_records") == []
    assert verify_shards(out, progress=False)[1] == []
    assert json.loads(storage.read_bytes(f"{out}/manifest.json")) == manifest.to_json()


def test_image_folder_on_gcs_as_source(gcs_bucket, tmp_path):
    root = make_image_folder(tmp_path / "img", per_class=5)
    for path in sorted(root.rglob("*.jpg")):
        storage.upload_file(str(path), f"{gcs_bucket}/src/{path.relative_to(root)}")
    storage.write_bytes(f"{gcs_bucket}/src/cat/bad.png", b"not a png")
    manifest, summary = shards.create_shards(
        _config(f"{gcs_bucket}/out", source=f"{gcs_bucket}/src", num_shards=2), progress=False
    )
    assert manifest.classes == ["cat", "dog"] and summary.skipped == 1
    assert "gs://" in manifest.skipped.examples[0] and "bad.png" in manifest.skipped.examples[0]
    assert sum(s.num_samples for s in manifest.splits.values()) == 10


def test_missing_bucket_and_existing_dataset(gcs_bucket):
    with pytest.raises(storage.NotFound, match="bucket gs://nope does not exist"):
        shards.create_shards(_config("gs://nope/ds"), progress=False)
    shards.create_shards(_config(f"{gcs_bucket}/ds", num_shards=2), progress=False)
    with pytest.raises(ShardError, match="--overwrite"):
        shards.create_shards(_config(f"{gcs_bucket}/ds", num_shards=2), progress=False)
    # --overwrite on GCS: written under _replacement/, then copied into place with the manifest last
    manifest, _ = shards.create_shards(
        _config(f"{gcs_bucket}/ds", num_shards=3, overwrite=True), progress=False
    )
    assert len(manifest.splits["train"].shards) == 3
    assert verify_shards(f"{gcs_bucket}/ds", progress=False) == (4, [])
    assert not storage.list_objects(f"{gcs_bucket}/ds/{finalize.REPLACEMENT_DIR}")


def test_create_and_verify_through_five_percent_faults(gcs_bucket, fault_proxy, tmp_path, monkeypatch):
    out = f"{gcs_bucket}/faulty"
    manifest, _ = shards.create_shards(_config(out, num_shards=8, workers=2), progress=False)
    assert verify_shards(out, progress=False) == (9, [])
    assert fault_proxy.faults > 0
    clean, _ = shards.create_shards(_config(str(tmp_path / "clean"), num_shards=8), progress=False)
    assert manifest.splits == clean.splits  # nothing lost or duplicated


def test_stock_webdataset_reads_upsampled_digits_from_gcs(gcs_bucket):
    """digits x10 into 16 train shards on the GCS server, decoded by stock webdataset's own tar
    expander, grouping and .decode("pil").to_tuple(...): counts and labels match the manifest.
    (Shards are opened with our in-process reader: webdataset's gs:// runs gsutil, see
    docs/ARCHITECTURE.md.)"""
    from collections import Counter

    import webdataset as wds
    from webdataset.tariterators import group_by_keys, tar_file_expander

    out = f"{gcs_bucket}/digits-x10"
    manifest, _ = shards.create_shards(_config(out, num_shards=16, upsample=10, workers=2), progress=False)
    train = manifest.splits["train"]
    assert len(train.shards) == 16 and train.num_samples == 10 * (1797 - manifest.num_samples("val"))

    def open_in_process(sources):
        for source in sources:
            yield {**source, "stream": storage.open_read(source["url"])}

    for shard in train.shards:
        pipeline = wds.DataPipeline(
            wds.SimpleShardList([f"{out}/{shard.path}"]), open_in_process, tar_file_expander, group_by_keys,
            wds.decode("pil"), wds.to_tuple("ppm;jpg;jpeg;png", "cls"),
        )  # fmt: skip
        samples = list(pipeline)
        assert len(samples) == shard.num_samples
        assert all(image.size == (8, 8) for image, _ in samples)
    labels = Counter()
    for shard in train.shards:
        with storage.open_read(f"{out}/{shard.path}") as f:
            labels.update(int(fields["cls"]) for _, fields in iter_tar_samples(f))
    assert [labels[c] for c in range(10)] == train.class_counts


def test_same_seed_gives_byte_identical_shards(gcs_bucket, tmp_path):
    a, _ = shards.create_shards(_config(str(tmp_path / "a"), num_shards=5, seed=11), progress=False)
    b, _ = shards.create_shards(_config(f"{gcs_bucket}/b", num_shards=5, seed=11, workers=2), progress=False)
    for split in ("train", "val"):
        for sa, sb in zip(a.splits[split].shards, b.splits[split].shards, strict=True):
            assert (tmp_path / "a" / sa.path).read_bytes() == storage.read_bytes(f"{gcs_bucket}/b/{sb.path}")


def test_killed_writer_rerun_completes(gcs_bucket):
    """A real `tpustream shards create` process SIGKILLed midway, then run again."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = f"{gcs_bucket}/killed"
    cmd = [sys.executable, "-m", "tpustream.cli", "shards", "create", "--source", "synthetic-imagenet:400",
           "--output", out, "--num-shards", "16", "--workers", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(storage.list_objects(f"{out}/train")) < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not storage.exists(f"{out}/manifest.json")
    done = len(storage.list_objects(f"{out}/train"))
    assert 3 <= done < 16
    result = subprocess.run(cmd, env=os.environ.copy(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    import re

    kept = int(re.search(r"(\d+) shards kept from an earlier run", result.stdout).group(1))
    # a shard uploaded in the instant before the kill, whose record was not yet written, is rewritten
    assert done - 1 <= kept <= done and kept >= 2
    assert verify_shards(out, progress=False) == (18, [])


def test_resume_on_gcs_removes_partial_objects(gcs_bucket):
    out = f"{gcs_bucket}/partials"
    config = _config(out, num_shards=6)
    with pytest.raises(RuntimeError, match="power cut"):
        shards.create_shards(config, progress=False, source=_crashing(open_source("digits"), after=700))
    leftover = f"{out}/train/.train-000004.tar.k1ll3d.partial"
    storage.write_bytes(leftover, b"half a shard")
    shards.create_shards(config, progress=False)
    assert not storage.exists(leftover)
    assert verify_shards(out, progress=False) == (7, [])


def test_partial_cifar10_copy_on_gcs_is_an_error(gcs_bucket, tmp_path):
    from tests.common.sources import CIFAR_BATCHES
    from tests.common.sources import write_cifar as _write_cifar
    from tpustream.sources.types import SourceError

    _write_cifar(tmp_path / "cifar", batches=CIFAR_BATCHES[:5])
    for path in sorted((tmp_path / "cifar").iterdir()):
        storage.upload_file(str(path), f"{gcs_bucket}/cifar/{path.name}")
    with pytest.raises(SourceError, match="missing test_batch"):
        open_source(f"cifar10:{gcs_bucket}/cifar")
