"""The XLA trainer: ResNet on TPU (or XLA CPU) from streamed shards, exact checkpoints, resume, preemption.

``train()`` loops over epochs; each epoch loops over ``train_step()`` and ends with ``evaluate()`` and
a committed checkpoint. Strategies:

- ``spmd`` (default): one process per host, a 1-D ``data`` mesh over every device; each host loads its
  slice of the global batch (per-device batch x local devices) and the batch is sharded over the mesh
  (``minibatch=True``); weights are replicated and XLA inserts the gradient all-reduce.
- ``replicas``: one process per device via ``torch_xla.launch``; gradients all-reduced by
  ``xm.optimizer_step``; each replica streams its own data slice.

Nothing in a step syncs with the host: logging goes through ``xm.add_step_closure``.

This module is the driver: ``train()`` starts the process(es) and ``Trainer`` runs one of them, epoch by
epoch, with its checkpoints and its stop at a preemption. What it drives lives beside it: ``run_inputs``
(the run's inputs, before its first step), ``run_start`` (resume or warm start), ``optimizer`` (the LR
schedule and fine-tuning's groups), ``step`` (the compiled step and validation), ``records`` (state, epoch records, logs
and TensorBoard), ``model_artifact`` (model.pt and model.json) and ``preemption``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from tpustream.artifacts import ModelCard
from tpustream.dataset.manifest import manifest_digest
from tpustream.models import build_network, default_small_input_stem, model_spec
from tpustream.storage import io as storage
from tpustream.train.checkpoint import (
    Checkpoint,
    CheckpointError,
    Position,
    latest_checkpoint_uri,
    load_checkpoint,
    save_checkpoint,
    to_cpu,
)
from tpustream.train.config import TrainConfig, TrainError  # torch-free: the CLI and the pipeline read it
from tpustream.train.model_artifact import wait_for_primary, write_model_artifact
from tpustream.train.optimizer import (
    backbone_groups,
    default_peak_lr,
    fine_tune_peak_lr,
    fine_tuning_phase,
    head_lr_scale,
    layer_decay_groups,
    lr_at,
    set_head_lr_scale,
)
from tpustream.train.preemption import Preempted, SigtermFlag, StopAgreement, preempted_error
from tpustream.train.recipe import choose_recipe, ema_decay_at
from tpustream.train.records import EpochLog, EpochRun, RunMeta, RunState, epoch_record, epoch_score
from tpustream.train.run_inputs import (
    choose_input,
    class_weights,
    make_loaders,
    per_device_batch,
    resolve_pretrained,
    training_manifest,
)
from tpustream.train.run_start import (
    check_resume,
    choose_init,
    resume_uri,
    start_from_init,
    start_from_pretrained,
    warm_peak_lr,
    within,
)
from tpustream.train.step import evaluate, log_step, train_step
from tpustream.xla_runtime import device_loader, runtime, seed_rngs

__all__ = ["EpochHook", "Trainer", "train"]

log = logging.getLogger(__name__)

# Called after each epoch is validated and checkpointed, with the epochs done and that epoch's val metrics
# (val_top1, ...), in every process; what it raises ends the run there (a tune trial's pruning,
# tpustream/tune/local.py). Must pickle under --strategy replicas.
EpochHook = Callable[[int, Mapping[str, Any]], None]


def train(config: TrainConfig, on_epoch: EpochHook | None = None) -> ModelCard:
    """Train per ``config``; returns the final model card (model.json). Raises Preempted on SIGTERM.
    ``on_epoch``: called after each epoch (``EpochHook``)."""
    if config.strategy == "replicas":
        import torch_xla

        torch_xla.launch(_replica_main, args=(config, on_epoch))
        return ModelCard.read(storage.join(config.output, ModelCard.NAME))
    return _train_process(config, on_epoch)


def _replica_main(index: int, config: TrainConfig, on_epoch: EpochHook | None = None) -> None:
    _train_process(config, on_epoch)


def _train_process(config: TrainConfig, on_epoch: EpochHook | None = None) -> ModelCard:
    from tpustream.train.compile_cache import open_compile_cache

    # SIGTERM is a preemption from the first instant: setup, loop and waiting for process 0 alike.
    with SigtermFlag() as preemption:
        cache = open_compile_cache(config.compile_cache, strategy=config.strategy)  # before any computation
        try:
            trainer = Trainer(config, preemption)
            trainer.compile_cache = cache
            trainer.on_epoch = on_epoch
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
        self.config, self.preemption = config, preemption
        self.output = storage.absolute(config.output)  # model.json names both: valid from any directory
        self.dataset = storage.absolute(config.data)
        self.manifest = training_manifest(self.dataset)
        self.digest = manifest_digest(self.dataset)
        self.classes = list(self.manifest.classes)
        self.rt = runtime(config.strategy)
        if self.rt.is_master:
            try:
                storage.ensure_prefix_writable(self.output)
            except storage.StorageError as exc:
                raise TrainError(f"--output {self.output}: {exc}") from exc
        self.per_device = per_device_batch(config, self.rt)
        self.global_batch = self.per_device * self.rt.num_devices
        self.pretrained = resolve_pretrained(config, self.output, self.rt)
        self.input_size, self.input_size_reason, self.preprocessing = choose_input(
            config, self.dataset, self.manifest, self.pretrained
        )
        log.info("input size %d: %s", self.input_size, self.input_size_reason)
        train_split = self.manifest.split("train")
        self.recipe = choose_recipe(
            config.recipe,
            model=config.model,
            vit=model_spec(config.model).layer_depths is not None,
            from_weights=bool(config.pretrained or config.init_from),
            train_samples=train_split.num_samples if train_split is not None else 0,
            num_classes=len(self.classes),
            overrides=config.recipe_overrides(),
        )
        log.info("recipe %s (%s): %s", self.recipe.name, self.recipe.why, self.recipe.to_json())
        self.loaders = make_loaders(
            config,
            self.dataset,
            self.manifest,
            self.rt,
            per_device=self.per_device,
            input_size=self.input_size,
            preprocessing=self.preprocessing,
            recipe=self.recipe.recipe,
        )
        self.steps_per_epoch = self.loaders.train.steps_per_epoch
        spec = model_spec(config.model)
        scratch_lr = default_peak_lr(self.global_batch, spec.base_lr)
        tuned_lr = fine_tune_peak_lr(self.global_batch, spec)
        self.peak_lr = config.lr or (tuned_lr if self.pretrained else scratch_lr)
        # The head's multiple of the scheduled LR: the model's for --pretrained's new head (a warm start whose
        # head is trained sets it back to 1, warm_start); the groups it needs are fixed here, from the config
        # alone, so that a resumed run's optimizer state fits them.
        self.head_lr_scale = head_lr_scale(config.head_lr_scale, spec, new_head=self.pretrained is not None)
        self.head_groups = config.backbone_lr_scale != 1.0 or self.head_lr_scale != 1.0
        seed_rngs(config.seed, self.rt.device)
        # The stem of a new run; a warm start or a resumed checkpoint keeps the one its weights were trained with.
        self.default_stem = default_small_input_stem(
            config.model, self.input_size, pretrained=self.pretrained is not None
        )
        self.build_network(self.default_stem)
        self.freeze_epochs = 0  # --freeze-epochs once the run is known to start from trained weights
        self.class_weights = class_weights(config, self.manifest)
        self.state = RunState()
        self.meta = RunMeta(
            model=config.model,
            classes=self.classes,
            input_size=self.input_size,
            input_size_reason=self.input_size_reason,
            dataset=self.dataset,
            dataset_digest=self.digest,
            config={**asdict(config), "data": self.dataset, "output": self.output},
            preprocessing=self.preprocessing.to_json(),
            pretrained_weights=self.pretrained is not None,
            recipe=self.recipe.to_json(),
        )
        if self.class_weights is not None:
            self.meta["class_weights"] = dict(zip(self.classes, self.class_weights.tolist(), strict=True))
            self.class_weights = self.class_weights.to(self.rt.device)
        self.epoch_log = EpochLog(self.output, epochs=config.epochs, writing=self.rt.is_master)
        self.stop: StopAgreement | None = None
        self.tracker: Any = None  # xm.RateTracker over the whole run, made in fit()
        self.compile_cache: Any = None  # CompileCache when --compile-cache is given
        self.on_epoch: EpochHook | None = None
        self.ema: Any = (
            None  # WeightAverage when the recipe has an EMA, made in fit() once the weights are set
        )
        self.restored_ema: Any = None  # the EMA's weights in the checkpoint a resumed run starts from

    def build_network(self, small_input_stem: bool) -> None:
        """The model (random weights, on the device), its optimizer and its head's parameters, for a network
        with the small-input stem or the stock one."""
        config, spec = self.config, model_spec(self.config.model)
        self.small_input_stem = small_input_stem
        self.model = build_network(
            config.model,
            num_classes=len(self.classes),
            input_size=self.input_size,
            small_input_stem=small_input_stem,
        ).to(self.rt.device)
        weight_decay = spec.weight_decay if config.weight_decay is None else config.weight_decay
        self.optimizer = spec.optimizer(
            self.model, lr=self.peak_lr, momentum=config.momentum, weight_decay=weight_decay
        )
        self.head = set(self.model.get_submodule(spec.head).parameters())
        layer_decay = self.recipe.recipe.layer_decay
        if layer_decay != 1 and spec.layer_depths is not None:
            depths, deepest = spec.layer_depths(self.model)
            self.optimizer = layer_decay_groups(self.optimizer, self.model, depths, deepest, layer_decay)
        if self.head_groups:
            self.optimizer = backbone_groups(self.optimizer, self.head)
            set_head_lr_scale(self.optimizer, self.head_lr_scale)

    def _keep_stem(self, small_input_stem: bool | None, source: str) -> None:
        """Rebuild the network when the weights it starts from (``source``) were trained with the other stem;
        None: they do not say (a checkpoint written before it was recorded), and the run's stem stays."""
        if small_input_stem is None or small_input_stem == self.small_input_stem:
            return
        log.info(
            "%s has the %s stem at %d px: the run keeps it",
            source,
            "small-input" if small_input_stem else "stock (pretrained)",
            self.input_size,
        )
        self.build_network(small_input_stem)

    def fit(self) -> ModelCard:
        """Train to ``config.epochs``; returns the model card. Raises Preempted (every host at one step)."""
        import torch_xla.core.xla_model as xm

        self.restore()
        self._freeze_plan()
        self._start_ema()
        if self.state.epoch >= self.config.epochs and latest_checkpoint_uri(self.output, "best") is None:
            raise TrainError(
                f"--resume {self.config.resume}: that run has already trained {self.state.epoch} epochs and "
                f"--epochs is {self.config.epochs}: raise --epochs to train on from it, or use the model it wrote"
            )
        # As chosen (a warm start or a checkpoint may have changed them since __init__), for the model card
        self.meta["peak_lr"] = self.peak_lr
        self.meta["head_lr_scale"] = self.head_lr_scale
        self.meta["global_batch"] = self.global_batch
        self.meta["small_input_stem"] = self.small_input_stem
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
            return wait_for_primary(
                self.output, self.digest, self.state.global_step, self.config, self.rt, self.stop
            )
        if self.compile_cache is not None:
            self.meta["compile_cache"] = self.compile_cache.record()
        return write_model_artifact(self.output, self.meta, self.state)

    def _start_ema(self) -> None:
        """The recipe's EMA of the weights, from the weights the run starts with (or a resumed run's own)."""
        if not self.recipe.recipe.ema_decay:
            return
        import torch_xla

        from tpustream.train.ema import WeightAverage

        self.ema = WeightAverage(self.model)
        if self.restored_ema is not None:
            self.ema.load_state_dict(self.restored_ema)
        # The copy as device data of its own: left pending, it would join the epoch's first graph, and the
        # next epoch's first graph (without it) would be one more compile.
        torch_xla.sync()

    def close(self) -> None:
        if self.stop is not None:
            self.stop.close()
        self.epoch_log.close()

    # -- where the weights begin ---------------------------------------------------------------------

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

    def restore(self) -> None:
        """Continue from ``--resume`` (auto: this output's `last`), mid-epoch included."""
        import torch
        import torch_xla.core.xla_model as xm

        config = self.config
        uri = resume_uri(config, self.output)
        if not uri:
            self.warm_start()
            return
        checkpoint = load_checkpoint(uri)
        check_resume(checkpoint, config, self.classes, self.input_size, uri, self.digest)
        if not within(uri, self.output):
            # Its checkpoints and best stay there: a run continued here could never write its model.
            raise TrainError(
                f"--resume {config.resume} is another run's checkpoint: --resume continues a run in its own "
                f"--output ({config.resume}); to start a new run in {self.output} from its weights, use "
                f"--init-from {config.resume} (and --resume never, or auto)"
            )
        self._restore_start(checkpoint)
        self.model.load_state_dict(checkpoint["model"])
        try:
            self.optimizer.load_state_dict(checkpoint["optimizer"])
        except ValueError as exc:  # other parameter groups: --backbone-lr-scale 1 or not, --head-lr-scale
            raise CheckpointError(
                f"checkpoint {uri}: its optimizer does not fit this run's ({exc}): resume with the options it "
                "was written with (--backbone-lr-scale, --head-lr-scale), or use --resume never"
            ) from exc
        # the head's LR multiple the run trained at: its head groups' (the checkpoint's), as train_step reads them
        self.head_lr_scale = next(
            (g.get("head_lr_scale", 1.0) for g in self.optimizer.param_groups if g.get("backbone") is False),
            1.0,
        )
        self.restored_ema = checkpoint.get("ema")
        xm.set_rng_state(int(checkpoint["rng"]["xla"]))
        torch.set_rng_state(checkpoint["rng"]["torch"])
        self.state = RunState(**checkpoint["state"])
        log.info("resumed from %s at epoch %d, batch %d", uri, self.state.epoch + 1, self.state.batches_done)

    def _restore_start(self, checkpoint: Checkpoint) -> None:
        """Where the resumed run's weights began (its checkpoint's meta), kept across restarts; a warm
        start's LR with it."""
        meta = checkpoint.get("meta") or {}
        self._keep_stem(meta.get("small_input_stem"), "the checkpoint")
        pretrained = meta.get("pretrained")
        if pretrained:
            self.meta["pretrained"] = pretrained
        init = meta.get("init")
        if init:
            self.meta["init"] = init
            self._warm_lr()

    def warm_start(self) -> None:
        """Start a new run from --init-from's weights (tpustream/train/warm_start.py) or --pretrained's
        (tpustream/train/pretrained.py), and record where from. --init-from wins when its classes are the run's
        (a retraining run); otherwise, or when it cannot be used and is optional, --pretrained starts it."""
        init_weights = None
        if self.config.init_from:
            init_weights = choose_init(self.config, classes=self.classes, pretrained=self.pretrained)
        if init_weights is not None:
            # The network the weights were trained as: a champion fine-tuned from pretrained weights keeps
            # its stock stem at a small input size, whether or not this run names --pretrained.
            self._keep_stem(init_weights.small_input_stem, f"--init-from {self.config.init_from}")
            init = start_from_init(
                self.config,
                self.model,
                init_weights,
                classes=self.classes,
                input_size=self.input_size,
                pretrained=self.pretrained,
            )
            if init is None:  # did not fit and was optional: --pretrained or random weights, with their stem
                self._keep_stem(self.default_stem, "the run")
            else:
                self.meta["init"] = init
                self._warm_lr()
                self._trained_head()
                if self.pretrained is not None:
                    log.info(
                        "the run starts from --init-from %s (same classes), not --pretrained %s",
                        self.config.init_from,
                        self.config.pretrained,
                    )
                return
        if self.pretrained is None:
            log.info("the run starts from random weights")
            return
        self.meta["pretrained"] = start_from_pretrained(self.model, self.pretrained, arch=self.config.model)
        log.info(
            "the run starts from --pretrained %s; peak lr %.4g%s",
            self.pretrained.name or self.pretrained.uri,
            self.peak_lr,
            f", the new head's {self.head_lr_scale:g}x it" if self.head_lr_scale != 1 else "",
        )

    def _trained_head(self) -> None:
        """A warm start's head is trained, not --pretrained's new one: its LR multiple, on its optimizer groups
        (split or not as ``__init__`` decided: a multiple other than 1 there split them)."""
        self.head_lr_scale = head_lr_scale(
            self.config.head_lr_scale, model_spec(self.config.model), new_head=False
        )
        if self.head_groups:
            set_head_lr_scale(self.optimizer, self.head_lr_scale)

    def _warm_lr(self) -> None:
        """A warm-started run without --lr trains at ``warm_peak_lr``, recorded in model.json's ``init``."""
        peak_lr = warm_peak_lr(self.config, self.global_batch)
        if peak_lr is not None:
            self.peak_lr = self.meta["init"]["peak_lr"] = peak_lr

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

    def run_epoch(self) -> EpochRun:
        """The steps of ``state.epoch`` from ``state.batches_done`` on; no host sync per step."""
        import torch
        import torch_xla.core.xla_model as xm

        config, state, rt = self.config, self.state, self.rt
        assert self.stop is not None
        total_steps = self.steps_per_epoch * config.epochs
        warmup_steps = int(round(config.warmup_epochs * self.steps_per_epoch))
        run = EpochRun(started=time.perf_counter(), loss_sum=torch.zeros((), device=rt.device))
        fine_tuning_phase(
            self.model, self.optimizer, self.head, epoch=state.epoch, freeze_epochs=self.freeze_epochs
        )
        last_checkpoint = time.monotonic()
        # resumed mid-epoch: the loader skips the batches already trained on without decoding them
        batches = iter(
            device_loader(self.loaders.train.epoch(state.epoch, start_batch=state.batches_done), rt)
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
            loss = train_step(
                self.model,
                self.optimizer,
                batch,
                lr,
                config,
                rt,
                self.class_weights,
                mix=self._mix(state.global_step),
                ema=self.ema,
                ema_decay=ema_decay_at(state.global_step, self.recipe.recipe.ema_decay),
            )
            run.loss_sum = run.loss_sum + loss
            state.global_step += 1
            state.batches_done += 1
            run.steps += 1
            self.tracker.add(self.global_batch / rt.num_replicas)
            if state.global_step % config.log_steps == 0:
                wait_fraction = run.wait / max(time.perf_counter() - run.started, 1e-9)
                xm.add_step_closure(
                    log_step,
                    args=(
                        loss,
                        state.global_step,
                        state.epoch,
                        lr,
                        self.tracker,
                        rt,
                        wait_fraction,
                        self.epoch_log.writer,
                    ),
                )
            agreed = self.stop.stop_step(state.global_step)
            if agreed is not None and state.global_step >= agreed:
                raise self.preempted(agreed)
            if time.monotonic() - last_checkpoint > config.checkpoint_minutes * 60:
                self.checkpoint(best=False)
                last_checkpoint = time.monotonic()

    def _mix(self, step: int) -> Any:
        """Step ``step``'s MixUp/CutMix draw as a device tensor (None: the recipe mixes nothing)."""
        recipe = self.recipe.recipe
        if not recipe.mixes:
            return None
        import torch

        from tpustream.train.mixing import draw_mix

        drawn = draw_mix(
            step,
            seed=self.config.seed,
            mixup_alpha=recipe.mixup_alpha,
            cutmix_alpha=recipe.cutmix_alpha,
            size=self.input_size,
        )
        return torch.tensor(drawn, dtype=torch.float32).to(self.rt.device)

    def finish_epoch(self, run: EpochRun) -> None:
        """Validate, record, log (and TensorBoard), then commit the epoch's checkpoint."""
        state = self.state
        metrics = evaluate(self.model, self.loaders.val, state.epoch, self.config, self.rt)
        train_loss = (run.loss_sum / max(run.steps, 1)).item()
        if not math.isfinite(train_loss):
            # Nothing of this epoch is checkpointed: `last` stays the previous, finite epoch.
            raise TrainError(
                f"training diverged: mean train loss is {train_loss} in epoch {state.epoch + 1}; lower --lr "
                f"(this run: peak {self.peak_lr:g}) or raise --warmup-epochs, then re-run: --resume auto "
                "continues from the last finite checkpoint"
            )
        record = epoch_record(
            state.epoch,
            run,
            train_loss,
            metrics,
            loader=self.loaders.train,
            steps_per_epoch=self.steps_per_epoch,
            global_batch=self.global_batch,
            num_devices=self.rt.num_devices,
        )
        top1 = metrics["val_top1"]
        if self.ema is not None:  # the EMA's weights beside the raw ones: the epoch's score is the better's
            averaged = evaluate(self.ema.model, self.loaders.val, state.epoch, self.config, self.rt)
            self.ema.model.eval()  # evaluate() leaves a network in training mode
            record["ema_val_top1"], record["ema_val_loss"] = averaged["val_top1"], averaged["val_loss"]
            record["ema_val_top5"] = averaged["val_top5"]
            top1 = max(top1, averaged["val_top1"])
        state.history.append(record)
        gained = top1 - state.best_top1 > self.config.min_delta
        state.epochs_without_gain = 0 if gained else state.epochs_without_gain + 1
        best = top1 > state.best_top1
        if best:
            state.best_top1 = top1
        state.epoch, state.batches_done = state.epoch + 1, 0
        patience = self.config.patience
        if patience and state.epochs_without_gain >= patience and state.epoch < self.config.epochs:
            state.stopped_early = True
        self.epoch_log.epoch(record)
        self.checkpoint(best=best)
        if state.stopped_early:
            best_epoch = max(state.history, key=epoch_score)
            log.warning(
                "early stopping after epoch %d of %d: val top-1 has not gained more than %g in %d epoch(s) "
                "(--patience %d); the model is the best epoch's, %d (val top-1 %.4f)",
                state.epoch,
                self.config.epochs,
                self.config.min_delta,
                state.epochs_without_gain,
                patience,
                best_epoch["epoch"],
                epoch_score(best_epoch),
            )
        if self.on_epoch is not None:
            self.on_epoch(state.epoch, metrics)

    # -- checkpoints and preemption ------------------------------------------------------------------

    def checkpoint(self, *, best: bool) -> None:
        """Process 0 commits the exact training state (weights, optimizer, position, RNG)."""
        import torch
        import torch_xla.core.xla_model as xm

        if not self.rt.is_master:
            return
        state = self.state
        payload = Checkpoint(
            model=to_cpu(self.model.state_dict()),
            optimizer=to_cpu(self.optimizer.state_dict()),
            state=asdict(state),
            meta=self.meta,
            rng={"xla": str(xm.get_rng_state()), "torch": torch.get_rng_state()},  # uint64: as text
        )
        if self.ema is not None:
            payload["ema"] = to_cpu(self.ema.state_dict())
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
        where = (
            f"epoch {state.epoch + 1}, batch {state.batches_done} (step {at})" if trained else f"step {at}"
        )
        return preempted_error(self.stop, self.preemption, trained=trained, where=where)
