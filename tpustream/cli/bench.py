"""The ``tpustream bench`` commands: one JSON line per result, ratios against the baseline run beside it.

The one module outside ``tpustream/bench/`` that imports it, and only inside a command, so ``tpustream
--help`` loads no benchmark (tests/unit/test_import_graph.py)."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

__all__ = ["bench_app"]

bench_app = typer.Typer(
    help="Benchmarks: one JSON line per result, ratios against the baseline.", no_args_is_help=True
)


@bench_app.command("write")
def bench_write(
    samples: Annotated[int, typer.Option(help="CIFAR-size samples per run.", min=1)] = 20000,
    imagenet_samples: Annotated[int, typer.Option(help="ImageNet-size JPEG samples per run.", min=1)] = 600,
    repeats: Annotated[int, typer.Option(help="Runs per writer (the median is reported).", min=1)] = 3,
    samples_per_shard: Annotated[int, typer.Option(help="Samples per shard for both writers.", min=1)] = 2000,
) -> None:
    """Our shard writer vs stock webdataset.ShardWriter on the same planned samples, side by side."""
    from tpustream.bench import write

    for line in write.bench_write(
        samples=samples,
        imagenet_samples=imagenet_samples,
        repeats=repeats,
        samples_per_shard=samples_per_shard,
    ):
        typer.echo(line)


@bench_app.command("import")
def bench_import_cmd(
    images: Annotated[
        int, typer.Option(help="Small JPEGs, uploaded flat with an import file and as ImageFolder.", min=10)
    ] = 2000,
    rows: Annotated[
        int, typer.Option(help="Rows of a local JSONL whose parsing is timed (0 skips it).", min=0)
    ] = 1_000_000,
    repeats: Annotated[int, typer.Option(help="Runs per source (the median is reported).", min=1)] = 3,
    workers: Annotated[
        int, typer.Option(help="shards create writer processes, the same for both sources.", min=1)
    ] = max(1, os.cpu_count() or 1),
) -> None:
    """Vertex AI import file vs ImageFolder on the GCS test server: listing rows/s and shards create images/s,
    and the parse rate of a large JSONL."""
    from tpustream.bench.import_files import bench_import

    for line in bench_import(images=images, rows=rows, repeats=repeats, workers=workers):
        typer.echo(line)


@bench_app.command("labelnoise")
def bench_labelnoise_cmd(
    seeds: Annotated[
        int, typer.Option(help="Draws of planted flips (val splits and flipped samples).", min=1)
    ] = 5,
    flip_fraction: Annotated[
        float, typer.Option(help="Share of val labels flipped.", min=0.01, max=0.5)
    ] = 0.05,
) -> None:
    """Planted label flips in the digits' val split: precision and recall of the likely label errors found."""
    from tpustream.bench.labelnoise import bench_labelnoise

    for line in bench_labelnoise(seeds=seeds, flip_fraction=flip_fraction):
        typer.echo(line)


@bench_app.command("warmstart")
def bench_warmstart_cmd(
    old: Annotated[
        int, typer.Option(help="Images of last week's data (the digits' first N; now: all).", min=100)
    ] = 1000,
    epochs: Annotated[int, typer.Option(help="Epochs of every run.", min=1)] = 6,
    model: Annotated[str, typer.Option(help="Model name.")] = "tiny",
    batch_size: Annotated[int, typer.Option(help="Per-device batch size.", min=1)] = 16,
    lr: Annotated[float, typer.Option(help="Peak LR of every run.")] = 0.2,
) -> None:
    """Epochs and steps to reach the champion's val top-1 after new data lands: from scratch vs --init-from."""
    from tpustream.bench.warmstart import bench_warmstart

    for line in bench_warmstart(old=old, epochs=epochs, model=model, batch_size=batch_size, lr=lr):
        typer.echo(line)


@bench_app.command("finetune")
def bench_finetune_cmd(
    images_per_class: Annotated[
        str | None, typer.Option(help="Target-task train images per class, a list [default: 10,30,100].")
    ] = None,
    epochs: Annotated[
        str | None, typer.Option(help="Fine-tuning epochs, one per size [default: 6,3,2].")
    ] = None,
    pretrain_epochs: Annotated[
        int | None,
        typer.Option(
            help="Epochs of the pretraining run on the source task [default: 24; 60 for the EfficientNets].",
            min=1,
        ),
    ] = None,
    source_per_class: Annotated[
        int | None, typer.Option(help="Source-task images per class, 22 classes [default: 100].", min=1)
    ] = None,
    test_per_class: Annotated[
        int | None,
        typer.Option(help="Test images per target class, the same at every size [default: 25].", min=1),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model name [default: resnet18].")] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Batch size of every run, one device [default: 16].", min=1)
    ] = None,
    lr_factors: Annotated[
        str,
        typer.Option(help="The LR sweep: also fine-tune at these multiples of the default fine-tuning LR."),
    ] = "",
    recipe_args: Annotated[
        list[str] | None,
        typer.Option(
            help="train options of an ours_recipe arm (none: the arm is not run); repeat it for several arms "
            "(ours_recipe_1, ours_recipe_2, ...)."
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed of the task's images, of the pretraining and of every fine-tune.")
    ] = 0,
    seeds: Annotated[
        str,
        typer.Option(
            help="Fine-tune at each of these seeds (a list; the pretraining and the images keep --seed): "
            "every arm runs at each, and the summary gives the mean top-1 and each seed's."
        ),
    ] = "",
    quick: Annotated[
        bool, typer.Option(help="A smoke run: tiny model, 4 images per class, 2 epochs, batch 8.")
    ] = False,
    source_weights: Annotated[
        str,
        typer.Option(
            help="Keep the pretraining's weights at this local .pth (and a .json beside it) and reuse them "
            "when they exist and were made by the same pretraining: the pretraining is most of the bench."
        ),
    ] = "",
    pretrain_lr: Annotated[
        float | None,
        typer.Option(
            help="The pretraining's peak LR [default: 4x the from-scratch default for the ResNets (SGD), "
            "3e-3 for the EfficientNets and 1e-3 for the others (AdamW)]; kept weights are reused only for "
            "the same.",
        ),
    ] = None,
    random_arm: Annotated[
        bool,
        typer.Option(
            help="Run the random arm (our trainer from scratch; as long as a fine-tune). The transfer check "
            "is plain_random's, run either way."
        ),
    ] = True,
    plain_trivial: Annotated[
        bool,
        typer.Option(
            help="Also run plain_trivial: the plain reference with TrivialAugmentWide after its crop and flip "
            "(what the policy does to a short fine-tune, without our trainer)."
        ),
    ] = False,
    default_arm: Annotated[
        bool,
        typer.Option(
            help="Run ours_default; --no-default-arm leaves it out (a sweep's further --lr-factors, the "
            "default measured already)."
        ),
    ] = True,
    ours: Annotated[
        bool,
        typer.Option(
            help="Run our trainer's arms; --no-ours runs the plain arms alone (seconds each on a CPU, at the "
            "steps our trainer takes): the reference's own spread over many --seeds."
        ),
    ] = True,
) -> None:
    """Random init, our fine-tune (default, recipe, an LR sweep) and a plain PyTorch reference fine-tune of
    the same pretrained weights, on a procedural transfer task (22 shape x texture classes -> 8 new ones at
    64 px), at a few images per class on the same test images and steps. JSON lines, a summary per size."""
    import dataclasses
    import shlex

    from tpustream.bench.finetune import DEFAULT, QUICK, bench_finetune
    from tpustream.bench.finetune_plain import pretrain_defaults
    from tpustream.errors import ConfigError

    def numbers(option: str, text: str, kind: type) -> tuple:
        try:
            return tuple(kind(part) for part in text.split(",") if part.strip())
        except ValueError:
            raise ConfigError(f"{option} {text}: give numbers separated by commas") from None

    given: dict[str, Any] = {
        "images_per_class": numbers("--images-per-class", images_per_class, int)
        if images_per_class
        else None,
        "epochs": numbers("--epochs", epochs, int) if epochs else None,
        "pretrain_epochs": pretrain_epochs,
        "source_per_class": source_per_class,
        "test_per_class": test_per_class,
        "model": model,
        "batch_size": batch_size,
    }
    size = dataclasses.replace(
        QUICK if quick else DEFAULT, **{k: v for k, v in given.items() if v is not None}
    )
    if not quick:  # the family's pretraining where the user gives none (the EfficientNets': longer, hotter)
        family_epochs, family_lr = pretrain_defaults(size.model, size.pretrain_epochs)
        if pretrain_epochs is None:
            size = dataclasses.replace(size, pretrain_epochs=family_epochs)
        pretrain_lr = family_lr if pretrain_lr is None else pretrain_lr
    for line in bench_finetune(
        size,
        lr_factors=numbers("--lr-factors", lr_factors, float),
        recipe_args=[shlex.split(args) for args in recipe_args or ()],
        seed=seed,
        seeds=numbers("--seeds", seeds, int),
        source_weights=source_weights,
        pretrain_lr=pretrain_lr,
        random_arm=random_arm,
        plain_trivial=plain_trivial,
        ours=ours,
        default_arm=default_arm,
    ):
        typer.echo(line)


@bench_app.command("train")
def bench_train_cmd(
    data: Annotated[str, typer.Option(help="Dataset URI (train split is streamed).")],
    model: Annotated[str, typer.Option(help="Model name.")] = "resnet50",
    steps: Annotated[int, typer.Option(help="Timed steps per input (after two warm-up steps).", min=1)] = 20,
    batch_size: Annotated[int, typer.Option(help="Per-device batch size.")] = 32,
    workers: Annotated[int, typer.Option(help="Loader worker processes.")] = max(1, os.cpu_count() or 1),
    bf16: Annotated[bool, typer.Option(help="bfloat16 autocast.")] = False,
) -> None:
    """Steps/s with synthetic on-device input vs the real loader: the data wait your host would cause."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    from tpustream.bench.train import bench_train

    for line in bench_train(
        data=data, model_name=model, steps=steps, batch_size=batch_size, workers=workers, bf16=bf16
    ):
        typer.echo(line)


@bench_app.command("preempt")
def bench_preempt_cmd(
    images: Annotated[
        int, typer.Option(help="synthetic-imagenet images (500x375 JPEGs) to train on.", min=64)
    ] = 1200,
    batch_size: Annotated[int, typer.Option(help="Batch size.", min=1)] = 16,
    workers: Annotated[int, typer.Option(help="Loader workers.", min=0)] = 2,
    input_size: Annotated[int, typer.Option(help="Training input side.", min=16)] = 224,
) -> None:
    """SIGTERM mid-epoch and restart, at three positions: signal->exit, restart->first step, and the loader's
    way back to the position (ours: nothing skipped is decoded) against replaying the epoch. JSON lines."""
    from tpustream.bench.preempt import bench_preempt

    for line in bench_preempt(images=images, batch_size=batch_size, workers=workers, input_size=input_size):
        typer.echo(line)


@bench_app.command("serve")
def bench_serve_cmd(
    model: Annotated[
        str | None, typer.Option(help="Model directory or registry (default: a random model built here).")
    ] = None,
    arch: Annotated[
        str, typer.Option(help="The random model's architecture (tiny, resnet18, resnet50).")
    ] = "tiny",
    streamed_case: Annotated[
        bool,
        typer.Option(
            help="Also run 64 images of 16 MP in one request on a second server, request budget raised."
        ),
    ] = True,
) -> None:
    """The model server under hostile requests, as Vertex starts it: status, latency, response size, the server's
    RSS and the health route's latency during each case (malformed bodies, budgets, formats, bombs, load)."""
    from tpustream.bench import serve

    serve.run(model, arch=arch, streamed_case=streamed_case, echo=typer.echo)


@bench_app.command("load")
def bench_load(
    data: Annotated[
        str,
        typer.Option(
            help="Dataset URI, or a SOURCE (e.g. synthetic-cifar:20000) sharded into a temp dir first."
        ),
    ] = "synthetic-cifar:20000",
    split: Annotated[str, typer.Option(help="train (augmented) or val.")] = "train",
    batch_size: Annotated[int, typer.Option(help="Batch size of every pipeline.")] = 128,
    workers: Annotated[
        str, typer.Option(help="DataLoader workers of every pipeline; a list (1,2,4) measures each.")
    ] = str(max(1, os.cpu_count() or 1)),
    seconds: Annotated[
        float, typer.Option(help="Measured seconds per run, after the first batch.", min=0.1)
    ] = 8.0,
    repeats: Annotated[int, typer.Option(help="Interleaved runs per pipeline (median reported).", min=1)] = 3,
    input_size: Annotated[
        int | None, typer.Option(help="Output side (default: 224 for large images, else the image size).")
    ] = None,
    augment: Annotated[
        str,
        typer.Option(
            help="Instead: our train loader per augmentation case against none, a list of none, trivial, "
            "randaugment, random-erasing (the training recipe's policies in the workers)."
        ),
    ] = "",
) -> None:
    """Per-file ImageFolder (A), the blog's webdataset pipeline (B), ours local and from GCS, installed peers,
    and the ceilings (our kernel alone, the kernel in as many processes as cores used, our pipeline without
    workers); with --augment, our loader's cost per augmentation policy instead."""
    from tpustream.bench import load as bl

    try:
        worker_counts = [int(count) for count in workers.split(",")]
    except ValueError:
        worker_counts = []
    if not worker_counts or min(worker_counts) < 0:
        raise typer.BadParameter(f"--workers takes counts like 2 or 1,2,4, got {workers!r}")
    if augment:
        for line in bl.bench_augment(
            data=data,
            batch_size=batch_size,
            workers=worker_counts,
            seconds=seconds,
            repeats=repeats,
            input_size=input_size,
            cases=[case.strip() for case in augment.split(",") if case.strip()],
        ):
            typer.echo(line)
        return
    for line in bl.bench_load(
        data=data,
        split=split,
        batch_size=batch_size,
        workers=worker_counts,
        seconds=seconds,
        repeats=repeats,
        input_size=input_size,
    ):
        typer.echo(line)


@bench_app.command("compile")
def bench_compile_cmd(
    model: Annotated[
        list[str] | None,
        typer.Option(
            help="A model to run (repeatable; default: vit_b_16, convnext_tiny, efficientnet_v2_s)."
        ),
    ] = None,
    precision: Annotated[
        list[str] | None, typer.Option(help="fp32 and/or bf16 (repeatable; default: both).")
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Images per step.", min=1)] = 2,
    epochs: Annotated[int, typer.Option(help="Epochs (the first compiles).", min=2)] = 2,
    steps: Annotated[int, typer.Option(help="Steps per epoch, each at another LR.", min=1)] = 2,
    timeout: Annotated[float, typer.Option(help="Seconds per model before it is reported as over.")] = 1800,
) -> None:
    """Full-size networks through the trainer's step on XLA: compiles after each epoch (0 recompiles after the
    first is the goal), first-epoch seconds and step time against resnet50, one fresh process per model."""
    from tpustream.bench.compile import bench_compile
    from tpustream.cli.options import fail
    from tpustream.models import MODEL_NAMES

    models = model or ["vit_b_16", "convnext_tiny", "efficientnet_v2_s"]
    precisions = precision or ["fp32", "bf16"]
    for name in models:
        if name not in MODEL_NAMES:
            fail(f"--model {name!r}: one of {', '.join(MODEL_NAMES)}")
    for value in precisions:
        if value not in ("fp32", "bf16"):
            fail(f"--precision {value!r}: fp32 or bf16")
    for line in bench_compile(
        models, precisions=precisions, batch_size=batch_size, epochs=epochs, steps=steps, timeout=timeout
    ):
        typer.echo(line)


@bench_app.command("datacheck")
def bench_datacheck_cmd(
    train: Annotated[
        int, typer.Option(help="Random train hashes searched (the scale line).", min=1)
    ] = 1_000_000,
    test: Annotated[
        int, typer.Option(help="Random test hashes looked up (the scale line).", min=1)
    ] = 100_000,
    planted: Annotated[
        int, typer.Option(help="Test hashes that are train hashes with 0..d bits flipped.", min=0)
    ] = 1000,
    max_distance: Annotated[
        int | None,
        typer.Option(
            help="Hamming distance searched (default: the data check's, from the ROC).", min=0, max=64
        ),
    ] = None,
    brute_force_sample: Annotated[
        int, typer.Option(help="Test hashes brute force compares (its time for all is extrapolated).", min=1)
    ] = 1000,
    copied: Annotated[
        int, typer.Option(help="Originals given one planted copy of each kind (digits and photos).", min=1)
    ] = 300,
    train_clusters: Annotated[
        bool, typer.Option(help="Also time the clusters inside train (a train x train search).")
    ] = True,
    hash_seconds: Annotated[
        float, typer.Option(help="Seconds timing each step of each hash-cost line.", min=0.01)
    ] = 1.0,
) -> None:
    """Near-duplicates: the hash's cost per image against the decodes shard writing does; recall of planted
    copies and false-pair rate per distance (the digits and scikit-image's photos); multi-index search of test
    against train hashes vs brute force, time and peak memory."""
    from tpustream.bench.datacheck import bench_datacheck
    from tpustream.dataset.near_duplicates import DEFAULT_MAX_DISTANCE

    for line in bench_datacheck(
        train=train,
        test=test,
        planted=planted,
        max_distance=DEFAULT_MAX_DISTANCE if max_distance is None else max_distance,
        brute_force_sample=brute_force_sample,
        copied=copied,
        train_clusters=train_clusters,
        hash_seconds=hash_seconds,
    ):
        typer.echo(line)
