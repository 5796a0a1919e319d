"""Reading a dataset: its manifest (the contract every reader trusts) and ``shards verify``.

Kept apart from ``dataset.write`` (the writer) so readers (the loader, the trainer, evaluation) import no
encoding or planning code. The manifest's type and format check are ``artifacts.Manifest``; ``load_manifest``
adds what to do when a dataset is not there.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple, TypeVar

from tpustream.artifacts import MANIFEST_FORMAT, ArtifactError, Manifest, Shard, SkippedSummary, json_file_uri
from tpustream.dataset.tario import HashingReader, iter_tar_samples
from tpustream.errors import TpustreamError
from tpustream.image.codec import image_member
from tpustream.storage import io as storage

__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_FORMAT",
    "INDEX_DIR",
    "ShardError",
    "SampleIndexEntry",
    "Manifest",
    "SkippedSummary",
    "index_path",
    "has_sample_index",
    "iter_sample_index",
    "load_manifest",
    "read_manifest",
    "manifest_digest",
    "verify_shards",
]

MANIFEST_NAME = "manifest.json"
# The sample index: one JSONL file per shard, one line per sample (SampleIndexEntry), named in the manifest's
# shard entry ("sample_index", "sample_index_sha256"). Datasets written before it have none: it is optional.
INDEX_DIR = "index"

T = TypeVar("T")
R = TypeVar("R")


class ShardError(TpustreamError, RuntimeError):
    """Shard creation or verification cannot proceed; the message says what and what to do."""


_PHASH = re.compile("[0-9a-f]{16}")
_PHASH_WINDOWS = re.compile("[0-9a-f]{144}")
_json_string = json.JSONEncoder().encode  # a str's JSON form, without json.dumps' per-call setup


class SampleIndexEntry(NamedTuple):
    """One line of a shard's sample index: which source image a shard sample came from, and what it is.

    A NamedTuple, not a dataclass: the writer makes one per sample, and that is the hot path of a CIFAR-size
    write (a frozen dataclass costs several times more to build)."""

    key: str  # the sample's key in the shard
    sha256: str  # of the image bytes written (equal bytes: the same image, whatever its name)
    width: int  # from the header; 0 when the header could not be read
    height: int
    format: str  # the image member's extension: jpg, png or ppm
    source: str  # where it came from (Source.locate: a gs:// or local path, cifar10:PATH#17)
    label: str  # the class name
    # the image's 64-bit perceptual hash (image.phash) as 16 hex digits; None in lines written before it
    phash: str | None = None
    # a thumbnail's window hashes of its split's role (image.phash_windows.window_role: train the 9 base
    # windows, val and test the 9 query windows) as 9 x 16 hex digits; None for larger images and in lines
    # written before them
    phash_windows: str | None = None

    def to_json_line(self) -> str:
        # by hand, for the same reason; key, sha256, format and phash never need JSON's escaping
        phash = "" if self.phash is None else f',"phash":"{self.phash}"'
        if self.phash_windows is not None:
            phash += f',"phash_windows":"{self.phash_windows}"'
        return (
            f'{{"key":"{self.key}","sha256":"{self.sha256}","width":{self.width},"height":{self.height},'
            f'"format":"{self.format}","source":{_json_string(self.source)},"class":{_json_string(self.label)}'
            f"{phash}}}"
        )

    @classmethod
    def from_json_line(cls, line: str) -> SampleIndexEntry:
        row = json.loads(line)
        phash = row.get("phash")
        if phash is not None and not _PHASH.fullmatch(str(phash)):
            raise ValueError(f"phash {phash!r} is not 16 hex digits")
        windows = row.get("phash_windows")
        if windows is not None and not _PHASH_WINDOWS.fullmatch(str(windows)):
            raise ValueError(f"phash_windows {windows!r} is not 9 x 16 hex digits")
        return cls(
            key=str(row["key"]),
            sha256=str(row["sha256"]),
            width=int(row["width"]),
            height=int(row["height"]),
            format=str(row["format"]),
            source=str(row["source"]),
            label=str(row["class"]),
            phash=None if phash is None else str(phash),
            phash_windows=None if windows is None else str(windows),
        )


def index_path(shard_path: str) -> str:
    """The sample index beside a shard: ``train/train-000003.tar`` -> ``index/train-000003.jsonl``."""
    name = shard_path.rsplit("/", 1)[-1]
    return f"{INDEX_DIR}/{name[: -len('.tar')] if name.endswith('.tar') else name}.jsonl"


def has_sample_index(manifest: Manifest) -> bool:
    """Whether every shard of the dataset lists its sample index (datasets written before it have none)."""
    return manifest.has_sample_index()


def iter_sample_index(
    uri: str, manifest: Manifest, split: str, *, workers: int = 8
) -> Iterator[SampleIndexEntry]:
    """Every sample index entry of ``split``, shard by shard in manifest order (files read concurrently)."""
    for _shard, entries in iter_shard_indexes(uri, manifest, split, workers=workers):
        yield from entries


def iter_shard_indexes(
    uri: str, manifest: Manifest, split: str, *, workers: int = 8
) -> Iterator[tuple[Shard, list[SampleIndexEntry]]]:
    """Each shard of ``split`` with its sample index entries, in manifest order (files read concurrently)."""
    uri = storage.check_uri(uri).rstrip("/")
    found = manifest.split(split)
    shards = found.shards if found is not None else []

    def read(shard: Shard) -> bytes:
        if not shard.sample_index:
            raise ShardError(f"{uri}: shard {shard.path} has no sample index (re-create the dataset)")
        try:
            return storage.read_bytes(storage.join(uri, shard.sample_index))
        except storage.NotFound as exc:
            raise ShardError(
                f"{uri}: the sample index {shard.sample_index} listed in the manifest is missing: "
                "re-create the dataset (tpustream shards create --overwrite)"
            ) from exc

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for shard, data in _in_order(pool, read, shards, window=2 * max(1, workers)):
            yield shard, list(_index_lines(uri, shard, data))


def _in_order(
    pool: ThreadPoolExecutor, fn: Callable[[T], R], items: list[T], *, window: int
) -> Iterator[tuple[T, R]]:
    """(item, fn(item)) in order, at most ``window`` running or done ahead of the consumer: a large
    dataset's index (~200 bytes a sample) is never all in memory at once."""
    pending: deque[tuple[T, Future[R]]] = deque()
    for item in items:
        pending.append((item, pool.submit(fn, item)))
        if len(pending) >= window:
            done, future = pending.popleft()
            yield done, future.result()
    while pending:
        done, future = pending.popleft()
        yield done, future.result()


def _index_lines(uri: str, shard: Shard, data: bytes) -> Iterator[SampleIndexEntry]:
    for number, line in enumerate(data.decode().splitlines(), 1):
        try:
            yield SampleIndexEntry.from_json_line(line)
        except (ValueError, KeyError, TypeError) as exc:
            raise ShardError(
                f"{storage.join(uri, shard.sample_index)}:{number} is not a sample index line ({exc}): "
                "re-create the dataset"
            ) from exc


def _manifest_uri(uri: str) -> tuple[str, str]:
    uri = storage.check_uri(uri).rstrip("/")
    return uri, json_file_uri(uri, MANIFEST_NAME)


def _why_no_manifest(uri: str) -> str:
    """What ``uri`` holds instead of a dataset, and what to run: the hint of read_manifest's error."""
    import os

    from tpustream.sources.image_folder import IMAGE_EXTENSIONS

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


def load_manifest(uri: str) -> Manifest:
    """A dataset's manifest, from the dataset URI (or the manifest's own URI), its format and shape checked.

    Raises:
        ShardError: there is no manifest (the message says what is there instead), or it is not one this
            version reads.
    """
    uri, manifest_uri = _manifest_uri(uri)
    try:
        return Manifest.read(manifest_uri)
    except storage.NotFound as exc:
        raise ShardError(
            f"no dataset at {uri}: {manifest_uri} does not exist ({_why_no_manifest(uri)})"
        ) from exc
    except ArtifactError as exc:
        raise ShardError(str(exc)) from exc


def read_manifest(uri: str) -> dict[str, Any]:
    """``load_manifest`` as the JSON document, for the code that wants the document itself (the benchmarks,
    tools/); new code takes the ``Manifest``."""
    return load_manifest(uri).to_json()


def manifest_digest(uri: str) -> str:
    """sha256 of the manifest bytes: identifies the exact dataset (shards' hashes are inside)."""
    uri, manifest_uri = _manifest_uri(uri)
    return hashlib.sha256(storage.read_bytes(manifest_uri)).hexdigest()


def _check_sample(key: str, fields: dict[str, bytes], num_classes: int, max_pixels: int) -> str | None:
    """Why the loader would count this sample undecodable (decoding it as the loader does), or None."""
    import random

    from tpustream.image.transforms import Augment, prepare_image

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
    dataset: str, shard: Shard, *, deep: bool = False, num_classes: int = 0, max_pixels: int = 0
) -> list[str]:
    uri = storage.join(dataset, shard.path)
    bad_samples: list[str] = []
    try:
        with storage.open_read(uri) as raw:
            reader = HashingReader(raw)
            samples = 0
            for key, fields in iter_tar_samples(reader, shard.num_bytes):  # type: ignore[arg-type]
                if "cls" not in fields or len(fields) != 2:
                    return [
                        f"{shard.path}: sample {key} has members {sorted(fields)}, expected one image + cls"
                    ]
                samples += 1
                if deep:
                    problem = _check_sample(key, fields, num_classes, max_pixels)
                    if problem:
                        bad_samples.append(f"{shard.path}: {problem}")
            reader.drain()
    except storage.NotFound:
        return [f"{shard.path}: missing"]
    except Exception as exc:  # a corrupt shard can fail in many ways; all mean "bad shard"
        return [f"{shard.path}: unreadable ({type(exc).__name__}: {exc})"]
    problems = []
    if reader.num_bytes != shard.num_bytes:
        problems.append(f"{reader.num_bytes} bytes, manifest says {shard.num_bytes}")
    if samples != shard.num_samples:
        problems.append(f"{samples} samples, manifest says {shard.num_samples}")
    if reader.sha256.hexdigest() != shard.sha256:
        problems.append("sha256 differs from the manifest")
    if shard.sample_index:
        problems.extend(_check_index(dataset, shard))
    return ([f"{shard.path}: " + "; ".join(problems)] if problems else []) + bad_samples


def _check_index(dataset: str, shard: Shard) -> list[str]:
    """The shard's sample index against the manifest: present, unchanged, one line per sample."""
    try:
        data = storage.read_bytes(storage.join(dataset, shard.sample_index))
    except storage.NotFound:
        return [f"sample index {shard.sample_index} missing"]
    problems = []
    if shard.sample_index_sha256 and hashlib.sha256(data).hexdigest() != shard.sample_index_sha256:
        problems.append(f"sample index {shard.sample_index}: sha256 differs from the manifest")
    lines = data.count(b"\n")
    if lines != shard.num_samples:
        problems.append(
            f"sample index {shard.sample_index}: {lines} lines, manifest says {shard.num_samples}"
        )
    return problems


def verify_shards(
    uri: str, *, workers: int = 8, progress: bool = True, deep: bool = False, max_pixels: int | None = None
) -> tuple[int, list[str]]:
    """Re-read every shard and check count, size and sha256 against the manifest; ``deep`` also decodes
    every image as the loader would (pixel budget ``max_pixels``, default 64 Mi px) and lists each sample
    it would skip, by shard and key.

    Returns (number of shards checked, problems); an empty list means the dataset is intact.
    """
    from tpustream.image.codec import DEFAULT_MAX_PIXELS

    uri = storage.check_uri(uri).rstrip("/")
    manifest = load_manifest(uri)
    shards = manifest.all_shards()
    options = {
        "deep": deep,
        "num_classes": len(manifest.classes),
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
