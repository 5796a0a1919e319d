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


class ShardError(RuntimeError):
    """Shard creation or verification cannot proceed; the message says what and what to do."""


def _manifest_uri(uri: str) -> tuple[str, str]:
    uri = storage.check_uri(uri).rstrip("/")
    return uri, uri if uri.endswith(".json") else storage.join(uri, MANIFEST_NAME)


def read_manifest(uri: str) -> dict[str, Any]:
    """Load a dataset's manifest from the dataset URI (or the manifest's own URI) and check its shape."""
    uri, manifest_uri = _manifest_uri(uri)
    try:
        manifest = json.loads(storage.read_bytes(manifest_uri))
    except storage.NotFound as exc:
        raise ShardError(
            f"no dataset at {uri}: {manifest_uri} does not exist (an unfinished `shards create` "
            "leaves no manifest; re-run it to resume)"
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


def _check_shard(dataset: str, shard: dict[str, Any]) -> str | None:
    uri = storage.join(dataset, shard["path"])
    try:
        with storage.open_read(uri) as raw:
            reader = HashingReader(raw)
            samples = 0
            for key, fields in iter_tar_samples(reader):  # type: ignore[arg-type]
                if "cls" not in fields or len(fields) != 2:
                    return f"{shard['path']}: sample {key} has members {sorted(fields)}, expected one image + cls"
                samples += 1
            reader.drain()
    except storage.NotFound:
        return f"{shard['path']}: missing"
    except Exception as exc:  # a corrupt shard can fail in many ways; all mean "bad shard"
        return f"{shard['path']}: unreadable ({type(exc).__name__}: {exc})"
    problems = []
    if reader.num_bytes != shard["num_bytes"]:
        problems.append(f"{reader.num_bytes} bytes, manifest says {shard['num_bytes']}")
    if samples != shard["num_samples"]:
        problems.append(f"{samples} samples, manifest says {shard['num_samples']}")
    if reader.sha256.hexdigest() != shard["sha256"]:
        problems.append("sha256 differs from the manifest")
    return f"{shard['path']}: " + "; ".join(problems) if problems else None


def verify_shards(uri: str, *, workers: int = 8, progress: bool = True) -> tuple[int, list[str]]:
    """Re-read every shard and check count, size and sha256 against the manifest.

    Returns (number of shards checked, problems); an empty list means the dataset is intact.
    """
    uri = storage.check_uri(uri).rstrip("/")
    manifest = read_manifest(uri)
    shards = [s for split in manifest["splits"].values() for s in split["shards"]]
    from tqdm import tqdm

    problems: list[str] = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = pool.map(lambda s: _check_shard(uri, s), shards)
        for problem in tqdm(
            results, total=len(shards), unit="shard", desc="verify", disable=not progress or None
        ):
            if problem:
                problems.append(problem)
    return len(shards), problems
