"""Samples to leave out or relabel when shards are written: ``shards create --exclude-keys FILE --relabel FILE``.

The loop they close: evaluate lists the likely label errors (``label_issues.json``, the report's gallery); a
person checks them and writes the keys to drop, one per line, and the corrections, ``key,class`` per CSV row;
the next ``shards create`` applies them to the source's items before the plan is made, so the plan's
fingerprints (which hold each item's label) change with them and a resumed run cannot mix old and new labels.

A sample is named by its **source** (the file as the sample index, the report and label_issues.json give it:
stable across runs, whatever else the source gains) or by its **key** in the dataset at ``--output``, the one
being replaced (keys are positions in a plan: resolved to a source through that dataset's sample index, so a
key means the image it meant there). Options of the CLI rather than an import-file edit: they work for every
SOURCE form (folders, CIFAR, WebDataset shards, the digits), where an import file is one of them. A name
that matches nothing, or a class that is not one of the source's, is an error naming them: a list that was
meant for another dataset is refused, not half applied. Blank lines and ``#`` comments are skipped.
"""

from __future__ import annotations

import csv
import io
import logging
from dataclasses import dataclass, field, replace

from tpustream.errors import ConfigError
from tpustream.sources.types import Source
from tpustream.storage import io as storage

__all__ = ["LabelEdits", "apply_label_edits", "read_label_edits"]

log = logging.getLogger(__name__)

NAMES_SHOWN = 10  # unknown names listed in an error


@dataclass(frozen=True, kw_only=True)
class LabelEdits:
    """Which samples to leave out and which to give another class (by source or key, as the files say)."""

    exclude: frozenset[str] = frozenset()
    relabel: dict[str, str] = field(default_factory=dict)  # sample -> class name


def _lines(uri: str, option: str) -> list[tuple[int, str]]:
    try:
        text = storage.read_text(uri)
    except storage.NotFound as exc:
        raise ConfigError(f"{option} {uri} does not exist") from exc
    return [
        (number, line.strip())
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]


def read_label_edits(exclude_keys: str | None, relabel: str | None) -> LabelEdits:
    """The edits the two files give (either may be None).

    Raises:
        ConfigError: a file is missing, a relabel row is not ``key,class``, or a sample is named twice.
    """
    exclude = (
        frozenset(line for _, line in _lines(exclude_keys, "--exclude-keys")) if exclude_keys else frozenset()
    )
    classes: dict[str, str] = {}
    for number, line in _lines(relabel, "--relabel") if relabel else []:
        row = next(csv.reader(io.StringIO(line)))
        if len(row) != 2 or not row[0].strip() or not row[1].strip():
            raise ConfigError(f"--relabel {relabel}:{number}: {line!r} is not a CSV row key,class")
        key, name = row[0].strip(), row[1].strip()
        if classes.get(key, name) != name:
            raise ConfigError(
                f"--relabel {relabel}:{number}: {key} is given two classes, {classes[key]} and {name}"
            )
        classes[key] = name
    both = sorted(exclude & classes.keys())
    if both:
        raise ConfigError(
            f"{', '.join(both[:NAMES_SHOWN])} both excluded and relabelled: keep one of the two"
        )
    return LabelEdits(exclude=exclude, relabel=classes)


def _keys_to_sources(dataset_uri: str, wanted: set[str]) -> dict[str, str]:
    """Sample key -> source in the dataset at ``dataset_uri`` for the ``wanted`` keys it holds ({} when it
    holds no dataset with a sample index)."""
    from tpustream.dataset.manifest import ShardError, iter_sample_index, load_manifest
    from tpustream.dataset.plan import SPLITS

    try:
        manifest = load_manifest(dataset_uri)
    except ShardError:
        return {}
    if not manifest.has_sample_index():
        return {}
    return {
        entry.key: entry.source
        for split in SPLITS
        if manifest.num_samples(split)
        for entry in iter_sample_index(dataset_uri, manifest, split)
        if entry.key in wanted
    }


def apply_label_edits(source: Source, edits: LabelEdits, *, dataset_uri: str) -> Source:
    """``source`` without the excluded samples and with the relabelled ones in their new class.

    Args:
        source: the listed source.
        edits: what ``read_label_edits`` read.
        dataset_uri: the dataset being replaced (``--output``), whose sample index resolves keys.

    Raises:
        ConfigError: a named sample is in neither the source nor that dataset, or a class is not the source's.
    """
    named = set(edits.exclude) | set(edits.relabel)
    if not named:
        return source
    by_source = {source.locate(item): i for i, item in enumerate(source.items)}
    keys = _keys_to_sources(dataset_uri, named - by_source.keys())
    where = {name: by_source.get(name, by_source.get(keys.get(name, ""))) for name in named}
    unknown = sorted(name for name, index in where.items() if index is None)
    if unknown:
        raise ConfigError(
            f"{len(unknown)} sample(s) named by --exclude-keys/--relabel are not in {source.spec} (by source) nor "
            f"in the dataset at {dataset_uri} (by key): {', '.join(unknown[:NAMES_SHOWN])}; name samples by "
            "the source or key label_issues.json gives, from the dataset this run replaces"
        )
    label_of = {name: i for i, name in enumerate(source.classes)}
    bad = sorted(f"{name},{cls}" for name, cls in edits.relabel.items() if cls not in label_of)
    if bad:
        raise ConfigError(
            f"--relabel names classes {source.spec} does not have: {', '.join(bad[:NAMES_SHOWN])}; its classes "
            f"are {', '.join(source.classes[:20])}"
        )
    dropped = {where[name] for name in edits.exclude}
    relabelled = {where[name]: label_of[cls] for name, cls in edits.relabel.items()}
    items = [
        replace(item, label=relabelled[i]) if i in relabelled else item
        for i, item in enumerate(source.items)
        if i not in dropped
    ]
    log.info("%d sample(s) excluded, %d relabelled (--exclude-keys/--relabel)", len(dropped), len(relabelled))
    return replace(source, items=items)
