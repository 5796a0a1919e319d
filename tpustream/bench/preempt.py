"""``tpustream bench preempt``: what a preemption costs, at several positions in an epoch.

For each position: ``tpustream train`` (a subprocess, as on a TPU VM) is sent SIGTERM right after step
``k`` of the first epoch; we time signal -> exit (the step in flight, the checkpoint), then restart the
same command and time restart -> its first step. Side by side, in this process, the loader's cost of
getting back to batch ``k``: ours (``epoch(e, start_batch=k)``: read and shuffle, draw from headers,
decode nothing skipped) against the replay approach (iterate the epoch from batch 0 and drop ``k``
batches: every skipped sample read, decoded and augmented again). One JSON line per position; then one line for the persistent XLA compile cache (``train --compile-cache``): the
same preemption at the middle position with a cache the first run fills, its restart -> first step against the
uncached restart's, and the restarted process's cache lookups (XLA's CPU client cannot load a cached executable:
on CPU the lookups find every program but compile again; the time saved is a TPU's).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["bench_preempt"]

_STEP = re.compile(r"epoch \d+ step (\d+):")
_LOOKUPS = re.compile(r"XLA compile cache .*: (\d+) entries found, (\d+) added; lookups: (\{.*\})")


def _train_cmd(data: str, output: str, *, batch_size: int, workers: int, input_size: int) -> list[str]:
    return [
        os.path.join(os.path.dirname(sys.executable), "tpustream"),
        "train",
        "--data",
        data,
        "--output",
        output,
        "--model",
        "tiny",
        "--epochs",
        "2",
        "--batch-size",
        str(batch_size),
        "--workers",
        str(workers),
        "--log-steps",
        "1",
        "--input-size",
        str(input_size),
        "--lr",
        "0.05",
    ]


def _wait_for_step(proc: subprocess.Popen, log_path: str, at_least: int, timeout: float) -> int:
    """Wait until the training log shows a step >= ``at_least``; returns that step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log_path, errors="replace") as f:
            steps = [int(m.group(1)) for m in _STEP.finditer(f.read())]
        if steps and max(steps) >= at_least:
            return max(steps)
        if proc.poll() is not None:
            raise RuntimeError(
                f"training exited with {proc.returncode} before step {at_least}: see {log_path}"
            )
        time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"no step {at_least} within {timeout:.0f} s: see {log_path}")


def _cache_lookups(log_path: str) -> dict[str, Any]:
    """What the restarted process's compile cache found, from its closing log line (tpustream/train/compile_cache.py)."""
    with open(log_path, errors="replace") as f:
        found = _LOOKUPS.findall(f.read())
    if not found:
        return {}
    entries, added, lookups = found[-1]
    return {
        "entries_found": int(entries),
        "entries_added": int(added),
        **json.loads(lookups.replace("'", '"')),
    }


def _preempt_and_restart(cmd: list[str], env: dict[str, str], workdir: str, position: int) -> dict[str, Any]:
    first_log, second_log = os.path.join(workdir, "first.log"), os.path.join(workdir, "second.log")
    with open(first_log, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    reached = _wait_for_step(proc, first_log, position, timeout=900)
    signalled = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=600)
    signal_to_exit = time.perf_counter() - signalled
    if code != 75:
        raise RuntimeError(f"expected exit 75 after SIGTERM, got {code}: see {first_log}")
    started = time.perf_counter()
    with open(second_log, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    _wait_for_step(proc, second_log, reached + 1, timeout=900)
    restart_to_first_step = time.perf_counter() - started
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=600)
    return {
        "stopped_after_step": reached,
        "signal_to_exit_s": round(signal_to_exit, 2),
        "restart_to_first_step_s": round(restart_to_first_step, 2),
        "restart_log": second_log,
    }


def _loader_to_batch(config: Any, start: int, replay: bool) -> tuple[float, dict[str, int]]:
    """Seconds until batch ``start`` of epoch 0 is in hand, ours or by replay; then the rest of the epoch
    is drained so the report counts every sample the epoch decoded and skipped."""
    from tpustream.loader.shard_loader import ShardLoader

    loader = ShardLoader(config)
    began = time.perf_counter()
    batches = iter(
        itertools.islice(loader.epoch(0), start, None) if replay else loader.epoch(0, start_batch=start)
    )
    next(batches)
    seconds = time.perf_counter() - began
    for _ in batches:
        pass
    report = loader.last_report
    assert report is not None
    return seconds, {"decoded": report.samples + report.repeated, "skipped": report.skipped_on_resume}


def bench_preempt(
    *,
    images: int = 1200,
    batch_size: int = 16,
    workers: int = 2,
    input_size: int = 224,
    positions: tuple[float, ...] = (0.05, 0.5, 0.9),
    keep: str | None = None,
) -> Iterator[str]:
    from tpustream.dataset.plan import ShardConfig
    from tpustream.dataset.write import create_shards
    from tpustream.loader.shard_loader import LoaderConfig, ShardLoader

    root = keep or tempfile.mkdtemp(prefix="tpustream-bench-preempt-")
    data = os.path.join(root, "data")
    if not os.path.exists(os.path.join(data, "manifest.json")):
        create_shards(
            ShardConfig(source=f"synthetic-imagenet:{images}", output=data, num_shards=8), progress=False
        )
    config = LoaderConfig(
        data=data,
        batch_size=batch_size,
        input_size=input_size,
        workers=workers,
        num_replicas=1,
        replica_index=0,
    )
    steps = ShardLoader(config).steps_per_epoch
    _loader_to_batch(config, 1, replay=False)  # warm-up: imports and page cache out of the timed runs
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    first: dict[str, float] = {}
    middle: dict[str, Any] = {}
    for fraction in positions:
        position = max(1, min(steps - 2, round(fraction * steps)))
        workdir = tempfile.mkdtemp(dir=root, prefix=f"at-{position}-")
        cmd = _train_cmd(
            data, os.path.join(workdir, "out"), batch_size=batch_size, workers=workers, input_size=input_size
        )
        run = _preempt_and_restart(cmd, env, workdir, position)
        run.pop("restart_log")
        if not middle or abs(fraction - 0.5) < abs(middle["fraction"] - 0.5):
            middle = {"fraction": fraction, "position": position, "cmd": cmd, **run}
        resumed_at = run["stopped_after_step"]
        ours, ours_counts = _loader_to_batch(config, resumed_at, replay=False)
        replay, replay_counts = _loader_to_batch(config, resumed_at, replay=True)
        first.setdefault("restart", run["restart_to_first_step_s"])
        first.setdefault("loader", ours)
        yield json.dumps(
            {
                "bench": "preempt",
                "data": f"synthetic-imagenet:{images}",
                "input_size": input_size,
                "batch_size": batch_size,
                "workers": workers,
                "steps_per_epoch": steps,
                **run,
                "restart_ratio_vs_earliest": round(run["restart_to_first_step_s"] / first["restart"], 3),
                "loader_to_batch_s": round(ours, 3),
                "loader_to_batch_replay_s": round(replay, 3),
                "loader_ratio_vs_earliest": round(ours / first["loader"], 3),
                "replay_vs_ours": round(replay / ours, 2),
                # decoded beyond the batches still to train on: ours 0, replay every skipped sample
                "samples_reread": ours_counts["skipped"],
                "samples_redecoded": ours_counts["decoded"] - (steps - resumed_at) * batch_size,
                "replay_samples_reread": resumed_at * batch_size,
                "replay_samples_redecoded": replay_counts["decoded"] - (steps - resumed_at) * batch_size,
            }
        )
    if not middle:
        return
    workdir = tempfile.mkdtemp(dir=root, prefix="compile-cache-")
    cache = os.path.join(workdir, "xla-cache")
    cached_cmd = [*middle["cmd"], "--compile-cache", cache]
    cached_cmd[cached_cmd.index("--output") + 1] = os.path.join(workdir, "out")
    run = _preempt_and_restart(cached_cmd, env, workdir, middle["position"])
    lookups = _cache_lookups(run.pop("restart_log"))
    yield json.dumps(
        {
            "bench": "preempt",
            "line": "compile-cache",
            "data": f"synthetic-imagenet:{images}",
            "input_size": input_size,
            "stopped_after_step": run["stopped_after_step"],
            "restart_to_first_step_s_no_cache": middle["restart_to_first_step_s"],
            "restart_to_first_step_s_warm_cache": run["restart_to_first_step_s"],
            "ratio_warm_vs_no_cache": round(
                run["restart_to_first_step_s"] / middle["restart_to_first_step_s"], 3
            ),
            "restart_cache_lookups": lookups,
            "note": "load_failures: XLA's CPU client cannot load a cached executable (UNIMPLEMENTED), so on CPU a warm "
            "cache finds every program and compiles it again; on a TPU those lookups are hits",
        }
    )
