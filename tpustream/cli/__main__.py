"""``python -m tpustream.cli``: the same command as ``tpustream``."""

from tpustream.cli.main import app

app()
