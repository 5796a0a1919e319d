"""WebDataset shards written by other tools as a SOURCE: re-sharded into tpustream's equal-count layout.

What is read (the conventions of the webdataset library, ``webdataset/tariterators.py``): a sample is the run
of consecutive tar members that share a key, the member name up to the first dot of its file name
(``dir/0001.jpg`` and ``dir/0001.cls`` make sample ``dir/0001``; the extension is lower-cased). Each sample
needs one image member (IMAGE_EXTS, the first present in that order) and a label:

- a ``.cls`` member: an integer class index (what ``webdataset.ShardWriter`` users write) or a class name;
- else a ``.json`` member whose ``label``, ``cls`` or ``class`` field (LABEL_FIELDS, in that order) holds one.

Integer labels and class names in one source are refused (``3`` and ``circle`` would be unrelated classes;
the error names which shards use which) unless ``--class-names`` names the integers (index i -> name i).

Class names are the labels as text, ordered numerically when every label is an integer (so index 3 stays
class "3") and by name otherwise. A shard whose path below the source (or file name) contains the word
``train``/``training`` keeps its samples in train, ``val``/``valid``/``validation`` in val and ``test``/``testing``
in test (held out from model selection, as for Vertex AI import files); the rest are split 10% to val per
class. An explicit ``--val-fraction`` re-splits every train/val sample, as it does for every source.

A SOURCE is a directory (local or gs://) holding ``.tar`` files and no ``manifest.json``, one ``x.tar``, a
comma list of them, a ``PREFIX*.tar`` pattern or a brace range ``shard-{000000..000009}.tar``. Shards may be
gzip-compressed (``.tar.gz``, ``.tgz``, as webdataset's own test shards are): they are decompressed while
streaming, and their images are found again through a gzip index (``tpustream/sources/gzip_index.py``), never
through a decompressed copy.

Listing reads every shard once, streaming, several shards at a time; it keeps each image member's place
(offset, size), not its bytes (in a .tar.gz: its inflated offset, plus the gzip index). Writing the new
shards then fetches each image by one ranged read (a GET with a Range header on GCS; in a .tar.gz, from the
index's checkpoint before it: up to 1 MiB more). So the source's bytes are read twice: the price of a plan (seeded shuffle,
equal-count shards, a per-class val split) that needs every label before the first shard is written.
Bad samples never raise and never vanish: a sample without an image, without a label or with a label that
does not parse, and a damaged tar (samples after the damage cannot be found) are ``Source.rejected``
entries, counted in the manifest's ``skipped``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO

from tpustream.image.codec import UnreadableImage, prepare_image_bytes
from tpustream.sources.class_names import is_integer_label
from tpustream.sources.gzip_index import Checkpoint, IndexingGunzip, read_at
from tpustream.sources.types import Item, Rejected, Source, SourceError
from tpustream.storage import io as storage

__all__ = [
    "IMAGE_EXTS",
    "LABEL_FIELDS",
    "is_shard_directory",
    "expand_shard_files",
    "shard_objects",
    "webdataset_source",
]

log = logging.getLogger(__name__)

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "ppm", "bmp")
LABEL_FIELDS = ("label", "cls", "class")
SHARD_USAGE = (
    "a directory of .tar (or .tar.gz, .tgz) shards, x.tar, a.tar,b.tar, PREFIX*.tar or "
    "shard-{000000..000009}.tar"
)
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
GZIP_SUFFIXES = (".gz", ".tgz")
LISTING_THREADS = 8  # shards listed at once: on GCS each is a stream of GETs, on disk a read
_SPLIT_WORDS = (
    {"train": "train", "training": "train"}
    | {word: "val" for word in ("val", "valid", "validation")}
    | {word: "test" for word in ("test", "testing")}
)
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext (tariterators.py)


def is_shard_directory(path: str) -> bool:
    """Whether the directory ``path`` is read as WebDataset shards: tar files (TAR_SUFFIXES) are more than half
    of what it holds, and it has no manifest.json (that is a tpustream dataset)."""
    objects = storage.list_objects(path)
    names = [obj.uri[len(path.rstrip("/")) + 1 :] for obj in objects]
    tars = [name for name in names if name.lower().endswith(TAR_SUFFIXES)]
    return bool(tars) and not any(name == "manifest.json" for name in names) and len(tars) * 2 > len(names)


def expand_shard_files(spec: str) -> list[str]:
    """The tar files (TAR_SUFFIXES) a SOURCE names, in sorted order per comma part, each once."""
    import braceexpand

    from tpustream.sources.import_files import expand_pattern

    files: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        try:
            uri = storage.check_uri(part)
        except storage.StorageError as exc:
            raise SourceError(f"source {spec!r}: {exc}") from exc
        if "*" in uri:
            matches = expand_pattern(spec, uri, example="gs://BUCKET/shards/*.tar", suffixes=".tar")
        elif storage.path_kind(uri) == "dir" and not uri.lower().endswith(TAR_SUFFIXES):
            listed = storage.list_objects(uri)
            matches = [obj.uri for obj in listed if obj.uri.lower().endswith(TAR_SUFFIXES)]
            if not matches:
                raise SourceError(f"source {spec!r}: no .tar (.tar.gz, .tgz) file under {uri}")
        else:
            matches = list(braceexpand.braceexpand(uri))
        files.extend(m for m in matches if m not in files)
    if not files:
        raise SourceError(f"source {spec!r}: names no .tar file; give {SHARD_USAGE}")
    return files


def shard_objects(spec: str) -> list[storage.ObjectInfo]:
    """What the data fingerprint hashes: every shard's name, size and version (generation, mtime)."""
    try:
        return sorted((storage.stat(uri) for uri in expand_shard_files(spec)), key=lambda obj: obj.uri)
    except storage.NotFound as exc:
        raise SourceError(f"source {spec!r}: {exc}") from exc


@dataclass
class _Sample:
    key: str
    image: tuple[str, int, int] | None = None  # (ext, offset, size)
    label: str | None = None
    problem: str = ""  # why the label cannot be read


@dataclass
class _ShardListing:
    uri: str
    split: str | None
    samples: list[_Sample] = field(default_factory=list)
    damaged: str = ""  # why the tar could not be read to its end
    gzip_index: list[Checkpoint] | None = None  # a .tar.gz: where to restart inflating (offsets are inflated)


def _split_of(uri: str, root: str) -> str | None:
    relative = uri[len(root) :] if root and uri.startswith(root) else uri.rsplit("/", 1)[-1]
    words = [word for word in re.split(r"[^a-z]+", relative.lower()) if word]
    found = {_SPLIT_WORDS[word] for word in words if word in _SPLIT_WORDS}
    return found.pop() if len(found) == 1 else None


def _label_of(sample: _Sample, members: dict[str, bytes]) -> None:
    """Set ``sample.label`` from its .cls member or else its .json member's label field."""
    if "cls" in members:
        try:
            text = members["cls"].decode("utf-8").strip()
        except UnicodeDecodeError:
            sample.problem = "its .cls member is not UTF-8 text"
            return
        if text:
            sample.label = str(int(text)) if re.fullmatch(r"[+-]?\d+", text) else text
        return
    if "json" in members:
        try:
            meta = json.loads(members["json"])
        except (ValueError, UnicodeDecodeError) as exc:
            sample.problem = f"its .json member does not parse ({exc})"
            return
        value = next((meta[name] for name in LABEL_FIELDS if isinstance(meta, dict) and name in meta), None)
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            if value is not None:
                sample.problem = f"its .json label {value!r} is neither an integer nor a class name"
            return
        text = str(value).strip()
        if text:
            sample.label = text


def _list_shard(uri: str, root: str) -> _ShardListing:
    """Every sample of one tar: its image member's place and its label; the tar is read once, streaming
    (a .tar.gz inflated on the way, its gzip index kept)."""
    listing = _ShardListing(uri, _split_of(uri, root))
    current: _Sample | None = None
    members: dict[str, bytes] = {}

    def close() -> None:
        if current is not None:
            _label_of(current, members)
            listing.samples.append(current)

    try:
        with storage.open_read(uri) as raw:
            stream: IO[bytes] = raw
            if uri.lower().endswith(GZIP_SUFFIXES):
                gunzip = IndexingGunzip(raw)
                listing.gzip_index = gunzip.checkpoints
                stream = io.BufferedReader(gunzip, buffer_size=1 << 20)
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    match = _KEY_EXT.match(member.name)
                    if match is None:
                        continue  # no extension: not part of a sample (webdataset skips it too)
                    key, ext = match.group(1), match.group(2).lower()
                    if current is None or key != current.key:
                        close()
                        current, members = _Sample(key), {}
                    if ext in IMAGE_EXTS:
                        if current.image is None or IMAGE_EXTS.index(ext) < IMAGE_EXTS.index(
                            current.image[0]
                        ):
                            current.image = (ext, member.offset_data, member.size)
                    elif ext in ("cls", "json") and member.size <= 1 << 20:
                        handle = tar.extractfile(member)
                        members[ext] = handle.read() if handle is not None else b""
                close()
    except storage.StorageError as exc:
        listing.damaged = str(exc)
    except (tarfile.TarError, EOFError, OSError) as exc:
        listing.damaged = f"damaged tar after {len(listing.samples)} sample(s) ({exc})"
    return listing


def _ordered_classes(labels: set[str]) -> list[str]:
    if all(is_integer_label(label) for label in labels):
        return sorted(labels, key=int)
    return sorted(labels)


def _few(names: list[str], count: int = 3) -> str:
    return ", ".join(names[:count]) + (f" and {len(names) - count} more" if len(names) > count else "")


def _refuse_mixed_labels(spec: str, root: str, kept: list[tuple[str, _Sample, str | None]]) -> None:
    """Refuse integer labels beside class names: ``3`` and ``circle`` would be unrelated classes."""
    shards: dict[bool, dict[str, None]] = {True: {}, False: {}}  # integer? -> shards using it, in order
    labels: dict[bool, set[str]] = {True: set(), False: set()}
    for uri, sample, _ in kept:
        assert sample.label is not None
        integer = is_integer_label(sample.label)
        shards[integer][uri[len(root) :] if root else uri] = None
        labels[integer].add(sample.label)
    if not labels[True] or not labels[False]:
        return
    raise SourceError(
        f"source {spec!r} mixes integer labels ({_few(_ordered_classes(labels[True]))} in "
        f"{_few(list(shards[True]))}) with class names ({_few(sorted(labels[False]))} in "
        f"{_few(list(shards[False]))}), which would make unrelated classes: give --class-names FILE|a,b,c to "
        "name the integers (index i -> name i), or write the shards with one label form"
    )


def webdataset_source(spec: str, *, mixed_labels: bool = False) -> Source:
    """The WebDataset-shards SOURCE form: see the module. Integer and named labels together are refused
    unless ``mixed_labels`` (``--class-names`` then names the integers: ``tpustream.sources.class_names``)."""
    spec = spec.strip()
    files = expand_shard_files(spec)
    directory = "," not in spec and "*" not in spec and not spec.lower().endswith(TAR_SUFFIXES)
    root = storage.check_uri(spec).rstrip("/") + "/" if directory else ""
    started = time.perf_counter()
    threads = min(LISTING_THREADS, len(files)) if storage.is_gcs(files[0]) else min(2, len(files))
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="tpustream-wds-list") as pool:
        listings = list(pool.map(lambda uri: _list_shard(uri, root), files))

    rejected: list[Rejected] = []
    kept: list[tuple[str, _Sample, str | None]] = []  # (shard uri, sample, split)
    for listing in listings:
        for sample in listing.samples:
            ref = f"{listing.uri}#{sample.key}"
            if sample.image is None:
                rejected.append(
                    Rejected(ref, "malformed-sample", f"{ref}: no image member ({', '.join(IMAGE_EXTS)})")
                )
            elif sample.label is None:
                reason, why = ("malformed-sample", sample.problem) if sample.problem else ("empty-label", "")
                rejected.append(
                    Rejected(
                        ref, reason, f"{ref}: {why or 'no label (.cls, or a .json label/cls/class field)'}"
                    )
                )
            else:
                kept.append((listing.uri, sample, listing.split))
        if listing.damaged:
            rejected.append(Rejected(listing.uri, "malformed-sample", f"{listing.uri}: {listing.damaged}"))
    if not kept:
        detail = f"; e.g. {rejected[0].message}" if rejected else ""
        hint = "; the CIFAR-10 python archive is cifar10:PATH" if spec.lower().endswith(GZIP_SUFFIXES) else ""
        raise SourceError(
            f"source {spec!r}: no labelled image sample in {len(files)} tar file(s){detail}{hint}"
        )
    if not mixed_labels:
        _refuse_mixed_labels(spec, root, kept)

    classes = _ordered_classes({sample.label for _, sample, _ in kept if sample.label is not None})
    index = {name: i for i, name in enumerate(classes)}
    places: dict[str, tuple[str, str, int, int]] = {}  # ref -> (tar uri, ext, offset, size)
    items: list[Item] = []
    for uri, sample, split in kept:
        assert sample.image is not None and sample.label is not None
        ref = f"{uri}#{sample.key}"
        if ref in places:  # the same key twice in one tar (not consecutive): keep the first
            rejected.append(Rejected(ref, "malformed-sample", f"{ref}: key repeated in the same tar"))
            continue
        places[ref] = (uri, *sample.image)
        items.append(Item(ref, index[sample.label], split))
    elapsed = time.perf_counter() - started
    log.info(
        "listed %d sample(s) in %d tar file(s) of %s in %.1f s (%d rejected)",
        len(items),
        len(files),
        spec,
        elapsed,
        len(rejected),
    )

    gzip_indexes = {listing.uri: listing.gzip_index for listing in listings if listing.gzip_index is not None}

    def load(item: Item, max_side: int | None) -> tuple[bytes, str]:
        ref = str(item.ref)
        uri, ext, offset, size = places[ref]
        try:
            index = gzip_indexes.get(uri)
            if index is None:
                data = storage.read_range(uri, offset, size)
            else:
                data = read_at(
                    lambda start, length: storage.read_range(uri, start, length), index, offset, size
                )
        except (storage.StorageError, OSError) as exc:
            raise UnreadableImage(f"{ref}: cannot read ({exc})") from exc
        if len(data) != size:
            raise UnreadableImage(f"{ref}: the tar is shorter than when it was listed (changed meanwhile?)")
        return prepare_image_bytes(data, os.extsep + ext, max_side, ref)

    counts = {split: sum(1 for item in items if item.split == split) for split in ("train", "val", "test")}
    named = ", ".join(files[:2]) + (f" and {len(files) - 2} more" if len(files) > 2 else "")
    description = (
        f"WebDataset shards {named}: {len(items)} images, {len(classes)} classes ({counts['train']} train / "
        f"{counts['val']} val / {counts['test']} test / {len(items) - sum(counts.values())} unassigned), "
        f"{len(rejected)} samples rejected"
    )
    return Source(
        spec=spec,
        description=description,
        classes=classes,
        items=items,
        loader=load,
        rejected=rejected,
        locator=lambda item: str(item.ref),
    )
