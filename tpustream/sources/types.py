"""What every SOURCE form produces: labelled ``Item``s and a ``Source`` that loads one as image bytes.

Kept apart from the forms themselves (``builtin``, ``cifar10``, ``image_folder``, ...) and from their registry
(``sources``) so that each of those imports this module and none imports another back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tpustream.errors import TpustreamError

__all__ = ["SourceError", "Item", "Rejected", "Source", "SKIP_REASONS"]

# Why a source item (or a row naming one) is not in the dataset: the manifest counts skips by these.
SKIP_REASONS = (
    "malformed-row",  # an import-file line that does not parse, or lacks the image URI
    "malformed-sample",  # a shard sample (another tool's tar) without an image member, or a damaged tar
    "empty-label",  # a row without a class name
    "multi-label",  # a row giving one image several labels (tpustream trains single-label classifiers)
    "local-path",  # a local path in an import file on gs:// (the reading container is another machine)
    "conflicting-labels",  # one image listed twice with two different labels (single-label datasets)
    "missing-object",  # the listed file or object does not exist or cannot be read
    "too-large",  # the header claims more pixels than the budget (--max-pixels)
    "undecodable",  # the bytes are not an image the decoder can read
)


class SourceError(TpustreamError, ValueError):
    """The source is unusable as given; the message names it and says what to do."""


@dataclass(frozen=True)
class Item:
    """One labelled item of a source. ``ref`` is picklable and stable: it goes into the shard plan."""

    ref: str | int
    label: int
    split: str | None = None  # the source's own split ("train"/"val"/"test"), when it has one


@dataclass(frozen=True)
class Rejected:
    """A row or item of the source left out before any image was read, and why (one of SKIP_REASONS)."""

    ref: str  # where it came from: "gs://b/import.jsonl:17" or the image URI
    reason: str
    message: str


@dataclass
class Source:
    """A listed source: its items, class names, and how to load one item as (bytes, ext)."""

    spec: str
    description: str
    classes: list[str]
    items: list[Item]
    loader: Callable[[Item, int | None], tuple[bytes, str]]
    ignored: list[str] = field(default_factory=list)  # non-image files seen and skipped
    rejected: list[Rejected] = field(default_factory=list)  # rows/items refused while listing
    locator: Callable[[Item], str] | None = None  # the file or object an item came from (default: its ref)

    @property
    def has_own_split(self) -> bool:
        return any(item.split is not None for item in self.items)

    def locate(self, item: Item) -> str:
        """Where ``item`` came from, as a user names it (a gs:// or local path, ``cifar10:PATH#17``)."""
        return self.locator(item) if self.locator is not None else str(item.ref)

    def load(self, item: Item, max_side: int | None = None) -> tuple[bytes, str]:
        """Return the item's image bytes and extension (``jpg``/``png``/``ppm``); raises CorruptImage."""
        return self.loader(item, max_side)
