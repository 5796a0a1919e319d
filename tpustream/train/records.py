"""What a run records: its state and meta (in every checkpoint), one record per epoch, and where they are shown.

``RunState`` is the position and history a checkpoint restores exactly; ``RunMeta`` what the run is (model,
classes, input size, dataset, config, where its weights began), checked on resume and written into model.json;
``EpochRecord`` one row of the history, built by ``epoch_record`` from what ``EpochRun`` measured. ``EpochLog``
logs each record and (process 0) writes it to TensorBoard event files, uploaded whole after each epoch.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from tpustream.storage import io as storage
from tpustream.train.step import ValMetrics, compile_count

if TYPE_CHECKING:
    from tpustream.loader.shard_loader import ShardLoader
    from tpustream.train.compile_cache import CompileCacheRecord
    from tpustream.train.pretrained import PreprocessingJson
    from tpustream.train.pretrained_load import PretrainedRecord
    from tpustream.train.warm_start import InitRecord

__all__ = [
    "RunState",
    "RunMeta",
    "EpochRun",
    "EpochRecord",
    "epoch_record",
    "epoch_score",
    "ema_won",
    "EpochLog",
    "tensorboard_uris",
]

log = logging.getLogger(__name__)


class EpochRecord(TypedDict):
    """One epoch of the run's history (in every checkpoint and in model.json's ``history``)."""

    epoch: int  # 1-based
    train_loss: float
    val_loss: float
    val_top1: float
    val_top5: float
    val_samples: int
    epoch_seconds: float
    samples_per_s: float
    samples_per_s_per_device: float
    data_wait_fraction: float
    compiles: int  # XLA compiles in this process so far
    train_samples_seen: int
    train_samples_left_out: int
    train_samples_repeated: int
    # slots of the epoch's padded last global batch (copies weighted 0); records before issue 46 lack it
    train_samples_padded: NotRequired[int]
    # The recipe's EMA of the weights, evaluated beside them (tpustream/train/ema.py); absent without one
    ema_val_top1: NotRequired[float]
    ema_val_top5: NotRequired[float]
    ema_val_loss: NotRequired[float]


class RunMeta(TypedDict):
    """What the run is, in every checkpoint's ``meta``: ``check_resume`` compares it with a resumed run's, and
    the model card is written from it. The keys marked NotRequired are absent from older checkpoints or from
    runs that do not use what they record."""

    model: str
    classes: list[str]
    input_size: int
    input_size_reason: NotRequired[str]  # checkpoints written before it lack it
    dataset: str
    dataset_digest: str
    config: dict[str, Any]  # the TrainConfig as JSON, data and output absolute
    preprocessing: NotRequired[PreprocessingJson]
    pretrained_weights: NotRequired[bool]  # --pretrained was given (older checkpoints: the stem followed it)
    peak_lr: NotRequired[
        float
    ]  # the schedule's peak, as chosen (--lr, the scaled default, fine-tuning's, warm start's)
    global_batch: NotRequired[int]
    # the head's multiple of the scheduled LR (--head-lr-scale, the model's)
    head_lr_scale: NotRequired[float]
    small_input_stem: NotRequired[bool]  # the network's stem: the spec's small-input one, or the stock one
    class_weights: NotRequired[dict[str, float]]  # --class-weights auto: each class's loss weight
    pretrained: NotRequired[PretrainedRecord]  # the weights the backbone began from
    init: NotRequired[InitRecord]  # warm start: where the weights began
    freeze_epochs: NotRequired[int]
    compile_cache: NotRequired[CompileCacheRecord]
    recipe: NotRequired[dict[str, Any]]  # RecipeChoice.to_json(): the recipe the run chose and why


@dataclass
class RunState:
    """The run's position and history: ``asdict`` of it is every checkpoint's ``state``."""

    epoch: int = 0
    batches_done: int = 0  # in `epoch`, when resuming mid-epoch
    global_step: int = 0
    best_top1: float = -1.0
    history: list[EpochRecord] = field(default_factory=list)
    epochs_without_gain: int = 0  # early stopping's counter: in every checkpoint, so a resumed run counts on
    stopped_early: bool = False


@dataclass
class EpochRun:
    """What ``run_epoch`` measured, for ``finish_epoch``'s record."""

    started: float
    loss_sum: Any  # on the device: read once, at the end of the epoch
    steps: int = 0
    wait: float = 0.0  # seconds spent waiting for the loader


def epoch_score(record: EpochRecord) -> float:
    """The epoch's val top-1 as model selection reads it: the better of the raw weights' and their EMA's."""
    return max(record["val_top1"], record.get("ema_val_top1", -1.0))


def ema_won(record: EpochRecord) -> bool:
    """Whether the epoch's EMA weights were better on val top-1 than its raw weights (ties: the raw)."""
    return record.get("ema_val_top1", -1.0) > record["val_top1"]


def epoch_record(
    epoch: int,
    run: EpochRun,
    train_loss: float,
    metrics: ValMetrics,
    *,
    loader: ShardLoader,
    steps_per_epoch: int,
    global_batch: int,
    num_devices: int,
) -> EpochRecord:
    """The history row of ``epoch`` (0-based): its losses, validation, speed and what the train loader dealt."""
    import torch_xla.debug.metrics as met

    seconds = time.perf_counter() - run.started
    samples_per_s = run.steps * global_batch / seconds
    # Every replica's plan deals each train sample once (but a remainder under the replica count, or all of it
    # with ``pad_last_batch`` off: ``TrainEpochSize``) and pads the epoch's last global batch; a repeat fills
    # a quota a short (corrupt) shard left open: counted by this process's replica (all of them on one host)
    # in the part of the epoch this run trained.
    repeated = loader.last_report.repeated if loader.last_report else 0
    size = loader.epoch_size
    padding = size.padding if size is not None else 0
    planned = steps_per_epoch * global_batch - padding
    return EpochRecord(
        epoch=epoch + 1,
        train_loss=train_loss,
        **metrics,
        epoch_seconds=seconds,
        samples_per_s=samples_per_s,
        samples_per_s_per_device=samples_per_s / num_devices,
        data_wait_fraction=run.wait / seconds,
        compiles=compile_count(met),
        train_samples_seen=planned - repeated,
        train_samples_left_out=loader.num_samples - planned,
        train_samples_repeated=repeated,
        train_samples_padded=padding,
    )


class EpochLog:
    """The run's log lines per epoch and, on process 0 (``writing``), its TensorBoard event files: written to a
    local directory and uploaded whole to ``OUTPUT/tensorboard`` (and Vertex AI's) after each epoch."""

    def __init__(self, output: str, *, epochs: int, writing: bool) -> None:
        self.epochs = epochs
        self.local_dir = tempfile.mkdtemp(prefix="tpustream-tb-") if writing else ""
        self.writer = _summary_writer(self.local_dir) if writing else None
        self.uris = tensorboard_uris(output) if writing else []

    def epoch(self, r: EpochRecord) -> None:
        """Log one epoch's record; add it to TensorBoard and upload the event files."""
        log.info(
            "epoch %d/%d: train loss %.4f (%d samples seen, %d left out, %d repeated, %d padding), val top-1 %.4f "
            "top-5 %.4f loss %.4f (%d samples), %.1f s, %.0f samples/s (%.0f per device), data wait %.1f%%, "
            "XLA compiles so far %d",
            r["epoch"],
            self.epochs,
            r["train_loss"],
            r["train_samples_seen"],
            r["train_samples_left_out"],
            r["train_samples_repeated"],
            r.get("train_samples_padded", 0),
            r["val_top1"],
            r["val_top5"],
            r["val_loss"],
            r["val_samples"],
            r["epoch_seconds"],
            r["samples_per_s"],
            r["samples_per_s_per_device"],
            100 * r["data_wait_fraction"],
            r["compiles"],
        )
        if self.writer is not None:
            self.writer.add_scalar("epoch/train_loss", r["train_loss"], r["epoch"])
            self.writer.add_scalar("epoch/val_loss", r["val_loss"], r["epoch"])
            self.writer.add_scalar("epoch/val_top1", r["val_top1"], r["epoch"])
            self.writer.add_scalar("epoch/val_top5", r["val_top5"], r["epoch"])
            self.writer.add_scalar("epoch/samples_per_s", r["samples_per_s"], r["epoch"])
            self.writer.add_scalar("epoch/data_wait_fraction", r["data_wait_fraction"], r["epoch"])
            self.writer.flush()
            for uri in self.uris:
                _upload_tree(self.local_dir, uri)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.local_dir:
            shutil.rmtree(self.local_dir, ignore_errors=True)


def _summary_writer(directory: str) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard not installed: no event files
        return None
    return SummaryWriter(directory)


def tensorboard_uris(output: str) -> list[str]:
    """Where process 0 uploads its event files: ``OUTPUT/tensorboard``, and ``AIP_TENSORBOARD_LOG_DIR`` when
    Vertex AI sets it (a custom job with a base output directory: ``<base>/logs/``), from which a job's
    TensorBoard instance streams them ("Use Vertex AI TensorBoard with custom training")."""
    uris = [storage.join(output, "tensorboard")]
    vertex_dir = os.environ.get("AIP_TENSORBOARD_LOG_DIR", "")
    if vertex_dir:
        uris.append(storage.check_uri(vertex_dir))
    return uris


def _upload_tree(local_dir: str, uri: str) -> None:
    """Event files are written locally and uploaded whole (fsspec to gs:// keeps only the last event)."""
    for root, _, files in os.walk(local_dir):
        for name in files:
            path = os.path.join(root, name)
            storage.upload_file(path, storage.join(uri, os.path.relpath(path, local_dir)))
