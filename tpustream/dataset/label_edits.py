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
that matches nothing, or a class that is not one of the source's, is an error naming the option and them: a
list that was meant for another dataset is refused, not half applied. Blank lines and ``#`` comments are skipped.

The pipeline takes the same files as its ``exclude_keys`` and ``relabel`` parameters, naming samples **by
source only**: its dataset is written at a new content-addressed location whenever the edits change (they are
in its fingerprint, tpustream/dataset/fingerprint.py), so there is no dataset being replaced to resolve a key
in, and each of its shard steps must plan the same shards whatever the location holds. What was applied is
recorded in the manifest (``label_edits``: the files, the sources left out, the sources relabelled).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from tpustream.artifacts import LabelEditsApplied
from tpustream.errors import ConfigError
from tpustream.sources.types import Source
from tpustream.storage import io as storage

if TYPE_CHECKING:
    from tpustream.dataset.plan import ShardConfig

__all__ = [
    "CLI_OPTIONS",
    "PIPELINE_PARAMETERS",
    "LabelEdits",
    "apply_label_edits",
    "edit_source",
    "label_edits_digest",
    "read_label_edits",
]

log = logging.getLogger(__name__)

NAMES_SHOWN = 10  # unknown names listed in an error
CLI_OPTIONS = ("--exclude-keys", "--relabel")  # how errors name the two files, by door
PIPELINE_PARAMETERS = ("exclude_keys", "relabel")


@dataclass(frozen=True, kw_only=True)
class LabelEdits:
    """Which samples to leave out and which to give another class (by source or key, as the files say)."""

    exclude: frozenset[str] = frozenset()
    relabel: dict[str, str] = field(default_factory=dict)  # sample -> class name
    # the option and file each came from, as errors name them ("--exclude-keys drop.txt")
    exclude_from: str = field(default=CLI_OPTIONS[0], compare=False)
    relabel_from: str = field(default=CLI_OPTIONS[1], compare=False)


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


def read_label_edits(
    exclude_keys: str | None, relabel: str | None, *, options: tuple[str, str] = CLI_OPTIONS
) -> LabelEdits:
    """The edits the two files give (either may be None).

    Args:
        exclude_keys, relabel: the files (local or gs://).
        options: what errors call the two (``CLI_OPTIONS``, or ``PIPELINE_PARAMETERS`` in the pipeline).

    Raises:
        ConfigError: a file is missing, a relabel row is not ``key,class``, or a sample is named twice.
    """
    exclude_option, relabel_option = options
    exclude = (
        frozenset(line for _, line in _lines(exclude_keys, exclude_option)) if exclude_keys else frozenset()
    )
    classes: dict[str, str] = {}
    for number, line in _lines(relabel, relabel_option) if relabel else []:
        row = next(csv.reader(io.StringIO(line)))
        if len(row) != 2 or not row[0].strip() or not row[1].strip():
            raise ConfigError(f"{relabel_option} {relabel}:{number}: {line!r} is not a CSV row key,class")
        key, name = row[0].strip(), row[1].strip()
        if classes.get(key, name) != name:
            raise ConfigError(
                f"{relabel_option} {relabel}:{number}: {key} is given two classes, {classes[key]} and {name}"
            )
        classes[key] = name
    both = sorted(exclude & classes.keys())
    if both:
        raise ConfigError(
            f"{', '.join(both[:NAMES_SHOWN])} both excluded ({exclude_option}) and relabelled "
            f"({relabel_option}): keep one of the two"
        )
    return LabelEdits(
        exclude=exclude,
        relabel=classes,
        exclude_from=f"{exclude_option} {exclude_keys}" if exclude_keys else exclude_option,
        relabel_from=f"{relabel_option} {relabel}" if relabel else relabel_option,
    )


def label_edits_digest(edits: LabelEdits) -> str:
    """sha256 of what the edits do (the names and classes, not the files' bytes): a comment or a reordered
    line leaves it as it was, one more sample named changes it."""
    document = {"exclude": sorted(edits.exclude), "relabel": sorted(edits.relabel.items())}
    return hashlib.sha256(json.dumps(document).encode()).hexdigest()


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


def apply_label_edits(source: Source, edits: LabelEdits, *, dataset_uri: str | None) -> Source:
    """``source`` without the excluded samples and with the relabelled ones in their new class.

    Args:
        source: the listed source.
        edits: what ``read_label_edits`` read.
        dataset_uri: the dataset being replaced (``--output``), whose sample index resolves keys; None: names
            are sources only (the pipeline's, the module doc says why).

    Raises:
        ConfigError: a named sample is in neither the source nor that dataset, or a class is not the source's;
            the message names the option and the samples.
    """
    return _apply(source, edits, dataset_uri=dataset_uri)[0]


def edit_source(
    source: Source,
    config: ShardConfig,
    *,
    dataset_uri: str | None,
    options: tuple[str, str] = CLI_OPTIONS,
) -> tuple[Source, LabelEditsApplied | None]:
    """``source`` with ``config``'s ``exclude_keys`` and ``relabel`` applied, and what was applied for the
    manifest (None: no file given); ``source`` itself when there is none. Every check runs here, before a
    shard is planned or written.

    Args:
        source: the listed source.
        config: the shard options (``exclude_keys``, ``relabel``: the files, or None).
        dataset_uri: as ``apply_label_edits``'s.
        options: what errors call the files (``CLI_OPTIONS`` or ``PIPELINE_PARAMETERS``).

    Raises:
        ConfigError: as ``read_label_edits`` and ``apply_label_edits``.
    """
    if not config.exclude_keys and not config.relabel:
        return source, None
    edits = read_label_edits(config.exclude_keys, config.relabel, options=options)
    edited, excluded, relabelled = _apply(source, edits, dataset_uri=dataset_uri)
    applied = LabelEditsApplied(
        exclude_keys=config.exclude_keys,
        relabel=config.relabel,
        excluded=sorted(excluded),
        relabelled=dict(sorted(relabelled.items())),
    )
    return edited, applied


def _apply(
    source: Source, edits: LabelEdits, *, dataset_uri: str | None
) -> tuple[Source, list[str], dict[str, str]]:
    """The edited source, the sources left out and the sources relabelled (source -> class)."""
    named = set(edits.exclude) | set(edits.relabel)
    if not named:
        return source, [], {}
    by_source = {source.locate(item): i for i, item in enumerate(source.items)}
    keys = _keys_to_sources(dataset_uri, named - by_source.keys()) if dataset_uri else {}
    where = {name: by_source.get(name, by_source.get(keys.get(name, ""))) for name in named}
    unknown = {
        option: sorted(name for name in names if where[name] is None)
        for option, names in ((edits.exclude_from, edits.exclude), (edits.relabel_from, edits.relabel))
    }
    if any(unknown.values()):
        looked = (
            f"in {source.spec} (by source) nor in the dataset at {dataset_uri} (by key)"
            if dataset_uri
            else f"in {source.spec} (by source)"
        )
        named_there = "; ".join(
            f"{option} names {len(names)} sample(s) not {looked}: {', '.join(names[:NAMES_SHOWN])}"
            + (", ..." if len(names) > NAMES_SHOWN else "")
            for option, names in unknown.items()
            if names
        )
        fix = (
            "name samples by the source or key label_issues.json gives, from the dataset this run replaces"
            if dataset_uri
            else "the pipeline names samples by source only (label_issues.json's source: a key is a position "
            "in one dataset's plan, and each set of edits writes a new dataset)"
        )
        raise ConfigError(f"{named_there}; {fix}")
    label_of = {name: i for i, name in enumerate(source.classes)}
    bad = sorted(f"{name},{cls}" for name, cls in edits.relabel.items() if cls not in label_of)
    if bad:
        raise ConfigError(
            f"{edits.relabel_from} names classes {source.spec} does not have: {', '.join(bad[:NAMES_SHOWN])}; "
            f"its classes are {', '.join(source.classes[:20])}"
        )
    dropped = {index for name in edits.exclude if (index := where[name]) is not None}
    relabelled = {
        index: label_of[cls] for name, cls in edits.relabel.items() if (index := where[name]) is not None
    }
    items = [
        replace(item, label=relabelled[i]) if i in relabelled else item
        for i, item in enumerate(source.items)
        if i not in dropped
    ]
    log.info(
        "%d sample(s) excluded, %d relabelled (%s, %s)",
        len(dropped),
        len(relabelled),
        edits.exclude_from,
        edits.relabel_from,
    )
    edited = replace(source, items=items)
    return (
        edited,
        [source.locate(source.items[i]) for i in dropped],
        {source.locate(source.items[i]): source.classes[label] for i, label in relabelled.items()},
    )
