"""The registry's error: a leaf, so the store and the policy both raise it without importing each other."""

from __future__ import annotations

from tpustream.errors import TpustreamError

__all__ = ["RegistryError"]


class RegistryError(TpustreamError, ValueError):
    """The registry or the inputs to a promotion are unusable; the message says what and the repair."""
