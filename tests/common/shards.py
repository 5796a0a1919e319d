"""Shard-writing helpers: a ShardConfig with the digits default and a source that crashes after N loads
(a power cut mid-write)."""

from __future__ import annotations

from tpustream.dataset.plan import ShardConfig
from tpustream.sources.types import Source


def shard_config(output, **kw):
    kw.setdefault("source", "digits")
    return ShardConfig(output=str(output), **kw)


class Crash(RuntimeError):
    pass


def crashing_source(source, after):
    calls = {"n": 0}

    def load(item, max_side):
        calls["n"] += 1
        if calls["n"] > after:
            raise Crash("power cut")
        return source.loader(item, max_side)

    return Source(source.spec, source.description, source.classes, source.items, load)
