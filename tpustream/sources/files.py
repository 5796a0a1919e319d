"""The SOURCE forms that read files: ``cifar10:PATH`` (the official CIFAR-10 python batches, a directory
or a .tar.gz, local or gs://) and an ImageFolder-layout directory (local or gs://; an optional ``train/`` +
``val/`` (``validation/``) + ``test/`` top level is the source's own split, while a ``train/`` with no val or
test images is read as plain class folders; CIFAR-10's ``test_batch`` is its val split, as the benchmark uses
it). Raw arrays are encoded once as binary PPM (the cheapest format for the loader to decode: see
``tpustream bench write``); image files keep their original bytes unless ``max_side`` shrinks them.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import tarfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from tpustream.image.codec import IMAGE_EXTS, UnreadableImage, encode_ppm, prepare_image_bytes, resize_array
from tpustream.sources.types import Item, Source, SourceError
from tpustream.storage import io as storage

__all__ = ["cifar10_source", "image_folder_source", "load_cifar_pickle", "IMAGE_EXTENSIONS"]

# Extensions we keep byte-for-byte, and the ones we accept but re-encode to PNG.
KEEP_EXT = {f".{ext}": "jpg" if ext == "jpeg" else ext for ext in IMAGE_EXTS}
REENCODE_EXT = {".bmp", ".gif", ".webp", ".tif", ".tiff", ".pgm", ".pbm", ".pnm"}
IMAGE_EXTENSIONS = frozenset(KEEP_EXT) | REENCODE_EXT
SPLIT_DIR_NAMES = {"train": "train", "val": "val", "validation": "val", "test": "test"}
CIFAR10_BATCHES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")  # an official extraction
CIFAR10_CLASSES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- CIFAR-10 python batches


class _CifarUnpickler(pickle.Unpickler):
    """Admits only what the official CIFAR-10 batches contain: numpy arrays, dtypes, builtins.

    Anything else (``os.system``, ``builtins.eval``, ...) is refused before it can be called.
    ``_frombuffer`` is how protocol-5 pickles rebuild an array: a dtype'd view of bytes, no code run.
    """

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),  # how protocol-2 pickles spell bytes
        ("copy_reg", "_reconstructor"),
        ("copyreg", "_reconstructor"),
        ("__builtin__", "object"),
        ("builtins", "object"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(
                f"refusing to load {module}.{name}: not part of a CIFAR-10 batch (possibly a crafted pickle)"
            )
        return super().find_class(module, name)


def load_cifar_pickle(data: bytes, name: str) -> dict:
    """Load one CIFAR batch/meta pickle with the restricted unpickler; keys come back as ``str``."""
    try:
        obj = _CifarUnpickler(io.BytesIO(data), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise SourceError(f"CIFAR-10 file {name} is not a valid batch: {exc}") from exc
    if not isinstance(obj, dict):
        raise SourceError(f"CIFAR-10 file {name}: expected a dict, found {type(obj).__name__}")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _cifar_files(path: str) -> dict[str, bytes]:
    """Read the batch files from a directory (or its cifar-10-batches-py/) or a .tar.gz, local or gs://."""
    wanted = {*CIFAR10_BATCHES, "batches.meta"}
    files: dict[str, bytes] = {}
    kind = storage.path_kind(path)
    if path.endswith((".tar.gz", ".tgz", ".tar")) or (kind == "file" and tarfile.is_tarfile(path)):
        try:
            with storage.open_read(path) as raw, tarfile.open(fileobj=raw, mode="r|*") as tar:
                for member in tar:
                    base = os.path.basename(member.name)
                    if member.isfile() and base in wanted:
                        extracted = tar.extractfile(member)
                        if extracted is not None:
                            files[base] = extracted.read()
        except storage.NotFound as exc:
            raise SourceError(f"cifar10:{path}: {exc}") from exc
        except tarfile.TarError as exc:
            raise SourceError(f"cifar10:{path} is not a readable tar archive: {exc}") from exc
        return files
    if kind == "file":
        raise SourceError(
            f"cifar10:{path} is a file, not a directory or archive: point at the directory holding "
            "data_batch_1..5 and test_batch (cifar-10-batches-py) or at cifar-10-python.tar.gz"
        )
    if kind == "missing":
        raise SourceError(f"cifar10:{path} does not exist")
    for base in sorted(wanted):
        for candidate in (storage.join(path, base), storage.join(path, "cifar-10-batches-py", base)):
            try:
                files[base] = storage.read_bytes(candidate)
                break
            except storage.NotFound:
                continue
            except storage.StorageError as exc:
                raise SourceError(f"cifar10:{path}: {exc}") from exc
    return files


def cifar10_source(path: str) -> Source:
    """The ``cifar10:PATH`` form: all six official batches, ``test_batch`` as the val split."""
    if not path:
        raise SourceError("source 'cifar10:' needs a path: cifar10:DIR or cifar10:FILE.tar.gz")
    try:
        path = storage.check_uri(path)  # file:///x -> /x
    except storage.StorageError as exc:
        raise SourceError(f"source cifar10:{path}: {exc}") from exc
    files = _cifar_files(path)
    batches = [name for name in CIFAR10_BATCHES if name in files]
    if not batches:
        raise SourceError(
            f"cifar10:{path}: no data_batch_N or test_batch found; point at the extracted "
            "cifar-10-batches-py directory or at cifar-10-python.tar.gz"
        )
    missing = [name for name in CIFAR10_BATCHES if name not in files]
    if missing:  # a partial copy would silently lose training data, or the whole val split
        raise SourceError(
            f"cifar10:{path}: missing {', '.join(missing)}; an official extraction has data_batch_1..5 "
            "and test_batch: copy or extract all of them"
        )
    classes = list(CIFAR10_CLASSES)
    if "batches.meta" in files:
        meta = load_cifar_pickle(files["batches.meta"], "batches.meta")
        names = meta.get("label_names")
        if isinstance(names, list) and names:
            classes = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    arrays: list[np.ndarray] = []
    items: list[Item] = []
    for name in batches:
        batch = load_cifar_pickle(files[name], name)
        data, labels = batch.get("data"), batch.get("labels")
        if (
            not isinstance(data, np.ndarray)
            or data.dtype != np.uint8
            or data.ndim != 2
            or data.shape[1] != 3072
        ):
            raise SourceError(f"CIFAR-10 file {name}: 'data' must be a uint8 array of shape (N, 3072)")
        if not isinstance(labels, Sequence) or len(labels) != len(data):
            raise SourceError(f"CIFAR-10 file {name}: 'labels' must list one label per row of 'data'")
        if any(not isinstance(v, int | np.integer) or not 0 <= int(v) < len(classes) for v in labels):
            raise SourceError(f"CIFAR-10 file {name}: labels must be integers in [0, {len(classes)})")
        split = "val" if name == "test_batch" else "train"
        offset = sum(len(a) for a in arrays)
        arrays.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        items.extend(Item(offset + i, int(label), split) for i, label in enumerate(labels))
    images = np.concatenate(arrays)

    def load(item: Item, max_side: int | None) -> tuple[bytes, str]:
        return encode_ppm(resize_array(images[int(item.ref)], max_side)), "ppm"

    return Source(
        spec=f"cifar10:{path}",
        description=f"CIFAR-10 python batches at {path}: {len(items)} 32x32 images ({', '.join(batches)})",
        classes=classes,
        items=items,
        loader=load,
    )


# --------------------------------------------------------------------------- ImageFolder


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
