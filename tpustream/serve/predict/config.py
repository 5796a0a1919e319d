"""``PredictConfig``: one ``tpustream predict``, the model, the inputs and the options, whose field docstrings
are the command's ``--help`` (``tpustream.cli.options.from_config``); and ``PredictError``, which every stage of
a predict run raises for an input it cannot read as given. Torch-free, so that ``--help`` stays light."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TypedDict

from tpustream.errors import TpustreamError
from tpustream.serve.settings import Limits

__all__ = ["DEFAULT_WORKERS", "PredictConfig", "PredictError", "PredictRequest"]

# Decode processes by default: one per CPU but one (the model runs in this process), at most 8.
DEFAULT_WORKERS = max(0, min(8, (os.cpu_count() or 1) - 1))


class PredictError(TpustreamError, ValueError):
    """An input cannot be read as given; the message names it and what to do."""


class PredictRequest(TypedDict):
    """What a complete output's results depend on (``_SUCCESS``'s ``request``, JSON): a re-run asking another
    is not complete there."""

    inputs: list[str]
    model: str
    top_k: int
    limit: int | None
    sample_val: int
    max_pixels: int
    part_size: int


@dataclass(frozen=True, kw_only=True)
class PredictConfig:
    """One ``tpustream predict``: the model, the inputs and the options; the CLI's defaults are these."""

    model: str
    """Model directory (model.pt + model.json), or a registry: its champion."""
    inputs: tuple[str, ...] = ()
    """Images, directories or gs:// prefixes of images, .tar shards, or datasets (their val split)."""
    top_k: int = 3
    """Classes to show per image."""
    as_json: bool = False
    """One JSON object per image (JSON lines)."""
    limit: int | None = None
    """Stop after this many images."""
    sample_val: int = 0
    """Also predict N images of the val split the model was trained on (model.json)."""
    batch_size: int = Limits.batch_size
    """Images per forward pass (the serving container's default)."""
    max_pixels: int = Limits.max_pixels
    """Pixel budget: an image whose header claims more pixels is refused, never decoded (the default is the
    serving container's: 16 Mi)."""
    workers: int = DEFAULT_WORKERS
    """Processes that read and decode images while the model runs here (0: all in this process). Default: one
    per CPU but one, at most 8."""
    output: str | None = None
    """Write the results (the objects --json prints) to OUTPUT/predictions-00000.jsonl, ... (local or gs://)
    instead of printing them, and OUTPUT/_SUCCESS (the summary) last. Re-run the same command to resume: parts
    already written for the same model, options and inputs are kept."""
    part_size: int = 1000
    """With --output: images per part file, the unit a re-run resumes by."""
    overwrite: bool = False
    """With --output: predict every part again, replacing what is there, also a complete output (one with
    _SUCCESS). Without it a complete output is left as it is and an interrupted one resumed."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs or ()))  # the CLI's argument is a list, or None
        if not self.inputs and not self.sample_val:
            raise PredictError(
                "nothing to predict: give images, directories, gs:// prefixes or shards, or --sample-val N"
            )
        if self.output and self.as_json:
            raise PredictError(
                "--json prints the results, --output writes them as JSON lines to OUTPUT: give one of them"
            )
        for name in ("top_k", "part_size", "batch_size", "max_pixels"):
            if getattr(self, name) < 1:
                raise PredictError(
                    f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}"
                )
        for name in ("workers", "sample_val"):
            if getattr(self, name) < 0:
                raise PredictError(f"--{name.replace('_', '-')} must be 0 or more, got {getattr(self, name)}")
        if self.limit is not None and self.limit < 1:
            raise PredictError(f"--limit must be at least 1, got {self.limit}")

    def limits(self) -> Limits:
        """The serving classifier's limits for this run: its batch size, top-k and pixel budget."""
        return Limits(batch_size=self.batch_size, top_k=self.top_k, max_pixels=self.max_pixels)

    def request(self, model_uri: str) -> PredictRequest:
        """What a complete output's results depend on: a re-run asking another is not complete there."""
        return PredictRequest(
            inputs=list(self.inputs),
            model=model_uri,
            top_k=self.top_k,
            limit=self.limit,
            sample_val=self.sample_val,
            max_pixels=self.max_pixels,
            part_size=self.part_size,
        )
