"""Warm start: a new training run that starts from another model's weights (``train --init-from URI``).

URI is a model artifact (the directory ``tpustream train`` wrote: model.json + model.pt), a registry (its
champion's version), a checkpoint file (``.pt``) or a training output with checkpoints (its ``best``, else its
``last``). Only the weights are taken: the optimizer starts fresh and the LR schedule is the run's own (a new
run, not a resumed one; ``--resume`` continues a run in its own ``--output``).

Same architecture and classes: every weight is loaded. Changed classes: the backbone is loaded and the head
(the network's last Linear layer) is new, except the rows of the classes both runs have, which keep theirs.
Anything else that does not fit (another architecture, a stem built for another input size) is a TrainError
naming the fix. What was loaded is recorded in the model card's ``init``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

from tpustream.artifacts import ArtifactError, ModelCard
from tpustream.errors import TpustreamError
from tpustream.models import MODEL_SPECS, card_small_input_stem, default_small_input_stem
from tpustream.storage import io as storage

if TYPE_CHECKING:
    from tpustream.train.checkpoint import Checkpoint, StateDict

__all__ = [
    "WarmStartError",
    "InitWeights",
    "InitRecord",
    "load_init_weights",
    "apply_init_weights",
    "CHAMPION",
    "champion_start",
]

log = logging.getLogger(__name__)

CHAMPION = "champion"  # the pipeline's init_from value for "the registry's current champion"
# A warm-started run without --lr trains at this fraction of the from-scratch default peak LR: the champion's
# weights are already near a minimum that the full LR would first throw them out of. Measured with
# `tpustream bench warmstart` (README, "Warm start"): at a tenth of the LR the new run reached the champion's
# val top-1 in its first epoch; at the full LR in epoch 4, like training from scratch.
WARM_LR_FACTOR = 0.1


class WarmStartError(TpustreamError, ValueError):
    """--init-from cannot be used as given; the message names it and what to do."""


# The model card's ``init``: where a warm start's weights came from and what of them the run kept. A TypedDict
# by its functional form: its key ``from`` is a Python keyword.
InitRecord = TypedDict(
    "InitRecord",
    {
        "from": str,  # --init-from as given
        "resolved": str,  # the file the weights came from
        "kind": Literal["model", "champion", "checkpoint"],
        "weights": Literal["all", "backbone"],  # backbone: other classes, a new head
        "head_rows_kept": int,  # the head's class rows carried over (all of them with the same classes)
        "new_classes": list[str],
        "gone_classes": list[str],
        "peak_lr": NotRequired[float],  # the warm start's LR when the run gave no --lr
    },
)


@dataclass(frozen=True)
class InitWeights:
    uri: str  # as given
    resolved: str  # the file the weights came from
    kind: Literal["model", "champion", "checkpoint"]
    arch: str | None  # None: a checkpoint written without it
    classes: list[str]
    input_size: int | None
    weights: StateDict
    small_input_stem: bool | None = None  # the network's stem (None: a checkpoint written without it)


def _json(uri: str) -> dict[str, Any] | None:
    try:
        return json.loads(storage.read_bytes(uri))
    except storage.NotFound:
        return None
    except ValueError as exc:
        raise WarmStartError(f"--init-from: {uri} is corrupt ({exc})") from exc


def _model_card(uri: str) -> ModelCard | None:
    try:
        return ModelCard.read(uri)
    except storage.NotFound:
        return None
    except ArtifactError as exc:
        raise WarmStartError(f"--init-from: {exc}") from exc


def champion_start(registry: str, pretrained: str = "") -> str | None:
    """The pipeline's ``init_from=champion``: ``registry`` when it has a champion to start from, else None, with
    a warning that says what starts the run instead: the ``pretrained`` weights when given, random ones
    otherwise (so the log agrees with the trainer's ``pretrained: ... loaded`` line that follows)."""
    from tpustream.registry.store import read_champion

    if read_champion(registry) is not None:
        return registry
    instead = f"the pretrained weights {pretrained}" if pretrained.strip() else "random weights"
    log.warning("no champion in %s yet: the run starts from %s", registry, instead)
    return None


def load_init_weights(uri: str) -> InitWeights:
    """Find and read the weights ``uri`` names (see the module)."""
    from tpustream.train.checkpoint import (
        CheckpointError,
        latest_checkpoint_uri,
        load_checkpoint,
        load_torch_file,
    )

    given = uri
    try:
        uri = storage.check_uri(uri).rstrip("/")
    except storage.StorageError as exc:
        raise WarmStartError(f"--init-from {given}: {exc}") from exc
    try:
        if uri.endswith(".pt"):
            checkpoint = load_checkpoint(uri)
            return _from_checkpoint(given, uri, checkpoint)
        kind: Literal["model", "champion"] = "model"
        pointer = _json(storage.join(uri, "champion.json"))
        if pointer is not None:
            from tpustream.registry.store import version_uri

            uri, kind = version_uri(uri, int(pointer["version"])), "champion"
        card = _model_card(storage.join(uri, "model.json"))
        if card is not None:
            weights, _ = load_torch_file(storage.join(uri, "model.pt"), what="model weights")
            return InitWeights(
                given,
                storage.join(uri, "model.pt"),
                kind,
                card.arch,
                list(card.classes),
                card.input_size,
                weights,
                card_small_input_stem(card),
            )
        checkpoint_uri = latest_checkpoint_uri(uri, "best") or latest_checkpoint_uri(uri, "last")
    except (CheckpointError, storage.StorageError, KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, WarmStartError):
            raise
        raise WarmStartError(f"--init-from {given}: {exc}") from exc
    if checkpoint_uri is None:
        raise WarmStartError(
            f"--init-from {given}: neither a model artifact (model.json), a registry (champion.json), a "
            "checkpoint (.pt) nor a training output with checkpoints: give one of those"
        )
    try:
        return _from_checkpoint(given, checkpoint_uri, load_checkpoint(checkpoint_uri))
    except CheckpointError as exc:
        raise WarmStartError(f"--init-from {given}: {exc}") from exc


def _from_checkpoint(given: str, uri: str, checkpoint: Checkpoint) -> InitWeights:
    meta: dict[str, Any] = dict(checkpoint.get("meta") or {})  # older checkpoints may lack any key
    if "model" not in checkpoint:
        raise WarmStartError(f"--init-from {given}: {uri} holds no model weights")
    return InitWeights(
        given,
        uri,
        "checkpoint",
        meta.get("model"),
        list(meta.get("classes") or []),
        meta.get("input_size"),
        checkpoint["model"],
        _checkpoint_stem(meta),
    )


def _checkpoint_stem(meta: dict[str, Any]) -> bool | None:
    """The stem a checkpoint's network had: its meta's, or, before that was recorded, the one --pretrained
    chose; None when the meta does not say."""
    if "small_input_stem" in meta:
        return bool(meta["small_input_stem"])
    if "pretrained_weights" in meta and meta.get("model") in MODEL_SPECS and meta.get("input_size"):
        return default_small_input_stem(
            meta["model"], int(meta["input_size"]), pretrained=bool(meta["pretrained_weights"])
        )
    return None


def _head(model: Any) -> str:
    """The name of the network's last Linear layer: the classifier head."""
    import torch.nn as nn

    names = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if not names:
        raise WarmStartError("the network has no Linear head to replace")
    return names[-1]


def _shape_fix(init: InitWeights, input_size: int) -> str:
    """Why a weight's shape differs and the option that fixes it: the input size only when it differs."""
    if init.input_size is not None and init.input_size != input_size:
        return (
            f"(it was trained at {init.input_size} px, this run at {input_size}: a stem built for another "
            f"input size differs); pass --input-size {init.input_size}"
        )
    return (
        f"(both at {input_size} px: the stems differ, one the stock stem of pretrained weights, the other the "
        "small-input stem, and this checkpoint does not record which); warm start from its model artifact or "
        "registry instead (model.json records the stem), or train without --init-from"
    )


def apply_init_weights(
    model: Any, init: InitWeights, *, arch: str, classes: list[str], input_size: int
) -> InitRecord:
    """Load ``init`` into ``model`` (built for ``arch``, ``classes``); returns the model card's ``init``."""
    import torch

    if init.arch is not None and init.arch != arch:
        raise WarmStartError(
            f"--init-from {init.uri} is a {init.arch}, this run trains a {arch}: pass --model {init.arch}, or "
            "start from a model of this architecture"
        )
    head = _head(model)
    head_keys = {f"{head}.weight", f"{head}.bias"}
    own = model.state_dict()
    same_classes = init.classes == classes
    loaded = {}
    for key, value in init.weights.items():
        if key in head_keys and not same_classes:
            continue
        if key not in own:
            raise WarmStartError(f"--init-from {init.uri}: its weight {key!r} is not in this run's {arch}")
        if tuple(own[key].shape) != tuple(value.shape):
            raise WarmStartError(
                f"--init-from {init.uri}: {key} is {tuple(value.shape)} there, {tuple(own[key].shape)} here "
                + _shape_fix(init, input_size)
            )
        loaded[key] = value
    missing = set(own) - set(loaded) - (head_keys if not same_classes else set())
    if missing:
        raise WarmStartError(
            f"--init-from {init.uri} lacks {len(missing)} weight(s) of this run's {arch}, e.g. {sorted(missing)[0]}"
        )
    kept_rows: list[str] = []
    if not same_classes:
        weight, bias = own[f"{head}.weight"].clone(), own[f"{head}.bias"].clone()
        old_index = {name: i for i, name in enumerate(init.classes)}
        old_weight, old_bias = init.weights.get(f"{head}.weight"), init.weights.get(f"{head}.bias")
        for i, name in enumerate(classes):
            j = old_index.get(name)
            if j is not None and old_weight is not None and old_bias is not None:
                weight[i] = old_weight[j].to(weight.dtype)
                bias[i] = old_bias[j].to(bias.dtype)
                kept_rows.append(name)
        loaded[f"{head}.weight"], loaded[f"{head}.bias"] = weight, bias
    with torch.no_grad():
        model.load_state_dict(loaded, strict=True)
    new = sorted(set(classes) - set(init.classes))
    gone = sorted(set(init.classes) - set(classes))
    if same_classes:
        log.info("warm start from %s (%s %s): all weights loaded", init.uri, init.kind, init.resolved)
    else:
        log.warning(
            "warm start from %s (%s %s): the classes changed (new: %s; gone: %s): backbone loaded, a new head "
            "(%d of %d class rows kept from it)",
            init.uri,
            init.kind,
            init.resolved,
            ", ".join(new) or "none",
            ", ".join(gone) or "none",
            len(kept_rows),
            len(classes),
        )
    return InitRecord(
        {
            "from": init.uri,
            "resolved": init.resolved,
            "kind": init.kind,
            "weights": "all" if same_classes else "backbone",
            "head_rows_kept": len(classes) if same_classes else len(kept_rows),
            "new_classes": new,
            "gone_classes": gone,
        }
    )
