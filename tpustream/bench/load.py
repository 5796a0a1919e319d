"""``tpustream bench load``: input pipelines side by side on the same data, cores and output shape.

(A) per-file: the same samples as one file per image, torchvision ImageFolder + DataLoader;
(B) the blog's pipeline: stock webdataset .shuffle().decode("pil").to_tuple().map_tuple(torchvision
    transforms incl. ToTensor + Normalize).batched(B, partial=True) + DataLoader;
(ours) tpustream.loader.shard_loader from local disk; (ours-gcs) tpustream.loader.shard_loader from a GCS-API server on loopback;
(peers) ``bench.peers``: each installed peer's documented pipeline and its plumbing with our decoder, over
    the same samples (webdataset: our shards; litdata, grain, mosaic-streaming: written in their own formats);
(ceilings) our decode+crop kernel alone in one process (``kernel-alone``, x cores used), the same kernel
    run in as many processes at once as the worker count uses cores (``kernel-in-N-processes``: what the
    cores really give together, shared caches and memory bandwidth included) and our whole pipeline with
    no worker processes (``tpustream-workers0``).
(feed ceilings, at 224 and 32 px whatever the data's size) what one main process can hand out when the
    workers have nothing to do (``handoff-ceiling``: ShardLoader's own workers, slot ring and main-process
    loop, every slot holding a batch rendered once), what the host->device transfer alone sustains
    (``device-transfer-ceiling``: one ready batch through ``device_loader``) and both in one process as
    the trainer feeds (``feed-ceiling``), the last two in a spawned process on torch_xla (PJRT_DEVICE,
    default CPU with CPU_NUM_DEVICES=4: a v5e host's 4 chips); at 224 px compared with a v5e host's need.
(augmentation, ``bench_augment``: ``--augment``) our loader per augmentation policy of the training recipe
    (torchvision.transforms.v2 TrivialAugmentWide, RandAugment, RandomErasing in the workers) against none.
Every pipeline runs ``repeats`` times, interleaved; each run counts samples for ``seconds`` after its
first batch (worker start-up excluded); the median is reported with ratios to tpustream, (B) and (A),
once per worker count of ``workers`` (``--workers 1,2,4``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache, partial
from typing import Any, cast

import numpy as np

from tpustream.artifacts import Manifest
from tpustream.errors import ConfigError
from tpustream.image.transforms import AugmentPolicy
from tpustream.loader.batch import Batch
from tpustream.loader.config import SplitName
from tpustream.loader.worker import EpochStream, WorkerBatch, WorkerStats
from tpustream.storage import io as storage

__all__ = ["AUGMENT_CASES", "bench_augment", "bench_load", "input_size_for"]


def _blog_transform(size: int, train: bool) -> Any:
    from torchvision import transforms as T

    from tpustream.image.transforms import default_min_crop_scale

    normalize = T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    if train:
        scale = (default_min_crop_scale(size), 1.0)
        return T.Compose(
            [T.RandomResizedCrop(size, scale=scale), T.RandomHorizontalFlip(), T.ToTensor(), normalize]
        )
    return T.Compose([T.Resize(int(size / 0.875)), T.CenterCrop(size), T.ToTensor(), normalize])


def _per_file_loader(root: str, size: int, batch: int, workers: int, train: bool) -> Iterable[Any]:
    import torch.utils.data
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(root, transform=_blog_transform(size, train))
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch,
        shuffle=train,
        num_workers=workers,
        drop_last=False,
        persistent_workers=False,
    )


def _blog_loader(urls: list[str], size: int, batch: int, workers: int, train: bool) -> Iterable[Any]:
    import torch.utils.data
    import webdataset as wds

    dataset = (
        wds.WebDataset(urls, shardshuffle=100 if train else False, empty_check=False, nodesplitter=None)
        .shuffle(1000 if train else 0)
        .decode("pil")
        .to_tuple("ppm;jpg;jpeg;png", "cls")
        .map_tuple(_blog_transform(size, train), lambda x: x)
        .batched(batch, partial=True)
    )
    return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)


def _ours_loader(
    dataset: str,
    split: str,
    size: int,
    batch: int,
    workers: int,
    policy: AugmentPolicy = "none",
    random_erasing: float = 0.0,
) -> Iterable[Any]:
    from tpustream.loader.shard_loader import LoaderConfig, ShardLoader

    loader = ShardLoader(
        LoaderConfig(
            data=dataset,
            split=cast(SplitName, split),  # LoaderConfig checks the name
            batch_size=batch,
            input_size=size,
            workers=workers,
            num_replicas=1,
            replica_index=0,
            augment_policy=policy,
            random_erasing=random_erasing,
        )
    )

    def forever() -> Iterator[Any]:
        epoch = 0
        while True:
            yield from loader.epoch(epoch)
            epoch += 1

    return forever()


def _kernel_alone(
    dataset: str, manifest: dict[str, Any], split: str, size: int, batch: int
) -> Callable[[], Iterable[Any]]:
    """Our decode + crop + render of in-memory samples in this process: no reading, shuffling or IPC."""
    import random

    import torch

    from tpustream.image.transforms import Augment, default_min_crop_scale, prepare_image, render_batch

    samples: list[tuple[bytes, str]] = []
    for shard in manifest["splits"][split]["shards"]:  # whole shards, until there are 4 batches
        samples += [(data, ext) for _, data, ext, _ in _shard_samples(dataset, shard)]
        if len(samples) >= 4 * batch:
            break
    augment = Augment(output_size=size, train=split == "train", min_crop_scale=default_min_crop_scale(size))

    def batches() -> Iterator[Any]:
        rng = random.Random(0)
        out = torch.empty((batch, 3, size, size), dtype=torch.uint8)
        while True:
            for start in range(0, len(samples) - batch + 1, batch):
                items = [
                    prepare_image(data, ext, augment, rng) for data, ext in samples[start : start + batch]
                ]
                render_batch(items, size, out)
                yield (out,)

    return batches


def _one_thread(make: Callable[[], Iterable[Any]]) -> Callable[[], Iterable[Any]]:
    """``make``'s batches with torch on one thread, as in a loader worker: a ceiling per core, not per
    machine (torch's intra-op threads would also contend with every other process on a shared host)."""

    def batches() -> Iterator[Any]:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield from make()
        finally:
            torch.set_num_threads(threads)

    return batches


def _kernel_process(args: tuple[Any, ...], seconds: float, barrier: Any, results: Any) -> None:
    make = _one_thread(_kernel_alone(*args))  # samples read before the barrier: all start measuring at once
    barrier.wait(timeout=600)
    results.put(_measure(make, seconds))


def _kernel_in_processes(args: tuple[Any, ...], processes: int, seconds: float) -> list[float]:
    """The kernel's samples/s in each of ``processes`` spawned processes measuring at the same time."""
    import multiprocessing
    import queue

    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes), context.Queue()
    children = [
        context.Process(target=_kernel_process, args=(args, seconds, barrier, results), daemon=True)
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    rates: list[float] = []
    try:
        while len(rates) < processes:
            try:
                rates.append(results.get(timeout=1))
            except queue.Empty:
                failed = [child.exitcode for child in children if child.exitcode not in (None, 0)]
                if failed:  # one that died before the barrier leaves the others waiting there
                    raise RuntimeError(f"a kernel measuring process exited with code {failed[0]}") from None
        return rates
    finally:
        for child in children:
            child.join(timeout=30 if len(rates) == processes else 0)
            if child.is_alive():
                child.terminate()


def _measure(
    make: Callable[[], Iterable[Any]], seconds: float, finish: Callable[[], Any] | None = None
) -> float:
    """Samples/s over ``seconds`` after the first batch (worker start-up and first fill excluded);
    ``finish`` (waiting for the device's outstanding transfers) runs inside the timed span."""
    iterator = iter(make())
    first = next(iterator)
    del first
    samples, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        try:
            batch = next(iterator)
        except StopIteration:
            iterator = iter(make())
            continue
        images = batch["image"] if isinstance(batch, dict) else batch[0]
        samples += int(images.shape[0])
    if finish is not None:
        finish()
    elapsed = time.perf_counter() - started
    del iterator
    return samples / elapsed


# ---------------------------------------------------------------- the feed ceiling

FEED_SIZES = (224, 32)  # ImageNet's and CIFAR's input sides, whatever the data's own
# Images/s a v5e host (ct5lp-hightpu-4t: 4 chips, 112 vCPUs) must be fed at 224 px to keep its chips busy
# at ResNet-50 speed: the estimate (~2,500 img/s per chip), not a measurement.
V5E_HOST_NEED_IMG_S = 10_000
# Batches the hand-off loader's manifest claims per epoch (samples never read): more than a run takes at 32 px
# (~0.15 ms a batch, 2 cores), few enough for the loader's per-epoch worker order (a list of every batch).
_LONG_EPOCH_BATCHES = 500_000


class _ReadyBatches(EpochStream):
    """ShardLoader's worker body with the work taken out: no reading, decoding or rendering. Each batch is
    the worker's next ring slot, which already holds a rendered batch (written once by the main process),
    handed out as ShardLoader's workers hand out theirs: the slot claimed in turn (``_SlotRing.claim``, which
    waits for the main process to free it) and its index, fresh label and mask arrays and a stats delta
    pickled to the main process through the DataLoader's queue."""

    def _run(self, plan: Any, skip_batches: int) -> Iterator[WorkerBatch]:
        assert self.ring is not None and self._worker is not None, "hand-off needs worker processes"
        batch = self.split.config.batch_size
        stats = WorkerStats()
        for _ in range(plan.num_batches - skip_batches):
            slot = self.ring.claim(self._worker, self._written, self.generation)
            self._written += 1
            stats.samples += batch
            label, mask = np.zeros(batch, np.int64), np.ones(batch, np.bool_)
            yield WorkerBatch(label=label, mask=mask, _stats=stats.take(), _slot=(self._worker, slot))


def _ready_batch(dataset: str, manifest: dict[str, Any], split: str, size: int, batch: int) -> Any:
    """One uint8 [batch, 3, size, size] batch of the split's first images, decoded and cropped once at
    ``size`` (the images cycled when the split has fewer than ``batch``)."""
    import random

    import torch

    from tpustream.image.transforms import Augment, default_min_crop_scale, prepare_image, render_batch

    augment = Augment(output_size=size, train=split == "train", min_crop_scale=default_min_crop_scale(size))
    rng = random.Random(0)
    items = []
    for _, data, ext, _ in _split_samples(dataset, manifest, split):
        items.append(prepare_image(data, ext, augment, rng))
        if len(items) == batch:
            break
    out = torch.empty((batch, 3, size, size), dtype=torch.uint8)
    render_batch([items[i % len(items)] for i in range(batch)], size, out)
    return out


def _handoff_batches(
    dataset: str, manifest: dict[str, Any], split: str, size: int, batch: int, workers: int, ready: Any
) -> Iterator[Batch]:
    """A real ShardLoader's batches (``epoch()``: its main-process loop, slot ring and persistent DataLoader
    workers) whose workers run ``_ReadyBatches``: every ring slot holds ``ready``. Its manifest claims
    ``_LONG_EPOCH_BATCHES`` batches (never read), so no epoch boundary falls in a measurement."""
    import copy
    import weakref

    from tpustream.loader import shard_loader as loader_module

    long = copy.deepcopy(manifest)
    shards = long["splits"][split]["shards"]
    for shard in shards:
        shard["num_samples"] = -(-_LONG_EPOCH_BATCHES * batch // len(shards))
    loader = loader_module.ShardLoader(
        loader_module.LoaderConfig(
            data=dataset,
            split=cast(SplitName, split),  # LoaderConfig checks the name
            batch_size=batch,
            input_size=size,
            workers=workers,
            num_replicas=1,
            replica_index=0,
        ),
        manifest=Manifest.from_json(long),
    )
    # The pool ShardLoader.epoch() would start, with the ready-batch worker body (data.py's own lines).
    ring = loader._slot_ring()
    ring.images[:] = ready  # every worker's every slot, before the workers start
    _, plans, skip = loader._split.layout(0, 0)
    stream = _ReadyBatches(loader._split, 0, plans, skip, ring, 0, persistent=True)
    loader._pool = loader_module._data_loader(stream, loader.config, persistent=True)
    loader._close_pool = weakref.finalize(loader, loader_module._shut_down, loader._pool)
    epoch = 0
    try:
        while True:
            yield from loader.epoch(epoch)
            epoch += 1
    finally:
        loader.close()


def _device_rate(host_batches: Iterator[Any], rt: Any, seconds: float) -> float:
    """Samples/s of ``host_batches`` through tpustream's ``device_loader`` (torch_xla MpDeviceLoader), device
    work waited for at the end; the loader's threads are stopped and ``host_batches`` closed after."""
    import torch_xla.core.xla_model as xm

    from tpustream.xla_runtime import device_loader

    loader: Any = device_loader(host_batches, rt)  # MpDeviceLoader: closed by hand below
    try:
        return _measure(lambda: loader, seconds, finish=xm.wait_device_ops)
    finally:
        if loader._parallel_loader is not None:
            loader._parallel_loader.close()
        close = getattr(host_batches, "close", None)
        if close is not None:
            close()


def _xla_feed_process(
    args: tuple[Any, ...], workers: int, seconds: float, repeats: int, results: Any
) -> None:
    """In a spawned process (torch_xla initialised here only): per size in FEED_SIZES, the median samples/s
    of ``device-transfer-ceiling`` and ``feed-ceiling`` over ``repeats`` interleaved runs."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    if os.environ["PJRT_DEVICE"] == "CPU":
        os.environ.setdefault("CPU_NUM_DEVICES", "4")  # a v5e host's 4 chips
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import itertools
        import multiprocessing

        # A spawned process inherits "spawn" as its default start method, and ShardLoader's DataLoader
        # dataset (a class local to data.py's _data_loader) cannot be pickled: fork, as in `tpustream train`.
        multiprocessing.set_start_method("fork", force=True)

        import torch
        import torch_xla.runtime as xr

        from tpustream.xla_runtime import runtime

        dataset, manifest, split, batch = args
        rt = runtime("spmd")
        rates: dict[tuple[str, int], list[float]] = {}
        ready = {size: _ready_batch(dataset, manifest, split, size, batch) for size in FEED_SIZES}
        for _ in range(repeats):
            for size in FEED_SIZES:
                one = {
                    "image": ready[size],
                    "label": torch.zeros(batch, dtype=torch.int64),
                    "mask": torch.ones(batch, dtype=torch.bool),
                }
                rates.setdefault(("device-transfer-ceiling", size), []).append(
                    _device_rate(itertools.repeat(one), rt, seconds)
                )
                handoff = _handoff_batches(dataset, manifest, split, size, batch, workers, ready[size])
                rates.setdefault(("feed-ceiling", size), []).append(_device_rate(handoff, rt, seconds))
        medians = {key: statistics.median(values) for key, values in rates.items()}
        results.put(("ok", {"device": str(xr.device_type()), "devices": rt.local_devices, "rates": medians}))
    except BaseException as exc:  # the parent reports it as a skipped line
        results.put(("error", f"{type(exc).__name__}: {exc}"))


def _xla_feed(args: tuple[Any, ...], workers: int, seconds: float, repeats: int) -> dict[str, Any]:
    """``_xla_feed_process``'s result, or ``{"error": why}``."""
    import multiprocessing
    import queue

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_xla_feed_process, args=(args, workers, seconds, repeats, results))
    child.start()
    deadline = time.monotonic() + 600 + 4 * repeats * len(FEED_SIZES) * (seconds + 30)
    try:
        while True:
            try:
                status, value = results.get(timeout=1)
                break
            except queue.Empty:
                if child.exitcode is not None:
                    return {"error": f"the torch_xla measuring process exited with code {child.exitcode}"}
                if time.monotonic() > deadline:
                    return {"error": "the torch_xla measuring process did not finish"}
        return value if status == "ok" else {"error": value}
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.terminate()


def _feed_lines(
    base: dict[str, Any], batch: int, workers: int, handoff: dict[int, float], xla: dict[str, Any] | None
) -> Iterator[dict[str, Any]]:
    """The feed-ceiling lines: per size, the hand-off, the device transfer and both together."""

    def line(pipeline: str, size: int, rate: float, note: str, **extra: Any) -> dict[str, Any]:
        loader_workers = 0 if pipeline == "device-transfer-ceiling" else workers  # that one has no loader
        out = {
            **base,
            "input_size": size,
            "pipeline": pipeline,
            "workers": loader_workers,
            "main_processes": 1,
            "host_cores": os.cpu_count(),
            "samples_per_s": round(rate),
            "ms_per_batch": round(1000 * batch / rate, 3),
            **extra,
        }
        if size == 224:
            out["v5e_host_need_img_s"] = V5E_HOST_NEED_IMG_S
            out["headroom"] = round(rate / V5E_HOST_NEED_IMG_S, 2)
        return {**out, "ceiling": True, "note": note}

    handoff_note = (
        f"one main process taking ready batches from {workers} ShardLoader worker process(es) through the "
        "loader's own path (DataLoader worker queue; shared-memory slot ring: the main process copies each "
        "batch's images out of its slot; label/mask wrapped, stats counted); the workers read, decode and "
        "render nothing (every slot holds one batch rendered once), so this is the main process's hand-off "
        "cost alone; no device transfer, no epoch boundary, start-up and first batch excluded"
    )
    for size in FEED_SIZES:
        yield line("handoff-ceiling", size, handoff[size], handoff_note)
    if xla is None:
        return
    if "error" in xla:
        for pipeline in ("device-transfer-ceiling", "feed-ceiling"):
            yield {"bench": "load", "pipeline": pipeline, "skipped": xla["error"]}
        return
    where = f"{xla['devices']} XLA {xla['device']} device(s)"
    cpu = (
        "; on XLA CPU the transfer is a host memory copy into XLA's buffers, not a PCIe DMA to a chip"
        if xla["device"] == "CPU"
        else ""
    )
    notes = {
        "device-transfer-ceiling": (
            "one host batch (uint8 image, int64 label, bool mask) sent again and again through tpustream's "
            f"device_loader (torch_xla MpDeviceLoader, SPMD: the batch sharded over {where}), no loader: "
            f"the host->device transfer alone, device work waited for{cpu}"
        ),
        "feed-ceiling": (
            f"handoff-ceiling's ready batches through device_loader to {where} in the same process, as the "
            "trainer feeds them: what one main process and the transfer sustain together; no model step, "
            f"no decode{cpu}"
        ),
    }
    for pipeline in ("device-transfer-ceiling", "feed-ceiling"):
        for size in FEED_SIZES:
            rate = xla["rates"][(pipeline, size)]
            yield line(pipeline, size, rate, notes[pipeline], device=xla["device"], devices=xla["devices"])


def _shard_samples(dataset: str, shard: dict[str, Any]) -> Iterator[tuple[str, bytes, str, int]]:
    """One shard's samples as stored: (key, image bytes, image extension, class index)."""
    from tpustream.dataset.tario import iter_tar_samples
    from tpustream.image.codec import image_member

    with storage.open_read(storage.join(dataset, shard["path"])) as stream:
        for key, fields in iter_tar_samples(stream):
            ext = image_member(fields) or ""
            yield key, fields[ext], ext, int(fields["cls"])


def _split_samples(
    dataset: str, manifest: dict[str, Any], split: str
) -> Iterator[tuple[str, bytes, str, int]]:
    """The split's samples as stored in its shards: (key, image bytes, image extension, class index)."""
    for shard in manifest["splits"][split]["shards"]:
        yield from _shard_samples(dataset, shard)


def input_size_for(dataset: str, manifest: dict[str, Any], split: str, requested: int | None = None) -> int:
    """The output side the bench measures at: ``requested``, else the trainer's default for the dataset."""
    from tpustream.dataset.input_size import default_input_size

    if not manifest["splits"].get(split, {}).get("num_samples"):
        raise ConfigError(f"{dataset} has no {split} samples to measure")
    return requested or default_input_size(dataset, Manifest.from_json(manifest))[0]


def _export_image_folder(dataset: str, manifest: dict[str, Any], split: str, root: str) -> int:
    """Write the split's samples as one file per image (class folders) for pipeline (A)."""
    count = 0
    for key, data, ext, cls in _split_samples(dataset, manifest, split):
        label = manifest["classes"][cls]
        os.makedirs(os.path.join(root, label), exist_ok=True)
        with open(os.path.join(root, label, f"{key}.{ext}"), "wb") as f:
            f.write(data)
        count += 1
    return count


def _resolve_dataset(data: str, workdir: str) -> str:
    """A dataset URI as given, or a SOURCE spec sharded into ``workdir`` first."""
    from tpustream.dataset import write as shards
    from tpustream.dataset.manifest import ShardError, read_manifest
    from tpustream.dataset.plan import ShardConfig

    try:
        read_manifest(data)
        return data
    except (ShardError, storage.StorageError):
        pass
    output = os.path.join(workdir, "dataset")
    config = ShardConfig(source=data, output=output, num_shards=16, workers=max(1, os.cpu_count() or 1))
    shards.create_shards(config, progress=False)
    return output


def _gcs_copy(dataset: str, manifest: dict[str, Any]) -> tuple[Any, str] | None:
    """Start a loopback GCS-API server and upload the dataset; None if the server is not installed."""
    try:
        from tpustream.bench.emulator import GcsServer, make_bucket
    except ImportError:
        return None
    try:
        server = GcsServer()
    except (FileNotFoundError, RuntimeError):
        return None
    make_bucket(server.url, "bench")
    os.environ["STORAGE_EMULATOR_HOST"] = server.url
    target = "gs://bench/dataset"
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            storage.copy(storage.join(dataset, shard["path"]), storage.join(target, shard["path"]))
    storage.copy(storage.join(dataset, "manifest.json"), storage.join(target, "manifest.json"))
    return server, target


# ``--augment``'s cases: (policy, RandomErasing's probability); "none" is every case's baseline. Erasing at
# probability 1: the most it can cost (the recipes erase at 0.1 to 0.25).
AUGMENT_CASES: dict[str, tuple[AugmentPolicy, float]] = {
    "none": ("none", 0.0),
    "trivial": ("trivial", 0.0),
    "randaugment": ("randaugment", 0.0),
    "random-erasing": ("none", 1.0),
}


@lru_cache(maxsize=8)
def _per_image_transform(policy: AugmentPolicy, random_erasing: float) -> Any:
    """The v2 transform of one uint8 CHW image the loader called per image before issue 46 batched it."""
    from torchvision.transforms import v2

    from tpustream.image.policy import ERASING_FILL

    steps: list[Any] = []
    if policy == "trivial":
        steps.append(v2.TrivialAugmentWide())
    elif policy == "randaugment":
        steps.append(v2.RandAugment())
    if random_erasing > 0:
        steps.append(v2.RandomErasing(p=random_erasing, value=list(ERASING_FILL)))
    return v2.Compose(steps)


def _per_image_policy(images: Any, policy: AugmentPolicy, random_erasing: float, seed: int) -> None:
    """The loader's policy before issue 46: torchvision's v2 transform called on each image in turn (the
    same distributions as ``apply_batch_policy``), kept here as the baseline of the policy-kernel lines."""
    import torch

    transform = _per_image_transform(policy, random_erasing)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for index in range(images.shape[0]):
            images[index] = transform(images[index])


# The policy kernel alone, on one rendered batch in this process: the per-image v2 calls against the batched path.
POLICY_PATHS = ("per-image-v2", "batched")


def _policy_kernel(ready: Any, policy: AugmentPolicy, random_erasing: float, path: str) -> Callable[[], Any]:
    from tpustream.image.policy import apply_batch_policy

    apply = _per_image_policy if path == "per-image-v2" else apply_batch_policy

    def batches() -> Iterator[Any]:
        seed = 0
        while True:
            images = ready.clone()
            apply(images, policy, random_erasing, seed)
            seed += 1
            yield (images,)

    return batches


def bench_augment(
    *,
    data: str,
    batch_size: int,
    workers: int | Sequence[int],
    seconds: float,
    repeats: int,
    input_size: int | None,
    cases: Sequence[str],
) -> Iterator[str]:
    """One JSON line per augmentation case (``AUGMENT_CASES``) and worker count: our train loader's samples/s
    with the case's policy in its workers, and its ratio to the same loader without one (median of
    ``repeats`` interleaved runs); then per case but none, the policy alone on one rendered batch in this
    process on one thread (``policy-kernel``): torchvision's v2 transform per image (the loader's path before
    issue 46) against the batched path the loader runs (``tpustream.image.policy``), side by side."""
    from tpustream.dataset.manifest import read_manifest

    unknown = [case for case in cases if case not in AUGMENT_CASES]
    if unknown:
        raise ConfigError(
            f"--augment: unknown case(s) {', '.join(unknown)}: choose from {', '.join(AUGMENT_CASES)}"
        )
    names = ["none", *(case for case in dict.fromkeys(cases) if case != "none")]
    worker_counts = [workers] if isinstance(workers, int) else list(workers)
    workdir = tempfile.mkdtemp(prefix="tpustream-bench-augment-")
    try:
        dataset = _resolve_dataset(data, workdir)
        manifest = read_manifest(dataset)
        size = input_size_for(dataset, manifest, "train", input_size)
        for count in worker_counts:
            rates: dict[str, list[float]] = {name: [] for name in names}
            for _ in range(repeats):
                for name in names:
                    policy, erasing = AUGMENT_CASES[name]
                    make = partial(_ours_loader, dataset, "train", size, batch_size, count, policy, erasing)
                    rates[name].append(_measure(make, seconds))
            medians = {name: statistics.median(values) for name, values in rates.items()}
            for name in names:
                yield _augment_line(
                    manifest,
                    size,
                    batch_size,
                    repeats,
                    seconds,
                    "tpustream",
                    name,
                    workers=count,
                    samples_per_s=round(medians[name]),
                    ratio_vs_none=round(medians[name] / medians["none"], 2),
                )
        yield from _policy_kernel_lines(dataset, manifest, size, batch_size, seconds, repeats, names[1:])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _augment_line(
    manifest: dict[str, Any],
    size: int,
    batch_size: int,
    repeats: int,
    seconds: float,
    pipeline: str,
    name: str,
    **measured: Any,
) -> str:
    """One ``bench_augment`` JSON line: the run's and the case's fields, then what ``measured`` adds."""
    policy, erasing = AUGMENT_CASES[name]
    return json.dumps(
        {
            "bench": "load",
            "data": manifest["source"],
            "split": "train",
            "input_size": size,
            "batch_size": batch_size,
            "repeats": repeats,
            "seconds_per_run": seconds,
            "pipeline": pipeline,
            "augment": name,
            "policy": policy,
            "random_erasing": erasing,
            **measured,
        }
    )


def _policy_kernel_lines(
    dataset: str,
    manifest: dict[str, Any],
    size: int,
    batch_size: int,
    seconds: float,
    repeats: int,
    names: Sequence[str],
) -> Iterator[str]:
    """``bench_augment``'s policy-kernel lines: each case's two paths, interleaved, one thread."""
    ready = _ready_batch(dataset, manifest, "train", size, batch_size)
    for name in names:
        policy, erasing = AUGMENT_CASES[name]
        rates: dict[str, list[float]] = {path: [] for path in POLICY_PATHS}
        for _ in range(repeats):
            for path in POLICY_PATHS:
                rates[path].append(
                    _measure(_one_thread(_policy_kernel(ready, policy, erasing, path)), seconds)
                )
        medians = {path: statistics.median(values) for path, values in rates.items()}
        for path in POLICY_PATHS:
            yield _augment_line(
                manifest,
                size,
                batch_size,
                repeats,
                seconds,
                "policy-kernel",
                name,
                path=path,
                threads=1,
                samples_per_s=round(medians[path]),
                ratio_vs_per_image_v2=round(medians[path] / medians["per-image-v2"], 2),
            )


def bench_load(
    *,
    data: str,
    split: str,
    batch_size: int,
    workers: int | Sequence[int],
    seconds: float,
    repeats: int,
    input_size: int | None,
) -> Iterator[str]:
    """Yield one JSON line per pipeline and worker count (median of ``repeats`` interleaved runs)."""
    from tpustream.bench import peers as bench_peers
    from tpustream.dataset.manifest import read_manifest

    worker_counts = [workers] if isinstance(workers, int) else list(workers)
    workdir = tempfile.mkdtemp(prefix="tpustream-bench-load-")
    server = None
    try:
        dataset = _resolve_dataset(data, workdir)
        manifest = read_manifest(dataset)  # the JSON form: this benchmark's helpers index it and edit copies
        size = input_size_for(dataset, manifest, split, input_size)
        train = split == "train"
        per_file_root = os.path.join(workdir, "per-file")
        _export_image_folder(dataset, manifest, split, per_file_root)
        urls = [storage.join(dataset, s["path"]) for s in manifest["splits"][split]["shards"]]
        peer_copies = bench_peers.write_peer_formats(
            os.path.join(workdir, "peers"), partial(_split_samples, dataset, manifest, split)
        )
        gcs = _gcs_copy(dataset, manifest)
        if gcs is not None:
            server, gcs_dataset = gcs
        base = {
            "bench": "load",
            "data": manifest["source"],
            "split": split,
            "input_size": size,
            "batch_size": batch_size,
            "repeats": repeats,
            "seconds_per_run": seconds,
        }
        # The ceilings need no worker processes: measured once, interleaved with the first worker count.
        ceilings: dict[str, Callable[[], Iterable[Any]]] = {
            "kernel-alone": _one_thread(_kernel_alone(dataset, manifest, split, size, batch_size)),
            "tpustream-workers0": _one_thread(lambda: _ours_loader(dataset, split, size, batch_size, 0)),
        }
        ceiling_rates: dict[str, float] = {}
        # The feed ceilings: measured once, with the most workers asked for (at least one: the hand-off is
        # from worker processes), the hand-off interleaved with the first worker count's pipelines.
        feed_workers = max(1, *worker_counts)
        handoff: dict[str, Callable[[], Iterable[Any]]] = {
            f"handoff-{size}": partial(
                _handoff_batches,
                dataset,
                manifest,
                split,
                size,
                batch_size,
                feed_workers,
                _ready_batch(dataset, manifest, split, size, batch_size),
            )
            for size in FEED_SIZES
        }
        handoff_rates: dict[int, float] = {}
        for count in worker_counts:
            pipelines: dict[str, Callable[[], Iterable[Any]]] = {
                "tpustream": partial(_ours_loader, dataset, split, size, batch_size, count),
                "A-per-file-imagefolder": partial(
                    _per_file_loader, per_file_root, size, batch_size, count, train
                ),
                "B-blog-webdataset": partial(_blog_loader, urls, size, batch_size, count, train),
                **bench_peers.peer_pipelines(urls, size, batch_size, count, train, peer_copies),
            }
            if gcs is not None:
                pipelines["tpustream-gcs"] = partial(
                    _ours_loader, gcs_dataset, split, size, batch_size, count
                )
            if not ceiling_rates:
                pipelines.update(ceilings)
                pipelines.update(handoff)
            cores = max(1, min(count, os.cpu_count() or 1))
            parallel = f"kernel-in-{cores}-processes"
            rates: dict[str, list[float]] = {name: [] for name in [*pipelines, parallel]}
            for _ in range(repeats):
                for name, make in pipelines.items():
                    rates[name].append(_measure(make, seconds))
                rates[parallel].append(
                    sum(_kernel_in_processes((dataset, manifest, split, size, batch_size), cores, seconds))
                )
            medians = {name: statistics.median(values) for name, values in rates.items()}
            for name in ceilings:
                ceiling_rates.setdefault(name, medians.pop(name, 0.0))
            first = count == worker_counts[0]
            if first:
                handoff_rates = {size: medians.pop(f"handoff-{size}") for size in FEED_SIZES}
            parallel_rate = medians.pop(parallel)
            ours = medians["tpustream"]
            for name, rate in medians.items():
                result = {
                    **base,
                    "pipeline": name,
                    "workers": count,
                    "cores": cores,
                    "samples_per_s": round(rate),
                    "samples_per_s_per_core": round(rate / cores),
                    "ratio_vs_tpustream": round(rate / ours, 2),
                    "ratio_vs_B": round(rate / medians["B-blog-webdataset"], 2),
                    "ratio_vs_A": round(rate / medians["A-per-file-imagefolder"], 2),
                }
                if name == "tpustream":
                    kernel = ceiling_rates["kernel-alone"]
                    result["fraction_of_kernel_x_cores"] = round(rate / (kernel * cores), 2)
                    result["fraction_of_kernel_in_processes"] = round(rate / parallel_rate, 2)
                    result["fraction_of_workers0_x_cores"] = round(
                        rate / (ceiling_rates["tpustream-workers0"] * cores), 2
                    )
                if name == "tpustream-gcs":
                    result["ratio_vs_tpustream_local"] = round(rate / ours, 2)
                yield json.dumps(result)
            yield json.dumps(
                {
                    **base,
                    "pipeline": parallel,
                    "workers": count,
                    "cores": cores,
                    "samples_per_s": round(parallel_rate),
                    "ratio_vs_tpustream": round(parallel_rate / ours, 2),
                    "ratio_vs_kernel_x_cores": round(
                        parallel_rate / (ceiling_rates["kernel-alone"] * cores), 2
                    ),
                    "ceiling": True,
                    "note": f"the kernel in {cores} process(es) at once, summed",
                }
            )
            if first:
                for name, rate in ceiling_rates.items():
                    yield json.dumps(
                        {
                            **base,
                            "pipeline": name,
                            "workers": 0,
                            "cores": 1,
                            "samples_per_s": round(rate),
                            "ratio_vs_tpustream": round(rate / ours, 2),
                            "ceiling": True,
                            "note": "one process: x cores is the most workers could reach",
                        }
                    )
                xla = None
                if importlib.util.find_spec("torch_xla") is not None:
                    xla = _xla_feed((dataset, manifest, split, batch_size), feed_workers, seconds, repeats)
                for line in _feed_lines(base, batch_size, feed_workers, handoff_rates, xla):
                    yield json.dumps(line)
                if xla is None:
                    for pipeline in ("device-transfer-ceiling", "feed-ceiling"):
                        yield json.dumps(
                            {"bench": "load", "pipeline": pipeline, "skipped": "torch_xla not installed"}
                        )
        if gcs is None:
            yield json.dumps(
                {"bench": "load", "pipeline": "tpustream-gcs", "skipped": "fake-gcs-server not installed"}
            )
        for line in bench_peers.skipped_lines():
            yield json.dumps(line)
    finally:
        if server is not None:
            server.close()
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        shutil.rmtree(workdir, ignore_errors=True)
