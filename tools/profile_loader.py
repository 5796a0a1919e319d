"""Where a loader's time goes, per process: the loader's epochs under py-spy, sampled in every process.

    .venv/bin/python tools/profile_loader.py --data DATASET --workers 2 --seconds 10

Runs ``ShardLoader`` epochs (as ``tpustream bench load`` does, without a consumer) under
``py-spy record --subprocesses --idle`` (``pip install py-spy``, or the ``bench`` extra) and prints one
JSON line per process: the share of its samples in each part of the pipeline. A worker's parts: the
decode+crop kernel (``prepare_image``/``render_batch``), tar reading and parsing, picking a sample's label
and image, the shuffle buffer, the loader's own loops (generators, batching, stats), waiting for a free
batch slot, and torch's DataLoader machinery (index and result queues, including waiting for the main
process to ask for the next batch). The main process's: busy in the epoch loop, or waiting for a batch.
Background threads (the queues' feeder threads) are left out: they are idle nearly all the time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict

WAITING = ("_PollLikeSelector.select", "Condition.wait", "Event.wait", "time.sleep")


def run_loader(data: str, workers: int, seconds: float, batch_size: int, input_size: int | None) -> None:
    from tpustream.bench.load import input_size_for
    from tpustream.dataset.manifest import read_manifest
    from tpustream.loader.shard_loader import LoaderConfig, ShardLoader

    size = input_size_for(
        data, read_manifest(data), "train", input_size
    )  # as `tpustream bench load` picks it
    config = LoaderConfig(data=data, batch_size=batch_size, input_size=size, workers=workers, num_replicas=1,
                          replica_index=0)  # fmt: skip
    with ShardLoader(config) as loader:
        for _ in loader.epoch(0):  # worker start-up and first fill: not what is measured
            pass
        started, samples, epoch = time.perf_counter(), 0, 1
        while time.perf_counter() - started < seconds:
            for batch in loader.epoch(epoch):
                samples += int(batch["image"].shape[0])
            epoch += 1
        print(json.dumps({"samples_per_s": round(samples / (time.perf_counter() - started))}), flush=True)


def part_of(frames: list[str], worker: bool) -> str:
    """The pipeline part one sampled stack (outermost first, py-spy's ``function (file:line)``) is in."""
    stack = ";".join(frames)
    leaf = frames[-1].split(" (")[0]
    if not worker:
        return "waiting for a batch" if leaf in WAITING else "busy"
    for part, markers in (
        ("kernel: decode + crop + resize", ("prepare_image", "render_batch", "skip_image")),
        ("waiting for a free batch slot", ("_SlotRing.claim",)),
        ("tar read + parse", ("iter_tar", "_member_runs", "_sample_runs")),
        ("pick label and image", ("_pick",)),
    ):
        if any(marker in stack for marker in markers):
            return part
    if leaf == "EpochStream._shuffled":
        return "shuffle buffer"
    if "EpochStream" in stack:
        return "loader loops: generators, batching, stats"
    if leaf in WAITING:
        return "torch DataLoader: waiting for the next index"
    return "torch DataLoader: queues, pickling"


def attribute(raw_lines: list[str]) -> dict[str, Counter[str]]:
    """py-spy raw output (``stack count`` per line, ``--subprocesses``) -> per process, samples per part."""
    per_process: dict[str, Counter[str]] = defaultdict(Counter)
    for line in raw_lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        processes = [frame for frame in frames if frame.startswith("process ")]
        frames = [frame for frame in frames if not frame.startswith("process ")]
        if not processes or not frames or any("Thread._bootstrap" in frame for frame in frames):
            continue
        if any("importlib._bootstrap" in frame for frame in frames):  # imports at start-up
            continue
        worker = len(processes) > 1  # a worker's stack is nested under the main process's
        name = processes[-1].split(":")[0].removeprefix("process ") + (" worker" if worker else " main")
        per_process[name][part_of(frames, worker)] += int(count)
    return per_process


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", required=True, help="a dataset (local path or gs://) with a manifest")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--input-size", type=int, default=None)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)  # the profiled child
    args = parser.parse_args()
    if args.run:
        run_loader(args.data, args.workers, args.seconds, args.batch_size, args.input_size)
        return
    py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(py_spy):
        sys.exit("py-spy not found next to this Python: pip install py-spy")
    with tempfile.TemporaryDirectory() as workdir:
        raw = os.path.join(workdir, "profile.txt")
        child = [sys.executable, os.path.abspath(__file__), "--run", "--data", args.data, "--workers",
                 str(args.workers), "--seconds", str(args.seconds), "--batch-size", str(args.batch_size)]  # fmt: skip
        if args.input_size:
            child += ["--input-size", str(args.input_size)]
        done = subprocess.run(
            [py_spy, "record", "--subprocesses", "--idle", "--rate", str(args.rate), "--format", "raw",
             "--output", raw, "--", *child],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0 or not os.path.exists(raw):
            sys.exit(f"py-spy failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        print(*[line for line in done.stdout.splitlines() if line.startswith("{")], sep="\n")  # the rate
        with open(raw) as f:
            per_process = attribute(f.readlines())
    for name, parts in per_process.items():
        total = sum(parts.values())
        shares = {part: round(count / total, 3) for part, count in parts.most_common()}
        print(json.dumps({"process": name, "samples": total, "shares": shares}))


if __name__ == "__main__":
    main()
