"""The loader's shared batch-slot ring: a worker waits for a free slot, and gives up when the epoch ends."""

import threading
import time

import pytest

from tpustream.data import _Abandoned, _SlotRing


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
