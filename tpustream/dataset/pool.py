"""The writers' process pool: shards written in forked processes that die with the process that started them.

Forked, not spawned: a writer inherits the listed source (CIFAR arrays, photos) without pickling it.
``exit_with_parent`` is also the initializer of ``predict``'s decode pool (one implementation).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

from tpustream.dataset.plan import ShardSpec
from tpustream.dataset.shard_writer import ShardRecord

__all__ = ["exit_with_parent", "run_parallel"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)


def exit_with_parent(parent_pid: int) -> None:
    """Pool initializer: a writer dies with the process that started it instead of writing on, orphaned.

    Linux kills it the moment the parent dies (``PR_SET_PDEATHSIG``); elsewhere a thread polls.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            args = (ctypes.c_ulong(v) for v in (signal.SIGKILL, 0, 0, 0))  # prctl is variadic: pass longs
            if libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), *args) == 0:
                if os.getppid() != parent_pid:  # the parent died before the request took effect
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="watch-parent").start()


def run_parallel(
    fn: Callable[[ShardSpec], ShardRecord],
    specs: list[ShardSpec],
    workers: int,
    on_done: Callable[[ShardRecord], None],
) -> None:
    """Run ``fn`` on every spec, on ``workers`` forked processes (in this one for one worker or one spec),
    handing each record to ``on_done`` in the order of ``specs``."""
    if workers <= 1 or len(specs) <= 1:
        for spec in specs:
            on_done(fn(spec))
        return
    # fork: workers inherit the listed source (CIFAR arrays, photos) without pickling it
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(
        max_workers=min(workers, len(specs)),
        mp_context=ctx,
        initializer=exit_with_parent,
        initargs=(os.getpid(),),
    ) as pool:
        for record in pool.map(fn, specs):
            on_done(record)
