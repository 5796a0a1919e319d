"""The ``tpustream dev`` commands: what a developer runs beside tpustream, not tpustream itself.

Like ``cli/bench.py``, a boundary to ``tpustream/bench/`` (the loopback GCS server lives there), imported only
inside a command so that ``tpustream --help`` loads none of it (tests/unit/test_import_graph.py)."""

from __future__ import annotations

import signal
from typing import Annotated

import typer

from tpustream.errors import TpustreamError

__all__ = ["dev_app"]

dev_app = typer.Typer(
    help="Developer tools: a local GCS-API server to point commands at.", no_args_is_help=True
)


@dev_app.command("gcs-server")
def gcs_server(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0: a free one).", min=0, max=65535)] = 0,
    bucket: Annotated[
        list[str] | None, typer.Option(help="Create this empty bucket (repeat for more).", metavar="NAME")
    ] = None,
) -> None:
    """Run a GCS-API server (fake-gcs-server, in memory: its objects go when it stops) on 127.0.0.1 until
    Ctrl-C. Prints the `export STORAGE_EMULATOR_HOST=...` line that points tpustream (and any
    google-cloud-storage client) at it; then gs://BUCKET/... URIs name its objects."""
    from tpustream.bench.emulator import GcsServer, make_bucket

    server = GcsServer(port=port)
    try:
        for name in bucket or []:
            make_bucket(server.url, name)
        typer.echo(f"export STORAGE_EMULATOR_HOST={server.url}")
        made = f" with bucket(s) {', '.join(f'gs://{name}' for name in bucket)}" if bucket else ""
        typer.echo(f"# fake-gcs-server on {server.url}{made}, in memory; Ctrl-C stops it", err=True)
        code = server.wait()
    except KeyboardInterrupt:
        code = -signal.SIGINT
    finally:
        server.close()
    if code in (0, -signal.SIGINT):  # Ctrl-C reaches the server too: it may exit before we see the signal
        typer.echo("# gcs-server stopped", err=True)
        return
    raise TpustreamError(f"fake-gcs-server on {server.url} exited by itself (exit code {code})")
