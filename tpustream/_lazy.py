"""A package's public face that imports nothing until a name is asked for (PEP 562: module ``__getattr__`` and
``__dir__``), so importing a package loads nothing heavy and ``tpustream --help`` stays torch-free.

    _HOMES = {"ShardLoader": "shard_loader", "Batch": "batch"}  # name -> the submodule that defines it
    __getattr__, __dir__ = lazy_front(__name__, _HOMES)

``moved`` keeps an old path working for one release with a DeprecationWarning naming the new one. A leaf: it
imports nothing of tpustream, so every package and shared leaf may use it.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_front"]


def lazy_front(
    package: str, homes: Mapping[str, str], *, moved: Mapping[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``'s lazy front.

    Args:
        package: the front's ``__name__``.
        homes: each public name -> the submodule of ``package`` that defines it (``"shard_loader"``,
            ``"predict.config"``).
        moved: each deprecated name -> the full path of the module that defines it now; getting the name
            warns (``DeprecationWarning``) and ``dir()`` leaves it out.

    Returns:
        ``(__getattr__, __dir__)``, to assign at the front's module level.
    """
    homes = dict(homes)
    moved = dict(moved or {})
    if both := sorted(homes.keys() & moved.keys()):
        raise ValueError(f"{package}: {both} are both public and moved; keep each name in one of the two")

    def __getattr__(name: str) -> Any:
        if name in moved:
            warnings.warn(
                f"{package}.{name} moved to {moved[name]}.{name}; import it from there",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(moved[name]), name)
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{homes[name]}"), name)

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *homes})

    return __getattr__, __dir__
