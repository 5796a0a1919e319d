"""The ImageFolder SOURCE form: a directory of class sub-folders, local or gs://. An optional ``train/`` +
``val/`` (``validation/``) + ``test/`` top level is the source's own split, while a ``train/`` with no val or
test images is read as plain class folders. Image files keep their original bytes unless ``max_side`` shrinks
them; the formats PIL reads but the loader does not are re-encoded (``REENCODE_EXT``).
"""

from __future__ import annotations

import logging
import os

from tpustream.image.codec import IMAGE_EXTS, UnreadableImage, prepare_image_bytes
from tpustream.sources.types import Item, Source, SourceError
from tpustream.storage import io as storage

__all__ = ["image_folder_source", "IMAGE_EXTENSIONS"]

# Extensions we keep byte-for-byte, and the ones we accept but re-encode to PNG.
KEEP_EXT = {f".{ext}": "jpg" if ext == "jpeg" else ext for ext in IMAGE_EXTS}
REENCODE_EXT = {".bmp", ".gif", ".webp", ".tif", ".tiff", ".pgm", ".pbm", ".pnm"}
IMAGE_EXTENSIONS = frozenset(KEEP_EXT) | REENCODE_EXT
SPLIT_DIR_NAMES = {"train": "train", "val": "val", "validation": "val", "test": "test"}

log = logging.getLogger(__name__)


def image_folder_source(root: str) -> Source:
    """A directory of class sub-folders (ImageFolder layout), local or gs://."""
    root = root.rstrip("/")
    try:
        listing = storage.list_objects(root)
    except storage.StorageError as exc:
        raise SourceError(f"source {root!r}: {exc}") from exc
    # "" is the root's own placeholder object (a folder made in the GCS console)
    rel_paths = [rel for rel in (obj.uri[len(root) + 1 :] for obj in listing) if rel]
    if not rel_paths:
        raise SourceError(
            f"source {root!r} is empty or does not exist: expected class sub-folders with images"
        )
    top_dirs = {p.split("/", 1)[0] for p in rel_paths if "/" in p}
    split_layout = bool(top_dirs) and top_dirs <= set(SPLIT_DIR_NAMES) and "train" in top_dirs
    by_class: dict[str, list[tuple[str, str | None]]] = {}
    ignored: list[str] = []
    for rel in rel_paths:
        parts = rel.split("/")
        split = None
        if split_layout and len(parts) > 1:
            split = SPLIT_DIR_NAMES[parts[0]]
            parts = parts[1:]
        if len(parts) < 2:  # a file beside the class (or split) folders, not inside one
            ignored.append(rel)
            continue
        ext = os.path.splitext(parts[-1])[1].lower()
        by_class.setdefault(parts[0], [])
        if ext in IMAGE_EXTENSIONS:
            by_class[parts[0]].append((rel, split))
        else:
            ignored.append(rel)
    # a folder with no files at all does not show up in the listing
    for class_parent in [storage.join(root, d) for d in sorted(top_dirs)] if split_layout else [root]:
        for name in storage.list_dirs(class_parent):
            by_class.setdefault(name, [])
    if not by_class:
        raise SourceError(
            f"source {root!r} has no class sub-folders: expected ROOT/<class>/<image> (ImageFolder layout)"
        )
    empty = sorted(name for name, files in by_class.items() if not files)
    if empty:
        raise SourceError(
            f"source {root!r}: class folder(s) {', '.join(empty)} contain no images "
            f"(accepted extensions: {', '.join(sorted(IMAGE_EXTENSIONS))}); add images or remove the folder"
        )
    own_split = split_layout and any(
        split in ("val", "test") for files in by_class.values() for _, split in files
    )
    if split_layout and not own_split:  # a train/ alone is not a split: one with an empty val would follow
        log.warning(
            "source %s has a train/ folder but no images in a val/, validation/ or test/ folder: its classes "
            "are read from train/ and the val split is drawn from them (--val-fraction, default 0.1)",
            root,
        )
        by_class = {name: [(rel, None) for rel, _ in files] for name, files in by_class.items()}
    classes = sorted(by_class)
    items = [
        Item(rel, label, split) for label, name in enumerate(classes) for rel, split in sorted(by_class[name])
    ]

    def load(item: Item, max_side: int | None) -> tuple[bytes, str]:
        uri = storage.join(root, str(item.ref))
        try:
            data = storage.read_bytes(uri)
        except storage.StorageError as exc:
            raise UnreadableImage(f"{uri}: cannot read ({exc})") from exc
        return prepare_image_bytes(data, os.path.splitext(uri)[1], max_side, uri)

    return Source(
        spec=root,
        description=f"ImageFolder at {root}: {len(items)} images, {len(classes)} classes"
        + (" (own train/val/test split)" if own_split else ""),
        classes=classes,
        items=items,
        loader=load,
        ignored=ignored,
        locator=lambda item: storage.join(root, str(item.ref)),
    )
