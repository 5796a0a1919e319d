"""The persistent XLA compilation cache of a training run (``train --compile-cache URI``).

torch_xla keeps compiled executables on disk when ``torch_xla.runtime.initialize_cache(path, readonly)`` is called
before the first computation (pytorch/xla ``docs/source/learn/pytorch-on-xla-devices.md``, "Compilation
Caching"): a later run of the same program (a retry after preemption, next week's scheduled run, every host of a
slice) loads them instead of compiling again. The same page sets the sharing rules followed here:

- SPMD (one process per host): one cache for the job, written by process 0 only, read by every host
  ("``readonly`` ... useful when a shared cache mount is used for an SPMD workload").
- ``replicas`` (one process per device, ``torch_xla.launch``): "use the different path for different process":
  ``URI/process-<global ordinal>``, each written by its own process.

URI is a local directory (or a mount such as Vertex's ``/gcs/BUCKET/...``), used in place; or ``gs://...``, which
torch_xla cannot write to: its entries are copied into a local directory before the first computation, and the
writing process uploads the entries it added when the run ends, or is preempted after `last` is committed.

XLA's CPU client cannot load a serialized executable ("Deserializing serialized executable not supported":
``PersistentCacheDeserializeFailure`` in the metrics), so on CPU the cache is written and consulted but every
lookup compiles again; the savings are a TPU's (or GPU's).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, TypedDict

from tpustream.storage import io as storage

__all__ = ["CompileCache", "CompileCacheRecord", "open_compile_cache", "cache_counters"]

log = logging.getLogger(__name__)

COUNTERS = ("PersistentCacheHit", "PersistentCacheMiss", "PersistentCacheDeserializeFailure")


def cache_counters() -> dict[str, int]:
    """torch_xla's persistent-cache counters so far: hits, misses and entries it could not load."""
    import torch_xla.debug.metrics as met

    names = dict(zip(COUNTERS, ("hits", "misses", "load_failures"), strict=True))
    return {short: int(met.counter_value(name) or 0) for name, short in names.items()}


class CompileCacheRecord(TypedDict):
    """The cache's lookups in the training process, as model.json's ``compile_cache`` records them."""

    uri: str
    hits: int
    misses: int
    load_failures: int


@dataclass
class CompileCache:
    uri: str  # as given (local path or gs://)
    local: str  # the directory torch_xla reads and writes
    writer: bool  # this process adds entries
    remote: str | None  # gs:// directory to upload new entries to (None: ``local`` is the cache itself)
    found: set[str] = field(default_factory=set)  # entries present when the run started

    def record(self) -> CompileCacheRecord:
        """This process's lookups so far, for the model card."""
        counters = cache_counters()
        return CompileCacheRecord(
            uri=self.uri,
            hits=counters["hits"],
            misses=counters["misses"],
            load_failures=counters["load_failures"],
        )

    def close(self) -> dict[str, Any]:
        """Upload what this run added (gs://, writing process); returns what the run did with the cache."""
        entries = set(os.listdir(self.local)) if os.path.isdir(self.local) else set()
        added = sorted(entries - self.found)
        if self.remote is not None:
            if self.writer:
                for name in added:
                    try:
                        storage.upload_file(os.path.join(self.local, name), storage.join(self.remote, name))
                    except storage.StorageError as exc:  # a cache, not an output: the run's result stands
                        log.warning(
                            "XLA compile cache: could not upload %s to %s: %s", name, self.remote, exc
                        )
                        break
            shutil.rmtree(self.local, ignore_errors=True)
        summary = {
            "uri": self.uri,
            "writer": self.writer,
            "entries_found": len(self.found),
            "entries_added": 0,
        }
        summary["entries_added"] = len(added) if self.writer else 0
        with contextlib.suppress(Exception):  # torch_xla not importable: nothing ran
            summary.update(cache_counters())
        log.info(
            "XLA compile cache %s: %d entries found, %d added; lookups: %s",
            self.uri,
            summary["entries_found"],
            summary["entries_added"],
            {k: summary.get(k) for k in ("hits", "misses", "load_failures")},
        )
        return summary


def open_compile_cache(uri: str | None, *, strategy: str) -> CompileCache | None:
    """Initialize torch_xla's persistent cache at ``uri`` for this process (before any computation)."""
    if not uri:
        return None
    import torch_xla.runtime as xr

    from tpustream.xla_runtime import process_layout

    uri = storage.check_uri(uri).rstrip("/")
    if strategy == "replicas":
        writer, sub = True, f"process-{xr.global_ordinal()}"
    else:
        writer, sub = process_layout()[0] == 0, ""
    target = storage.join(uri, sub) if sub else uri
    if storage.is_gcs(target):
        local = tempfile.mkdtemp(prefix="tpustream-xla-cache-")
        for obj in storage.list_objects(target, recursive=False):
            name = obj.uri.rsplit("/", 1)[-1]
            with storage.open_read(obj.uri) as src, open(os.path.join(local, name), "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        remote: str | None = target
    else:
        local, remote = target, None
        os.makedirs(local, exist_ok=True)
    found = set(os.listdir(local))
    xr.initialize_cache(local, readonly=not writer)
    log.info(
        "XLA compile cache %s: %d entries, %s", target, len(found), "read-write" if writer else "read-only"
    )
    return CompileCache(uri=target, local=local, writer=writer, remote=remote, found=found)
