"""The model registry: ``store`` where each record lives (the champion pointer, versions), ``events`` the decision log, ``policy`` when a
candidate replaces the champion (pure), ``history`` the champion's history.

The names below are the package's public API, imported on first use so that importing the package loads nothing
heavy (``tpustream --help`` stays torch-free); the modules themselves are imported by their full path inside tpustream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from tpustream.registry.errors import RegistryError
    from tpustream.registry.events import list_events
    from tpustream.registry.history import HistoryEntry, champion_history
    from tpustream.registry.policy import Decision, PromotionPolicy, QualityFloor, decide
    from tpustream.registry.store import ChampionPointer, list_versions, read_champion, version_uri

_HOMES = {
    "ChampionPointer": "store",
    "read_champion": "store",
    "version_uri": "store",
    "list_versions": "store",
    "list_events": "events",
    "Decision": "policy",
    "PromotionPolicy": "policy",
    "QualityFloor": "policy",
    "RegistryError": "errors",
    "decide": "policy",
    "champion_history": "history",
    "HistoryEntry": "history",
}
__all__ = [
    "ChampionPointer",
    "list_events",
    "list_versions",
    "read_champion",
    "version_uri",
    "Decision",
    "PromotionPolicy",
    "QualityFloor",
    "RegistryError",
    "decide",
    "HistoryEntry",
    "champion_history",
]

__getattr__, __dir__ = lazy_front(__name__, _HOMES)
