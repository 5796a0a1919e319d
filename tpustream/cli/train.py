"""`tpustream train`, `tpustream weights fetch` and `tpustream evaluate`."""

from __future__ import annotations

import signal
from typing import Annotated, Any

import typer

from tpustream.cli.app import app, weights_app
from tpustream.cli.options import Opt, fail, from_config
from tpustream.models import MODEL_NAMES
from tpustream.train.config import TrainConfig


class _EarlySigterm:
    """SIGTERM in `tpustream train`'s first seconds (importing torch and torch_xla, setting up), before the
    trainer's own handler exists: recorded instead of fatal (exit 143). The trainer's handler takes over
    and finds it ``requested``, so it stops before the first step: exit 75, run again to resume."""

    requested = False

    def __init__(self) -> None:
        self.previous: Any = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.requested = True

    def install(self) -> _EarlySigterm:
        try:
            self.previous = signal.signal(signal.SIGTERM, self)
        except ValueError:  # not the main thread (a test runner's): leave SIGTERM alone
            self.previous = None
        return self

    def uninstall(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None


@app.command("train")
@from_config(
    TrainConfig,
    exclude={"commit_timeout_minutes", "init_optional"},
    model=Opt(more_help=f"One of: {' | '.join(MODEL_NAMES)}."),
    log_steps=Opt(min=1),
    patience=Opt(min=0),
    min_delta=Opt(min=0.0),
)
def train_cmd(config: TrainConfig) -> None:
    """Train a ResNet with PyTorch/XLA (SPMD or replicas), checkpointing to --output; resumable. SIGTERM or
    Ctrl-C: the step in flight finishes, `last` is written, exit 75 (run again to resume)."""
    early = _EarlySigterm().install()  # before these imports, which take seconds
    from tpustream.train.preemption import Preempted, exit_now, exit_preempted
    from tpustream.train.trainer import train

    try:
        if config.strategy == "replicas":  # one process per device, each with its own handler from its start
            if early.requested:
                raise Preempted("SIGTERM before training started: nothing to save")
            early.uninstall()
        card = train(config)
    except Preempted as exc:
        exit_preempted(exc)  # exit 75
    except KeyboardInterrupt:  # Ctrl-C before the trainer's handler existed (importing torch, setting up)
        typer.echo("tpustream: Ctrl-C before the first step: nothing to save; exit 130", err=True)
        exit_now(130)
    finally:
        early.uninstall()
    if card:
        metrics = card.metrics
        early_stop = f"; stopped early after epoch {len(card.history)}" if card.stopped_early else ""
        typer.echo(
            f"model: {config.output} (best epoch {metrics['epoch']}, val top-1 {metrics['val_top1']:.4f}{early_stop})"
        )


@weights_app.command("fetch")
def weights_fetch(
    name: Annotated[
        str, typer.Argument(help="A torchvision weights name: <arch>.<member>, e.g. resnet50.IMAGENET1K_V2.")
    ],
    cache: Annotated[
        str, typer.Option(help="The weights cache (local or gs://) that `train --weights-cache` will read.")
    ],
    model: Annotated[
        str | None,
        typer.Option(help=f"Model name (default: NAME's arch). One of: {' | '.join(MODEL_NAMES)}."),
    ] = None,
) -> None:
    """Fetch a named weight set once into --cache, its sha256 checked against the hash prefix in its file
    name (torch.hub's rule); a copy already there is only checked. `train --pretrained NAME --weights-cache
    CACHE` (every host of a slice) then reads that copy and fetches nothing."""
    from tpustream.models import MODEL_SPECS
    from tpustream.train.pretrained import is_uri, resolve

    if is_uri(name):
        fail(f"{name} is a file, not a torchvision weights name: pass it to `train --pretrained` as it is")
    arch = name.rpartition(".")[0]
    if model is None:
        found = [m for m, spec in MODEL_SPECS.items() if spec.torchvision_arch == arch]
        if not found:
            fail(f"{name}: give --model (the name has no arch tpustream knows, e.g. resnet50.IMAGENET1K_V2)")
        model = found[0]
    resolved = resolve(name, model=model, cache=cache)
    typer.echo(f"{resolved.name}: {resolved.uri} (sha256 {resolved.sha256})")


@app.command("evaluate")
def evaluate_cmd(
    model: Annotated[str, typer.Option(help="Model artifact URI (model.pt + model.json).")],
    data: Annotated[
        str,
        typer.Option(help="Dataset URI; its test split is evaluated (and val), or val when it has no test."),
    ],
    output: Annotated[str, typer.Option(help="Where metrics.json is written.")],
    registry: Annotated[
        str | None, typer.Option(help="Also evaluate this registry's champion on the same shards.")
    ] = None,
    workers: Annotated[int, typer.Option(help="Loader worker processes.")] = 2,
) -> None:
    """Top-1/top-5/loss, per-class accuracy and confusion matrix on the test split, or val without one (XLA if
    PJRT_DEVICE is set)."""
    from tpustream.report.facts import shows_top5
    from tpustream.train import evaluate

    result = evaluate.evaluate(model, data, output, registry=registry, workers=workers)
    for role, entry in (("candidate", result.candidate), ("champion", result.champion)):
        if entry:
            version = f" (version {entry.version})" if role == "champion" else ""
            top5 = f" top-5 {entry.top5:.4f}" if shows_top5(len(result.classes)) else ""
            macro_f1 = f" macro-F1 {entry.macro_f1:.4f}" if entry.macro_f1 is not None else ""
            typer.echo(
                f"{role}{version}: top-1 {entry.top1:.4f}{top5}{macro_f1} loss {entry.loss:.4f} "
                f"on {entry.num_samples} {result.split} samples"
            )
            if entry.scores:
                typer.echo(f"{role} per-sample scores: {output.rstrip('/')}/{entry.scores}")
    if result.baseline is not None:
        baseline = result.baseline
        typer.echo(
            f"majority-class baseline (always {baseline.answer!r}, the train split's most frequent class): "
            f"top-1 {baseline.top1:.4f} on the {result.split} split"
        )
    if result.val is not None:
        typer.echo(
            f"candidate on val (chose its best epoch; test decides): top-1 {result.val.top1:.4f} "
            f"loss {result.val.loss:.4f} on {result.val.num_samples} val samples"
        )
    typer.echo(f"metrics: {output.rstrip('/')}/metrics.json")
