"""Reading a dataset: its manifest (the contract every reader trusts) and ``shards verify``.

Kept apart from ``shards.py`` (the writer) so readers (the loader, the trainer, evaluation) import no
encoding or planning code.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tpustream import storage
from tpustream.errors import TpustreamError
from tpustream.imagecodec import image_member
from tpustream.tario import HashingReader, iter_tar_samples

__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_FORMAT",
    "ShardError",
    "read_manifest",
    "manifest_digest",
    "verify_shards",
]

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "tpustream.shards/v1"


class ShardError(TpustreamError, RuntimeError):
    """Shard creation or verification cannot proceed; the message says what and what to do."""


def _manifest_uri(uri: str) -> tuple[str, str]:
    uri = storage.check_uri(uri).rstrip("/")
    return uri, uri if uri.endswith(".json") else storage.join(uri, MANIFEST_NAME)


def _why_no_manifest(uri: str) -> str:
    """What ``uri`` holds instead of a dataset, and what to run: the hint of read_manifest's error."""
    import os

    from tpustream.file_sources import IMAGE_EXTENSIONS

    where = "" if storage.is_gcs(uri) or os.path.isabs(uri) else f", relative to {os.getcwd()}"
    try:
        found = [obj.uri[len(uri) + 1 :] for obj in storage.sample_objects(uri)]
    except storage.StorageError:
        found = []
    if not found:
        return (
            f"nothing is there{where}: check the path, or create the dataset with `tpustream shards create`"
        )
    if any(name.startswith("_records/") for name in found):
        return "an unfinished `shards create` left shards without a manifest: re-run it to resume"
    if any(os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS for name in found):
        return (
            f"it holds images, not shards{where}: make a dataset from them first with `tpustream shards "
            f"create --source {uri} --output DATASET` and pass DATASET"
        )
    if any(name.endswith(".tar") for name in found):
        return (
            f"it holds .tar files but no manifest{where}: shards from another tool are re-sharded with "
            f"`tpustream shards create --source {uri} --output DATASET`"
        )
    return f"it holds no shards{where}, e.g. {found[0]}: pass the directory `tpustream shards create` wrote"


def read_manifest(uri: str) -> dict[str, Any]:
    """Load a dataset's manifest from the dataset URI (or the manifest's own URI) and check its shape."""
    uri, manifest_uri = _manifest_uri(uri)
    try:
        manifest = json.loads(storage.read_bytes(manifest_uri))
    except storage.NotFound as exc:
        raise ShardError(
            f"no dataset at {uri}: {manifest_uri} does not exist ({_why_no_manifest(uri)})"
        ) from exc
    except ValueError as exc:
        raise ShardError(f"{manifest_uri} is not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ShardError(f"{manifest_uri} is not a tpustream manifest (expected format {MANIFEST_FORMAT!r})")
    for key in ("classes", "splits"):
        if key not in manifest:
            raise ShardError(f"{manifest_uri} lacks {key!r}: re-create the dataset")
    return manifest


def manifest_digest(uri: str) -> str:
    """sha256 of the manifest bytes: identifies the exact dataset (shards' hashes are inside)."""
    uri, manifest_uri = _manifest_uri(uri)
    return hashlib.sha256(storage.read_bytes(manifest_uri)).hexdigest()


def _check_sample(key: str, fields: dict[str, bytes], num_classes: int, max_pixels: int) -> str | None:
    """Why the loader would count this sample undecodable (decoding it as the loader does), or None."""
    import random

    from tpustream.transforms import Augment, prepare_image

    try:
        label = int(fields["cls"])
    except (KeyError, ValueError):
        return f"sample {key}: no valid .cls"
    if not 0 <= label < num_classes:
        return f"sample {key}: class {label} out of range for {num_classes} classes"
    ext = image_member(fields)
    if ext is None:
        return f"sample {key}: no image (members {sorted(fields)})"
    try:
        prepare_image(
            fields[ext], ext, Augment(output_size=64, train=False, max_pixels=max_pixels), random.Random(0)
        )
    except Exception as exc:  # whatever the decoder raises, the loader would skip this sample
        return f"sample {key}: undecodable {ext} ({exc})"
    return None


def _check_shard(
    dataset: str, shard: dict[str, Any], *, deep: bool = False, num_classes: int = 0, max_pixels: int = 0
) -> list[str]:
    uri = storage.join(dataset, shard["path"])
    bad_samples: list[str] = []
    try:
        with storage.open_read(uri) as raw:
            reader = HashingReader(raw)
            samples = 0
            for key, fields in iter_tar_samples(reader, int(shard["num_bytes"])):  # type: ignore[arg-type]
                if "cls" not in fields or len(fields) != 2:
                    return [
                        f"{shard['path']}: sample {key} has members {sorted(fields)}, expected one image + cls"
                    ]
                samples += 1
                if deep:
                    problem = _check_sample(key, fields, num_classes, max_pixels)
                    if problem:
                        bad_samples.append(f"{shard['path']}: {problem}")
            reader.drain()
    except storage.NotFound:
        return [f"{shard['path']}: missing"]
    except Exception as exc:  # a corrupt shard can fail in many ways; all mean "bad shard"
        return [f"{shard['path']}: unreadable ({type(exc).__name__}: {exc})"]
    problems = []
    if reader.num_bytes != shard["num_bytes"]:
        problems.append(f"{reader.num_bytes} bytes, manifest says {shard['num_bytes']}")
    if samples != shard["num_samples"]:
        problems.append(f"{samples} samples, manifest says {shard['num_samples']}")
    if reader.sha256.hexdigest() != shard["sha256"]:
        problems.append("sha256 differs from the manifest")
    return ([f"{shard['path']}: " + "; ".join(problems)] if problems else []) + bad_samples


def verify_shards(
    uri: str, *, workers: int = 8, progress: bool = True, deep: bool = False, max_pixels: int | None = None
) -> tuple[int, list[str]]:
    """Re-read every shard and check count, size and sha256 against the manifest; ``deep`` also decodes
    every image as the loader would (pixel budget ``max_pixels``, default 64 Mi px) and lists each sample
    it would skip, by shard and key.

    Returns (number of shards checked, problems); an empty list means the dataset is intact.
    """
    from tpustream.imagecodec import DEFAULT_MAX_PIXELS

    uri = storage.check_uri(uri).rstrip("/")
    manifest = read_manifest(uri)
    shards = [s for split in manifest["splits"].values() for s in split["shards"]]
    options = {
        "deep": deep,
        "num_classes": len(manifest["classes"]),
        "max_pixels": max_pixels or DEFAULT_MAX_PIXELS,
    }
    from tqdm import tqdm

    problems: list[str] = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = pool.map(lambda s: _check_shard(uri, s, **options), shards)  # type: ignore[arg-type]
        for found in tqdm(
            results, total=len(shards), unit="shard", desc="verify", disable=not progress or None
        ):
            problems.extend(found)
    return len(shards), problems
