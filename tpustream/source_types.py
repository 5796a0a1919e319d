"""What every SOURCE form produces: labelled ``Item``s and a ``Source`` that loads one as image bytes.

Kept apart from the forms themselves (``builtin_sources``, ``file_sources``) and from their registry
(``sources``) so that each of those imports this module and none imports another back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tpustream.errors import TpustreamError

__all__ = ["SourceError", "Item", "Source"]


class SourceError(TpustreamError, ValueError):
    """The source is unusable as given; the message names it and says what to do."""


@dataclass(frozen=True)
class Item:
    """One labelled item of a source. ``ref`` is picklable and stable: it goes into the shard plan."""

    ref: str | int
    label: int
    split: str | None = None  # the source's own split ("train"/"val"), when it has one


@dataclass
class Source:
    """A listed source: its items, class names, and how to load one item as (bytes, ext)."""

    spec: str
    description: str
    classes: list[str]
    items: list[Item]
    loader: Callable[[Item, int | None], tuple[bytes, str]]
    ignored: list[str] = field(default_factory=list)  # non-image files seen and skipped

    @property
    def has_own_split(self) -> bool:
        return any(item.split is not None for item in self.items)

    def load(self, item: Item, max_side: int | None = None) -> tuple[bytes, str]:
        """Return the item's image bytes and extension (``jpg``/``png``/``ppm``); raises CorruptImage."""
        return self.loader(item, max_side)
