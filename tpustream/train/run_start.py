"""Where a run's weights begin: its own checkpoint (``--resume``: found, then checked against the run), or a
warm start from ``--init-from`` (tpustream/train/warm_start.py) or ``--pretrained`` weights
(tpustream/train/pretrained.py); random weights otherwise. Each returns what the run's meta records of it;
``Trainer.restore`` and ``Trainer.warm_start`` decide which applies.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tpustream.models import model_spec
from tpustream.storage import io as storage
from tpustream.train.checkpoint import Checkpoint, CheckpointError, latest_checkpoint_uri
from tpustream.train.config import TrainConfig, TrainError
from tpustream.train.optimizer import default_peak_lr

if TYPE_CHECKING:
    from tpustream.train.pretrained import ResolvedWeights
    from tpustream.train.pretrained_load import PretrainedRecord
    from tpustream.train.warm_start import InitRecord, InitWeights

__all__ = [
    "resume_uri",
    "check_resume",
    "within",
    "start_from_pretrained",
    "choose_init",
    "start_from_init",
    "warm_peak_lr",
]

log = logging.getLogger(__name__)


def resume_uri(config: TrainConfig, output: str) -> str | None:
    """The checkpoint ``--resume`` continues from (auto: this output's `last`), or None: a new run."""
    if config.resume == "auto":
        return latest_checkpoint_uri(output)
    if config.resume == "never":
        return None
    uri = latest_checkpoint_uri(config.resume) if not config.resume.endswith(".pt") else config.resume
    if uri is None:
        raise CheckpointError(f"--resume {config.resume}: no committed checkpoint there")
    return uri


def check_resume(
    checkpoint: Checkpoint,
    config: TrainConfig,
    classes: list[str],
    input_size: int,
    uri: str,
    digest: str,
) -> None:
    """Refuse a checkpoint of another dataset, model, class list or input size than this run's."""
    meta: dict[str, Any] = dict(checkpoint.get("meta") or {})  # older checkpoints may lack any key
    problems = []
    if meta.get("dataset_digest") not in (None, digest):
        # Resuming on other data would keep the old weights and history but record the new dataset.
        problems.append(
            f"dataset {meta.get('dataset')} (manifest sha256 {str(meta.get('dataset_digest'))[:12]}; this run's "
            f"--data has {digest[:12]})"
        )
    if meta.get("model") != config.model:
        problems.append(f"model {meta.get('model')!r} (this run: {config.model!r})")
    if meta.get("classes") != classes:
        problems.append(
            f"{len(meta.get('classes') or [])} classes {str(meta.get('classes'))[:80]} (dataset: {len(classes)})"
        )
    if meta.get("input_size") != input_size:
        problems.append(f"input size {meta.get('input_size')} (this run: {input_size})")
    if problems:
        raise CheckpointError(
            f"checkpoint {uri} does not fit this run: it has "
            + "; ".join(problems)
            + ". Use --resume never, or another --output for a different model or dataset"
        )


def within(uri: str, output: str) -> bool:
    """Whether the checkpoint ``uri`` lies under the run directory ``output``."""
    return storage.absolute(uri).startswith(storage.absolute(output).rstrip("/") + "/")


def start_from_pretrained(model: Any, resolved: ResolvedWeights, *, arch: str) -> PretrainedRecord:
    """Load --pretrained's backbone into ``model`` (its head stays new); returns the meta's ``pretrained``."""
    from tpustream.train.pretrained import PretrainedError
    from tpustream.train.pretrained_load import apply_pretrained, load_state_dict

    try:
        weights, digest = load_state_dict(resolved)
        return apply_pretrained(model, weights, arch=arch, resolved=resolved, sha256=digest)
    except PretrainedError as exc:
        raise TrainError(str(exc)) from exc


def choose_init(
    config: TrainConfig, *, classes: list[str], pretrained: ResolvedWeights | None
) -> InitWeights | None:
    """--init-from's weights when they start the run; None when they do not (other classes than the run's
    while --pretrained is given, or optional and unusable: --pretrained or random weights instead)."""
    from tpustream.train.warm_start import WarmStartError, load_init_weights

    try:
        init = load_init_weights(config.init_from or "")
    except WarmStartError as exc:
        _init_unusable(config, exc, pretrained)
        return None
    if pretrained is not None and init.classes != classes:
        log.info(
            "--init-from %s has other classes than this run: --pretrained %s starts it instead",
            config.init_from,
            config.pretrained,
        )
        return None
    return init


def start_from_init(
    config: TrainConfig,
    model: Any,
    init: InitWeights,
    *,
    classes: list[str],
    input_size: int,
    pretrained: ResolvedWeights | None,
) -> InitRecord | None:
    """Load ``init`` (``choose_init``) into ``model``; returns the meta's ``init``, or None when it does not
    fit and is optional (--pretrained or random weights instead)."""
    from tpustream.train.warm_start import WarmStartError, apply_init_weights

    try:
        record = apply_init_weights(model, init, arch=config.model, classes=classes, input_size=input_size)
    except WarmStartError as exc:
        _init_unusable(config, exc, pretrained)
        return None
    log.info("the run starts from --init-from %s", config.init_from)
    return record


def _init_unusable(config: TrainConfig, exc: Exception, pretrained: ResolvedWeights | None) -> None:
    """An optional --init-from that cannot start the run is a warning; a required one a TrainError."""
    if not config.init_optional:
        raise TrainError(str(exc)) from exc
    instead = "--pretrained weights" if pretrained is not None else "random weights"
    log.warning("%s: training from %s instead", exc, instead)
    return None


def warm_peak_lr(config: TrainConfig, global_batch: int) -> float | None:
    """A warm-started run's peak LR without --lr: a tenth of the scratch default (warm_start.WARM_LR_FACTOR);
    the same on every restart of the run, which finds ``init`` in its checkpoint's meta. None: --lr given."""
    from tpustream.train.warm_start import WARM_LR_FACTOR

    if config.lr is not None:
        return None
    peak_lr = WARM_LR_FACTOR * default_peak_lr(global_batch, model_spec(config.model).base_lr)
    log.info(
        "warm start: peak lr %.4g, %g x the from-scratch default (give --lr to choose another)",
        peak_lr,
        WARM_LR_FACTOR,
    )
    return peak_lr
