"""The loader's shared batch-slot ring: a worker waits for a free slot, and gives up when the epoch ends."""

import threading
import time

import pytest

from tpustream.loader.ring import _Abandoned, _SlotRing


def test_a_worker_waits_for_its_oldest_slot_to_be_copied_out():
    ring = _SlotRing(workers=2, depth=2, batch_size=3, input_size=4)
    generation = ring.start_epoch()
    assert [ring.claim(1, written, generation) for written in range(2)] == [0, 1]
    ring.images[1, 0].fill_(9)
    threading.Timer(0.2, lambda: ring.take(1, 0)).start()
    started = time.perf_counter()
    assert ring.claim(1, 2, generation) == 0  # slot 0 again, once batch 0 has been taken
    assert time.perf_counter() - started >= 0.15
    assert ring.claim(0, 0, generation) == 0  # the other worker's slots are its own


def test_taken_images_are_a_copy_and_a_waiting_worker_gives_up_when_the_epoch_ends():
    ring = _SlotRing(workers=1, depth=1, batch_size=2, input_size=3)
    generation = ring.start_epoch()
    ring.images[0, 0].fill_(5)
    taken = ring.take(0, 0)
    ring.images[0, 0].fill_(6)
    assert int(taken.sum()) == 5 * taken.numel()
    ring.claim(0, 1, generation)
    threading.Timer(0.1, ring.end_epoch).start()
    with pytest.raises(_Abandoned):
        ring.claim(0, 2, generation)
    assert not ring.in_use


def test_the_ring_shrinks_to_what_dev_shm_holds_and_refuses_with_the_size_needed(caplog):
    from tpustream.loader.epoch_plan import LoaderError
    from tpustream.loader.shard_loader import ring_depth

    mib = 1 << 20
    assert ring_depth(5, 100 * mib, None, "train loader") == 5  # no /dev/shm to measure: as configured
    assert ring_depth(5, 100 * mib, 600 * mib, "train loader") == 5
    assert ring_depth(5, 100 * mib, 250 * mib, "train loader") == 2
    assert "250.0 MiB free, not the 500.0 MiB for 5 prefetched batches per worker: using 2" in caplog.text
    with pytest.raises(
        LoaderError, match=r"need 100.0 MiB in /dev/shm at least .* 64.0 MiB are free.*--shm-size=2g"
    ):
        ring_depth(5, 100 * mib, 64 * mib, "train loader")


@pytest.mark.integration
def test_a_loader_under_a_small_dev_shm_streams_with_fewer_slots_or_says_what_to_do(tmp_path, monkeypatch):
    """/dev/shm's free space is what a container of Docker's default 64 MB would report (patched: making a
    small tmpfs needs mount rights CI may lack); the ring and its workers are real."""
    from tpustream.dataset import write as shards
    from tpustream.dataset.plan import ShardConfig
    from tpustream.loader import shard_loader as data
    from tpustream.loader.epoch_plan import LoaderError
    from tpustream.loader.shard_loader import LoaderConfig, ShardLoader

    out = str(tmp_path / "digits")
    shards.create_shards(ShardConfig(source="digits", output=out, num_shards=4), progress=False)
    config = LoaderConfig(data=out, batch_size=32, input_size=16, workers=2, num_replicas=1, replica_index=0)
    per_depth = 2 * 32 * 3 * 16 * 16
    monkeypatch.setattr(data, "shm_free_bytes", lambda: 2 * per_depth)
    loader = ShardLoader(config)
    try:
        labels = [b["label"].tolist() for b in loader.epoch(0)]
        assert loader._ring is not None and loader._ring.depth == 2  # prefetch 4 + 1 wanted, 2 fit
    finally:
        loader.close()
    monkeypatch.setattr(data, "shm_free_bytes", lambda: None)
    full = ShardLoader(config)
    try:
        assert [b["label"].tolist() for b in full.epoch(0)] == labels  # the same batches, less prefetch
        assert full._ring is not None and full._ring.depth == 5
    finally:
        full.close()
    monkeypatch.setattr(data, "shm_free_bytes", lambda: per_depth // 2)
    small = ShardLoader(config)
    try:
        with pytest.raises(LoaderError, match="shared-memory batch slots need"):
            list(small.epoch(0))
    finally:
        small.close()
