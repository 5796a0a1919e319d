"""The SOURCE forms: a registry ``{prefix: SourceForm}``, with an ImageFolder directory as the fallback.

``open_source`` parses a SOURCE string and lists its items. The registry's keys and usages are the one
list of forms: they make the CLI's help text, the "unknown source" error and the data fingerprint's
choice of what to list (``source_location``). Importing this module loads no image code: each form
imports its module (``builtin_sources``, ``file_sources``) only when opened.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tpustream import storage
from tpustream.source_types import Source, SourceError

__all__ = ["SourceForm", "SOURCE_FORMS", "open_source", "source_location", "source_help"]

IMAGE_FOLDER_USAGE = "DIR or gs://DIR of class sub-folders"  # the fallback: any other SOURCE


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
    from tpustream.builtin_sources import digits_source

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
    from tpustream.builtin_sources import synthetic_cifar_source

    return synthetic_cifar_source(_count("synthetic-cifar", argument))


def _synthetic_imagenet(argument: str) -> Source:
    from tpustream.builtin_sources import synthetic_imagenet_source

    return synthetic_imagenet_source(_count("synthetic-imagenet", argument))


def _cifar10(argument: str) -> Source:
    from tpustream.file_sources import cifar10_source

    return cifar10_source(argument)


SOURCE_FORMS: dict[str, SourceForm] = {
    "digits": SourceForm("digits", _digits),
    "synthetic-cifar": SourceForm("synthetic-cifar:N", _synthetic_cifar),
    "synthetic-imagenet": SourceForm("synthetic-imagenet:N", _synthetic_imagenet),
    "cifar10": SourceForm("cifar10:PATH", _cifar10, reads_path=True),
}


def source_help() -> str:
    """The SOURCE forms as the CLI's help lists them."""
    return " | ".join([*(form.usage for form in SOURCE_FORMS.values()), IMAGE_FOLDER_USAGE]) + "."


def _parse(spec: str) -> tuple[SourceForm | None, str]:
    """The registered form ``spec`` is written in and its argument; ``(None, spec)`` for a directory."""
    prefix, sep, argument = spec.partition(":")
    form = SOURCE_FORMS.get(prefix)
    if form is None or bool(sep) != form.takes_argument:
        return None, spec
    return form, argument


def open_source(spec: str) -> Source:
    """Parse a SOURCE string and list its items (no image is decoded yet)."""
    form, argument = _parse(spec.strip())
    if form is not None:
        return form.open(argument)
    try:
        path = storage.check_uri(argument)  # refuses pipe: and unsupported schemes; file:///x is /x
    except storage.StorageError as exc:
        raise SourceError(f"source {argument!r}: {exc}") from exc
    kind = storage.path_kind(path)
    if kind == "dir":
        from tpustream.file_sources import image_folder_source

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
