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
import io
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn

from tpustream.artifacts import MODEL_FORMAT, ArtifactError, DatasetRef, ModelCard
from tpustream.dataset.manifest import Manifest, ShardError, load_manifest, manifest_digest
from tpustream.errors import TpustreamError
from tpustream.image.transforms import IMAGENET_MEAN, IMAGENET_STD
from tpustream.loader.batch import Batch
from tpustream.metrics.masked import masked_sums, summarize
from tpustream.models import model_spec
from tpustream.storage import io as storage
from tpustream.train.checkpoint import (
    CheckpointError,
    Position,
    latest_checkpoint_uri,
    load_checkpoint,
    save_checkpoint,
    to_cpu,
)
from tpustream.train.config import TrainConfig  # torch-free: the CLI and the pipeline read it
from tpustream.train.preemption import SigtermFlag, StopAgreement, exit_now
from tpustream.train.pretrained import Preprocessing, ResolvedWeights, build_network
from tpustream.xla_runtime import Runtime, device_loader, runtime

__all__ = [
    "TrainConfig",
    "TrainError",
    "Preempted",
    "exit_preempted",
    "exit_now",
    "PREEMPTED_EXIT_CODE",
    "lr_at",
    "inverse_frequency_weights",
    "backbone_groups",
    "freeze_backbone",
    "fill_optimizer_state",
    "train",
    "MODEL_FORMAT",
]

log = logging.getLogger(__name__)

# A run from --pretrained weights without --lr trains at a tenth of the from-scratch peak LR: fine-tuning's
# best LR is well below training from scratch's (Kornblith, Shlens, Le, CVPR 2019, sec. 3/A.3: their
# fine-tuning grid's optimum sits an order of magnitude under the from-scratch one), as torchvision's and
# timm's fine-tuning recipes do. The same factor as warm start (warm_start.WARM_LR_FACTOR).
FINE_TUNE_LR_FACTOR = 0.1

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: "try again" — the job is restarted and resumes from `last`


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


def default_peak_lr(global_batch: int, base: float = 0.1) -> float:
    """SGD's peak LR when the run gives none: 0.1 at a global batch of 256 (torchvision's ResNet recipe),
    scaled linearly above it (Goyal et al. 2017, "Accurate, Large Minibatch SGD") and by the square root
    below it (timm's ``--lr-base-scale sqrt``; Krizhevsky 2014, "One weird trick"): linear scaling gives a
    batch of 32 a tenth of the LR of 0.1 (0.0125), too little for the few hundred steps a small dataset
    offers; the square root gives it 0.035 (pure). ``base`` is the model's recipe's LR at 256
    (``ModelSpec.base_lr``: 0.1 for SGD, about 2e-4 for the AdamW recipes)."""
    ratio = global_batch / 256
    return base * (ratio if ratio >= 1 else math.sqrt(ratio))


def lr_at(step: int, *, peak_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup to ``peak_lr``, then cosine decay to zero at ``total_steps`` (pure)."""
    if warmup_steps and step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return peak_lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def inverse_frequency_weights(class_counts: list[int]) -> list[float]:
    """``--class-weights auto``: one loss weight per class, inverse to its train samples and normalised so
    that the mean weight over the train samples is 1 (scikit-learn's ``class_weight="balanced"``:
    ``samples / (classes * count)``). A class without train samples gets 1.0: no sample of it is weighted."""
    present = [count for count in class_counts if count > 0]
    total = sum(present)
    return [total / (len(present) * count) if count > 0 else 1.0 for count in class_counts]


# --------------------------------------------------------------------------- fine-tuning


def backbone_groups(optimizer: Any, head: set[Any]) -> Any:
    """``optimizer`` with each parameter group split in two: the ``head`` parameters, and the rest, marked
    ``backbone`` (``train_step`` gives those ``--backbone-lr-scale`` of the scheduled LR). Regrouped in place
    before any step: the optimizer has no state to carry over."""
    groups = []
    for group in optimizer.param_groups:
        options = {key: value for key, value in group.items() if key != "params"}
        for is_backbone in (False, True):
            params = [p for p in group["params"] if (p not in head) == is_backbone]
            if params:
                groups.append({**options, "params": params, "backbone": is_backbone})
    optimizer.param_groups = []
    for group in groups:
        optimizer.add_param_group(group)
    return optimizer


def freeze_backbone(model: Any, head: set[Any], frozen: bool) -> None:
    """Freeze (or thaw) every parameter but the ``head``'s: a frozen parameter gets no gradient, so the
    optimizer skips it (no update, no weight decay, no optimizer state) and the backward pass stops at the
    head. Frozen, the backbone's BatchNorm layers also run in inference mode: its running statistics stay
    the pretrained ones, as Keras's transfer-learning guide does (the model is otherwise in training mode).

    Their ``num_batches_tracked`` still counts each training forward while frozen (a hook; it is read only by
    a BatchNorm without momentum): on XLA a buffer no step has written yet enters the first step after the
    thaw unlike one a step has written, which compiles that step once more than the steps after it."""
    from torch import nn

    for parameter in model.parameters():
        if parameter not in head:
            parameter.requires_grad_(not frozen)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.train(not frozen)
            hook = module.__dict__.pop("_tpustream_frozen_count", None)
            if hook is not None:
                hook.remove()
            if frozen and module.num_batches_tracked is not None:
                module.__dict__["_tpustream_frozen_count"] = module.register_forward_hook(
                    _count_frozen_forward
                )


def _count_frozen_forward(module: Any, inputs: Any, output: Any) -> None:
    import torch

    if torch.is_grad_enabled():  # a training step's forward, not validation's (under no_grad)
        module.num_batches_tracked.add_(1)


def fill_optimizer_state(optimizer: Any, params: list[Any]) -> int:
    """Give ``params`` without optimizer state the state their optimizer's first step would create (zero
    momentum buffer; AdamW's zero step count and moments: the same update to the bit), copied from the host.
    A parameter thawed after ``--freeze-epochs`` has none; left to the optimizer, its first step would create
    it inside the step's graph: one more XLA compile of the whole step. Returns how many were filled (other
    optimizers are left to create their own)."""
    import torch
    import torch_xla.core.xla_model as xm

    wanted = set(params)
    filled = 0
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param not in wanted or optimizer.state.get(param):
                continue

            def zeros(shape: Any, dtype: Any, device: Any = param.device) -> Any:
                # device data from the host, no graph to compile (``.to(device)`` makes a 0-d tensor a
                # constant of the next step's graph instead)
                sent: Any = xm.send_cpu_data_to_device(torch.zeros(shape, dtype=dtype), device)
                return sent[0]

            if isinstance(optimizer, torch.optim.SGD) and group["momentum"]:
                state = {"momentum_buffer": zeros(param.shape, param.dtype)}
            elif isinstance(optimizer, torch.optim.Adam) and group["capturable"] and not group["fused"]:
                state = {
                    "step": zeros((), torch.get_default_dtype()),
                    "exp_avg": zeros(param.shape, param.dtype),
                    "exp_avg_sq": zeros(param.shape, param.dtype),
                }
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = zeros(param.shape, param.dtype)
            else:
                continue
            optimizer.state[param] = state
            filled += 1
    return filled


# --------------------------------------------------------------------------- steps


def _normalize(images: Any) -> Any:
    """uint8 NCHW on the device -> normalised float32 (autocast lowers the convolutions to bf16)."""
    from tpustream.image.transforms import normalize

    return normalize(images)


def train_step(
    model: Any,
    optimizer: Any,
    batch: Batch,
    lr: float,
    config: TrainConfig,
    rt: Runtime,
    class_weights: Any = None,
) -> Any:
    """One optimizer step on a device batch; returns the (device) loss. No host sync.

    ``lr`` is the schedule's: the backbone's groups (``backbone_groups``) take ``--backbone-lr-scale`` of it.
    ``class_weights`` (a device tensor, one weight per class; None: unweighted) weights each sample's loss."""
    import torch
    import torch.nn.functional as F
    import torch_xla
    import torch_xla.core.xla_model as xm

    for group in optimizer.param_groups:
        group["lr"] = lr * config.backbone_lr_scale if group.get("backbone") else lr
    images = _normalize(batch["image"])
    with torch.autocast("xla", dtype=torch.bfloat16, enabled=config.bf16):
        logits = model(images)
    if class_weights is None:
        loss = F.cross_entropy(logits.float(), batch["label"], label_smoothing=config.label_smoothing)
    else:
        # Averaged over the batch, not over its weights (cross_entropy's own mean): with weights whose mean
        # per training sample is 1, the loss keeps its unweighted scale and the LR its meaning.
        loss = F.cross_entropy(
            logits.float(),
            batch["label"],
            weight=class_weights,
            label_smoothing=config.label_smoothing,
            reduction="none",
        ).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if rt.strategy == "replicas":
        xm.optimizer_step(optimizer)  # all-reduces gradients across replicas, then steps
    else:
        optimizer.step()
    torch_xla.sync()
    return loss.detach()


def evaluate(model: Any, loader: Any, epoch: int, config: TrainConfig, rt: Runtime) -> dict[str, float]:
    """Exact val metrics (tpustream/metrics/masked.py): masked sums on the device, one host transfer per epoch."""
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm

    model.eval()
    sums = torch.zeros(4, device=rt.device)  # loss, top1, top5, count
    with torch.no_grad():
        for batch in device_loader(loader.epoch(epoch), rt):
            with torch.autocast("xla", dtype=torch.bfloat16, enabled=config.bf16):
                logits = model(_normalize(batch["image"]))
            sums = sums + masked_sums(logits.float(), batch["label"], batch["mask"])[0]
            torch_xla.sync()
    if rt.strategy == "replicas" and rt.num_replicas > 1:
        sums = xm.all_reduce(xm.REDUCE_SUM, sums)  # type: ignore[assignment]
    model.train()
    metrics = summarize(sums)
    return {
        "val_loss": metrics["loss"],
        "val_top1": metrics["top1"],
        "val_top5": metrics["top5"],
        "val_samples": metrics["samples"],
    }


# --------------------------------------------------------------------------- the loop


@dataclass
class _State:
    epoch: int = 0
    batches_done: int = 0  # in `epoch`, when resuming mid-epoch
    global_step: int = 0
    best_top1: float = -1.0
    history: list[dict[str, Any]] = field(default_factory=list)
    epochs_without_gain: int = 0  # early stopping's counter: in every checkpoint, so a resumed run counts on
    stopped_early: bool = False


@dataclass
class _EpochRun:
    """What ``run_epoch`` measured, for ``finish_epoch``'s record."""

    started: float
    loss_sum: Any  # on the device: read once, at the end of the epoch
    steps: int = 0
    wait: float = 0.0  # seconds spent waiting for the loader


def resolve_input_size(config: TrainConfig, dataset: str, manifest: Manifest) -> tuple[int, str]:
    """--input-size, else the model's rule (``ModelSpec.input_size``) applied to the dataset's median shorter
    side; and how it was chosen."""
    if config.input_size:
        return config.input_size, f"--input-size {config.input_size}"
    from tpustream.loader.shard_loader import default_input_size

    return default_input_size(dataset, manifest, model_spec(config.model).input_size)


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


def train(config: TrainConfig) -> ModelCard:
    """Train per ``config``; returns the final model card (model.json). Raises Preempted on SIGTERM."""
    if config.strategy == "replicas":
        import torch_xla

        torch_xla.launch(_replica_main, args=(config,))
        return ModelCard.read(storage.join(config.output, ModelCard.NAME))
    return _train_process(config)


def _replica_main(index: int, config: TrainConfig) -> None:
    _train_process(config)


def _train_process(config: TrainConfig) -> ModelCard:
    from tpustream.train.compile_cache import open_compile_cache

    # SIGTERM is a preemption from the first instant: setup, loop and waiting for process 0 alike.
    with SigtermFlag() as preemption:
        cache = open_compile_cache(config.compile_cache, strategy=config.strategy)  # before any computation
        try:
            trainer = Trainer(config, preemption)
            trainer.compile_cache = cache
            try:
                return trainer.fit()
            finally:
                trainer.close()
        finally:
            if cache is not None:  # after `last` or the model is committed: a cache never delays those
                cache.close()


class Trainer:
    """One training process of the job. ``fit()`` is the whole story; each step of it is a method.

    Built (``__init__``): the dataset, this process's place in the job, the loaders, model and optimizer.
    ``restore()``: continue from a checkpoint. Per epoch: ``run_epoch()`` (the steps; a preemption stops
    it at the step every host agreed on) and ``finish_epoch()`` (validate, record, log, checkpoint).
    Finally process 0 writes the model artifact and the other hosts wait for it.
    """

    def __init__(self, config: TrainConfig, preemption: SigtermFlag) -> None:
        import torch

        self.config, self.preemption = config, preemption
        self.output = storage.absolute(config.output)  # model.json names both: valid from any directory
        self.dataset = storage.absolute(config.data)
        self.manifest = self._read_manifest()
        self.digest = manifest_digest(self.dataset)
        self.classes = list(self.manifest.classes)
        self.rt = runtime(config.strategy)
        if self.rt.is_master:
            try:
                storage.ensure_prefix_writable(self.output)
            except storage.StorageError as exc:
                raise TrainError(f"--output {self.output}: {exc}") from exc
        self.per_device = self._per_device_batch()
        self.global_batch = self.per_device * self.rt.num_devices
        self.pretrained = self._resolve_pretrained()
        if self.pretrained is not None and not config.input_size:
            self.input_size = self.pretrained.preprocessing.crop_size
            self.input_size_reason = (
                f"the crop size of the --pretrained weights ({self.pretrained.name or self.pretrained.uri})"
            )
        else:
            self.input_size, self.input_size_reason = resolve_input_size(config, self.dataset, self.manifest)
        self.preprocessing = (
            self.pretrained.preprocessing.at(self.input_size)
            if self.pretrained is not None
            else Preprocessing.default(self.input_size)
        )
        log.info("input size %d: %s", self.input_size, self.input_size_reason)
        self.loaders = self._loaders()
        self.steps_per_epoch = self.loaders["train"].steps_per_epoch
        spec = model_spec(config.model)
        scratch_lr = default_peak_lr(self.global_batch, spec.base_lr)
        self.peak_lr = config.lr or (scratch_lr * FINE_TUNE_LR_FACTOR if self.pretrained else scratch_lr)
        torch.manual_seed(config.seed)
        self.model = build_network(
            config.model,
            num_classes=len(self.classes),
            input_size=self.input_size,
            pretrained=self.pretrained is not None,
        )
        self.model = self.model.to(self.rt.device)
        weight_decay = spec.weight_decay if config.weight_decay is None else config.weight_decay
        self.optimizer = spec.optimizer(
            self.model, lr=self.peak_lr, momentum=config.momentum, weight_decay=weight_decay
        )
        self.head = set(self.model.get_submodule(spec.head).parameters())
        if config.backbone_lr_scale != 1.0:
            self.optimizer = backbone_groups(self.optimizer, self.head)
        self.freeze_epochs = 0  # --freeze-epochs once the run is known to start from trained weights
        self.class_weights = self._class_weights()
        self.state = _State()
        self.meta: dict[str, Any] = {
            "model": config.model,
            "classes": self.classes,
            "input_size": self.input_size,
            "input_size_reason": self.input_size_reason,
            "dataset": self.dataset,
            "dataset_digest": self.digest,
            "config": {**asdict(config), "data": self.dataset, "output": self.output},
            "preprocessing": self.preprocessing.to_json(),
            "pretrained_weights": self.pretrained is not None,
        }
        if self.class_weights is not None:
            self.meta["class_weights"] = dict(zip(self.classes, self.class_weights.tolist(), strict=True))
            self.class_weights = self.class_weights.to(self.rt.device)
        self.tb_dir = tempfile.mkdtemp(prefix="tpustream-tb-") if self.rt.is_master else ""
        self.writer = _summary_writer(self.tb_dir) if self.rt.is_master else None
        self.tb_uris = _tensorboard_uris(self.output) if self.rt.is_master else []
        self.stop: StopAgreement | None = None
        self.tracker: Any = None  # xm.RateTracker over the whole run, made in fit()
        self.compile_cache: Any = None  # CompileCache when --compile-cache is given

    def fit(self) -> ModelCard:
        """Train to ``config.epochs``; returns the model card. Raises Preempted (every host at one step)."""
        import torch_xla.core.xla_model as xm

        self.restore()
        self._freeze_plan()
        if self.state.epoch >= self.config.epochs and latest_checkpoint_uri(self.output, "best") is None:
            raise TrainError(
                f"--resume {self.config.resume}: that run has already trained {self.state.epoch} epochs and "
                f"--epochs is {self.config.epochs}: raise --epochs to train on from it, or use the model it wrote"
            )
        self._log_plan()
        # Every host stops at the same step when any of them is preempted (tpustream/train/preemption.py).
        self.stop = StopAgreement(
            self.output,
            host=self.rt.replica_index,
            hosts=self.rt.num_replicas,
            from_step=self.state.global_step,
            flag=self.preemption,
            sync_seconds=self.config.preemption_sync_seconds,
        )
        if self.stop.stop_step(self.state.global_step) == self.state.global_step:
            raise self.preempted(self.state.global_step)
        self.model.train()
        self.tracker = xm.RateTracker()
        while self.state.epoch < self.config.epochs and not self.state.stopped_early:
            run = self.run_epoch()
            self.finish_epoch(run)
        if self.stop.stop_step(self.state.global_step) is not None:  # told during the last validation
            raise self.preempted(self.state.global_step)
        if not self.rt.is_master:
            return _wait_for_primary(
                self.output, self.digest, self.state.global_step, self.config, self.rt, self.stop
            )
        if self.compile_cache is not None:
            from tpustream.train.compile_cache import cache_counters

            self.meta["compile_cache"] = {"uri": self.compile_cache.uri, **cache_counters()}
        return _write_model_artifact(self.output, self.meta, self.state)

    def close(self) -> None:
        if self.stop is not None:
            self.stop.close()
        if self.writer is not None:
            self.writer.close()
        if self.tb_dir:
            shutil.rmtree(self.tb_dir, ignore_errors=True)

    # -- setup ---------------------------------------------------------------------------------------

    def _read_manifest(self) -> Manifest:
        try:
            manifest = load_manifest(self.dataset)
        except ShardError as exc:
            raise TrainError(f"--data {self.dataset}: {exc}") from exc
        for split in ("train", "val"):
            found = manifest.split(split)
            if found is None or not found.shards:
                raise TrainError(
                    f"--data {self.dataset} has no {split!r} split: re-create it with a validation fraction"
                )
        return manifest

    def _resolve_pretrained(self) -> ResolvedWeights | None:
        """--pretrained resolved to the file this run reads (a named set: the cached, hash-checked copy)."""
        if not self.config.pretrained:
            return None
        from tpustream.train.pretrained import PretrainedError, default_weights_cache, resolve

        try:
            # A named set is fetched by process 0 alone; the other hosts of a slice read its cached copy.
            return resolve(
                self.config.pretrained,
                model=self.config.model,
                cache=self.config.weights_cache or default_weights_cache(self.output),
                input_size=self.config.input_size,
                fetch=self.rt.is_master,
                wait_seconds=self.config.commit_timeout_minutes * 60,
            )
        except PretrainedError as exc:
            raise TrainError(str(exc)) from exc

    def _class_weights(self) -> Any:
        """--class-weights auto: the train split's inverse class frequencies (a host tensor); else None."""
        import torch

        if self.config.class_weights == "none":
            return None
        counts = list(self.manifest.split("train").class_counts)  # type: ignore[union-attr]
        weights = inverse_frequency_weights(counts)
        log.info(
            "class weights (--class-weights auto, inverse train frequency, max/min %.1fx): %s",
            max(weights) / min(weights),
            ", ".join(f"{name} {weight:.3g}" for name, weight in zip(self.classes, weights, strict=True)),
        )
        return torch.tensor(weights, dtype=torch.float32)

    def _freeze_plan(self) -> None:
        """--freeze-epochs applies to a run that started from trained weights (--pretrained or --init-from,
        as its meta says on every restart); one that fell back to random weights (an optional warm start
        that did not fit) trains everything, with a warning."""
        wanted = self.config.freeze_epochs
        if not wanted:
            return
        if self.meta.get("pretrained") or self.meta.get("init"):
            self.freeze_epochs = wanted
            self.meta["freeze_epochs"] = wanted
            return
        log.warning("--freeze-epochs %d ignored: the run starts from random weights", wanted)

    def _per_device_batch(self) -> int:
        wanted, devices = self.config.global_batch_size, self.rt.num_devices
        if wanted is None:
            return self.config.batch_size
        if wanted % devices:
            raise TrainError(
                f"--global-batch-size {wanted} does not divide over {devices} devices: "
                f"use a multiple of {devices}, e.g. {devices * max(1, wanted // devices)}"
            )
        return wanted // devices

    def _loaders(self) -> dict[str, Any]:
        from tpustream.loader.epoch_plan import LoaderError
        from tpustream.loader.shard_loader import LoaderConfig, ShardLoader

        rt = self.rt
        try:
            return {
                split: ShardLoader(
                    LoaderConfig(
                        data=self.dataset,
                        split=split,
                        batch_size=rt.host_batch(self.per_device),
                        input_size=self.input_size,
                        num_replicas=rt.num_replicas,
                        replica_index=rt.replica_index,
                        workers=self.config.workers,
                        seed=self.config.seed,
                        val_crop_fraction=self.preprocessing.crop_fraction,
                    ),
                    manifest=self.manifest,
                )
                for split in ("train", "val")
            }
        except LoaderError as exc:
            raise TrainError(str(exc)) from exc

    def restore(self) -> None:
        """Continue from ``--resume`` (auto: this output's `last`), mid-epoch included."""
        import torch
        import torch_xla.core.xla_model as xm

        config = self.config
        uri = None
        if config.resume == "auto":
            uri = latest_checkpoint_uri(self.output)
        elif config.resume != "never":
            uri = latest_checkpoint_uri(config.resume) if not config.resume.endswith(".pt") else config.resume
            if uri is None:
                raise CheckpointError(f"--resume {config.resume}: no committed checkpoint there")
        if not uri:
            self.warm_start()
            return
        checkpoint = load_checkpoint(uri)
        _check_resume(checkpoint, config, self.classes, self.input_size, uri, self.digest)
        if not _within(uri, self.output):
            # Its checkpoints and best stay there: a run continued here could never write its model.
            raise TrainError(
                f"--resume {config.resume} is another run's checkpoint: --resume continues a run in its own "
                f"--output ({config.resume}); to start a new run in {self.output} from its weights, use "
                f"--init-from {config.resume} (and --resume never, or auto)"
            )
        if checkpoint.get("meta", {}).get("pretrained"):
            self.meta["pretrained"] = checkpoint["meta"]["pretrained"]  # kept across restarts, as init
        if checkpoint.get("meta", {}).get("init"):
            self.meta["init"] = checkpoint["meta"]["init"]  # where the run began, kept across restarts
            self._warm_lr()
        self.model.load_state_dict(checkpoint["model"])
        try:
            self.optimizer.load_state_dict(checkpoint["optimizer"])
        except ValueError as exc:  # other parameter groups: --backbone-lr-scale 1 or not
            raise CheckpointError(
                f"checkpoint {uri}: its optimizer does not fit this run's ({exc}): resume with the options it "
                "was written with (--backbone-lr-scale), or use --resume never"
            ) from exc
        xm.set_rng_state(int(checkpoint["rng"]["xla"]))
        torch.set_rng_state(checkpoint["rng"]["torch"])
        self.state = _State(**checkpoint["state"])
        log.info("resumed from %s at epoch %d, batch %d", uri, self.state.epoch + 1, self.state.batches_done)

    def warm_start(self) -> None:
        """Start a new run from --init-from's weights (tpustream/train/warm_start.py) or --pretrained's
        (tpustream/train/pretrained.py), and record where from. --init-from wins when its classes are the run's
        (a retraining run); otherwise, or when it cannot be used and is optional, --pretrained starts it."""
        if self.config.init_from and self._init_from():
            if self.pretrained is not None:
                log.info(
                    "the run starts from --init-from %s (same classes), not --pretrained %s",
                    self.config.init_from,
                    self.config.pretrained,
                )
            return
        if self.pretrained is not None:
            self._load_pretrained()
        else:
            log.info("the run starts from random weights")

    def _load_pretrained(self) -> None:
        from tpustream.train.pretrained import PretrainedError, apply_pretrained, load_state_dict

        assert self.pretrained is not None
        try:
            weights, digest = load_state_dict(self.pretrained)
            self.meta["pretrained"] = apply_pretrained(
                self.model, weights, arch=self.config.model, resolved=self.pretrained, sha256=digest
            )
        except PretrainedError as exc:
            raise TrainError(str(exc)) from exc
        log.info(
            "the run starts from --pretrained %s; peak lr %.4g",
            self.pretrained.name or self.pretrained.uri,
            self.peak_lr,
        )

    def _init_from(self) -> bool:
        """Load --init-from; whether it started the run (False: not used, --pretrained or random instead)."""
        from tpustream.train.warm_start import WarmStartError, apply_init_weights, load_init_weights

        try:
            init = load_init_weights(self.config.init_from or "")
            if self.pretrained is not None and init.classes != self.classes:
                log.info(
                    "--init-from %s has other classes than this run: --pretrained %s starts it instead",
                    self.config.init_from,
                    self.config.pretrained,
                )
                return False
            self.meta["init"] = apply_init_weights(
                self.model,
                init,
                arch=self.config.model,
                classes=self.classes,
                input_size=self.input_size,
            )
        except WarmStartError as exc:
            if not self.config.init_optional:
                raise TrainError(str(exc)) from exc
            instead = "--pretrained weights" if self.pretrained is not None else "random weights"
            log.warning("%s: training from %s instead", exc, instead)
            return False
        log.info("the run starts from --init-from %s", self.config.init_from)
        self._warm_lr()
        return True

    def _warm_lr(self) -> None:
        """A warm-started run without --lr: a tenth of the scratch default (warm_start.WARM_LR_FACTOR); the
        same on every restart of the run, which finds ``init`` in its checkpoint's meta."""
        from tpustream.train.warm_start import WARM_LR_FACTOR

        if self.config.lr is not None:
            return
        base_lr = model_spec(self.config.model).base_lr
        self.peak_lr = WARM_LR_FACTOR * default_peak_lr(self.global_batch, base_lr)
        self.meta["init"]["peak_lr"] = self.peak_lr  # in model.json: the LR this warm start trained at
        log.info(
            "warm start: peak lr %.4g, %g x the from-scratch default (give --lr to choose another)",
            self.peak_lr,
            WARM_LR_FACTOR,
        )

    def _log_plan(self) -> None:
        log.info(
            "training %s on %s: %d classes, %dpx, %d device(s) (%s), per-device batch %d, global batch %d, "
            "%d steps/epoch x %d epochs, peak lr %.4g",
            self.config.model,
            self.dataset,
            len(self.classes),
            self.input_size,
            self.rt.num_devices,
            self.config.strategy,
            self.per_device,
            self.global_batch,
            self.steps_per_epoch,
            self.config.epochs,
            self.peak_lr,
        )

    # -- the epoch -----------------------------------------------------------------------------------

    def run_epoch(self) -> _EpochRun:
        """The steps of ``state.epoch`` from ``state.batches_done`` on; no host sync per step."""
        import torch
        import torch_xla.core.xla_model as xm

        config, state, rt = self.config, self.state, self.rt
        assert self.stop is not None
        total_steps = self.steps_per_epoch * config.epochs
        warmup_steps = int(round(config.warmup_epochs * self.steps_per_epoch))
        run = _EpochRun(started=time.perf_counter(), loss_sum=torch.zeros((), device=rt.device))
        self._fine_tuning_phase()
        last_checkpoint = time.monotonic()
        # resumed mid-epoch: the loader skips the batches already trained on without decoding them
        batches = iter(
            device_loader(self.loaders["train"].epoch(state.epoch, start_batch=state.batches_done), rt)
        )
        while True:
            waited = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                return run
            run.wait += time.perf_counter() - waited
            lr = lr_at(
                state.global_step, peak_lr=self.peak_lr, warmup_steps=warmup_steps, total_steps=total_steps
            )
            loss = train_step(self.model, self.optimizer, batch, lr, config, rt, self.class_weights)
            run.loss_sum = run.loss_sum + loss
            state.global_step += 1
            state.batches_done += 1
            run.steps += 1
            self.tracker.add(self.global_batch / rt.num_replicas)
            if state.global_step % config.log_steps == 0:
                wait_fraction = run.wait / max(time.perf_counter() - run.started, 1e-9)
                xm.add_step_closure(
                    _log_step,
                    args=(
                        loss,
                        state.global_step,
                        state.epoch,
                        lr,
                        self.tracker,
                        rt,
                        wait_fraction,
                        self.writer,
                    ),
                )
            agreed = self.stop.stop_step(state.global_step)
            if agreed is not None and state.global_step >= agreed:
                raise self.preempted(agreed)
            if time.monotonic() - last_checkpoint > config.checkpoint_minutes * 60:
                self.checkpoint(best=False)
                last_checkpoint = time.monotonic()

    def _fine_tuning_phase(self) -> None:
        """--freeze-epochs: the phase of ``state.epoch`` (so a resumed run is in the phase its epoch is): the
        head alone, or everything. Thawed, the backbone gets its optimizer state before the first step, so
        the steps compile to the graph a run without freezing compiles: the frozen phase's is the one extra."""
        if not self.freeze_epochs:
            return
        frozen = self.state.epoch < self.freeze_epochs
        freeze_backbone(self.model, self.head, frozen)
        if frozen:
            log.info(
                "epoch %d: the backbone is frozen (--freeze-epochs %d): training the head only",
                self.state.epoch + 1,
                self.freeze_epochs,
            )
            return
        if self.state.epoch == self.freeze_epochs:
            log.info("epoch %d: the backbone is thawed: training every layer", self.state.epoch + 1)
        fill_optimizer_state(self.optimizer, [p for p in self.model.parameters() if p not in self.head])

    def finish_epoch(self, run: _EpochRun) -> None:
        """Validate, record, log (and TensorBoard), then commit the epoch's checkpoint."""
        state = self.state
        metrics = evaluate(self.model, self.loaders["val"], state.epoch, self.config, self.rt)
        train_loss = (run.loss_sum / max(run.steps, 1)).item()
        if not math.isfinite(train_loss):
            # Nothing of this epoch is checkpointed: `last` stays the previous, finite epoch.
            raise TrainError(
                f"training diverged: mean train loss is {train_loss} in epoch {state.epoch + 1}; lower --lr "
                f"(this run: peak {self.peak_lr:g}) or raise --warmup-epochs, then re-run: --resume auto "
                "continues from the last finite checkpoint"
            )
        record = self._record(run, train_loss, metrics)
        state.history.append(record)
        gained = metrics["val_top1"] - state.best_top1 > self.config.min_delta
        state.epochs_without_gain = 0 if gained else state.epochs_without_gain + 1
        best = metrics["val_top1"] > state.best_top1
        if best:
            state.best_top1 = metrics["val_top1"]
        state.epoch, state.batches_done = state.epoch + 1, 0
        patience = self.config.patience
        if patience and state.epochs_without_gain >= patience and state.epoch < self.config.epochs:
            state.stopped_early = True
        self._report(record)
        self.checkpoint(best=best)
        if state.stopped_early:
            best_epoch = max(state.history, key=lambda r: r["val_top1"])
            log.warning(
                "early stopping after epoch %d of %d: val top-1 has not gained more than %g in %d epoch(s) "
                "(--patience %d); the model is the best epoch's, %d (val top-1 %.4f)",
                state.epoch,
                self.config.epochs,
                self.config.min_delta,
                state.epochs_without_gain,
                patience,
                best_epoch["epoch"],
                best_epoch["val_top1"],
            )

    def _record(self, run: _EpochRun, train_loss: float, metrics: dict[str, float]) -> dict[str, Any]:
        import torch_xla.debug.metrics as met

        seconds = time.perf_counter() - run.started
        samples_per_s = run.steps * self.global_batch / seconds
        loader = self.loaders["train"]
        # Every replica's plan deals each train sample once, but the remainder under one global batch; a
        # repeat fills a quota a short (corrupt) shard left open: counted by this process's replica (all
        # of them on one host) in the part of the epoch this run trained.
        repeated = loader.last_report.repeated if loader.last_report else 0
        planned = self.steps_per_epoch * self.global_batch
        return {
            "epoch": self.state.epoch + 1,
            "train_loss": train_loss,
            **metrics,
            "epoch_seconds": seconds,
            "samples_per_s": samples_per_s,
            "samples_per_s_per_device": samples_per_s / self.rt.num_devices,
            "data_wait_fraction": run.wait / seconds,
            "compiles": compile_count(met),
            "train_samples_seen": planned - repeated,
            "train_samples_left_out": loader.num_samples - planned,
            "train_samples_repeated": repeated,
        }

    def _report(self, r: dict[str, Any]) -> None:
        log.info(
            "epoch %d/%d: train loss %.4f (%d samples seen, %d left out, %d repeated), val top-1 %.4f "
            "top-5 %.4f loss %.4f (%d samples), %.1f s, %.0f samples/s (%.0f per device), data wait %.1f%%, "
            "XLA compiles so far %d",
            r["epoch"],
            self.config.epochs,
            r["train_loss"],
            r["train_samples_seen"],
            r["train_samples_left_out"],
            r["train_samples_repeated"],
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
            for key in (
                "train_loss",
                "val_loss",
                "val_top1",
                "val_top5",
                "samples_per_s",
                "data_wait_fraction",
            ):
                self.writer.add_scalar(f"epoch/{key}", r[key], r["epoch"])
            self.writer.flush()
            for uri in self.tb_uris:
                _upload_tree(self.tb_dir, uri)

    # -- checkpoints and preemption ------------------------------------------------------------------

    def checkpoint(self, *, best: bool) -> None:
        """Process 0 commits the exact training state (weights, optimizer, position, RNG)."""
        import torch
        import torch_xla.core.xla_model as xm

        if not self.rt.is_master:
            return
        state = self.state
        payload = {
            "model": to_cpu(self.model.state_dict()),
            "optimizer": to_cpu(self.optimizer.state_dict()),
            "state": asdict(state),
            "meta": self.meta,
            "rng": {"xla": str(xm.get_rng_state()), "torch": torch.get_rng_state()},  # uint64: as text
        }
        save_checkpoint(
            self.output,
            Position(state.epoch, state.batches_done, state.global_step),
            payload,
            best=best,
            keep=self.config.keep_checkpoints,
        )

    def preempted(self, at: int) -> Preempted:
        """Leave at the agreed step: process 0 commits `last` (unless nothing new was trained)."""
        import torch_xla

        assert self.stop is not None
        state = self.state
        trained = state.global_step > self.stop.from_step
        if trained:
            torch_xla.sync()
            self.checkpoint(best=False)
        self.stop.close(cleanup=True)
        if self.stop.hosts == 1:
            how = ""
        elif self.stop.timed_out:
            how = ", stopping without the slice's agreement (see the error above)"
        else:
            how = ", stopping with every host"
        if not trained:
            cause = "Ctrl-C" if self.preemption.interrupted else "SIGTERM"
            cause = cause if self.preemption.requested else "another host's preemption"
            return Preempted(f"{cause} before the first step (step {at}){how}: nothing new to save")
        what = "interrupted (Ctrl-C)" if self.preemption.interrupted else "preempted"
        return Preempted(
            f"{what} at epoch {state.epoch + 1}, batch {state.batches_done} (step {at}){how}: `last` written"
        )


def _within(uri: str, output: str) -> bool:
    """Whether the checkpoint ``uri`` lies under the run directory ``output``."""
    return storage.absolute(uri).startswith(storage.absolute(output).rstrip("/") + "/")


def _wait_for_primary(
    output: str, digest: str, steps: int, config: TrainConfig, rt: Runtime, stop: StopAgreement
) -> ModelCard:
    """Hosts other than process 0 return once it has committed this run's model.json (same dataset, same
    final step), so every host of a slice leaves together and only process 0 wrote anything."""
    uri = storage.join(output, "model.json")
    deadline = time.monotonic() + config.commit_timeout_minutes * 60
    log.info("host %d: waiting for process 0 to commit %s", rt.replica_index, uri)
    while True:
        try:
            card = ModelCard.read(uri)
            if card.dataset is not None and card.dataset.manifest_digest == digest and card.steps == steps:
                return card
        except (storage.NotFound, ArtifactError):  # not written yet, or half-written by another version
            pass
        # Told (SIGTERM) or seeing another host's notice: nothing of ours to save; report our final step so
        # process 0 stops there too, rather than time out waiting for us and leave us waiting for it.
        if stop.requested:
            stop.stop_step(steps)
            raise Preempted(f"host {rt.replica_index}: preempted while waiting for process 0 to commit {uri}")
        if time.monotonic() > deadline:
            raise TrainError(
                f"host {rt.replica_index}: process 0 did not commit {uri} (step {steps}) within "
                f"{config.commit_timeout_minutes:g} min; see process 0's log. A re-run resumes from `last`"
            )
        time.sleep(1.0)


def compile_count(met: Any) -> int:
    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def _log_step(
    loss: Any, step: int, epoch: int, lr: float, tracker: Any, rt: Runtime, wait_fraction: float, writer: Any
) -> None:
    loss_value = loss.item()  # inside a step closure: the step already ran, this is no extra sync
    log.info(
        "epoch %d step %d: loss %.4f lr %.4g Rate %.1f GlobalRate %.1f samples/s per device, data wait %.1f%%",
        epoch + 1,
        step,
        loss_value,
        lr,
        tracker.rate() / rt.local_devices,
        tracker.global_rate() / rt.local_devices,
        100 * wait_fraction,
    )
    if writer is not None:
        writer.add_scalar("train/loss", loss_value, step)
        writer.add_scalar("train/lr", lr, step)


def _summary_writer(directory: str) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard not installed: no event files
        return None
    return SummaryWriter(directory)


def _tensorboard_uris(output: str) -> list[str]:
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


def _write_model_artifact(output: str, meta: dict[str, Any], state: _State) -> ModelCard:
    """model.pt (the best epoch's weights, weights_only-loadable) and model.json, model.json last."""
    import torch

    best_uri = latest_checkpoint_uri(output, "best")
    if best_uri is None:
        raise CheckpointError(f"no best checkpoint under {output}")
    best = load_checkpoint(best_uri)
    buffer = io.BytesIO()  # a file object: the archive name is fixed, so equal weights hash equal
    torch.save(best["model"], buffer)
    storage.write_bytes(storage.join(output, "model.pt"), buffer.getvalue())
    model_digest = hashlib.sha256(buffer.getbuffer()).hexdigest()
    best_epoch = max(state.history, key=lambda r: r["val_top1"]) if state.history else {}
    card = ModelCard(
        arch=meta["model"],
        num_classes=len(meta["classes"]),
        classes=meta["classes"],
        input_size=meta["input_size"],
        input_size_reason=meta.get("input_size_reason", ""),  # checkpoints written before it lack it
        in_channels=3,
        small_input_stem=not meta.get("pretrained_weights")
        and model_spec(meta["model"]).small_input_stem(meta["input_size"]),
        normalization={
            "mean": list(meta.get("preprocessing", {}).get("mean", IMAGENET_MEAN)),
            "std": list(meta.get("preprocessing", {}).get("std", IMAGENET_STD)),
            "scale": 255,
        },
        preprocessing=meta.get("preprocessing", {}),
        pretrained=meta.get("pretrained"),  # the weights the backbone began from (None: not pretrained)
        metrics={k: best_epoch.get(k) for k in ("epoch", "val_top1", "val_top5", "val_loss", "val_samples")},
        history=state.history,
        dataset=DatasetRef(uri=meta["dataset"], manifest_digest=meta["dataset_digest"]),
        model_sha256=model_digest,
        steps=state.global_step,
        training=meta["config"],
        init=meta.get("init"),  # warm start: where the weights began (None: random)
        compile_cache=meta.get("compile_cache"),  # its lookups in this process (None: no cache)
        stopped_early=state.stopped_early,
        # --class-weights auto: the loss weight of each class (the training config says auto)
        extra={"class_weights": meta["class_weights"]} if meta.get("class_weights") else {},
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    card.write(storage.join(output, ModelCard.NAME))
    log.info(
        "model artifact: %s (best epoch %s, val top-1 %.4f)",
        output,
        card.metrics["epoch"],
        card.best_top1 or 0,
    )
    return card
