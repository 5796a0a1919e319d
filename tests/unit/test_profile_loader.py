"""tools/profile_loader.py: py-spy's raw stacks, from every process, sorted into the loader's parts."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "profile_loader", Path(__file__).parents[2] / "tools" / "profile_loader.py"
)
profile_loader = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile_loader)

MAIN = 'process 10:"python tools/profile_loader.py --run"'
WORKER = 'process 11:"python tools/profile_loader.py --run"'
EPOCH = "<module> (profile_loader.py:1);ShardLoader.epoch (tpustream/loader/shard_loader.py:680)"
STREAM = f"{MAIN};{WORKER};{EPOCH};_worker_loop (torch/utils/data/_utils/worker.py:300)"
RAW = [
    f"{MAIN};{EPOCH};Queue.get (multiprocessing/queues.py:113);_PollLikeSelector.select (selectors.py:415) 30\n",
    f"{MAIN};{EPOCH};_SlotRing.take (tpustream/loader/shard_loader.py:228) 10\n",
    f"{MAIN};Thread._bootstrap (threading.py:1002);Condition.wait (threading.py:327) 500\n",  # feeder thread
    f"{STREAM};EpochStream._batch (tpustream/loader/shard_loader.py:398);render_batch (tpustream/image/transforms.py:307) 50\n",
    f"{STREAM};EpochStream._decoded (tpustream/loader/shard_loader.py:367);prepare_image (tpustream/image/transforms.py:199) 10\n",
    f"{STREAM};EpochStream._raw_samples (tpustream/loader/shard_loader.py:322);_sample_runs (tpustream/dataset/tario.py:449) 20\n",
    f"{STREAM};EpochStream._shuffled (tpustream/loader/shard_loader.py:350) 5\n",
    f"{STREAM};EpochStream._train (tpustream/loader/shard_loader.py:445) 5\n",
    f"{MAIN};{WORKER};_worker_loop (torch/utils/data/_utils/worker.py:290);wait (multiprocessing/connection.py:939);"
    "_PollLikeSelector.select (selectors.py:415) 10\n",
    "not a stack line\n",
]


def test_stacks_sort_into_parts_per_process_without_background_threads():
    parts = profile_loader.attribute(RAW)
    assert set(parts) == {"10 main", "11 worker"}
    assert parts["10 main"] == {"waiting for a batch": 30, "busy": 10}  # the feeder thread is left out
    assert parts["11 worker"] == {
        "kernel: decode + crop + resize": 60,
        "tar read + parse": 20,
        "shuffle buffer": 5,
        "loader loops: generators, batching, stats": 5,
        "torch DataLoader: waiting for the next index": 10,
    }
