"""Checkpoints through the storage seam, committed atomically.

``OUTPUT/checkpoints/ckpt-e0003-b000000.pt`` files are immutable; ``last.json`` and ``best.json`` are
small pointer objects replaced only after the file they name is completely written, so a reader
never sees half a checkpoint. Files are loadable with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

import torch

from tpustream.errors import TpustreamError
from tpustream.storage import io as storage

if TYPE_CHECKING:
    from tpustream.train.records import RunMeta

__all__ = [
    "Checkpoint",
    "CheckpointRng",
    "StateDict",
    "CheckpointError",
    "Position",
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint_uri",
    "to_cpu",
]

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"


StateDict = dict[str, torch.Tensor]  # a module's state_dict(): parameter and buffer name -> tensor


class CheckpointRng(TypedDict):
    xla: str  # xm.get_rng_state(), a uint64: as text
    torch: torch.Tensor  # torch.get_rng_state()


class Checkpoint(TypedDict):
    """A checkpoint file: the exact training state (``torch.save`` of it; ``weights_only``-loadable)."""

    model: StateDict
    optimizer: Any  # the optimizer's state_dict(): its own nested layout
    state: Any  # asdict(RunState): position, history, early stopping
    meta: RunMeta
    rng: CheckpointRng
    ema: NotRequired[StateDict]  # the recipe's EMA of the weights (tpustream/train/ema.py), when it has one


class CheckpointError(TpustreamError, ValueError):
    """A checkpoint is missing, unreadable or incompatible with this run; the message says what to do."""


@dataclass(frozen=True)
class Position:
    """Where a checkpoint was taken: ``epoch`` (0-based) and batches already done in it."""

    epoch: int
    batches_done: int
    global_step: int

    @property
    def name(self) -> str:
        return f"ckpt-e{self.epoch:04d}-b{self.batches_done:06d}.pt"


def to_cpu(value: Any) -> Any:
    """Recursively copy tensors (XLA included) to CPU so the checkpoint holds plain tensors."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_cpu(v) for v in value)
    return value


def _pointer(output: str, which: str) -> str:
    return storage.join(output, CHECKPOINT_DIR, f"{which}.json")


def save_checkpoint(output: str, position: Position, state: Checkpoint, *, best: bool, keep: int = 2) -> str:
    """Write the checkpoint file, then move ``last`` (and ``best``) to it; prune old files. Returns its URI."""
    uri = storage.join(output, CHECKPOINT_DIR, position.name)
    with storage.open_write(uri) as f:
        torch.save(state, f)
    pointer = json.dumps(
        {
            "checkpoint": position.name,
            "epoch": position.epoch,
            "batches_done": position.batches_done,
            "global_step": position.global_step,
            "saved": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    ).encode()
    storage.write_bytes(_pointer(output, "last"), pointer, content_type="application/json")
    if best:
        storage.write_bytes(_pointer(output, "best"), pointer, content_type="application/json")
    _prune(output, keep)
    log.info("checkpoint %s committed%s", uri, " (new best)" if best else "")
    return uri


def _referenced(output: str) -> set[str]:
    names = set()
    for which in ("last", "best"):
        with contextlib.suppress(storage.NotFound, ValueError, KeyError):
            names.add(json.loads(storage.read_bytes(_pointer(output, which)))["checkpoint"])
    return names


def _prune(output: str, keep: int) -> None:
    files = [o for o in storage.list_objects(storage.join(output, CHECKPOINT_DIR)) if o.uri.endswith(".pt")]
    keep_names = _referenced(output) | {o.uri.rsplit("/", 1)[1] for o in files[-keep:]}
    for obj in files:
        if obj.uri.rsplit("/", 1)[1] not in keep_names:
            storage.delete(obj.uri)


def latest_checkpoint_uri(output: str, which: str = "last") -> str | None:
    """The committed checkpoint ``last``/``best`` points at, or None when there is none yet."""
    try:
        pointer = json.loads(storage.read_bytes(_pointer(output, which)))
    except storage.NotFound:
        return None
    except storage.PathKindError as exc:
        if storage.path_kind(output) == "file":
            raise CheckpointError(
                f"{output} is a file, not a training output directory: give the output directory, or a "
                "checkpoint file whose name ends in .pt"
            ) from exc
        raise
    except ValueError as exc:
        raise CheckpointError(
            f"{_pointer(output, which)} is corrupt ({exc}): delete it to start over"
        ) from exc
    uri = storage.join(output, CHECKPOINT_DIR, pointer["checkpoint"])
    if not storage.exists(uri):
        raise CheckpointError(
            f"{_pointer(output, which)} names {uri}, which is missing: delete the pointer to start over"
        )
    return uri


def _why_unreadable(exc: Exception) -> str:
    """One line for why ``torch.load(weights_only=True)`` failed (torch explains over many lines)."""
    text = str(exc)
    if "Weights only load failed" in text:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        if found:
            return f"it pickles {found.group(1)}, which a weights-only load refuses to run"
        return "not a file torch.load(weights_only=True) can read"
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return first if len(first) <= 200 else first[:197] + "..."


def load_torch_file(uri: str, *, what: str = "checkpoint", fix: str = "") -> tuple[Any, str]:
    """Load a torch file (local or gs://) with ``weights_only=True``; returns (object, sha256 of its bytes).

    Raises ``CheckpointError`` with one line: the file, why it cannot be read, then ``fix`` when given."""
    import hashlib

    try:
        data = storage.read_bytes(uri)
        digest = hashlib.sha256(data).hexdigest()
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True), digest
    except storage.NotFound as exc:
        raise CheckpointError(f"{what} {uri} does not exist" + (f": {fix}" if fix else "")) from exc
    except storage.StorageError as exc:  # a directory, a file in the way, permissions: its message says which
        raise CheckpointError(f"{what}: {exc}") from exc
    except Exception as exc:  # unpickling errors come in many types
        reason = _why_unreadable(exc)
        raise CheckpointError(f"{what} {uri} is unreadable ({reason})" + (f": {fix}" if fix else "")) from exc


def load_checkpoint(uri: str) -> Checkpoint:
    """Load a checkpoint file (local or gs://) with ``weights_only=True``."""
    fix = "resume from another checkpoint (a .pt under OUTPUT/checkpoints/, or OUTPUT), or use --resume never"
    loaded: Checkpoint = load_torch_file(uri, fix=fix)[0]  # the layout Trainer.checkpoint saves
    return loaded
