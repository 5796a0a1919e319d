"""The SOURCE forms behind one dispatch (as timm's ``data/readers/reader_factory.py``): two tables, the forms
written ``prefix[:ARGUMENT]`` (``SOURCE_FORMS``) and the forms recognised by their shape (``SHAPED_FORMS``:
a Vertex AI dataset's resource name, import files, tar shards), with a directory as the fallback (ImageFolder,
or a directory of shards: told apart when listed).

``open_source`` parses a SOURCE string and lists its items. The tables are the one list of forms: they make the
CLI's help text, the "unknown source" error, ``source_kind`` and the data fingerprint's choice of what to list
(``source_location``). Each form is one module (``builtin``, ``cifar10``, ``image_folder``, ``import_files``,
``vertex_dataset``, ``webdataset``), imported only when a SOURCE of that form is opened: importing this module
loads no image code.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tpustream.sources.types import Source, SourceError
from tpustream.storage import io as storage

__all__ = [
    "SourceForm",
    "SOURCE_FORMS",
    "ShapedForm",
    "SHAPED_FORMS",
    "open_source",
    "source_kind",
    "source_location",
    "source_help",
]

IMAGE_FOLDER_USAGE = "DIR or gs://DIR of class sub-folders"  # the fallback: any other SOURCE
# Forms recognised by their shape rather than a prefix (docs/ARCHITECTURE.md, "SOURCE forms"):
IMPORT_FILES_USAGE = "FILE.jsonl|FILE.csv (Vertex AI import files; a comma list or PREFIX*.jsonl)"
MANAGED_DATASET_USAGE = "projects/P/locations/L/datasets/ID (a Vertex AI managed image dataset)"
SHARDS_USAGE = "DIR of .tar shards or SHARD.tar (WebDataset shards written by other tools; .tar.gz, .tgz too)"
IMPORT_FILE_SUFFIXES = (".jsonl", ".csv")
MANAGED_DATASET = re.compile(r"^projects/[^/]+/locations/[^/]+/datasets/[^/]+$")


@dataclass(frozen=True)
class SourceForm:
    """One SOURCE form: how users write it, and how to open it from what follows ``prefix:``."""

    usage: str  # "digits", "synthetic-cifar:N", "cifar10:PATH": a ":" means the form takes an argument
    open: Callable[[str], Source]
    reads_path: bool = False  # the argument is a local or gs:// path (a live source, listed to fingerprint)

    @property
    def takes_argument(self) -> bool:
        return ":" in self.usage


def _digits(_: str) -> Source:
    from tpustream.sources.builtin import digits_source

    return digits_source()


def _count(form: str, argument: str) -> int:
    try:
        count = int(argument)
    except ValueError:
        count = -1
    if count <= 0:
        spec = f"{form}:{argument}"
        raise SourceError(f"source {spec!r}: N must be a positive integer, e.g. {form}:1000")
    return count


def _synthetic_cifar(argument: str) -> Source:
    from tpustream.sources.builtin import synthetic_cifar_source

    return synthetic_cifar_source(_count("synthetic-cifar", argument))


def _synthetic_imagenet(argument: str) -> Source:
    from tpustream.sources.builtin import synthetic_imagenet_source

    return synthetic_imagenet_source(_count("synthetic-imagenet", argument))


def _cifar10(argument: str) -> Source:
    from tpustream.sources.cifar10 import cifar10_source

    return cifar10_source(argument)


SOURCE_FORMS: dict[str, SourceForm] = {
    "digits": SourceForm("digits", _digits),
    "synthetic-cifar": SourceForm("synthetic-cifar:N", _synthetic_cifar),
    "synthetic-imagenet": SourceForm("synthetic-imagenet:N", _synthetic_imagenet),
    "cifar10": SourceForm("cifar10:PATH", _cifar10, reads_path=True),
}


def _is_import_files(spec: str) -> bool:
    """A SOURCE naming Vertex AI import files: each comma-separated part ends in .jsonl or .csv."""
    parts = [part.strip() for part in spec.split(",")]
    return all(part.lower().endswith(IMPORT_FILE_SUFFIXES) for part in parts) and all(parts)


def _is_shard_files(spec: str) -> bool:
    """A SOURCE naming tar shards directly: ``x.tar`` (``.tar.gz``, ``.tgz``) or a brace pattern
    ``train-{000000..000009}.tar``."""
    return spec.lower().endswith((".tar", ".tar.gz", ".tgz"))


def _managed_dataset(spec: str, staging: str | None, names_given: bool) -> Source:
    from tpustream.sources.vertex_dataset import managed_dataset_source

    return managed_dataset_source(spec, staging=staging)


def _import_files(spec: str, staging: str | None, names_given: bool) -> Source:
    from tpustream.sources.import_files import import_files_source

    return import_files_source(spec)


def _shard_files(spec: str, staging: str | None, names_given: bool) -> Source:
    from tpustream.sources.webdataset import webdataset_source

    return webdataset_source(spec, mixed_labels=names_given)


@dataclass(frozen=True)
class ShapedForm:
    """A SOURCE form recognised by its shape rather than a prefix: whether a (stripped) SOURCE ``matches``
    it, and how to ``open`` it (with the staging location and whether --class-names was given)."""

    usage: str
    matches: Callable[[str], bool]
    open: Callable[[str, str | None, bool], Source]


# In the order they are tried (and listed): a dataset's resource name is never read as files.
SHAPED_FORMS: dict[str, ShapedForm] = {
    "managed-dataset": ShapedForm(
        MANAGED_DATASET_USAGE, lambda spec: MANAGED_DATASET.match(spec) is not None, _managed_dataset
    ),
    "import-files": ShapedForm(IMPORT_FILES_USAGE, _is_import_files, _import_files),
    "shards": ShapedForm(SHARDS_USAGE, _is_shard_files, _shard_files),
}


def source_help() -> str:
    """The SOURCE forms as the CLI's help lists them."""
    usages = [form.usage for form in SOURCE_FORMS.values()] + [form.usage for form in SHAPED_FORMS.values()]
    return " | ".join([*usages, IMAGE_FOLDER_USAGE]) + "."


def source_kind(spec: str) -> str:
    """Which family a SOURCE belongs to, from its text alone (nothing is read): "builtin" (digits,
    synthetic), a registered form's prefix ("cifar10"), a shaped form's name ("managed-dataset",
    "import-files", "shards": tar files named directly) or "directory" (ImageFolder, or a directory of shards:
    told apart when listed)."""
    spec = spec.strip()
    form, _ = _parse(spec)
    if form is not None:
        return next(name for name, f in SOURCE_FORMS.items() if f is form) if form.reads_path else "builtin"
    return next((kind for kind, shaped in SHAPED_FORMS.items() if shaped.matches(spec)), "directory")


def _parse(spec: str) -> tuple[SourceForm | None, str]:
    """The registered form ``spec`` is written in and its argument; ``(None, spec)`` for a directory."""
    prefix, sep, argument = spec.partition(":")
    form = SOURCE_FORMS.get(prefix)
    if form is None or bool(sep) != form.takes_argument:
        return None, spec
    return form, argument


def open_source(spec: str, *, staging: str | None = None, class_names: str | None = None) -> Source:
    """Parse a SOURCE string and list its items (no image is decoded yet).

    Args:
        spec: the SOURCE string (``tpustream shards create --help`` lists the forms).
        staging: a writable location for what a source must materialise first (a Vertex AI managed
            dataset is exported to import files under it); the dataset's own output when creating shards.
        class_names: ``--class-names`` (FILE or a,b,c): integer labels become these names, and the
            source's classes are exactly them (``tpustream.sources.class_names``).
    """
    if class_names is None:
        return _open(spec, staging, names_given=False)
    from tpustream.sources.class_names import apply_class_names, read_class_names

    names = read_class_names(class_names)
    return apply_class_names(_open(spec, staging, names_given=True), names)


def _open(spec: str, staging: str | None, *, names_given: bool) -> Source:
    form, argument = _parse(spec.strip())
    if form is not None:
        return form.open(argument)
    kind = source_kind(argument)
    if kind in SHAPED_FORMS:
        return SHAPED_FORMS[kind].open(argument.strip(), staging, names_given)
    try:
        path = storage.check_uri(argument)  # refuses pipe: and unsupported schemes; file:///x is /x
    except storage.StorageError as exc:
        raise SourceError(f"source {argument!r}: {exc}") from exc
    kind = storage.path_kind(path)
    if kind == "dir":
        from tpustream.sources.webdataset import is_shard_directory, webdataset_source

        if is_shard_directory(path):
            return webdataset_source(path, mixed_labels=names_given)
        from tpustream.sources.image_folder import image_folder_source

        return image_folder_source(path)
    if kind == "file":
        raise SourceError(
            f"source {argument!r} is a file; give a directory of class sub-folders (ImageFolder layout) "
            "or cifar10:PATH for CIFAR-10 batches"
        )
    usages = ", ".join(form.usage for form in SOURCE_FORMS.values())
    raise SourceError(
        f"unknown source {argument!r}: use {usages}, or a local/gs:// directory of class sub-folders"
    )


def source_location(spec: str) -> str | None:
    """The local or gs:// path a SOURCE reads (an archive or a directory), None for the built-in data."""
    form, argument = _parse(spec.strip())
    if form is None:
        return argument
    return argument if form.reads_path else None
