"""The one error family: every failure a user must act on is a `TpustreamError`.

Each subclass lives next to the code that raises it (`storage.StorageError`, `sources.SourceError`,
`train.TrainError`, ...) and keeps its historical builtin base (`ValueError` or `RuntimeError`) so
callers that caught those keep working. The message names the input, says what is wrong and what
to do; the CLI prints it as one line and exits 2 (see `tpustream/cli/app.py`).
"""

from __future__ import annotations


class TpustreamError(Exception):
    """Base of every error whose message is meant for the user (one line, names the fix)."""


class ConfigError(TpustreamError, ValueError):
    """An option or setting out of range or inconsistent (a config dataclass's ``__post_init__``, a flag the
    CLI or a pipeline parameter got). A ``ValueError`` too, so callers that caught one keep working; the CLI
    prints it as one line, while a bare ``ValueError`` (a bug) keeps its traceback."""


__all__ = ["TpustreamError", "ConfigError"]
