"""Pretrained weights as the start of a run (``train --pretrained SPEC``): resolve, fetch once, cache.

SPEC is a torchvision weights name (``resnet50.IMAGENET1K_V2``, ``efficientnet_b0.DEFAULT``, or a member alone,
``IMAGENET1K_V1``, for the run's model), checked against ``torchvision.models.get_model_weights`` of the model's
``ModelSpec.torchvision_arch``; or a URI (local or gs://) of a state dict in torchvision layout (``.pth``/``.pt``)
or a ``.safetensors`` file, as a project without internet egress stages them.

A named weight set is fetched once, by the CLI or the pipeline's CPU step, into a content-addressed cache
(``--weights-cache``, default ``<output>/../weights-cache``): the file keeps torchvision's name, whose last
``-``-separated part is a prefix of its sha256 (``torch.hub.check_hash``'s rule), checked on download and on
every later read. The training job is given the cached copy's URI, so no host of a slice reaches the internet.

Loading the file into a network is tpustream/train/pretrained_load.py's: the backbone loads every weight; the
classifier (``ModelSpec.head``) is re-initialised for the run's classes. With pretrained weights the stock stem
is kept whatever the input size (small images are upscaled), and the input pipeline uses the weights'
preprocessing (``Preprocessing``, here), which the model card records.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from tpustream.errors import TpustreamError
from tpustream.image.transforms import IMAGENET_MEAN, IMAGENET_STD, VAL_CROP_FRACTION
from tpustream.models import MODEL_SPECS, ModelSpec, model_spec
from tpustream.storage import io as storage

__all__ = [
    "BASE_URL_ENV",
    "TORCHVISION_BASE_URL",
    "PretrainedError",
    "Preprocessing",
    "PreprocessingJson",
    "ResolvedWeights",
    "ResolvedWeightsJson",
    "check_hash",
    "default_weights_cache",
    "is_uri",
    "MODEL_DEFAULT",
    "resolve",
    "resolve_ahead",
    "spec_preprocessing",
]

log = logging.getLogger(__name__)

TORCHVISION_BASE_URL = "https://download.pytorch.org/models/"
# Replaces TORCHVISION_BASE_URL in a weight set's URL: a mirror, or the tests' loopback server.
BASE_URL_ENV = "TPUSTREAM_WEIGHTS_BASE_URL"
WEIGHT_SUFFIXES = (".pth", ".pt", ".safetensors")


class PretrainedError(TpustreamError, ValueError):
    """--pretrained cannot be used as given; the message names it and what to do."""


class PreprocessingJson(TypedDict):
    """``Preprocessing`` as model.json (and a checkpoint's meta) records it."""

    resize_size: int
    crop_size: int
    mean: list[float]
    std: list[float]
    interpolation: str
    weights_interpolation: str


@dataclass(frozen=True, kw_only=True)
class Preprocessing:
    """How an image becomes the network's input at evaluation: resize the shorter side to ``resize_size``,
    centre-crop ``crop_size`` (the model's input side), scale to [0, 1], normalise by ``mean``/``std``.
    ``interpolation`` is the resample every tpustream reader applies (antialiased bilinear); the weights'
    own, when another (EfficientNet's bicubic), is in ``weights_interpolation``."""

    resize_size: int
    crop_size: int
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    interpolation: str = "bilinear"
    weights_interpolation: str = "bilinear"

    @property
    def crop_fraction(self) -> float:
        return self.crop_size / self.resize_size

    def at(self, crop_size: int) -> Preprocessing:
        """The same preprocessing at another input side (the crop fraction kept)."""
        resize = max(crop_size, round(crop_size / self.crop_fraction))
        return Preprocessing(
            resize_size=resize,
            crop_size=crop_size,
            mean=self.mean,
            std=self.std,
            interpolation=self.interpolation,
            weights_interpolation=self.weights_interpolation,
        )

    def to_json(self) -> PreprocessingJson:
        return PreprocessingJson(
            resize_size=self.resize_size,
            crop_size=self.crop_size,
            mean=list(self.mean),
            std=list(self.std),
            interpolation=self.interpolation,
            weights_interpolation=self.weights_interpolation,
        )

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> Preprocessing:
        return cls(
            resize_size=int(document["resize_size"]),
            crop_size=int(document["crop_size"]),
            mean=tuple(float(v) for v in document.get("mean", IMAGENET_MEAN)),
            std=tuple(float(v) for v in document.get("std", IMAGENET_STD)),
            interpolation=str(document.get("interpolation", "bilinear")),
            weights_interpolation=str(document.get("weights_interpolation", "bilinear")),
        )

    @classmethod
    def default(cls, crop_size: int) -> Preprocessing:
        """A run from random weights: ImageNet's statistics and Resize(S/0.875) + CenterCrop(S)."""
        return cls(resize_size=round(crop_size / VAL_CROP_FRACTION), crop_size=crop_size)


class ResolvedWeightsJson(TypedDict):
    """``ResolvedWeights`` as JSON: the start of the model card's ``pretrained`` record."""

    spec: str
    uri: str
    name: str | None
    sha256: str | None
    preprocessing: PreprocessingJson


@dataclass(frozen=True, kw_only=True)
class ResolvedWeights:
    """Where a --pretrained SPEC's weights are: ``uri`` is what the training job reads."""

    spec: str  # as given
    uri: str  # the file: the cached copy of a named weight set, or the given URI
    name: str | None  # torchvision's name (resnet50.IMAGENET1K_V2) for a named set
    sha256: str | None  # known once read (named: checked against the file name's prefix)
    preprocessing: Preprocessing

    def to_json(self) -> ResolvedWeightsJson:
        return ResolvedWeightsJson(
            spec=self.spec,
            uri=self.uri,
            name=self.name,
            sha256=self.sha256,
            preprocessing=self.preprocessing.to_json(),
        )


def is_uri(spec: str) -> bool:
    """Whether SPEC names a file (a URI or path of weights) rather than a torchvision weight set."""
    return "/" in spec or spec.endswith(WEIGHT_SUFFIXES) or spec.startswith("gs:")


def default_weights_cache(output: str) -> str:
    """``<output>/../weights-cache``: beside the run's output, shared by the runs under the same parent."""
    parent = storage.absolute(output).rstrip("/").rsplit("/", 1)[0]
    return storage.join(parent, "weights-cache")


def _torchvision_weights(spec: ModelSpec, text: str) -> Any:
    """The torchvision weights enum member SPEC names for ``spec``'s architecture."""
    from torchvision.models import get_model_weights

    arch, _, member = text.rpartition(".")
    if spec.torchvision_arch is None:
        raise PretrainedError(
            f"--pretrained {text}: model {spec.name} has no published torchvision weights; pass a state dict "
            "URI, or choose a model that has (one of "
            + ", ".join(name for name, s in MODEL_SPECS.items() if s.torchvision_arch)
            + ")"
        )
    if arch and arch != spec.torchvision_arch:
        raise PretrainedError(
            f"--pretrained {text} names weights for {arch}, this run trains {spec.name}: pass --model {arch}, "
            f"or weights of {spec.torchvision_arch}"
        )
    enum = get_model_weights(spec.torchvision_arch)
    names = list(enum.__members__)
    if member not in names:
        raise PretrainedError(
            f"--pretrained {text}: torchvision has no weight set {member!r} for {spec.torchvision_arch}: choose "
            "one of " + ", ".join(f"{spec.torchvision_arch}.{name}" for name in names)
        )
    return enum[member]


def _weights_preprocessing(weights: Any) -> Preprocessing:
    transforms = weights.transforms()
    interpolation = str(getattr(transforms, "interpolation", "bilinear")).rsplit(".", 1)[-1].lower()
    return Preprocessing(
        resize_size=int(transforms.resize_size[0]),
        crop_size=int(transforms.crop_size[0]),
        mean=tuple(float(v) for v in transforms.mean),
        std=tuple(float(v) for v in transforms.std),
        weights_interpolation=interpolation,
    )


def spec_preprocessing(spec: ModelSpec) -> Preprocessing:
    """A weights file's preprocessing: that of the architecture's DEFAULT torchvision weights (read offline
    from torchvision's tables), else ImageNet's 256/224 crop and statistics."""
    if spec.torchvision_arch is None:
        return Preprocessing.default(224)
    from torchvision.models import get_model_weights

    return _weights_preprocessing(get_model_weights(spec.torchvision_arch).DEFAULT)


# torch.hub's rule (torch/hub.py, HASH_REGEX, used by download_url_to_file(check_hash=True)): the first
# "-<hex>." in the file name is a prefix of its sha256; a name without one carries no hash to check.
_HASH_REGEX = re.compile(r"-([a-f0-9]*)\.")


def _hash_prefix(file_name: str) -> str:
    """The sha256 prefix torch.hub reads from ``file_name`` ("" when the name carries none)."""
    found = _HASH_REGEX.search(file_name)
    return found.group(1) if found else ""


def check_hash(data: bytes, file_name: str, where: str) -> str:
    """The sha256 of ``data``; a PretrainedError when it does not start with ``file_name``'s hash prefix."""
    digest = hashlib.sha256(data).hexdigest()
    prefix = _hash_prefix(file_name)
    if prefix and not digest.startswith(prefix):
        raise PretrainedError(
            f"{where}: sha256 {digest[:12]}... does not start with {prefix!r} from its file name: the file is "
            "corrupt or not the published one; delete it and resolve --pretrained again"
        )
    return digest


def _download(url: str, spec_text: str) -> bytes:
    base = os.environ.get(BASE_URL_ENV, "")
    if base and url.startswith(TORCHVISION_BASE_URL):
        url = base.rstrip("/") + "/" + url[len(TORCHVISION_BASE_URL) :]
    log.info("pretrained: fetching %s", url)
    try:
        with urllib.request.urlopen(url, timeout=300) as response:  # noqa: S310 (http(s) URL from torchvision)
            return response.read()
    except (urllib.error.URLError, OSError) as exc:
        raise PretrainedError(
            f"--pretrained {spec_text}: cannot fetch {url} ({exc}); without internet egress, stage the file "
            f"(gsutil cp {url.rsplit('/', 1)[-1]} gs://BUCKET/weights/) and pass --pretrained with its URI"
        ) from exc


def resolve(
    text: str,
    *,
    model: str,
    cache: str | None = None,
    input_size: int | None = None,
    fetch: bool = True,
    wait_seconds: float = 0.0,
) -> ResolvedWeights:
    """Resolve --pretrained ``text`` for ``model``: a named weight set is found in (or fetched once into)
    ``cache`` and hash-checked; a URI is checked to exist. ``input_size`` overrides the crop size.

    ``fetch=False`` (every host of a slice but process 0): never download; wait up to ``wait_seconds`` for
    the copy process 0 (or the pipeline's resolve-weights step) puts in the cache, then read it."""
    spec = model_spec(model)
    text = text.strip()
    if not text:
        raise PretrainedError("--pretrained is empty: give a torchvision weights name or a weights file URI")
    if is_uri(text):
        try:
            uri = storage.check_uri(text)
            found = storage.exists(uri)
        except storage.StorageError as exc:
            raise PretrainedError(f"--pretrained {text}: {exc}") from exc
        if not found:
            raise PretrainedError(f"--pretrained {text} does not exist: stage the weights file there first")
        if not uri.endswith(WEIGHT_SUFFIXES):
            raise PretrainedError(
                f"--pretrained {text}: not a .pth, .pt or .safetensors file; give a state dict in torchvision "
                "layout"
            )
        preprocessing = spec_preprocessing(spec)
        if input_size:
            preprocessing = preprocessing.at(input_size)
        return ResolvedWeights(spec=text, uri=uri, name=None, sha256=None, preprocessing=preprocessing)
    weights = _torchvision_weights(spec, text)
    name = f"{spec.torchvision_arch}.{weights.name}"
    file_name = weights.url.rsplit("/", 1)[-1]
    if cache is None:
        raise PretrainedError(
            f"--pretrained {text}: a named weight set needs --weights-cache (where to keep it)"
        )
    try:
        cached = storage.join(storage.check_uri(cache), file_name)
        if not fetch:
            _wait_for(cached, wait_seconds, text)
        if storage.exists(cached):
            digest = check_hash(storage.read_bytes(cached), file_name, cached)
            log.info("pretrained: %s from the cache, %s", name, cached)
        else:
            data = _download(weights.url, text)
            digest = check_hash(data, file_name, weights.url)
            storage.write_bytes(cached, data)
            log.info("pretrained: %s fetched into %s", name, cached)
    except storage.StorageError as exc:
        raise PretrainedError(f"--weights-cache {cache}: {exc}") from exc
    preprocessing = _weights_preprocessing(weights)
    if input_size:
        preprocessing = preprocessing.at(input_size)
    return ResolvedWeights(spec=text, uri=cached, name=name, sha256=digest, preprocessing=preprocessing)


# The pipeline parameter `pretrained`'s default: the run's model's torchvision DEFAULT weights (a member
# alone names the run's model's set); a model with none trains from random weights, said in the log.
MODEL_DEFAULT = "DEFAULT"


def resolve_ahead(text: str, *, model: str, cache: str) -> str:
    """The pipeline's resolve-weights step (a CPU step before the TPU job): fetch a named weight set into
    ``cache`` once and hash-check it, or check a weights file exists; return the SPEC the train step
    passes on (its hosts then only read the cached copy). "" for random weights: ``text`` empty, or
    MODEL_DEFAULT for a model without published weights."""
    text = text.strip()
    if not text:
        log.info("pretrained: none; the run starts from random weights (or its warm start's)")
        return ""
    if text == MODEL_DEFAULT and model_spec(model).torchvision_arch is None:
        log.warning(
            "pretrained: %s has no published torchvision weights: the run starts from random weights",
            model,
        )
        return ""
    resolved = resolve(text, model=model, cache=cache)
    log.info("pretrained: %s -> %s (sha256 %s)", text, resolved.uri, (resolved.sha256 or "not computed")[:12])
    return text


def _wait_for(cached: str, wait_seconds: float, text: str) -> None:
    """Return once ``cached`` exists (writes are atomic: it is whole); a one-line error after ``wait_seconds``."""
    deadline = time.monotonic() + wait_seconds
    while not storage.exists(cached):
        if time.monotonic() >= deadline:
            raise PretrainedError(
                f"--pretrained {text}: {cached} did not appear within {wait_seconds:g} s; process 0 fetches a "
                "named weight set for the whole slice (see its log), or stage it there first with "
                "`tpustream weights fetch`"
            )
        time.sleep(1.0)
