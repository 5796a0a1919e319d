"""``TrainConfig``: the options of ``tpustream train``, apart from the trainer so that reading them (the CLI's
``--help``, the pipeline's parameter defaults) imports no torch. Each field's docstring is its ``--help``.
``TrainConfig.from_pipeline``: the pipeline's train parameters, as the train step receives them, decoded into one.
``TrainError``: a run that cannot start (or finish) as configured, raised by every module of the trainer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tpustream.errors import ConfigError, TpustreamError
from tpustream.models import model_spec
from tpustream.train.recipe import RECIPES, AugmentPolicy, Recipe
from tpustream.xla_runtime import Strategy

__all__ = ["TrainConfig", "TrainError"]


class TrainError(TpustreamError, ValueError):
    """Training cannot start as configured; the message names the input and the fix."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Options of ``tpustream train`` (the CLI contract in docs/ARCHITECTURE.md)."""

    data: str
    """Dataset URI (holds manifest.json)."""
    output: str
    """Model/checkpoint URI (local or gs://)."""
    model: str = "resnet50"
    """The model architecture."""
    epochs: int = 10
    """Epochs."""
    batch_size: int = 128
    """Per-device batch size."""
    global_batch_size: int | None = None
    """Global batch instead of --batch-size (must divide over the devices)."""
    lr: float | None = None
    """Peak LR (default 0.1 at a global batch of 256, scaled linearly above it and by the square root below:
    0.035 at 32, 0.4 at 1024; with --pretrained the model family's fine-tuning factor times that, measured by
    `bench finetune`: 0.3 for the ResNets, 3 for convnext_tiny (AdamW), 0.03 for the EfficientNets, a tenth for
    the others; with --init-from a tenth)."""
    momentum: float = 0.9
    """SGD momentum (AdamW's beta1 for the models whose recipe is AdamW)."""
    weight_decay: float | None = None
    """Weight decay, not on norms/biases (default: the model's recipe: 1e-4 for SGD, 0.05 ConvNeXt, 0.3 ViT)."""
    label_smoothing: float = 0.1
    """Label smoothing."""
    warmup_epochs: float = 1.0
    """Linear LR warmup, in epochs."""
    bf16: bool = False
    """bfloat16 autocast."""
    strategy: Strategy = "spmd"
    """spmd (one process per host) or replicas (one per device)."""
    resume: str = "auto"
    """auto | never | URI of a checkpoint or output directory."""
    log_steps: int = 20
    """Log every N steps."""
    checkpoint_minutes: float = 30.0
    """Also write `last` every N minutes."""
    keep_checkpoints: int = 2
    """Newest checkpoint files kept (and always those `last` and `best` name)."""
    workers: int = 4
    """Loader worker processes per host."""
    input_size: int | None = None
    """Input side (default: the images' median shorter side, rounded down to a multiple of 8, within
    [16, 224]; model.json records how it was chosen)."""
    seed: int = 0
    """Seed of init, data order, augmentation and the device's random draws (dropout, stochastic depth)."""
    commit_timeout_minutes: float = 30.0
    """Multi-host: how long the hosts other than process 0 wait for its model artifact (not a CLI option)."""
    preemption_sync_seconds: float = 10.0
    """Multi-host slice: seconds the hosts wait for each other's stop step."""
    compile_cache: str | None = None
    """Persistent XLA compilation cache (local dir or gs://): a restarted or later run of the same program
    loads its executables instead of compiling (process 0 writes, the other hosts read)."""
    init_from: str | None = None
    """Warm start from these weights: a model artifact (model.json), a registry (its champion), a checkpoint
    (.pt) or a training output. Same classes: all weights; other classes: the backbone and a new head. The
    optimizer and LR schedule start fresh; model.json records it (init)."""
    init_optional: bool = False
    """A warm start that cannot be used (no champion yet, another architecture) trains from random weights
    with a warning instead of failing. Not a CLI option: the pipeline's init_from=champion sets it, whose
    champion may predate a model change; on the CLI an --init-from that does not fit is an error."""
    pretrained: str | None = None
    """Start the backbone from pretrained weights: a torchvision weights name (resnet50.IMAGENET1K_V2,
    efficientnet_b0.DEFAULT) fetched once into --weights-cache, or a .pth/.pt/.safetensors state dict URI in
    torchvision layout. The head is new; the stock stem is kept (small images are upscaled); the input uses the
    weights' preprocessing (default input size: their crop size). Fine-tuning defaults: peak LR the model family's
    factor times the from-scratch one (measured by `bench finetune`: ResNets 0.3, convnext_tiny 3, EfficientNets
    0.03; the others a tenth), 1 warmup epoch, label smoothing 0.1 (Kornblith et al.,
    CVPR 2019: fine-tuning's best LR is below training from scratch's). --init-from wins when its classes
    match."""
    weights_cache: str | None = None
    """Where named --pretrained weights are fetched to, once, content-addressed (default: OUTPUT/../weights-cache)."""
    patience: int = 0
    """Early stopping: stop after N epochs without a val top-1 gain of more than --min-delta; the model is
    the best epoch's (0: off)."""
    min_delta: float = 0.0
    """Early stopping: the val top-1 gain (0-1) that counts as one."""
    freeze_epochs: int = 0
    """Fine-tuning: train only the head for the first N epochs (the backbone's weights and BatchNorm
    statistics fixed), then everything; needs --pretrained or --init-from. N = --epochs: a linear probe."""
    backbone_lr_scale: float = 1.0
    """Fine-tuning: the backbone trains at this fraction (0 < X <= 1) of the scheduled LR, the head at all of
    it (to keep the backbone fixed, use --freeze-epochs)."""
    head_lr_scale: float | None = None
    """The head trains at this multiple (> 0) of the scheduled LR (default: the model's for a new head, a run
    from --pretrained weights: 10 for ConvNeXt, 1 for the others; 1 for a run from random weights or a
    warm start's trained head). With --backbone-lr-scale, the backbone at its fraction and the head at this."""
    class_weights: Literal["none", "auto"] = "none"
    """auto: weight the training loss by inverse class frequency in the train split (mean weight per sample
    1; model.json records the weights), for imbalanced classes; val metrics stay unweighted."""
    recipe: str = "auto"
    """The training recipe (tpustream/train/recipe.py): auto picks one by model, pretrained or not and train
    images per class (and, pretrained, in all) (logged, and recorded in model.json), or plain, scratch,
    finetune, small-data-finetune, vit-finetune. The five options below override its values one by one."""
    augment: AugmentPolicy | None = None
    """torchvision.transforms.v2 policy applied in the loader's workers after the crop and flip: none,
    trivial (TrivialAugmentWide) or randaugment (RandAugment) (default: the recipe's)."""
    random_erasing: float | None = None
    """Probability of torchvision's RandomErasing on each train image, filled with the mean colour (default:
    the recipe's; 0 off)."""
    mixup_alpha: float | None = None
    """MixUp's Beta(alpha, alpha) in the compiled step, with soft-target cross entropy (default: the recipe's;
    0 off). With --cutmix-alpha too, each step is one or the other, half the time each."""
    cutmix_alpha: float | None = None
    """CutMix's Beta(alpha, alpha) in the compiled step (default: the recipe's; 0 off)."""
    ema_decay: float | None = None
    """EMA of the weights on the device, per step, with timm's warmup (default: the recipe's; 0 off). Evaluated
    each epoch beside the raw weights; the model is the EMA's when its val top-1 is better."""
    layer_decay: float | None = None
    """ViT models: layer-wise LR decay, each block below the head at this fraction of the LR of the block
    above it (default: the recipe's; 1 off)."""

    def __post_init__(self) -> None:
        model_spec(self.model)  # ValueError naming the models
        if self.strategy not in ("spmd", "replicas"):
            raise ConfigError(f"--strategy must be spmd or replicas, got {self.strategy!r}")
        for name in ("epochs", "batch_size", "log_steps", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.global_batch_size is not None and self.global_batch_size < 1:
            raise ConfigError(f"--global-batch-size must be at least 1, got {self.global_batch_size}")
        if self.lr is not None and self.lr <= 0:
            raise ConfigError(f"--lr must be positive, got {self.lr}")
        if self.warmup_epochs < 0 or self.checkpoint_minutes <= 0:
            raise ConfigError("--warmup-epochs must be >= 0 and --checkpoint-minutes > 0")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.workers < 0:
            raise ConfigError(f"--workers must be >= 0, got {self.workers}")
        # the XLA device's RNG takes an unsigned 64-bit seed (xm.set_rng_state)
        if not 0 <= self.seed < 2**64:
            raise ConfigError(f"--seed must be in [0, 2**64), got {self.seed}")
        if self.patience < 0 or self.min_delta < 0:
            raise ConfigError(
                f"--patience and --min-delta must be >= 0, got {self.patience} and {self.min_delta}"
            )
        if not 0 <= self.freeze_epochs <= self.epochs:
            raise ConfigError(
                f"--freeze-epochs must be in [0, --epochs {self.epochs}], got {self.freeze_epochs} "
                "(equal to --epochs: only the head ever trains)"
            )
        if self.freeze_epochs and not (self.pretrained or self.init_from):
            raise ConfigError(
                f"--freeze-epochs {self.freeze_epochs} needs --pretrained or --init-from: freezing a randomly "
                "initialised backbone trains the head on random features"
            )
        if not 0 < self.backbone_lr_scale <= 1:
            raise ConfigError(
                f"--backbone-lr-scale must be in (0, 1], got {self.backbone_lr_scale} (to keep the backbone "
                "fixed, use --freeze-epochs)"
            )
        if self.head_lr_scale is not None and not self.head_lr_scale > 0:
            raise ConfigError(
                f"--head-lr-scale must be positive, got {self.head_lr_scale} (1: the head at the scheduled LR)"
            )
        if self.class_weights not in ("none", "auto"):
            raise ConfigError(f"--class-weights must be none or auto, got {self.class_weights!r}")
        if self.recipe != "auto" and self.recipe not in RECIPES:
            raise ConfigError(f"--recipe must be auto or one of {', '.join(RECIPES)}, got {self.recipe!r}")
        Recipe(**{key: value for key, value in self.recipe_overrides().items() if value is not None})
        if self.preemption_sync_seconds <= 0 or self.commit_timeout_minutes <= 0:
            raise ConfigError("--preemption-sync-seconds and --commit-timeout-minutes must be positive")

    def recipe_overrides(self) -> dict[str, Any]:
        """The recipe's values this run gives itself, by ``Recipe`` field (None: the recipe's)."""
        return {
            "augment": self.augment,
            "random_erasing": self.random_erasing,
            "mixup_alpha": self.mixup_alpha,
            "cutmix_alpha": self.cutmix_alpha,
            "ema_decay": self.ema_decay,
            "layer_decay": self.layer_decay,
        }

    @classmethod
    def from_pipeline(
        cls,
        *,
        data: str,
        output: str,
        model_name: str,
        epochs: float,
        batch_size: float,
        lr: float,
        bf16: bool,
        workers: float,
        input_size: float,
        init_from: str,
        pretrained: str,
        freeze_epochs: float,
        backbone_lr_scale: float,
        head_lr_scale: float,
        class_weights: str,
        registry: str,
        patience: float,
        early_stop_min_delta: float,
        compile_cache: str,
        pipeline_root: str,
        recipe: str,
        augment: str,
        random_erasing: float,
        mixup_alpha: float,
        cutmix_alpha: float,
        ema_decay: float,
        layer_decay: float,
    ) -> TrainConfig:
        """The train step's config from the pipeline's parameters, named and typed as the step receives them:
        the one place their stand-ins are decoded, as ``PromotionPolicy.from_pipeline`` does the policy's.

        A KFP parameter cannot be None: ``lr`` 0 is the scaled default, ``input_size`` 0 the dataset's rule,
        "" no ``init_from``, ``pretrained`` or ``compile_cache``, ``augment`` "" and a negative
        ``random_erasing``, ``mixup_alpha``, ``cutmix_alpha``, ``ema_decay`` or ``layer_decay`` the recipe's, a
        negative ``head_lr_scale`` the model's rule. An integer parameter can arrive as a float
        (the compiled YAML keeps a default as 8.0): a whole one is taken as an int, another refused.
        ``init_from`` "champion" is ``registry``'s current champion, read now: none yet (a new registry) is
        random weights (or ``pretrained``), with a warning; a champion that does not fit the run (another
        architecture) trains from those too (``init_optional``). ``pipeline_root`` (the run's root, "" none)
        holds the named pretrained weights' cache (weights-cache/, shared by the runs under that root) and,
        with ``compile_cache`` "auto", the XLA compilation cache (xla-cache/). ``data`` and ``output`` are the
        dataset's and the model artifact's URIs; ``resume`` stays "auto", so a retried step continues its run.

        Raises:
            ConfigError: a value the run cannot take, naming the parameter (init_from=champion without a
                registry; a fractional integer), or whatever ``TrainConfig`` refuses.
        """
        from tpustream.train.warm_start import CHAMPION, champion_start

        root = pipeline_root.strip().rstrip("/")
        start: str | None = init_from.strip() or None
        optional = start == CHAMPION
        if optional:
            if not registry.strip():
                raise ConfigError(
                    "init_from=champion needs the registry parameter: give the pipeline's registry, or "
                    'init_from="" (random weights) or a model URI'
                )
            start = champion_start(registry.strip(), pretrained)  # None: the first run of a new registry
        cache = compile_cache.strip()
        if cache == "auto":
            cache = f"{root}/xla-cache" if root else ""
        return cls(
            data=data,
            output=output,
            model=model_name,
            epochs=_whole("epochs", epochs),
            batch_size=_whole("batch_size", batch_size),
            lr=lr or None,
            bf16=bf16,
            workers=_whole("workers", workers),
            input_size=_whole("input_size", input_size) or None,
            init_from=start,
            init_optional=optional,
            pretrained=pretrained.strip() or None,
            weights_cache=f"{root}/weights-cache" if root else None,
            freeze_epochs=_whole("freeze_epochs", freeze_epochs),
            backbone_lr_scale=backbone_lr_scale,
            head_lr_scale=_or_recipe(head_lr_scale),
            class_weights=class_weights,  # type: ignore[arg-type]  # __post_init__ checks none/auto
            patience=_whole("patience", patience),
            min_delta=early_stop_min_delta,
            compile_cache=cache or None,
            recipe=recipe.strip() or "auto",
            augment=augment.strip() or None,  # type: ignore[arg-type]  # __post_init__ checks the policy
            random_erasing=_or_recipe(random_erasing),
            mixup_alpha=_or_recipe(mixup_alpha),
            cutmix_alpha=_or_recipe(cutmix_alpha),
            ema_decay=_or_recipe(ema_decay),
            layer_decay=_or_recipe(layer_decay),
        )


def _or_recipe(value: float) -> float | None:
    """A recipe value as a pipeline parameter: negative (the stand-in -1) is the recipe's (or the model's) own."""
    return None if value < 0 else float(value)


def _whole(name: str, value: float) -> int:
    """An integer pipeline parameter, which may arrive as a float (8.0); a ConfigError for a fraction."""
    if isinstance(value, bool) or not float(value).is_integer():
        raise ConfigError(f"pipeline parameter {name}={value!r}: a whole number")
    return int(value)
