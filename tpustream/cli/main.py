"""The ``tpustream`` command: the app (``cli/app.py``) with every command module registered on it, in the order
``tpustream --help`` lists them."""

from __future__ import annotations

from tpustream.cli.app import app

# Each module registers its commands on import, in the order `tpustream --help` lists them.
# isort: off
import tpustream.cli.data  # noqa: E402, F401
import tpustream.cli.train  # noqa: E402, F401
import tpustream.cli.tune  # noqa: E402, F401
import tpustream.cli.registry  # noqa: E402, F401
import tpustream.cli.serve  # noqa: E402, F401
import tpustream.cli.report  # noqa: E402, F401
# isort: on

__all__ = ["app"]

if __name__ == "__main__":  # pragma: no cover
    app()
