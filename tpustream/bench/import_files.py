"""``tpustream bench import``: Vertex AI import files against an ImageFolder, the same images on the same GCS.

Starts the loopback GCS-API server, uploads the same small JPEGs twice (flat, with a JSONL import file;
and in class folders), then times listing each source and ``shards create`` from each with the same
workers, interleaved, and parsing a large JSONL generated locally (no image fetched). One JSON line per
result, medians of ``repeats`` runs; the import-file lines carry ``ratio_vs_image_folder``.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tpustream.storage import io as storage

__all__ = ["bench_import"]

BUCKET = "bench-import"
NUM_CLASSES = 10
ML_USES = ("training", "validation", "test")


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _small_jpeg(index: int, label: int) -> bytes:
    """A distinct 64x64 JPEG (a few KB) whose class sets its colour and grating."""
    from PIL import Image

    from tpustream.sources.builtin import synthetic_cifar_image

    out = io.BytesIO()
    Image.fromarray(synthetic_cifar_image(index, label, size=64)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _upload(images: int, root: str) -> tuple[str, str]:
    """The same images flat under ``root/flat`` (+ ``root/labels/import.jsonl``) and under ``root/folder``."""
    flat, folder = f"{root}/flat", f"{root}/folder"
    rows = []
    jobs: list[tuple[str, bytes]] = []
    for i in range(images):
        label = i % NUM_CLASSES
        data = _small_jpeg(i, label)
        name = f"IMG_{i:06d}.jpg"
        jobs += [(f"{flat}/{name}", data), (f"{folder}/class-{label}/{name}", data)]
        # no ml_use: both sources get the same seeded 0.1 val split from the plan
        rows.append(
            json.dumps(
                {
                    "imageGcsUri": f"{flat}/{name}",
                    "classificationAnnotation": {"displayName": f"class-{label}"},
                }
            )
        )
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda job: storage.write_bytes(*job), jobs))
    import_file = f"{root}/labels/import.jsonl"
    storage.write_bytes(import_file, ("\n".join(rows) + "\n").encode())
    return import_file, folder


def _write_jsonl(path: str, rows: int) -> None:
    """``rows`` Vertex AI single-label rows naming images that are never fetched."""
    with open(path, "w", buffering=1 << 20) as f:
        for i in range(rows):
            row = {
                "imageGcsUri": f"gs://{BUCKET}/raw/IMG_{i:07d}.jpg",
                "classificationAnnotation": {"displayName": f"class-{i % 100}"},
                "dataItemResourceLabels": {"aiplatform.googleapis.com/ml_use": ML_USES[i % 3]},
            }
            f.write(json.dumps(row) + "\n")


def _compare_sources(
    sources: dict[str, str], images: int, repeats: int, workers: int
) -> Iterator[dict[str, Any]]:
    """Listing and ``shards create`` for each source, interleaved repeat by repeat; medians."""
    from tpustream.dataset.plan import ShardConfig
    from tpustream.dataset.write import create_shards
    from tpustream.sources.dispatch import open_source

    listing: dict[str, list[float]] = {name: [] for name in sources}
    creating: dict[str, list[float]] = {name: [] for name in sources}
    counts: dict[str, int] = {}
    for repeat in range(repeats):
        order = list(sources.items())
        for name, spec in (
            order if repeat % 2 == 0 else order[::-1]
        ):  # neither always runs first (warm caches)
            started = time.perf_counter()
            counts[name] = len(open_source(spec).items)
            listing[name].append(time.perf_counter() - started)
            config = ShardConfig(
                source=spec, output=f"gs://{BUCKET}/out/{name}-{repeat}", workers=workers, overwrite=True
            )
            started = time.perf_counter()
            create_shards(config, progress=False)
            creating[name].append(time.perf_counter() - started)
    base = {"bench": "import", "images": images, "repeats": repeats}
    for stage, runs, unit in (("list", listing, "rows_per_s"), ("shards-create", creating, "images_per_s")):
        baseline = counts["image-folder"] / statistics.median(runs["image-folder"])
        for name in sources:
            seconds = statistics.median(runs[name])
            rate = counts[name] / seconds
            yield {
                **base,
                "stage": stage,
                "source": name,
                **({"workers": workers} if stage == "shards-create" else {}),
                "items": counts[name],
                "seconds": round(seconds, 3),
                unit: round(rate),
                "ratio_vs_image_folder": round(rate / baseline, 2),
            }


def bench_import(*, images: int, rows: int, repeats: int, workers: int) -> Iterator[str]:
    """Yield JSON lines: listing and ``shards create`` (import file vs ImageFolder on the GCS server), then
    the parse rate of a ``rows``-row JSONL on local disk (0 rows: skipped)."""
    from tpustream.bench.emulator import GcsServer, make_bucket

    workdir = tempfile.mkdtemp(prefix="tpustream-bench-import-")
    previous = os.environ.get("STORAGE_EMULATOR_HOST")
    try:
        try:
            server = GcsServer()
        except (FileNotFoundError, RuntimeError) as exc:
            yield json.dumps({"bench": "import", "stage": "list", "skipped": f"no GCS test server ({exc})"})
            server = None
        if server is not None:
            try:
                make_bucket(server.url, BUCKET)
                os.environ["STORAGE_EMULATOR_HOST"] = server.url
                import_file, folder = _upload(images, f"gs://{BUCKET}/data")
                sources = {"import-file": import_file, "image-folder": folder}
                for result in _compare_sources(sources, images, repeats, workers):
                    yield json.dumps(result)
            finally:
                server.close()
                if previous is None:
                    os.environ.pop("STORAGE_EMULATOR_HOST", None)
                else:
                    os.environ["STORAGE_EMULATOR_HOST"] = previous
        if rows:
            from tpustream.sources.import_files import import_files_source

            path = os.path.join(workdir, "rows.jsonl")
            _write_jsonl(path, rows)
            seconds = _median_seconds(lambda: import_files_source(path), repeats)
            yield json.dumps(
                {
                    "bench": "import",
                    "stage": "parse",
                    "source": "jsonl-local",
                    "rows": rows,
                    "repeats": repeats,
                    "megabytes": round(os.path.getsize(path) / 1e6, 1),
                    "seconds": round(seconds, 3),
                    "rows_per_s": round(rows / seconds),
                }
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
