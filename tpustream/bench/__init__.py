"""Benchmarks (``tpustream bench ...``, one module per command) and the loopback GCS-API server they and the
tests use. Nothing in the runtime imports this package: only the CLI's bench commands do, inside the command.
"""

__all__: list[str] = []
