"""Pretrained weights into a network (``train --pretrained``, after tpustream/train/pretrained.py resolved them
to a file): read the state dict (``.pth``/``.pt`` with ``torch.load(weights_only=True)``, or ``.safetensors``),
load every backbone weight into the network (``tpustream.models.build_network``) and keep its new head.

A file that does not fit (another architecture, a missing or misshapen key) is a one-line ``PretrainedError``
naming the file and the fix; the model card's ``pretrained`` record says what was loaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
from typing import TYPE_CHECKING

from tpustream.models import MODEL_SPECS, model_spec
from tpustream.storage import io as storage
from tpustream.train.pretrained import PretrainedError, ResolvedWeights, ResolvedWeightsJson, check_hash

if TYPE_CHECKING:
    from torch import nn

    from tpustream.train.checkpoint import StateDict

__all__ = [
    "PretrainedRecord",
    "read_safetensors",
    "load_state_dict",
    "apply_pretrained",
]

log = logging.getLogger(__name__)


class PretrainedRecord(ResolvedWeightsJson):
    """The model card's ``pretrained``: the resolved weights, their bytes' sha256, the head re-initialised and
    how many backbone tensors were loaded."""

    head: str
    tensors_loaded: int


_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def read_safetensors(data: bytes, where: str) -> StateDict:
    """A .safetensors file's tensors (the format: an 8-byte little-endian header length, a JSON header of
    ``name: {dtype, shape, data_offsets}``, then the bytes). Read here, not with the ``safetensors``
    package, which the environment does not install: it is a 30-line format, and no code runs from it."""
    import torch

    try:
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + length])
        body = memoryview(data)[8 + length :]
        tensors: StateDict = {}
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            dtype = getattr(torch, _SAFETENSORS_DTYPES[entry["dtype"]])
            start, end = entry["data_offsets"]
            flat = (
                torch.frombuffer(bytearray(body[start:end]), dtype=dtype) if end > start else torch.empty(0)
            )
            tensors[key] = flat.to(dtype).reshape(entry["shape"])
        return tensors
    except (struct.error, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise PretrainedError(f"--pretrained {where}: not a readable .safetensors file ({exc})") from exc


def load_state_dict(resolved: ResolvedWeights) -> tuple[StateDict, str]:
    """The state dict at ``resolved.uri`` and the sha256 of its bytes (checked again for a named set)."""
    import io

    import torch

    try:
        data = storage.read_bytes(resolved.uri)
    except storage.StorageError as exc:
        raise PretrainedError(f"--pretrained {resolved.spec}: {exc}") from exc
    file_name = resolved.uri.rsplit("/", 1)[-1]
    digest = check_hash(data, file_name, resolved.uri) if resolved.name else hashlib.sha256(data).hexdigest()
    if resolved.uri.endswith(".safetensors"):
        return read_safetensors(data, resolved.uri), digest
    try:
        loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling errors come in many types
        raise PretrainedError(
            f"--pretrained {resolved.uri}: unreadable with torch.load(weights_only=True) ({type(exc).__name__}): "
            "give a state dict saved with torch.save(model.state_dict())"
        ) from exc
    if isinstance(loaded, dict) and isinstance(loaded.get("model"), dict):
        loaded = loaded["model"]  # a checkpoint that wraps its state dict (ours, and many trainers')
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
        loaded = loaded["state_dict"]
    if not isinstance(loaded, dict) or not all(isinstance(k, str) for k in loaded):
        raise PretrainedError(
            f"--pretrained {resolved.uri} holds a {type(loaded).__name__}, not a state dict: save "
            "model.state_dict()"
        )
    return {key.removeprefix("module."): value for key, value in loaded.items()}, digest


def _shapes(state: StateDict) -> dict[str, tuple[int, ...]]:
    return {key: tuple(value.shape) for key, value in state.items()}


def _which_arch(weights: StateDict, heads: set[str]) -> str | None:
    """The supported torchvision architecture whose backbone ``weights`` are (built on the meta device)."""
    import torch
    from torchvision import models

    given = {k: v for k, v in _shapes(weights).items() if k not in heads}
    for spec in MODEL_SPECS.values():
        if spec.torchvision_arch is None:
            continue
        with torch.device("meta"):
            network = models.get_model(spec.torchvision_arch, weights=None)
        own = _shapes(network.state_dict())
        head = {f"{spec.head}.weight", f"{spec.head}.bias"}
        backbone = {k: v for k, v in own.items() if k not in head and not k.endswith("num_batches_tracked")}
        if all(given.get(k) == v for k, v in backbone.items()) and set(given) - head <= set(own):
            return spec.torchvision_arch
    return None


def apply_pretrained(
    model: nn.Module, weights: StateDict, *, arch: str, resolved: ResolvedWeights, sha256: str
) -> PretrainedRecord:
    """Load ``weights`` into ``model``'s backbone, keep its freshly initialised head; returns the model
    card's ``pretrained``. A key missing or of another shape is a one-line PretrainedError with the fix."""
    import torch

    spec = model_spec(arch)
    head = {f"{spec.head}.weight", f"{spec.head}.bias"}
    own = model.state_dict()
    loaded: StateDict = {}
    mismatched: list[str] = []
    missing: list[str] = []
    for key, value in own.items():
        if key in head:
            continue
        if key not in weights:
            if key.endswith("num_batches_tracked"):  # files saved before torch 0.4.1 lack the counters
                continue
            missing.append(key)
        elif tuple(weights[key].shape) != tuple(value.shape):
            mismatched.append(key)
        else:
            loaded[key] = weights[key].to(value.dtype)
    unexpected = sorted(set(weights) - set(own) - head)
    if missing or mismatched or unexpected:
        holder = _which_arch(weights, {k for k in weights if k.rsplit(".", 1)[0] in _linear_names(weights)})
        where = f"--pretrained {resolved.spec}"
        if holder is not None and holder != spec.torchvision_arch:
            raise PretrainedError(
                f"{where}: the file holds weights for {holder}, not {arch}: pass --model {holder}, or weights "
                f"of {arch}"
            )
        if mismatched:
            key = mismatched[0]
            raise PretrainedError(
                f"{where}: {key} is {tuple(weights[key].shape)} in the file, {tuple(own[key].shape)} in {arch} "
                f"({len(mismatched)} such): give weights of torchvision's {arch} (torchvision layout)"
            )
        if missing:
            raise PretrainedError(
                f"{where} lacks {len(missing)} backbone weight(s) of {arch}, e.g. {missing[0]!r}: give a full "
                f"state dict of torchvision's {arch} (model.state_dict())"
            )
        raise PretrainedError(
            f"{where} has {len(unexpected)} weight(s) {arch} lacks, e.g. {unexpected[0]!r}: it is not a "
            f"torchvision {arch} state dict"
        )
    with torch.no_grad():
        result = model.load_state_dict(loaded, strict=False)
    assert set(result.missing_keys) <= head | {k for k in own if k.endswith("num_batches_tracked")}
    log.info(
        "pretrained: %d backbone tensors loaded from %s (%s); head %s re-initialised for the run's classes",
        len(loaded),
        resolved.name or resolved.uri,
        sha256[:12],
        spec.head,
    )
    return PretrainedRecord(
        spec=resolved.spec,
        uri=resolved.uri,
        name=resolved.name,
        sha256=sha256,
        preprocessing=resolved.preprocessing.to_json(),
        head=spec.head,
        tensors_loaded=len(loaded),
    )


def _linear_names(weights: StateDict) -> set[str]:
    """Module names whose weight is 2-D (Linear layers): a file's head, whatever its class count."""
    return {
        key.rsplit(".", 1)[0] for key, value in weights.items() if key.endswith(".weight") and value.ndim == 2
    }
