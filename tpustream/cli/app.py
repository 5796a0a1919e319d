"""The ``tpustream`` command line: argument parsing lives here and nowhere else."""

from __future__ import annotations

import logging
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from tpustream.cli.bench import bench_app
from tpustream.cli.dev import dev_app
from tpustream.cli.options import fail
from tpustream.cli.pipeline import pipeline_app
from tpustream.errors import TpustreamError

__all__ = ["app", "champion_app", "shards_app", "weights_app"]

log = logging.getLogger("tpustream")


def _user_error_message(exc: Exception) -> str | None:
    """The one line to print for an error the user can act on, or None for a bug (keep its traceback).

    User errors: the `TpustreamError` family (``ConfigError``: what the config dataclasses raise for an
    option out of range, in ``__post_init__``); and a cloud API's refusal or missing credentials. A bare
    ``ValueError`` is a bug: it keeps its traceback."""
    if isinstance(exc, TpustreamError):
        return str(exc)
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import DefaultCredentialsError, GoogleAuthError

    if isinstance(exc, DefaultCredentialsError):
        return (
            "no Google Cloud credentials found: run `gcloud auth application-default login`, or set "
            "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file"
        )
    if isinstance(exc, GoogleAPIError | GoogleAuthError):
        return str(exc)
    return None


class _OneLineErrors(TyperGroup):
    """Every command runs inside this group's ``invoke``: the one place a user error becomes one line on
    stderr and exit code 2 (with ``-v`` its traceback is logged too). Anything else keeps its traceback."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            message = _user_error_message(exc)
            if message is None:
                raise
            log.debug("traceback of the error below", exc_info=exc)
            fail(message)


app = typer.Typer(
    cls=_OneLineErrors,
    help="tpustream: image dataset -> WebDataset shards on GCS -> ResNet on TPU pods -> evaluated, promoted model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
shards_app = typer.Typer(
    help="Create, verify and check WebDataset tar shards + manifest.", no_args_is_help=True
)
app.add_typer(shards_app, name="shards")
champion_app = typer.Typer(help="Inspect the model registry's champion.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(dev_app, name="dev")
app.add_typer(champion_app, name="champion")
app.add_typer(pipeline_app, name="pipeline")
weights_app = typer.Typer(
    help="Pretrained weights: stage a torchvision weight set where `train --pretrained` reads it.",
    no_args_is_help=True,
)
app.add_typer(weights_app, name="weights")


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted, not the stream of the first call:
    an embedding caller (a test runner's CliRunner, a notebook) may swap and close stderr between calls."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[_CurrentStderr()],
    )


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False) -> None:
    _setup_logging(verbose)
