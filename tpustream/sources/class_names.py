"""``--class-names FILE|a,b,c``: names for integer labels, so a label means one class whatever its form.

Sources label samples by name (a folder, a displayName, a ``.json`` label) or by integer index (a
WebDataset ``.cls`` member, a folder named ``3``). Given names, integer label ``i`` becomes ``names[i]`` and a
named label must be one of them, so integer and named labels mix into one set of classes; the dataset's
classes are exactly these names in this order (index i is name i, as the integers meant). An integer out
of range or a name not listed is an error naming it: a typo'd class never becomes a class of its own.
"""

from __future__ import annotations

import dataclasses
import re

from tpustream.errors import ConfigError
from tpustream.sources.types import Source, SourceError
from tpustream.storage import io as storage

__all__ = ["parse_class_names", "read_class_names", "apply_class_names", "is_integer_label"]

_INTEGER = re.compile(r"[+-]?\d+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
USAGE = "FILE (one name per line, local or gs://) or a comma list a,b,c"


def is_integer_label(label: str) -> bool:
    """Whether a source's label text is an integer class index rather than a class name."""
    return _INTEGER.fullmatch(label) is not None


def _checked(names: list[str], where: str) -> list[str]:
    if not names:
        raise ConfigError(f"--class-names {where}: no names; give {USAGE}")
    for name in names:
        if not name or _CONTROL.search(name):
            raise ConfigError(
                f"--class-names {where}: {name!r} is not a class name (empty or a control character)"
            )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(
            f"--class-names {where}: {', '.join(repeated[:5])} listed twice; give each class once"
        )
    return names


def parse_class_names(value: str) -> list[str] | None:
    """The names of a comma list (checked, no I/O); None when ``value`` names a FILE (no comma)."""
    if "," not in value:
        return None
    return _checked([name.strip() for name in value.split(",")], repr(value))


def read_class_names(value: str) -> list[str]:
    """The names ``--class-names`` gives: the comma list, or the FILE's non-blank lines."""
    names = parse_class_names(value)
    if names is not None:
        return names
    try:
        text = storage.read_text(storage.check_uri(value.strip()))
    except storage.NotFound as exc:
        raise ConfigError(f"--class-names {value!r}: no such file; give {USAGE}") from exc
    except (storage.StorageError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--class-names {value!r}: cannot read it ({exc}); give {USAGE}") from exc
    return _checked([line.strip() for line in text.splitlines() if line.strip()], repr(value))


def apply_class_names(source: Source, names: list[str]) -> Source:
    """``source`` with its classes renamed to ``names``: integer label i -> names[i], a name -> its place."""
    position = {name: index for index, name in enumerate(names)}
    mapping: list[int] = []
    for label in source.classes:
        if is_integer_label(label):
            index = int(label)
            if not 0 <= index < len(names):
                raise SourceError(
                    f"source {source.spec!r}: integer label {label} has no name: --class-names gives "
                    f"{len(names)} (indices 0..{len(names) - 1}); add the missing names or fix the labels"
                )
            mapping.append(index)
        elif label in position:
            mapping.append(position[label])
        else:
            listed = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
            raise SourceError(
                f"source {source.spec!r}: label {label!r} is not one of --class-names ({listed}): add it to the "
                "names or fix the label (a misspelt class would otherwise become a class of its own)"
            )
    items = [dataclasses.replace(item, label=mapping[item.label]) for item in source.items]
    return dataclasses.replace(
        source,
        classes=list(names),
        items=items,
        description=f"{source.description}; classes named by --class-names ({len(names)})",
    )
