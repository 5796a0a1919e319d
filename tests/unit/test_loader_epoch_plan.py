"""The loader's per-epoch plan: pure arithmetic on the manifest's shard sizes."""

import itertools

import pytest

from tpustream.loader.epoch_plan import LoaderError, idle_workers, plan_epoch, train_epoch_size

LAYOUTS = list(itertools.product([3, 8, 9, 13, 17, 40], [1, 2, 4], [0, 1, 2, 3, 8], [4, 7, 16]))


def _sizes(num_shards, total=1000):
    base, extra = divmod(total, num_shards)
    return [base + (1 if i < extra else 0) for i in range(num_shards)]


@pytest.mark.parametrize("num_shards, replicas, workers, batch", LAYOUTS)
def test_train_every_replica_gets_exactly_steps_batches(num_shards, replicas, workers, batch):
    sizes = _sizes(num_shards)
    if num_shards < replicas:
        with pytest.raises(LoaderError, match=f"--num-shards {replicas * max(1, workers)}"):
            plan_epoch(sizes, split="train", epoch=0, seed=0, num_replicas=replicas, replica_index=0,
                       workers=workers, batch_size=batch)  # fmt: skip
        return
    seen = []
    for rank in range(replicas):
        steps, plans = plan_epoch(sizes, split="train", epoch=3, seed=1, num_replicas=replicas,
                                  replica_index=rank, workers=workers, batch_size=batch)  # fmt: skip
        assert steps == -(-sum(sizes) // (batch * replicas))  # the remainder padded: ceil
        assert sum(p.num_batches for p in plans) == steps
        own = len(range(rank, num_shards, replicas))  # the shards dealt to this replica
        assert idle_workers(plans) == max(0, max(1, workers) - own)
        assert all(p.num_batches == 0 for p in plans if not p.shards)  # an idle worker reads nothing
        seen += [s for p in plans for s in p.shards]
    assert sorted(seen) == list(range(num_shards))  # each shard read by exactly one (replica, worker)


@pytest.mark.parametrize("num_shards, replicas, workers, batch", LAYOUTS)
def test_val_covers_every_sample_once_with_equal_steps(num_shards, replicas, workers, batch):
    sizes = _sizes(num_shards, total=997)
    steps_seen, shards_seen = set(), []
    for rank in range(replicas):
        steps, plans = plan_epoch(sizes, split="val", epoch=0, seed=0, num_replicas=replicas,
                                  replica_index=rank, workers=workers, batch_size=batch)  # fmt: skip
        steps_seen.add(steps)
        assert sum(p.num_batches for p in plans) == steps
        for p in plans:
            assert p.num_batches * batch >= sum(sizes[s] for s in p.shards)  # room for every sample
        shards_seen += [s for p in plans for s in p.shards]
    assert len(steps_seen) == 1
    assert sorted(shards_seen) == list(range(num_shards))


def test_train_order_is_deterministic_and_changes_per_epoch():
    sizes = _sizes(16)
    kw = dict(split="train", seed=5, num_replicas=2, replica_index=1, workers=2, batch_size=8)
    assert plan_epoch(sizes, epoch=4, **kw) == plan_epoch(sizes, epoch=4, **kw)
    orders = {tuple(s for p in plan_epoch(sizes, epoch=e, **kw)[1] for s in p.shards) for e in range(6)}
    assert len(orders) == 6


def test_quotas_follow_worker_sample_counts():
    # 5 shards on 2 workers: the worker with 3 shards gets ~3/5 of the batches, so nobody repeats much
    steps, plans = plan_epoch([100] * 5, split="train", epoch=0, seed=0, num_replicas=1, replica_index=0,
                              workers=2, batch_size=10)  # fmt: skip
    assert steps == 50
    assert sorted(p.num_batches for p in plans) == [20, 30]


def test_batch_larger_than_dataset():
    """Padded, a split smaller than one global batch still trains (one padded step); unpadded, or with fewer
    samples than replicas (each padded batch needs a real sample), it cannot."""
    kw = dict(split="train", epoch=0, seed=0, replica_index=0, workers=1, batch_size=64)
    steps, plans = plan_epoch([3] * 8, num_replicas=2, **kw)
    assert steps == 1 and sum(p.padding for p in plans) == 128 // 2 - 12
    with pytest.raises(LoaderError, match="smaller batch size"):
        plan_epoch([3] * 8, num_replicas=2, pad_last_batch=False, **kw)
    with pytest.raises(LoaderError, match="smaller batch size .*one sample per replica"):
        plan_epoch([1, 1, 1, 0], num_replicas=4, **kw)


UNEVEN = [3, 40, 17, 8, 29, 5, 36, 11]  # 149 samples in 8 shards of 3..40


@pytest.mark.parametrize("num_shards", [2, 5, 7, 8])
@pytest.mark.parametrize("replicas, workers", [(1, 0), (1, 3), (2, 1), (2, 2), (2, 4), (3, 2)])
@pytest.mark.parametrize("batch", [1, 4, 7, 16])
@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("pad", [True, False])
def test_train_deals_every_sample_once_and_pads_the_last_batch(
    num_shards, replicas, workers, batch, seed, pad
):
    """Issues 37 and 46: on small, uneven shards every sample is read by exactly one (replica, worker) per
    epoch; the epoch's last global batch is padded (at most batch - 1 slots per replica, in the batch the
    replica delivers last) so that nothing is left out but a remainder under the replica count, or, unpadded,
    the remainder under one global batch, counted; every replica takes the same number of batches."""
    sizes = UNEVEN[:num_shards]
    if num_shards < replicas or sum(sizes) < (replicas if pad else batch * replicas):
        return  # refused: the tests above
    size = train_epoch_size(sum(sizes), batch_size=batch, num_replicas=replicas, pad_last_batch=pad)
    for epoch in range(3):
        reads: list[tuple[int, int]] = []
        left_out = padding = 0
        for rank in range(replicas):
            steps, plans = plan_epoch(sizes, split="train", epoch=epoch, seed=seed, num_replicas=replicas,
                                      replica_index=rank, workers=workers, batch_size=batch,
                                      pad_last_batch=pad)  # fmt: skip
            assert steps == size.steps
            assert sum(p.num_batches for p in plans) == steps
            counts = [p.num_batches for p in plans]
            last = max(range(len(plans)), key=lambda w: (counts[w], w))  # the DataLoader's last batch
            assert all(p.padding == 0 for w, p in enumerate(plans) if w != last)
            assert 0 <= plans[last].padding < batch  # the padded batch keeps a real sample
            for plan in plans:
                ranges = plan.read_ranges(sizes)
                assert sum(r.num_samples for r in ranges) == plan.num_batches * batch - plan.padding
                assert all(0 <= r.start < r.stop <= sizes[r.shard] for r in ranges)
                reads += [(r.shard, i) for r in ranges for i in range(r.start, r.stop)]
                assert plan.num_batches == 0 or plan.shards  # an idle worker stays idle
            left_out += sum(p.left_out for p in plans)
            padding += sum(p.padding for p in plans)
        assert len(reads) == len(set(reads))  # nothing read twice, by any replica or worker
        assert left_out == sum(sizes) - len(reads) == size.left_out
        assert padding == size.padding == steps * batch * replicas - len(reads)
        remainder = sum(sizes) % (batch * replicas)
        if pad and remainder >= replicas:
            assert left_out == 0 and size.code == "padded"  # every sample, every epoch
        else:
            assert left_out == remainder and padding == 0


@pytest.mark.parametrize(
    "samples, batch, replicas, pad, expected",
    [
        (80, 32, 1, True, (3, 16, 0, "padded")),  # issue 46: 10 images x 8 classes, global batch 32
        (80, 32, 1, False, (2, 0, 16, "not-padded")),  # before: a fifth of the data unseen each epoch
        (80, 8, 4, True, (3, 16, 0, "padded")),  # 4 replicas of 8: 4 padding slots each
        (96, 8, 4, True, (3, 0, 0, "exact")),
        (97, 8, 4, True, (3, 0, 1, "under-replicas")),  # 1 sample for 4 replicas: a padded batch needs 4
        (100, 8, 4, True, (4, 28, 0, "padded")),  # 7 padding slots per replica: each keeps one real sample
    ],
)
def test_train_epoch_size(samples, batch, replicas, pad, expected):
    size = train_epoch_size(samples, batch_size=batch, num_replicas=replicas, pad_last_batch=pad)
    assert (size.steps, size.padding, size.left_out, size.code) == expected
    assert size.steps * batch * replicas == samples - size.left_out + size.padding
    assert f"{samples} train samples in {size.steps} step(s)" in size.line()
    if size.code == "padded":
        assert f"padded with {size.padding} copies" in size.line()
    if size.left_out:
        assert f"{size.left_out} left out" in size.line()


def test_the_samples_left_out_change_with_the_epoch():
    sizes = UNEVEN[:7]
    kw = dict(split="train", seed=3, num_replicas=2, workers=2, batch_size=16, pad_last_batch=False)

    def unread(epoch):
        read = {
            (r.shard, i)
            for rank in range(2)
            for p in plan_epoch(sizes, epoch=epoch, replica_index=rank, **kw)[1]
            for r in p.read_ranges(sizes)
            for i in range(r.start, r.stop)
        }
        return {(s, i) for s, size in enumerate(sizes) for i in range(size)} - read

    left = [unread(epoch) for epoch in range(6)]
    assert all(len(x) == sum(sizes) - 4 * 32 for x in left)
    assert len({frozenset(x) for x in left}) > 1
