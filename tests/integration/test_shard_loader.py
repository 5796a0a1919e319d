"""The streaming loader on real shards: local disk, the GCS test server, injected faults, bad shards."""

from collections import Counter

import numpy as np
import pytest
import torch

from tpustream.dataset import write as shards
from tpustream.dataset.manifest import read_manifest
from tpustream.dataset.plan import ShardConfig
from tpustream.image.codec import encode_ppm
from tpustream.loader.epoch_plan import LoaderError
from tpustream.loader.shard_loader import LoaderConfig, ShardLoader
from tpustream.sources.types import Item, Source
from tpustream.storage import io as storage

pytestmark = pytest.mark.integration


def _id_source(count, classes=4):
    """Each image is one uniform colour encoding its index: crops, resizes and flips keep it."""

    def load(item, _max_side):
        i = int(item.ref)
        return encode_ppm(np.full((6, 6, 3), (i % 256, i // 256, 7), np.uint8)), "ppm"

    items = [Item(i, i % classes) for i in range(count)]
    return Source("ids", "identity test source", [f"c{k}" for k in range(classes)], items, load)


def _ids(batch):
    image = batch["image"].numpy()
    ids = image[:, 0, 0, 0].astype(int) + 256 * image[:, 1, 0, 0].astype(int)
    return ids[batch["mask"].numpy()]


def make_id_dataset(output, count=400, num_shards=8, val_shards=3, val_fraction=0.25):
    config = ShardConfig(
        source="ids", output=output, num_shards=num_shards, val_shards=val_shards, val_fraction=val_fraction
    )
    manifest, _ = shards.create_shards(config, progress=False, source=_id_source(count))
    return manifest


def _split_ids(manifest, dataset, split):
    from tpustream.dataset.tario import iter_tar_samples
    from tpustream.image.codec import decode_ppm

    ids = []
    for shard in manifest.splits[split].shards:
        with storage.open_read(storage.join(dataset, shard.path)) as f:
            for _, fields in iter_tar_samples(f):
                pixel = decode_ppm(fields["ppm"])[0, 0]
                ids.append(int(pixel[0]) + 256 * int(pixel[1]))
    return ids


def _epoch(dataset, split, replicas, rank, workers, batch, epoch=0, **kw):
    loader = ShardLoader(LoaderConfig(data=dataset, split=split, batch_size=batch, input_size=4,
                                      num_replicas=replicas, replica_index=rank, workers=workers, **kw))  # fmt: skip
    batches = list(loader.epoch(epoch))
    return loader, batches


@pytest.mark.parametrize("replicas, workers, batch", [(1, 0, 16), (2, 2, 8), (4, 2, 5), (3, 1, 12)])
def test_equal_full_batches_and_exact_val_coverage(tmp_path, replicas, workers, batch):
    dataset = str(tmp_path / "ds")
    manifest = make_id_dataset(dataset)
    train_ids = set(_split_ids(manifest, dataset, "train"))
    steps = set()
    for rank in range(replicas):
        loader, batches = _epoch(dataset, "train", replicas, rank, workers, batch)
        steps.add(len(batches))
        assert len(batches) == loader.steps_per_epoch == -(-300 // (batch * replicas))  # the last padded
        assert all(tuple(b["image"].shape) == (batch, 3, 4, 4) for b in batches)
        assert all(bool(b["mask"].all()) for b in batches[:-1])  # padding in the last batch alone
        delivered = Counter(i for b in batches for i in _ids(b))
        assert set(delivered) <= train_ids
        report = loader.last_report
        assert (
            sum(delivered.values())
            == report.samples + report.repeated
            == len(batches) * batch - report.padded
        )
        assert (
            sum(n - 1 for n in delivered.values()) <= report.repeated
        )  # duplicates only as reported repeats
    assert len(steps) == 1
    val_ids = _split_ids(manifest, dataset, "val")
    seen = []
    val_steps = set()
    for rank in range(replicas):
        loader, batches = _epoch(dataset, "val", replicas, rank, workers, batch)
        val_steps.add(len(batches))
        assert all(tuple(b["image"].shape) == (batch, 3, 4, 4) for b in batches)
        seen += [i for b in batches for i in _ids(b)]
        labels = [int(lbl) for b in batches for lbl, m in zip(b["label"], b["mask"], strict=False) if m]
        assert labels == [i % 4 for b in batches for i in _ids(b)]
    assert len(val_steps) == 1
    assert sorted(seen) == sorted(val_ids)  # every val sample exactly once across replicas


def make_uneven_id_dataset(output, sizes, classes=4):
    """An id dataset whose train shards hold ``sizes`` samples each (a prefix of equal shards', rewritten)."""
    import json

    from tpustream.artifacts import Manifest
    from tpustream.dataset.tar_writer import TarShardWriter
    from tpustream.dataset.tario import iter_tar_samples

    count = 4 * len(sizes) * max(sizes) // 3 + 8
    manifest = make_id_dataset(output, count=count, num_shards=len(sizes), val_shards=2)
    document = manifest.to_json()
    train = document["splits"]["train"]
    class_counts = [0] * classes
    for shard, size in zip(train["shards"], sizes, strict=True):
        path = f"{output}/{shard['path']}"
        with open(path, "rb") as f:
            samples = [sample for _, sample in zip(range(size), iter_tar_samples(f), strict=False)]
        assert len(samples) == size
        with open(path, "wb") as f, TarShardWriter(f) as writer:
            for key, fields in samples:
                writer.write(key, fields)
                class_counts[int(fields["cls"])] += 1
        stats = writer.finish()
        shard.update(num_samples=size, num_bytes=stats.num_bytes, sha256=stats.sha256, sample_index="",
                     sample_index_sha256="")  # fmt: skip
    train.update(num_samples=sum(sizes), num_bytes=sum(s["num_bytes"] for s in train["shards"]),
                 class_counts=class_counts)  # fmt: skip
    train.pop("stats", None)  # the image statistics describe the equal shards
    with open(f"{output}/manifest.json", "w") as f:
        json.dump(document, f)
    return Manifest.from_json(json.loads(json.dumps(document)))


def _all_ids(batch):
    """The id of every slot of a batch, padding included (a padding slot copies a real sample's image)."""
    image = batch["image"].numpy()
    return (image[:, 0, 0, 0].astype(int) + 256 * image[:, 1, 0, 0].astype(int)).tolist()


@pytest.mark.parametrize(
    "sizes, replicas, workers, batch, seed",
    [
        ([3, 40, 17, 8, 29, 5, 36], 2, 2, 16, 0),  # issue 37: ~10% of the data skipped or repeated before
        ([3, 40, 17, 8, 29, 5, 36], 2, 2, 7, 1),
        ([3, 40, 17, 8, 29, 5, 36], 2, 3, 4, 2),
        ([3, 40, 17, 8, 29, 5, 36], 1, 2, 10, 3),
        ([40, 3, 3, 21, 9], 2, 0, 5, 4),
        ([10] * 8, 1, 2, 32, 5),  # issue 46: 80 images at batch 32, 3 steps (not 2)
        ([10] * 8, 4, 1, 8, 6),  # 4 replicas of 8: 4 padding slots each
    ],
)
def test_every_train_sample_once_per_epoch_on_small_uneven_shards(
    tmp_path, sizes, replicas, workers, batch, seed
):
    """Issues 37 and 46: across replicas every train key is delivered exactly once per epoch, the remainder
    under one global batch included; every replica gets the same number of batches of one shape; each
    replica's last batch is padded (mask False) with copies of that batch's own samples, labels included,
    so its BatchNorm statistics see real images alone; nothing is repeated; the line says so."""
    dataset = str(tmp_path / "ds")
    manifest = make_uneven_id_dataset(dataset, sizes)
    train_ids = _split_ids(manifest, dataset, "train")
    assert sorted(train_ids) == sorted(set(train_ids)) and len(train_ids) == sum(sizes)
    assert sum(sizes) % (batch * replicas) >= replicas  # every case here pads
    for epoch in range(2):
        delivered, steps, padded = [], set(), 0
        for rank in range(replicas):
            loader, batches = _epoch(dataset, "train", replicas, rank, workers, batch, epoch=epoch, seed=seed)
            steps.add(len(batches))
            assert all(tuple(b["image"].shape) == (batch, 3, 4, 4) for b in batches)
            assert all(bool(b["mask"].all()) for b in batches[:-1])  # the padding: in the last batch alone
            last = batches[-1]
            real = int(last["mask"].sum())
            assert real >= 1
            ids, labels = _all_ids(last), last["label"].tolist()
            for slot in range(real, batch):  # padding: the batch's own samples again, in turn
                assert ids[slot] == ids[(slot - real) % real] and labels[slot] == labels[(slot - real) % real]
                assert torch.equal(last["image"][slot], last["image"][(slot - real) % real])
            delivered += [i for b in batches for i in _ids(b)]
            report = loader.last_report
            assert report.repeated == 0 and report.left_out == 0
            assert (
                report.samples == len(batches) * batch - report.padded == sum(len(_ids(b)) for b in batches)
            )
            assert f"{report.samples} samples seen, 0 repeated, {report.padded} padding" in report.line()
            assert loader.epoch_size.code == "padded"
            padded += report.padded
        (num_steps,) = steps
        assert num_steps == -(-sum(sizes) // (batch * replicas))  # ceil: the same on every replica
        assert sorted(delivered) == sorted(train_ids)  # every key exactly once
        assert padded == loader.epoch_size.padding == num_steps * batch * replicas - sum(sizes)


def test_unpadded_epochs_leave_the_remainder_out_and_count_it(tmp_path):
    """``pad_last_batch`` off (issue 37's epochs): full batches only, the remainder under one global batch
    left out and counted."""
    sizes = [3, 40, 17, 8, 29, 5, 36]
    dataset = str(tmp_path / "ds")
    make_uneven_id_dataset(dataset, sizes)
    delivered, left_out = [], 0
    for rank in range(2):
        loader, batches = _epoch(dataset, "train", 2, rank, 2, 16, pad_last_batch=False)
        assert len(batches) == sum(sizes) // 32 and all(bool(b["mask"].all()) for b in batches)
        delivered += [i for b in batches for i in _ids(b)]
        left_out += loader.last_report.left_out
        assert loader.epoch_size.code == "not-padded"
    assert len(delivered) == len(set(delivered)) == sum(sizes) - left_out and left_out == sum(sizes) % 32


def test_an_epoch_resumed_on_uneven_shards_is_the_uninterrupted_tail(tmp_path):
    """The plan's shared shards (a worker reading another's tail) keep resume exact on every replica, the
    padded last batch included (its padding too)."""
    dataset = str(tmp_path / "ds")
    make_uneven_id_dataset(dataset, [3, 40, 17, 8, 29, 5, 36])

    def _ids(batch):  # every slot, and which are real
        return _all_ids(batch), batch["mask"].tolist()

    for rank in range(2):
        full = [_ids(b) for b in _epoch(dataset, "train", 2, rank, 2, 5, epoch=1)[1]]
        assert not all(full[-1][1])  # 138 samples in 14 steps of 2 x 5: the last batch is padded
        for start in (1, len(full) // 2, len(full) - 1):
            config = LoaderConfig(data=dataset, batch_size=5, input_size=4, num_replicas=2, replica_index=rank,
                                  workers=2)  # fmt: skip
            with ShardLoader(config) as loader:
                assert [_ids(b) for b in loader.epoch(1, start_batch=start)] == full[start:]


def test_deterministic_and_reshuffled_per_epoch(tmp_path):
    dataset = str(tmp_path / "ds")
    make_id_dataset(dataset)
    first = [_ids(b).tolist() for b in _epoch(dataset, "train", 2, 1, 2, 8, epoch=1)[1]]
    again = [_ids(b).tolist() for b in _epoch(dataset, "train", 2, 1, 2, 8, epoch=1)[1]]
    other = [_ids(b).tolist() for b in _epoch(dataset, "train", 2, 1, 2, 8, epoch=2)[1]]
    assert first == again
    assert first != other


def test_truncated_and_garbage_shards_keep_step_counts(tmp_path):
    dataset = tmp_path / "ds"
    manifest = make_id_dataset(str(dataset))
    clean_steps = [len(_epoch(str(dataset), "train", 2, r, 2, 8)[1]) for r in range(2)]
    train_shards = manifest.splits["train"].shards
    truncated = dataset / train_shards[2].path
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    (dataset / train_shards[5].path).write_bytes(b"garbage" * 1000)
    reports = []
    for rank in range(2):
        loader, batches = _epoch(str(dataset), "train", 2, rank, 2, 8)
        assert len(batches) == clean_steps[rank]
        report = loader.last_report
        assert sum(int(b["mask"].sum()) for b in batches) == report.samples + report.repeated
        reports.append(report)
    problems = [p for r in reports for p in r.problems]
    # a bad shard whose tail another worker reads (the plan deals every sample, the remainder too) is
    # reported by each reader: the shards named are the two broken ones
    assert sum(r.bad_shards for r in reports) >= 2
    assert {p.split(":")[0] for p in problems} == {train_shards[2].path, train_shards[5].path}
    assert any(train_shards[2].path in p for p in problems) and any(
        train_shards[5].path in p for p in problems
    )
    assert sum(r.repeated for r in reports) > 0  # the short replica filled its quota by repeating
    val_shard = dataset / manifest.splits["val"].shards[0].path
    lost = manifest.splits["val"].shards[0].num_samples
    val_shard.write_bytes(b"\0" * 100)
    loader, batches = _epoch(str(dataset), "val", 1, 0, 2, 8)
    assert len(batches) == loader.steps_per_epoch
    assert sum(int(b["mask"].sum()) for b in batches) == manifest.num_samples("val") - lost
    assert loader.last_report.bad_shards == 1


def test_undecodable_samples_are_skipped_and_counted(tmp_path, monkeypatch):
    import functools

    from tpustream.dataset import shard_writer
    from tpustream.dataset import write as dataset_write

    source = _id_source(120)
    good = source.loader
    source.loader = lambda item, m: (
        (b"P6\n6 6\n255\nshort", "ppm") if int(item.ref) % 10 == 0 else good(item, m)
    )
    # The writer's perceptual hash decodes every image and so skips these truncated PPMs itself; to give the
    # loader shards that hold them (a writer before the hash, or another tool's shards), write without it.
    monkeypatch.setattr(
        dataset_write, "write_shard", functools.partial(shard_writer.write_shard, perceptual_hashes=False)
    )
    shards.create_shards(ShardConfig(source="ids", output=str(tmp_path / "d"), num_shards=4, val_fraction=0.25),
                         progress=False, source=source)  # fmt: skip
    loader, batches = _epoch(str(tmp_path / "d"), "val", 1, 0, 0, 8)
    val_ids = _split_ids_raw(tmp_path / "d")
    broken = [i for i in val_ids if i is None]
    assert loader.last_report.undecodable == len(broken) > 0
    delivered = sorted(i for b in batches for i in _ids(b))
    assert delivered == sorted(i for i in val_ids if i is not None)


def _split_ids_raw(dataset):
    """Val ids of a dataset whose broken samples decode to None."""
    from tpustream.dataset.tario import iter_tar_samples
    from tpustream.image.codec import decode_ppm

    manifest = read_manifest(str(dataset))
    ids = []
    for shard in manifest["splits"]["val"]["shards"]:
        with open(dataset / shard["path"], "rb") as f:
            for _, fields in iter_tar_samples(f):
                try:
                    pixel = decode_ppm(fields["ppm"])[0, 0]
                    ids.append(int(pixel[0]) + 256 * int(pixel[1]))
                except ValueError:
                    ids.append(None)
    return ids


def test_fewer_shards_than_hosts_is_a_clear_error(tmp_path):
    make_id_dataset(str(tmp_path / "ds"), num_shards=4, val_shards=1)
    with pytest.raises(
        LoaderError, match=r"4 shards but 8 replicas \(hosts\) each need one.*--num-shards 32"
    ):
        ShardLoader(
            LoaderConfig(data=str(tmp_path / "ds"), batch_size=4, num_replicas=8, replica_index=0, workers=4)
        )


def test_gcs_with_five_percent_faults_loses_and_duplicates_nothing(gcs_bucket, fault_proxy, monkeypatch):
    dataset = f"{gcs_bucket}/ids"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fault_proxy.upstream.geturl())  # write cleanly
    manifest = make_id_dataset(dataset, count=480, num_shards=8, val_shards=4, val_fraction=1 / 6)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fault_proxy.url)  # read through the faults
    train_ids = _split_ids(manifest, dataset, "train")
    delivered = []
    for rank in range(2):  # 400 train samples, 8 equal shards, 2 x 2 readers: no repeats needed
        loader, batches = _epoch(dataset, "train", 2, rank, 2, 10)
        assert len(batches) == 20 and loader.last_report.bad_shards == 0
        delivered += [i for b in batches for i in _ids(b)]
    assert sorted(delivered) == sorted(train_ids)
    seen = []
    for rank in range(2):
        loader, batches = _epoch(dataset, "val", 2, rank, 2, 10)
        seen += [i for b in batches for i in _ids(b)]
    assert sorted(seen) == sorted(_split_ids(manifest, dataset, "val"))
    assert fault_proxy.faults > 0
    # the shard bodies themselves were faulted (the proxy rewrites the server's mediaLink to itself)
    assert fault_proxy.media_requests >= 16 and fault_proxy.media_faults > 0


@pytest.mark.parametrize(("source", "workers", "num_shards"), [("synthetic-cifar:600", 0, 8), ("synthetic-cifar:600", 2, 8),
                                                     ("synthetic-cifar:600", 3, 8), ("synthetic-imagenet:96", 2, 8)])  # fmt: skip
def test_resumed_epoch_equals_the_uninterrupted_tail_and_decodes_nothing_skipped(
    tmp_path, source, workers, num_shards
):
    """Issue 12 (instant resume): epoch(e, start_batch=k) yields exactly batches k.. of the uninterrupted
    epoch (same samples, same random crops and flips), and the report shows the first k batches were
    skipped without decoding. 3 workers over 8 shards: unequal batch counts per worker."""
    import torch

    from tpustream.dataset.plan import ShardConfig
    from tpustream.dataset.write import create_shards

    dataset = str(tmp_path / "ds")
    create_shards(ShardConfig(source=source, output=dataset, num_shards=num_shards), progress=False)
    size = 32 if source.startswith("synthetic-cifar") else 64
    config = LoaderConfig(
        data=dataset, batch_size=8, input_size=size, workers=workers, num_replicas=1, replica_index=0
    )
    loader = ShardLoader(config)
    full = list(loader.epoch(1))
    steps = loader.steps_per_epoch
    assert len(full) == steps >= 6
    decoded_full = loader.last_report.samples + loader.last_report.repeated
    for start in (1, steps // 2, steps - 1):
        resumed = list(ShardLoader(config).epoch(1, start_batch=start))
        assert len(resumed) == steps - start
        for mine, theirs in zip(resumed, full[start:], strict=True):
            assert torch.equal(mine["image"], theirs["image"]) and torch.equal(mine["label"], theirs["label"])
    report = ShardLoader(config)
    list(report.epoch(1, start_batch=steps // 2))
    assert report.last_report.skipped_on_resume == (steps // 2) * 8  # drawn for from headers, not decoded
    assert report.last_report.samples + report.last_report.repeated == decoded_full - (steps // 2) * 8
    assert "skipped on resume (not decoded)" in report.last_report.line()


@pytest.mark.parametrize("workers", [0, 2])
def test_every_batch_is_the_batch_epoch_declares(tmp_path, workers):
    """``ShardLoader.epoch()`` is declared ``Iterator[Batch]``: from the shared ring (workers) and without
    workers, train and val, each batch has exactly ``Batch``'s required keys with their dtypes and shapes;
    ``key``, its one optional key, only when evaluation asks for it (``sample_keys``)."""
    from tpustream.loader.batch import BATCH_KEYS, Batch

    dataset = str(tmp_path / "ds")
    make_id_dataset(dataset)
    assert set(BATCH_KEYS) == Batch.__required_keys__ and Batch.__optional_keys__ == {"key"}
    dtypes = {"image": "torch.uint8", "label": "torch.int64", "mask": "torch.bool"}
    for split, options in (("train", {}), ("val", {}), ("val", {"sample_keys": True})):
        _, batches = _epoch(dataset, split, 1, 0, workers, 8, **options)
        expected = set(Batch.__required_keys__) | ({"key"} if options else set())
        assert batches and all(set(batch) == expected for batch in batches)
        for batch in batches:
            assert {key: str(batch[key].dtype) for key in BATCH_KEYS} == dtypes
            assert tuple(batch["image"].shape) == (8, 3, 4, 4)
            assert batch["label"].shape == batch["mask"].shape == (8,)
            if options:
                assert len(batch["key"]) == 8 and [bool(k) for k in batch["key"]] == batch["mask"].tolist()


def test_abandoned_and_overlapping_epochs(tmp_path):
    """Workers render into a small reused ring of shared slots: batches the caller keeps are copies,
    leaving epochs part-way does not stall the next ones, and two open epochs do not share slots."""
    import itertools
    import time

    dataset = str(tmp_path / "ds")
    make_id_dataset(dataset)
    loader = ShardLoader(LoaderConfig(data=dataset, batch_size=4, input_size=4, num_replicas=1, replica_index=0,
                                      workers=2, prefetch_factor=1))  # fmt: skip
    kept = list(loader.epoch(1))  # 75 batches through 2 slots per worker
    assert {k: str(v.dtype) for k, v in kept[0].items()} == {
        "image": "torch.uint8", "label": "torch.int64", "mask": "torch.bool"
    }  # fmt: skip
    reference = [_ids(b).tolist() for b in kept]
    started = time.perf_counter()
    for _ in range(3):
        stream = loader.epoch(0)
        next(stream)
        time.sleep(0.3)  # the workers fill their slots and wait
        stream.close()
    first, second = loader.epoch(1), loader.epoch(1)
    head = [_ids(b).tolist() for b in itertools.islice(first, 5)]
    both = [_ids(b).tolist() for b in second]
    head += [_ids(b).tolist() for b in first]
    assert head == both == reference
    assert time.perf_counter() - started < 15.0  # a worker left waiting would cost 5 s each (torch kills it)


def test_workers_live_across_epochs_and_shut_down_with_the_loader(tmp_path):
    """Issue 13: a loader's worker processes serve every epoch (no fork and start-up per epoch), each new
    epoch (or resumed epoch) read off the shared ring gives exactly a fresh loader's batches, and the
    workers end with the loader: at close(), or as soon as it is dropped."""
    import multiprocessing
    import time

    dataset = str(tmp_path / "ds")
    make_id_dataset(dataset)
    config = LoaderConfig(
        data=dataset, batch_size=8, input_size=4, num_replicas=1, replica_index=0, workers=2
    )

    def fresh(epoch, start=0):
        with ShardLoader(config) as loader:
            return [_ids(b).tolist() for b in loader.epoch(epoch, start_batch=start)]

    before = set(multiprocessing.active_children())
    loader = ShardLoader(config)
    pids = []
    epochs = []
    for epoch in range(3):
        batches = []
        for batch in loader.epoch(epoch):
            if not batches:
                pids.append({p.pid for p in set(multiprocessing.active_children()) - before})
            batches.append(_ids(batch).tolist())
        epochs.append(batches)
    assert len(pids[0]) == 2 and pids[0] == pids[1] == pids[2]  # the same two workers every epoch
    assert epochs == [fresh(epoch) for epoch in range(3)]
    assert epochs[1] != epochs[2]  # and each epoch is its own shuffle

    left = loader.epoch(3)
    next(left), next(left)
    left.close()  # abandoned part-way; then the same workers resume that epoch at batch 4
    assert [_ids(b).tolist() for b in loader.epoch(3, start_batch=4)] == fresh(3, start=4)

    started = time.perf_counter()
    loader.close()
    assert not set(multiprocessing.active_children()) - before
    dropped = ShardLoader(config)
    next(dropped.epoch(0))
    assert len(set(multiprocessing.active_children()) - before) == 2
    del dropped  # no reference cycle: the workers go at once, not at a later garbage collection
    assert not set(multiprocessing.active_children()) - before
    assert time.perf_counter() - started < 4.0  # no worker left to torch's 5 s join timeout

    assert [_ids(b).tolist() for b in loader.epoch(1)] == epochs[1]  # a closed loader starts workers anew
    started = time.perf_counter()
    loader.close()  # and closes them again
    assert not set(multiprocessing.active_children()) - before
    assert time.perf_counter() - started < 4.0


def test_more_loader_workers_than_shards_leave_the_extra_workers_idle(tmp_path, caplog):
    """A slice's defaults can ask for more readers than the dataset has shards: the workers without a shard
    idle (said in the log), the others deliver every step, and no sample is read twice in an epoch."""
    dataset = str(tmp_path / "ds")
    manifest = make_id_dataset(dataset, count=400, num_shards=3)
    config = LoaderConfig(
        data=dataset, batch_size=16, input_size=8, workers=4, num_replicas=1, replica_index=0
    )
    loader = ShardLoader(config)
    try:
        batches = list(loader.epoch(0))
    finally:
        loader.close()
    assert "1 of this replica's workers have no shard and stay idle" in caplog.text
    assert "--num-shards 4" in caplog.text
    assert len(batches) == loader.steps_per_epoch == -(-manifest.num_samples("train") // 16)
    ids = np.concatenate([_ids(b) for b in batches])
    assert len(ids) == len(set(ids.tolist())) == manifest.num_samples("train")  # the last batch padded


@pytest.fixture(scope="module")
def digits_shards(tmp_path_factory):
    dataset = str(tmp_path_factory.mktemp("digits") / "ds")
    shards.create_shards(ShardConfig(source="digits", output=dataset, num_shards=4), progress=False)
    return dataset


@pytest.mark.parametrize("policy, erasing", [("trivial", 0.0), ("randaugment", 0.0), ("none", 1.0)])
def test_augmentation_policies_run_in_the_workers_seeded_and_resumable(digits_shards, policy, erasing):
    """Issue 46: a torchvision.transforms.v2 policy (and RandomErasing) after the crop and flip, in the
    worker processes: the same shapes, dtype, samples and labels as without it, other pixels; the same pixels
    again under the same seed, other ones under another, and a resumed epoch's batches the uninterrupted ones."""
    import torch

    dataset = digits_shards

    def epoch(start=0, **kw):
        config = LoaderConfig(data=dataset, batch_size=8, input_size=32, workers=2, num_replicas=1,
                              replica_index=0, **kw)  # fmt: skip
        with ShardLoader(config) as loader:
            return list(loader.epoch(1, start_batch=start))

    plain = epoch()
    augmented = epoch(augment_policy=policy, random_erasing=erasing)
    assert len(augmented) == len(plain) >= 4
    changed = 0
    for mine, theirs in zip(augmented, plain, strict=True):
        assert mine["image"].shape == theirs["image"].shape == (8, 3, 32, 32)
        assert mine["image"].dtype == torch.uint8
        assert torch.equal(mine["label"], theirs["label"]) and torch.equal(mine["mask"], theirs["mask"])
        changed += int((mine["image"] != theirs["image"]).flatten(1).any(1).sum())
    assert changed > len(plain) * 8 // 4  # most images: every policy op but identity changes pixels
    again = epoch(augment_policy=policy, random_erasing=erasing)
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(again, augmented, strict=True))
    other_seed = epoch(augment_policy=policy, random_erasing=erasing, seed=1)
    assert not all(torch.equal(a["image"], b["image"]) for a, b in zip(other_seed, augmented, strict=True))
    start = len(augmented) // 2
    resumed = epoch(start, augment_policy=policy, random_erasing=erasing)
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(resumed, augmented[start:], strict=True))
