"""What a SOURCE reads, written on disk: ImageFolder trees, CIFAR-10 python batches, Vertex import-file rows
and their images, webdataset ShardWriter tars (plain or gzip-compressed)."""

from __future__ import annotations

import io
import json
import os
import pickle

import numpy as np
import webdataset as wds
from PIL import Image

CIFAR_BATCHES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def write_cifar(directory, per_batch=20, protocol=2, batches=CIFAR_BATCHES):
    """Write batches in the official layout (dicts with bytes keys, protocol 2 like the originals)."""
    rng = np.random.default_rng(1)
    os.makedirs(directory, exist_ok=True)
    for name in batches:
        batch = {
            b"batch_label": name.encode(),
            b"labels": [int(x) for x in rng.integers(0, 10, per_batch)],
            b"data": rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8),
            b"filenames": [f"{name}_{i}.png".encode() for i in range(per_batch)],
        }
        with open(os.path.join(directory, name), "wb") as f:
            pickle.dump(batch, f, protocol=protocol)
    with open(os.path.join(directory, "batches.meta"), "wb") as f:
        names = [
            b"airplane",
            b"automobile",
            b"bird",
            b"cat",
            b"deer",
            b"dog",
            b"frog",
            b"horse",
            b"ship",
            b"truck",
        ]
        pickle.dump({b"label_names": names, b"num_cases_per_batch": per_batch}, f, protocol=2)


def solid_jpeg(color, size=(40, 30)):
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="JPEG")
    return out.getvalue()


def digit_images(root, start, stop, classes=None):
    """Real data for an ImageFolder source: scikit-learn's bundled digits ``start:stop`` as PNG files, one
    folder a class (only the digits in ``classes``, when given)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    wanted = None if classes is None else set(classes)
    for i in range(start, stop):
        label = int(digits.target[i])
        if wanted is not None and label not in wanted:
            continue
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (digits.images[i] * (255 / 16)).astype(np.uint8)
        Image.fromarray(pixels).convert("RGB").save(folder / f"{i:05d}.png")


def make_image_folder(root, per_class=4, classes=("cat", "dog")):
    for c, name in enumerate(classes):
        os.makedirs(root / name, exist_ok=True)
        for i in range(per_class):
            (root / name / f"{i}.jpg").write_bytes(solid_jpeg((c * 100, i * 40, 0)))
    return root


def noise_jpeg(seed: int, size: tuple[int, int] = (12, 10)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return out.getvalue()


def import_row(image: str, label: str | None, ml_use: str | None = None) -> str:
    row: dict = {"imageGcsUri": image}
    if label is not None:
        row["classificationAnnotation"] = {"displayName": label}
    if ml_use is not None:
        row["dataItemResourceLabels"] = {"aiplatform.googleapis.com/ml_use": ml_use}
    return json.dumps(row)


def noise_pixels(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (20, 24, 3), dtype=np.uint8)


def encoded_image(seed: int, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(noise_pixels(seed)).save(out, format=fmt, **options)
    return out.getvalue()


def write_stock_shards(directory: str, *, per_split: int = 18, maxcount: int = 7) -> dict[str, int]:
    """train-NNNN.tar / val-NNNN.tar by webdataset's own ShardWriter; returns {sample key: seed}. Class c of
    sample i is i % 3; labels as .cls ints, .json {"label"} and .json {"cls"}; jpg, png and lossless webp."""
    seeds = {}
    for split_number, split in enumerate(("train", "val")):
        with wds.ShardWriter(f"{directory}/{split}-%04d.tar", maxcount=maxcount, verbose=0) as writer:
            for i in range(per_split):
                seed = split_number * 1000 + i
                key = f"{split}/s{i:05d}"
                seeds[key] = seed
                if i % 3 == 0:
                    sample = {"jpg": encoded_image(seed, "JPEG", quality=95), "cls": i % 3}
                elif i % 3 == 1:
                    sample = {"png": encoded_image(seed, "PNG"), "json": {"label": i % 3}}
                else:
                    sample = {"webp": encoded_image(seed, "WEBP", lossless=True), "json": {"cls": i % 3}}
                writer.write({"__key__": key, **sample})
    return seeds


def gzip_shards(directory, *, suffix: str = ".tar.gz") -> None:
    """Replace every .tar in ``directory`` by its gzip-compressed copy (train ones as two gzip members)."""
    import gzip

    for tar in sorted(directory.glob("*.tar")):
        data = tar.read_bytes()
        if tar.name.startswith("train"):  # several members, as pigz/bgzip write: one stream to a reader
            half = len(data) // 2
            compressed = gzip.compress(data[:half], mtime=0) + gzip.compress(data[half:], mtime=0)
        else:
            compressed = gzip.compress(data, mtime=0)
        tar.with_name(tar.stem + suffix).write_bytes(compressed)
        tar.unlink()
