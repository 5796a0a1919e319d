"""The XLA trainer: ResNet on TPU (or XLA CPU) from streamed shards, exact checkpoints, resume, preemption.

``train()`` loops over epochs; each epoch loops over ``train_step()`` and ends with ``evaluate()`` and
a committed checkpoint. Strategies:

- ``spmd`` (default): one process per host, a 1-D ``data`` mesh over every device; each host loads its
  slice of the global batch (per-device batch x local devices) and the batch is sharded over the mesh
  (``minibatch=True``); weights are replicated and XLA inserts the gradient all-reduce.
- ``replicas``: one process per device via ``torch_xla.launch``; gradients all-reduced by
  ``xm.optimizer_step``; each replica streams its own data slice.

Nothing in a step syncs with the host: logging goes through ``xm.add_step_closure``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn

from tpustream import storage
from tpustream.checkpoint import (
    CheckpointError,
    Position,
    latest_checkpoint_uri,
    load_checkpoint,
    save_checkpoint,
    to_cpu,
)
from tpustream.errors import TpustreamError
from tpustream.manifest import ShardError, manifest_digest, read_manifest
from tpustream.models import MODEL_NAMES, build_model, parameter_groups, small_input
from tpustream.preemption import SigtermFlag, StopAgreement
from tpustream.transforms import IMAGENET_MEAN, IMAGENET_STD
from tpustream.xla_runtime import Runtime, device_loader, runtime

__all__ = [
    "TrainConfig",
    "TrainError",
    "Preempted",
    "exit_preempted",
    "exit_now",
    "PREEMPTED_EXIT_CODE",
    "lr_at",
    "train",
    "MODEL_FORMAT",
]

log = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: "try again" — the job is restarted and resumes from `last`
MODEL_FORMAT = "tpustream.model/v1"


class TrainError(TpustreamError, ValueError):
    """Training cannot start as configured; the message names the input and the fix."""


class Preempted(RuntimeError):
    """SIGTERM arrived: the current step finished and `last` was written. Exit with PREEMPTED_EXIT_CODE."""


def exit_preempted(exc: Preempted) -> NoReturn:
    """Say why and leave with PREEMPTED_EXIT_CODE at once. ``os._exit``, not ``sys.exit``: the checkpoint is
    committed, and an interpreter teardown with XLA's runtime threads still up can abort (SIGABRT, exit
    134: "terminate called without an active exception"), which Vertex would read as a crash."""
    print(f"tpustream: {exc}; exit {PREEMPTED_EXIT_CODE} (run again to resume)", file=sys.stderr, flush=True)
    exit_now(PREEMPTED_EXIT_CODE)


def exit_now(code: int) -> NoReturn:
    """Flush logs and leave with ``code`` without the interpreter teardown (see ``exit_preempted``)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Options of ``tpustream train`` (the CLI contract in docs/ARCHITECTURE.md)."""

    data: str
    output: str
    model: str = "resnet50"
    epochs: int = 10
    batch_size: int = 128  # per device
    global_batch_size: int | None = None  # alternative to batch_size: must divide over the devices
    lr: float | None = None  # peak LR; default 0.1 x global batch / 256
    momentum: float = 0.9
    weight_decay: float = 1e-4
    label_smoothing: float = 0.1
    warmup_epochs: float = 1.0
    bf16: bool = False
    strategy: str = "spmd"
    resume: str = "auto"
    log_steps: int = 20
    checkpoint_minutes: float = 30.0
    workers: int = 4
    input_size: int | None = None  # default: 224, or the images' size when they are small
    seed: int = 0
    keep_checkpoints: int = 2
    commit_timeout_minutes: float = 30.0  # hosts other than process 0 wait this long for its model artifact
    preemption_sync_seconds: float = 10.0  # on a slice: how long hosts wait for each other's stop step

    def __post_init__(self) -> None:
        if self.model not in MODEL_NAMES:
            raise ValueError(f"unknown model {self.model!r}: choose one of {', '.join(MODEL_NAMES)}")
        if self.strategy not in ("spmd", "replicas"):
            raise ValueError(f"--strategy must be spmd or replicas, got {self.strategy!r}")
        for name in ("epochs", "batch_size", "log_steps", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.global_batch_size is not None and self.global_batch_size < 1:
            raise ValueError(f"--global-batch-size must be at least 1, got {self.global_batch_size}")
        if self.lr is not None and self.lr <= 0:
            raise ValueError(f"--lr must be positive, got {self.lr}")
        if self.warmup_epochs < 0 or self.checkpoint_minutes <= 0:
            raise ValueError("--warmup-epochs must be >= 0 and --checkpoint-minutes > 0")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.workers < 0:
            raise ValueError(f"--workers must be >= 0, got {self.workers}")
        if self.preemption_sync_seconds <= 0 or self.commit_timeout_minutes <= 0:
            raise ValueError("--preemption-sync-seconds and --commit-timeout-minutes must be positive")


def lr_at(step: int, *, peak_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup to ``peak_lr``, then cosine decay to zero at ``total_steps`` (pure)."""
    if warmup_steps and step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return peak_lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


# --------------------------------------------------------------------------- steps


def _normalize(images: Any) -> Any:
    """uint8 NCHW on the device -> normalised float32 (autocast lowers the convolutions to bf16)."""
    from tpustream.transforms import normalize

    return normalize(images)


def train_step(
    model: Any, optimizer: Any, batch: dict[str, Any], lr: float, config: TrainConfig, rt: Runtime
) -> Any:
    """One optimizer step on a device batch; returns the (device) loss. No host sync."""
    import torch
    import torch.nn.functional as F
    import torch_xla
    import torch_xla.core.xla_model as xm

    for group in optimizer.param_groups:
        group["lr"] = lr
    images = _normalize(batch["image"])
    with torch.autocast("xla", dtype=torch.bfloat16, enabled=config.bf16):
        logits = model(images)
    loss = F.cross_entropy(logits.float(), batch["label"], label_smoothing=config.label_smoothing)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if rt.strategy == "replicas":
        xm.optimizer_step(optimizer)  # all-reduces gradients across replicas, then steps
    else:
        optimizer.step()
    torch_xla.sync()
    return loss.detach()


def evaluate(model: Any, loader: Any, epoch: int, config: TrainConfig, rt: Runtime) -> dict[str, float]:
    """Exact val metrics: masked sums on the device, one host transfer per epoch."""
    import torch
    import torch.nn.functional as F
    import torch_xla
    import torch_xla.core.xla_model as xm

    model.eval()
    sums = torch.zeros(4, device=rt.device)  # loss, top1, top5, count
    with torch.no_grad():
        for batch in device_loader(loader.epoch(epoch), rt):
            with torch.autocast("xla", dtype=torch.bfloat16, enabled=config.bf16):
                logits = model(_normalize(batch["image"]))
            logits = logits.float()
            mask = batch["mask"].float()
            labels = batch["label"]
            loss = F.cross_entropy(logits, labels, reduction="none")
            top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
            hit1 = (top5[:, 0] == labels).float()
            hit5 = (top5 == labels[:, None]).any(dim=1).float()
            sums = sums + torch.stack(
                [(loss * mask).sum(), (hit1 * mask).sum(), (hit5 * mask).sum(), mask.sum()]
            )
            torch_xla.sync()
    if rt.strategy == "replicas" and rt.num_replicas > 1:
        sums = xm.all_reduce(xm.REDUCE_SUM, sums)  # type: ignore[assignment]
    loss_sum, top1, top5_sum, count = sums.cpu().tolist()
    model.train()
    count = max(count, 1.0)
    return {
        "val_loss": loss_sum / count,
        "val_top1": top1 / count,
        "val_top5": top5_sum / count,
        "val_samples": int(count),
    }


# --------------------------------------------------------------------------- the loop


@dataclass
class _State:
    epoch: int = 0
    batches_done: int = 0  # in `epoch`, when resuming mid-epoch
    global_step: int = 0
    best_top1: float = -1.0
    history: list[dict[str, Any]] = field(default_factory=list)


def resolve_input_size(config: TrainConfig, dataset: str, manifest: dict[str, Any]) -> int:
    """--input-size, else 224 for photo-size images and the images' own side (at least 16) for small ones."""
    if config.input_size:
        return config.input_size
    from tpustream.data import first_image_side

    side = first_image_side(dataset, manifest)
    return 224 if side >= 128 else max(16, side)  # tiny sources (8x8 digits) are upscaled to 16


def _check_resume(
    checkpoint: dict[str, Any],
    config: TrainConfig,
    classes: list[str],
    input_size: int,
    uri: str,
    digest: str,
) -> None:
    meta = checkpoint.get("meta", {})
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


def train(config: TrainConfig) -> dict[str, Any]:
    """Train per ``config``; returns the final model.json contents. Raises Preempted on SIGTERM."""
    if config.strategy == "replicas":
        import torch_xla

        torch_xla.launch(_replica_main, args=(config,))
        return json.loads(storage.read_bytes(storage.join(config.output, "model.json")))
    return _train_process(config)


def _replica_main(index: int, config: TrainConfig) -> None:
    _train_process(config)


def _train_process(config: TrainConfig) -> dict[str, Any]:
    # SIGTERM is a preemption from the first instant: setup, loop and waiting for process 0 alike.
    with SigtermFlag() as preemption:
        return _setup_and_run(config, preemption)


def _setup_and_run(config: TrainConfig, preemption: SigtermFlag) -> dict[str, Any]:
    import torch
    import torch_xla.core.xla_model as xm

    from tpustream.data import LoaderConfig, LoaderError, ShardLoader

    output = storage.check_uri(config.output).rstrip("/")
    dataset = storage.check_uri(config.data).rstrip("/")
    try:
        manifest = read_manifest(dataset)
    except ShardError as exc:
        raise TrainError(f"--data {dataset}: {exc}") from exc
    for split in ("train", "val"):
        if not manifest["splits"].get(split, {}).get("shards"):
            raise TrainError(
                f"--data {dataset} has no {split!r} split: re-create it with a validation fraction"
            )
    digest = manifest_digest(dataset)
    classes = list(manifest["classes"])
    rt = runtime(config.strategy)
    if rt.is_master:
        try:
            storage.ensure_prefix_writable(output)
        except storage.StorageError as exc:
            raise TrainError(f"--output {output}: {exc}") from exc
    per_device = config.batch_size
    if config.global_batch_size is not None:
        if config.global_batch_size % rt.num_devices:
            raise TrainError(
                f"--global-batch-size {config.global_batch_size} does not divide over {rt.num_devices} devices: "
                f"use a multiple of {rt.num_devices}, e.g. {rt.num_devices * max(1, config.global_batch_size // rt.num_devices)}"
            )
        per_device = config.global_batch_size // rt.num_devices
    global_batch = per_device * rt.num_devices
    input_size = resolve_input_size(config, dataset, manifest)
    try:
        loaders = {
            split: ShardLoader(
                LoaderConfig(
                    data=dataset, split=split, batch_size=rt.host_batch(per_device), input_size=input_size,
                    num_replicas=rt.num_replicas, replica_index=rt.replica_index, workers=config.workers,
                    seed=config.seed,
                ),
                manifest=manifest,
            )
            for split in ("train", "val")
        }  # fmt: skip
    except LoaderError as exc:
        raise TrainError(str(exc)) from exc
    steps_per_epoch = loaders["train"].steps_per_epoch
    peak_lr = config.lr or 0.1 * global_batch / 256

    torch.manual_seed(config.seed)
    model = build_model(config.model, num_classes=len(classes), input_size=input_size).to(rt.device)
    optimizer = torch.optim.SGD(
        parameter_groups(model, config.weight_decay), lr=peak_lr, momentum=config.momentum
    )
    state = _State()
    resume_uri = None
    if config.resume == "auto":
        resume_uri = latest_checkpoint_uri(output)
    elif config.resume != "never":
        resume_uri = (
            latest_checkpoint_uri(config.resume) if not config.resume.endswith(".pt") else config.resume
        )
        if resume_uri is None:
            raise CheckpointError(f"--resume {config.resume}: no committed checkpoint there")
    if resume_uri:
        checkpoint = load_checkpoint(resume_uri)
        _check_resume(checkpoint, config, classes, input_size, resume_uri, digest)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        xm.set_rng_state(int(checkpoint["rng"]["xla"]))
        torch.set_rng_state(checkpoint["rng"]["torch"])
        state = _State(**checkpoint["state"])
        log.info("resumed from %s at epoch %d, batch %d", resume_uri, state.epoch + 1, state.batches_done)
    meta = {"model": config.model, "classes": classes, "input_size": input_size, "dataset": dataset,
            "dataset_digest": digest, "config": asdict(config)}  # fmt: skip
    log.info(
        "training %s on %s: %d classes, %dpx, %d device(s) (%s), per-device batch %d, global batch %d, "
        "%d steps/epoch x %d epochs, peak lr %.4g", config.model, dataset, len(classes), input_size,
        rt.num_devices, config.strategy, per_device, global_batch, steps_per_epoch, config.epochs, peak_lr,
    )  # fmt: skip

    tb_dir = tempfile.mkdtemp(prefix="tpustream-tb-") if rt.is_master else ""
    writer = _summary_writer(tb_dir) if rt.is_master else None
    # Every host stops at the same step when any of them is preempted (tpustream/preemption.py).
    stop = StopAgreement(output, host=rt.replica_index, hosts=rt.num_replicas, from_step=state.global_step,
                         flag=preemption, sync_seconds=config.preemption_sync_seconds)  # fmt: skip
    try:
        return _run(config, rt, loaders, model, optimizer, state, meta, output, tb_dir, writer,
                    peak_lr=peak_lr, global_batch=global_batch, stop=stop)  # fmt: skip
    finally:
        stop.close()
        if writer is not None:
            writer.close()
        if tb_dir:
            shutil.rmtree(tb_dir, ignore_errors=True)


def _run(config: TrainConfig, rt: Runtime, loaders: dict[str, Any], model: Any, optimizer: Any, state: _State,
         meta: dict[str, Any], output: str, tb_dir: str, writer: Any, *, peak_lr: float,
         global_batch: int, stop: StopAgreement) -> dict[str, Any]:  # fmt: skip
    """The epoch loop; returns the model card (process 0 writes it, the other hosts wait for it)."""
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    steps_per_epoch = loaders["train"].steps_per_epoch
    total_steps = steps_per_epoch * config.epochs
    warmup_steps = int(round(config.warmup_epochs * steps_per_epoch))

    def checkpoint_now(best: bool) -> None:
        if not rt.is_master:
            return
        payload = {
            "model": to_cpu(model.state_dict()), "optimizer": to_cpu(optimizer.state_dict()),
            "state": asdict(state), "meta": meta,
            "rng": {"xla": str(xm.get_rng_state()), "torch": torch.get_rng_state()},  # uint64: as text
        }  # fmt: skip
        save_checkpoint(output, Position(state.epoch, state.batches_done, state.global_step), payload,
                        best=best, keep=config.keep_checkpoints)  # fmt: skip

    def preempted(at: int | None) -> Preempted:
        # process 0 commits `last` at the agreed step (unless nothing new was trained), then every host leaves
        trained = state.global_step > stop.from_step
        if trained:
            torch_xla.sync()
            checkpoint_now(best=False)
        stop.close(cleanup=True)
        how = "without the slice's agreement (see the error above)" if stop.timed_out else "with every host"
        saved = "`last` written" if trained else "nothing new to save"
        return Preempted(f"preempted at epoch {state.epoch + 1}, batch {state.batches_done} (step {at}), "
                         f"stopping {how}: {saved}")  # fmt: skip

    model.train()
    tracker = xm.RateTracker()
    last_checkpoint = time.monotonic()
    if stop.stop_step(state.global_step) == state.global_step:
        raise preempted(state.global_step)
    while state.epoch < config.epochs:
        epoch = state.epoch
        epoch_started = time.perf_counter()
        wait = 0.0
        # resumed mid-epoch: the loader skips the batches already trained on without decoding them
        batches = loaders["train"].epoch(epoch, start_batch=state.batches_done)
        iterator = iter(device_loader(batches, rt))
        loss_sum = torch.zeros((), device=rt.device)
        steps_this_run = 0
        while True:
            waited = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                break
            wait += time.perf_counter() - waited
            lr = lr_at(state.global_step, peak_lr=peak_lr, warmup_steps=warmup_steps, total_steps=total_steps)
            loss = train_step(model, optimizer, batch, lr, config, rt)
            loss_sum = loss_sum + loss
            state.global_step += 1
            state.batches_done += 1
            steps_this_run += 1
            tracker.add(global_batch / rt.num_replicas)
            if state.global_step % config.log_steps == 0:
                elapsed = time.perf_counter() - epoch_started
                xm.add_step_closure(
                    _log_step, args=(loss, state.global_step, epoch, lr, tracker, rt, wait / max(elapsed, 1e-9), writer)
                )  # fmt: skip
            agreed = stop.stop_step(state.global_step)
            if agreed is not None and state.global_step >= agreed:
                raise preempted(agreed)
            if time.monotonic() - last_checkpoint > config.checkpoint_minutes * 60:
                checkpoint_now(best=False)
                last_checkpoint = time.monotonic()
        metrics = evaluate(model, loaders["val"], epoch, config, rt)
        train_loss = (loss_sum / max(steps_this_run, 1)).item()
        if not math.isfinite(train_loss):
            # Nothing of this epoch is checkpointed: `last` stays the previous, finite epoch.
            raise TrainError(
                f"training diverged: mean train loss is {train_loss} in epoch {epoch + 1}; lower --lr "
                f"(this run: peak {peak_lr:g}) or raise --warmup-epochs, then re-run: --resume auto "
                "continues from the last finite checkpoint"
            )
        seconds = time.perf_counter() - epoch_started
        samples = steps_this_run * global_batch
        record = {
            "epoch": epoch + 1, "train_loss": train_loss, **metrics, "epoch_seconds": seconds,
            "samples_per_s": samples / seconds, "samples_per_s_per_device": samples / seconds / rt.num_devices,
            "data_wait_fraction": wait / seconds, "compiles": _compiles(met),
        }  # fmt: skip
        state.history.append(record)
        best = metrics["val_top1"] > state.best_top1
        if best:
            state.best_top1 = metrics["val_top1"]
        state.epoch, state.batches_done = epoch + 1, 0
        log.info(
            "epoch %d/%d: train loss %.4f, val top-1 %.4f top-5 %.4f loss %.4f (%d samples), %.1f s, "
            "%.0f samples/s (%.0f per device), data wait %.1f%%, XLA compiles so far %d",
            epoch + 1, config.epochs, train_loss, metrics["val_top1"], metrics["val_top5"], metrics["val_loss"],
            metrics["val_samples"], seconds, record["samples_per_s"], record["samples_per_s_per_device"],
            100 * record["data_wait_fraction"], record["compiles"],
        )  # fmt: skip
        if writer is not None:
            for key in (
                "train_loss",
                "val_loss",
                "val_top1",
                "val_top5",
                "samples_per_s",
                "data_wait_fraction",
            ):
                writer.add_scalar(f"epoch/{key}", record[key], epoch + 1)
            writer.flush()
            _upload_tree(tb_dir, storage.join(output, "tensorboard"))
        checkpoint_now(best=best)
        last_checkpoint = time.monotonic()
    if stop.stop_step(state.global_step) is not None:  # told during the last epoch's validation
        raise preempted(state.global_step)
    if not rt.is_master:
        return _wait_for_primary(output, meta["dataset_digest"], state.global_step, config, rt, stop)
    return _write_model_artifact(output, meta, state)


def _wait_for_primary(
    output: str, digest: str, steps: int, config: TrainConfig, rt: Runtime, stop: StopAgreement
) -> dict[str, Any]:
    """Hosts other than process 0 return once it has committed this run's model.json (same dataset, same
    final step), so every host of a slice leaves together and only process 0 wrote anything."""
    uri = storage.join(output, "model.json")
    deadline = time.monotonic() + config.commit_timeout_minutes * 60
    log.info("host %d: waiting for process 0 to commit %s", rt.replica_index, uri)
    while True:
        try:
            card = json.loads(storage.read_bytes(uri))
            if card.get("dataset", {}).get("manifest_digest") == digest and card.get("steps") == steps:
                return dict(card)
        except (storage.NotFound, ValueError):
            pass
        if stop.flag.requested:  # nothing of ours to save: report our step so process 0 stops there too
            stop.stop_step(steps)
            raise Preempted(f"host {rt.replica_index}: preempted while waiting for process 0 to commit {uri}")
        if time.monotonic() > deadline:
            raise TrainError(
                f"host {rt.replica_index}: process 0 did not commit {uri} (step {steps}) within "
                f"{config.commit_timeout_minutes:g} min; see process 0's log. A re-run resumes from `last`"
            )
        time.sleep(1.0)


def _compiles(met: Any) -> int:
    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def _log_step(
    loss: Any, step: int, epoch: int, lr: float, tracker: Any, rt: Runtime, wait_fraction: float, writer: Any
) -> None:
    loss_value = loss.item()  # inside a step closure: the step already ran, this is no extra sync
    log.info(
        "epoch %d step %d: loss %.4f lr %.4g Rate %.1f GlobalRate %.1f samples/s per device, data wait %.1f%%",
        epoch + 1, step, loss_value, lr, tracker.rate() / rt.local_devices, tracker.global_rate() / rt.local_devices,
        100 * wait_fraction,
    )  # fmt: skip
    if writer is not None:
        writer.add_scalar("train/loss", loss_value, step)
        writer.add_scalar("train/lr", lr, step)


def _summary_writer(directory: str) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard not installed: no event files
        return None
    return SummaryWriter(directory)


def _upload_tree(local_dir: str, uri: str) -> None:
    """Event files are written locally and uploaded whole (fsspec to gs:// keeps only the last event)."""
    for root, _, files in os.walk(local_dir):
        for name in files:
            path = os.path.join(root, name)
            storage.upload_file(path, storage.join(uri, os.path.relpath(path, local_dir)))


def _write_model_artifact(output: str, meta: dict[str, Any], state: _State) -> dict[str, Any]:
    """model.pt (the best epoch's weights, weights_only-loadable) and model.json, model.json last."""
    import torch

    best_uri = latest_checkpoint_uri(output, "best")
    if best_uri is None:
        raise CheckpointError(f"no best checkpoint under {output}")
    best = load_checkpoint(best_uri)
    fd, tmp = tempfile.mkstemp(suffix=".pt")
    os.close(fd)
    try:
        with open(tmp, "wb") as f:  # a file object: the archive name is fixed, so equal weights hash equal
            torch.save(best["model"], f)
        storage.upload_file(tmp, storage.join(output, "model.pt"))
        with open(tmp, "rb") as f:
            model_digest = hashlib.sha256(f.read()).hexdigest()
    finally:
        os.unlink(tmp)
    best_epoch = max(state.history, key=lambda r: r["val_top1"]) if state.history else {}
    card = {
        "format": MODEL_FORMAT,
        "arch": meta["model"],
        "num_classes": len(meta["classes"]),
        "classes": meta["classes"],
        "input_size": meta["input_size"],
        "in_channels": 3,
        "small_input_stem": small_input(meta["input_size"]),
        "normalization": {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD), "scale": 255},
        "metrics": {
            k: best_epoch.get(k) for k in ("epoch", "val_top1", "val_top5", "val_loss", "val_samples")
        },
        "history": state.history,
        "dataset": {"uri": meta["dataset"], "manifest_digest": meta["dataset_digest"]},
        "model_sha256": model_digest,
        "steps": state.global_step,
        "training": meta["config"],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    storage.write_bytes(
        storage.join(output, "model.json"),
        json.dumps(card, indent=1).encode(),
        content_type="application/json",
    )
    log.info(
        "model artifact: %s (best epoch %s, val top-1 %.4f)",
        output,
        card["metrics"]["epoch"],
        card["metrics"]["val_top1"] or 0,
    )
    return card
