"""How fast the pipeline's evaluate step runs a model over a val split on CPU, and what that means for a
50,000-image val set evaluated twice (candidate and champion) on a Vertex CPU machine.

    .venv/bin/python tools/measure_eval.py                 # resnet50 at 224 px on XLA CPU (PJRT_DEVICE=CPU)
    .venv/bin/python tools/measure_eval.py --device cpu    # plain torch: the CPU image's path (no PJRT_DEVICE)

Builds a small dataset with ``tpustream shards create --source synthetic-imagenet:N`` (500x375 JPEGs, so
decoding and resizing are measured too), a randomly initialised model artifact (model.pt + model.json, as
`tpustream train` writes them; the weights do not change the cost), then runs ``tpustream.train.evaluate`` as the
evaluate step does: one untimed pass first (imports, page cache, and on XLA the graph compile, reported as
``first_pass_s``), then ``tpustream.train.evaluate.evaluate`` timed over the val split. Prints one JSON line.

Two rates per core: ``img_s_per_core_wall`` divides the timed pass's img/s by the CPUs this process may
use (torch's and XLA's thread pools size to them), which on a shared machine counts the other tenants' time
against us; ``img_s_per_core`` divides the images by the CPU seconds the pass consumed (this process and its
loader workers, from getrusage), which does not. The estimate scales ``img_s_per_core`` linearly to
``--vcpus`` (default 4: e2-standard-4, Vertex's default machine for a pipeline step) for 50,000 images x 2
models; a vCPU there is a hyperthread, as on most cloud machines. ``loadavg_1m`` (before, after) says how
shared the machine was; there, ``OMP_NUM_THREADS=1`` keeps torch's threads from spinning (and counting CPU
time) while another tenant holds the other cores.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

VAL_FRACTION = 0.8  # most of the few images go to val: that is the split evaluate reads


def build_dataset(root: str, images: int) -> str:
    data = os.path.join(root, "data")
    if not os.path.exists(os.path.join(data, "manifest.json")):
        source = f"synthetic-imagenet:{math.ceil(images / VAL_FRACTION)}"
        subprocess.run(
            [sys.executable, "-m", "tpustream.cli", "shards", "create", "--source", source, "--output", data,
             "--val-fraction", str(VAL_FRACTION), "--num-shards", "1"],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    return data


def build_model_artifact(root: str, arch: str, classes: list[str], input_size: int) -> str:
    """model.pt (random init: nothing is downloaded) and the model.json fields evaluate reads."""
    import torch

    from tpustream.models import build_model

    output = os.path.join(root, f"model-{arch}-{input_size}")
    os.makedirs(output, exist_ok=True)
    model = build_model(arch, num_classes=len(classes), input_size=input_size)
    torch.save(model.state_dict(), os.path.join(output, "model.pt"))
    card = {"format": "tpustream.model/v1", "arch": arch, "num_classes": len(classes), "classes": classes,
            "input_size": input_size, "in_channels": 3}  # fmt: skip
    with open(os.path.join(output, "model.json"), "w") as f:
        json.dump(card, f)
    return output


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its reaped children (the loader workers)."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=256, help="val images to evaluate (about)")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--input-size", type=int, default=224)
    parser.add_argument(
        "--device", choices=("xla", "cpu"), default="xla",
        help="xla: XLA CPU (PJRT_DEVICE=CPU); cpu: plain torch, as the CPU image runs it",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, default=2, help="loader workers (the evaluate step's default)")
    parser.add_argument("--vcpus", type=int, default=4, help="vCPUs of the machine estimated for")
    parser.add_argument("--val-images", type=int, default=50_000, help="val set size estimated for")
    parser.add_argument("--keep", help="keep the dataset and model here (reused when present)")
    args = parser.parse_args()

    if args.device == "xla":
        os.environ.update(PJRT_DEVICE="CPU", CPU_NUM_DEVICES="1", TF_CPP_MIN_LOG_LEVEL="2")
    else:
        os.environ.pop("PJRT_DEVICE", None)  # tpustream.xla_runtime.single_device: plain torch CPU
    import torch

    from tpustream.dataset.manifest import read_manifest
    from tpustream.train import evaluate

    root = args.keep or tempfile.mkdtemp(prefix="tpustream-measure-eval-")
    data = build_dataset(root, args.images)
    classes = list(read_manifest(data)["classes"])
    model = build_model_artifact(root, args.model, classes, args.input_size)

    started = time.perf_counter()
    evaluate.evaluate_model(model, data, workers=args.workers)  # untimed: imports, page cache, XLA compile
    first_pass = time.perf_counter() - started
    gc.collect()  # the first pass's loader workers shut down (and are reaped) before the CPU clock starts
    load_before = os.getloadavg()[0]
    cpu_before = _cpu_seconds()
    started = time.perf_counter()
    result = evaluate.evaluate(model, data, os.path.join(root, "eval"), workers=args.workers)
    wall = time.perf_counter() - started
    gc.collect()  # this pass's loader workers exit and are reaped: their CPU time is counted
    cpu = _cpu_seconds() - cpu_before
    load_after = os.getloadavg()[0]
    candidate = result["candidate"]
    samples = int(candidate["num_samples"])
    img_s = samples / wall
    cores = len(os.sched_getaffinity(0))
    per_core = samples / cpu
    minutes = 2 * args.val_images / (per_core * args.vcpus) / 60
    print(json.dumps({
        "tool": "measure_eval", "model": args.model, "input_size": args.input_size,
        "device": "xla-cpu" if args.device == "xla" else "torch-cpu", "images": samples,
        "batch_size": 64, "workers": args.workers, "cores": cores, "torch_threads": torch.get_num_threads(),
        "first_pass_s": round(first_pass, 1), "timed_s": round(wall, 1), "loop_s": candidate["seconds"],
        "cpu_s": round(cpu, 1), "img_s": round(img_s, 2), "img_s_per_core_wall": round(img_s / cores, 2),
        "img_s_per_core": round(per_core, 2),
        f"estimate_min_{args.val_images}x2_on_{args.vcpus}_vcpu": round(minutes, 1),
        "loadavg_1m": [round(load_before, 2), round(load_after, 2)],
    }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
