"""The ``cifar10:PATH`` SOURCE form: the official CIFAR-10 python batches, a directory or a .tar.gz, local or
gs://. CIFAR-10's ``test_batch`` is its val split, as the benchmark uses it. Raw arrays are encoded once as
binary PPM (the cheapest format for the loader to decode: see ``tpustream bench write``). The pickles are read
by an unpickler that builds nothing but plain data.
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

from tpustream.image.codec import encode_ppm, resize_array
from tpustream.sources.types import Item, Source, SourceError
from tpustream.storage import io as storage

__all__ = ["cifar10_source", "load_cifar_pickle"]

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
