"""The ``tpustream`` command: ``app`` is the entry point (``pyproject.toml``); ``python -m tpustream.cli`` runs it too.

Importing it loads no torch, so ``tpustream --help`` stays fast: every command imports its work inside itself.
"""

from tpustream.cli.main import app

__all__ = ["app"]
