"""``tpustream bench load``: input pipelines side by side on the same data, cores and output shape.

(A) per-file: the same samples as one file per image, torchvision ImageFolder + DataLoader;
(B) the blog's pipeline: stock webdataset .shuffle().decode("pil").to_tuple().map_tuple(torchvision
    transforms incl. ToTensor + Normalize).batched(B, partial=True) + DataLoader;
(ours) tpustream.data from local disk; (ours-gcs) tpustream.data from a GCS-API server on loopback.
Every pipeline runs ``repeats`` times, interleaved; each run counts samples for ``seconds`` after its
first batch (worker start-up excluded); the median is reported with ratios to (B) and (A).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tpustream import storage

__all__ = ["bench_load"]


def _blog_transform(size: int, train: bool) -> Any:
    from torchvision import transforms as T

    normalize = T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    if train:
        scale = (0.08, 1.0) if size >= 128 else (0.35, 1.0)
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


def _ours_loader(dataset: str, split: str, size: int, batch: int, workers: int) -> Iterable[Any]:
    from tpustream.data import LoaderConfig, ShardLoader

    loader = ShardLoader(
        LoaderConfig(data=dataset, split=split, batch_size=batch, input_size=size, workers=workers,
                     num_replicas=1, replica_index=0)
    )  # fmt: skip

    def forever() -> Iterator[Any]:
        epoch = 0
        while True:
            yield from loader.epoch(epoch)
            epoch += 1

    return forever()


def _measure(make: Callable[[], Iterable[Any]], seconds: float) -> float:
    """Samples/s over ``seconds`` after the first batch (worker start-up and first fill excluded)."""
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
    elapsed = time.perf_counter() - started
    del iterator
    return samples / elapsed


def _export_image_folder(dataset: str, manifest: dict[str, Any], split: str, root: str) -> int:
    """Write the split's samples as one file per image (class folders) for pipeline (A)."""
    from tpustream.data import IMAGE_EXTS
    from tpustream.tario import iter_tar_samples

    count = 0
    for shard in manifest["splits"][split]["shards"]:
        with storage.open_read(storage.join(dataset, shard["path"])) as stream:
            for key, fields in iter_tar_samples(stream):  # type: ignore[arg-type]
                ext = next(e for e in IMAGE_EXTS if e in fields)
                label = manifest["classes"][int(fields["cls"])]
                os.makedirs(os.path.join(root, label), exist_ok=True)
                with open(os.path.join(root, label, f"{key}.{ext}"), "wb") as f:
                    f.write(fields[ext])
                count += 1
    return count


def _resolve_dataset(data: str, workdir: str) -> str:
    """A dataset URI as given, or a SOURCE spec sharded into ``workdir`` first."""
    from tpustream import shards
    from tpustream.manifest import ShardError, read_manifest
    from tpustream.shard_plan import ShardConfig

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
        from tpustream.emulator import GcsServer, make_bucket
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


def bench_load(
    *,
    data: str,
    split: str,
    batch_size: int,
    workers: int,
    seconds: float,
    repeats: int,
    input_size: int | None,
) -> Iterator[str]:
    """Yield one JSON line per pipeline (median of ``repeats`` interleaved runs)."""
    from tpustream.data import first_image_side
    from tpustream.manifest import read_manifest

    workdir = tempfile.mkdtemp(prefix="tpustream-bench-load-")
    server = None
    try:
        dataset = _resolve_dataset(data, workdir)
        manifest = read_manifest(dataset)
        side = first_image_side(dataset, manifest, split)
        size = input_size or (224 if side >= 128 else side)
        train = split == "train"
        per_file_root = os.path.join(workdir, "per-file")
        _export_image_folder(dataset, manifest, split, per_file_root)
        urls = [storage.join(dataset, s["path"]) for s in manifest["splits"][split]["shards"]]
        pipelines: dict[str, Callable[[], Iterable[Any]]] = {
            "A-per-file-imagefolder": lambda: _per_file_loader(
                per_file_root, size, batch_size, workers, train
            ),
            "B-blog-webdataset": lambda: _blog_loader(urls, size, batch_size, workers, train),
            "tpustream": lambda: _ours_loader(dataset, split, size, batch_size, workers),
        }
        gcs = _gcs_copy(dataset, manifest)
        if gcs is not None:
            server, gcs_dataset = gcs
            pipelines["tpustream-gcs"] = lambda: _ours_loader(gcs_dataset, split, size, batch_size, workers)
        rates: dict[str, list[float]] = {name: [] for name in pipelines}
        for _ in range(repeats):
            for name, make in pipelines.items():
                rates[name].append(_measure(make, seconds))
        cores = max(1, min(workers, os.cpu_count() or 1))
        medians = {name: statistics.median(values) for name, values in rates.items()}
        for name, rate in medians.items():
            result = {
                "bench": "load",
                "data": manifest["source"],
                "split": split,
                "pipeline": name,
                "input_size": size,
                "batch_size": batch_size,
                "workers": workers,
                "cores": cores,
                "repeats": repeats,
                "seconds_per_run": seconds,
                "samples_per_s": round(rate),
                "samples_per_s_per_core": round(rate / cores),
                "ratio_vs_B": round(rate / medians["B-blog-webdataset"], 2),
                "ratio_vs_A": round(rate / medians["A-per-file-imagefolder"], 2),
            }
            if name == "tpustream-gcs":
                result["ratio_vs_tpustream_local"] = round(rate / medians["tpustream"], 2)
            yield json.dumps(result)
        if gcs is None:
            yield json.dumps(
                {"bench": "load", "pipeline": "tpustream-gcs", "skipped": "fake-gcs-server not installed"}
            )
    finally:
        if server is not None:
            server.close()
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        shutil.rmtree(workdir, ignore_errors=True)
