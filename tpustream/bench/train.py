"""``tpustream bench train``: training steps/s with synthetic on-device input vs the real loader.

Both runs use the trainer's own ``train_step`` on the same runtime (SPMD over every device); the
synthetic run feeds one batch that already lives on the device, so its rate is the chips' ceiling,
and ``data_wait_fraction = 1 - loader_rate / synthetic_rate`` is what the host's input costs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["bench_train"]


def _timed_steps(
    model: Any, optimizer: Any, batches: Iterator[Any], steps: int, config: Any, rt: Any
) -> float:
    """Seconds for ``steps`` steps after two warm-up steps (the first step, and the first with momentum
    buffers, are different graphs: both compile outside the timed region), device work included."""
    from tpustream.train.step import train_step

    for _ in range(2):
        loss = train_step(model, optimizer, next(batches), 0.01, config, rt)
    loss.cpu()
    started = time.perf_counter()
    for _ in range(steps):
        loss = train_step(model, optimizer, next(batches), 0.01, config, rt)
    loss.cpu()  # waits for the last step to finish
    return time.perf_counter() - started


def bench_train(
    *, data: str, model_name: str, steps: int, batch_size: int, workers: int, bf16: bool
) -> Iterator[str]:
    import itertools

    import torch

    from tpustream.dataset.manifest import load_manifest
    from tpustream.loader.shard_loader import LoaderConfig, ShardLoader
    from tpustream.models import build_model, model_spec
    from tpustream.train.config import TrainConfig
    from tpustream.train.run_inputs import resolve_input_size
    from tpustream.xla_runtime import device_loader, runtime

    config = TrainConfig(
        data=data, output="-", model=model_name, batch_size=batch_size, bf16=bf16, workers=workers
    )
    manifest = load_manifest(data)
    rt = runtime("spmd")
    input_size, _ = resolve_input_size(config, data, manifest)
    host_batch = rt.host_batch(batch_size)
    global_batch = batch_size * rt.num_devices
    loader = ShardLoader(
        LoaderConfig(
            data=data,
            split="train",
            batch_size=host_batch,
            input_size=input_size,
            workers=workers,
            num_replicas=rt.num_replicas,
            replica_index=rt.replica_index,
        ),
        manifest=manifest,
    )

    def fresh_model() -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = build_model(model_name, num_classes=len(manifest.classes), input_size=input_size).to(
            rt.device
        )
        spec = model_spec(model_name)
        weight_decay = spec.weight_decay if config.weight_decay is None else config.weight_decay
        optimizer = spec.optimizer(model, lr=0.01, momentum=config.momentum, weight_decay=weight_decay)
        return model, optimizer

    def real_batches() -> Iterator[Any]:
        epoch = 0
        while True:
            yield from device_loader(loader.epoch(epoch), rt)
            epoch += 1

    first = next(iter(device_loader(itertools.islice(loader.epoch(0), 1), rt)))
    synthetic = itertools.repeat(first)  # one batch already on the device: no host input at all
    rates = {}
    for name, batches in (("synthetic-on-device", synthetic), ("tpustream-loader", real_batches())):
        model, optimizer = fresh_model()
        seconds = _timed_steps(model, optimizer, batches, steps, config, rt)
        rates[name] = steps / seconds
    for name, steps_per_s in rates.items():
        yield json.dumps(
            {
                "bench": "train",
                "input": name,
                "model": model_name,
                "input_size": input_size,
                "devices": rt.num_devices,
                "per_device_batch": batch_size,
                "global_batch": global_batch,
                "steps": steps,
                "bf16": bf16,
                "steps_per_s": round(steps_per_s, 3),
                "samples_per_s": round(steps_per_s * global_batch, 1),
                "samples_per_s_per_device": round(steps_per_s * global_batch / rt.num_devices, 1),
                "data_wait_fraction": round(max(0.0, 1 - steps_per_s / rates["synthetic-on-device"]), 3),
            }
        )
