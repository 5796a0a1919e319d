"""Where a training process sits in an XLA job, and how its batches reach the devices.

Two strategies: ``spmd`` (one process per host; a 1-D ``data`` mesh over all devices, batches sharded on
their first axis) and ``replicas`` (one process per device, gradients all-reduced).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

__all__ = [
    "Strategy",
    "Runtime",
    "runtime",
    "device_loader",
    "emulated_slice",
    "is_primary_host",
    "process_layout",
    "seed_rngs",
    "single_device",
    "EMULATE_SLICE_ENV",
]

# Test-only: XLA on CPU cannot span processes (multi-process collectives crash, pytorch/xla #5005,
# #9089), so a multi-host slice is emulated in control flow: N processes, each told it is host k of N
# through the variables a TPU VM host reads when it skips the metadata server (TPU_WORKER_ID,
# TPU_WORKER_HOSTNAMES: torch_xla/_internal/tpu.py). On a real TPU slice, torch_xla's PJRT runtime
# supplies process_index/process_count and this switch is never set.
EMULATE_SLICE_ENV = "TPUSTREAM_EMULATE_SLICE"

Strategy = Literal["spmd", "replicas"]  # TrainConfig.strategy: one process per host, or one per device
BatchT = TypeVar("BatchT")


@dataclass
class Runtime:
    """Where this process sits: device, mesh, how many devices and which data slice it loads."""

    device: Any
    strategy: Strategy
    num_devices: int  # all devices of the job
    local_devices: int
    replica_index: int  # data slice this process loads
    num_replicas: int
    is_master: bool
    mesh: Any = None
    emulated: bool = False  # a host of an emulated slice (EMULATE_SLICE_ENV): no cross-host arrays

    def host_batch(self, per_device: int) -> int:
        return per_device * (self.local_devices if self.strategy == "spmd" else 1)


def emulated_slice() -> tuple[int, int] | None:
    """``(host index, host count)`` of an emulated slice on XLA CPU, else None (see EMULATE_SLICE_ENV)."""
    if os.environ.get(EMULATE_SLICE_ENV) != "1":
        return None
    if os.environ.get("PJRT_DEVICE", "CPU") != "CPU":
        raise RuntimeError(f"{EMULATE_SLICE_ENV}=1 is a test switch for XLA CPU only; unset it on a TPU")
    hosts = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    index = int(os.environ.get("TPU_WORKER_ID", "0"))
    if not hosts or not 0 <= index < len(hosts):
        raise RuntimeError(
            f"{EMULATE_SLICE_ENV}=1 needs TPU_WORKER_HOSTNAMES (comma-separated) and TPU_WORKER_ID in range"
        )
    return index, len(hosts)


def is_primary_host() -> bool:
    """Whether this process is process 0 of the job: the one that writes checkpoints and outputs."""
    emulated = emulated_slice()
    if emulated is not None:
        return emulated[0] == 0
    import torch_xla.runtime as xr

    return xr.process_index() == 0


def process_layout() -> tuple[int, int]:
    """``(process index, process count)`` of this process in the job without building a Runtime: the
    emulated slice's host, torch_xla's PJRT runtime when one is configured, else ``(0, 1)``."""
    emulated = emulated_slice()
    if emulated is not None:
        return emulated
    if os.environ.get("PJRT_DEVICE"):
        try:
            import torch_xla.runtime as xr

            return int(xr.process_index()), int(xr.process_count())
        except Exception:  # torch_xla absent or not initialised: a single process
            pass
    return 0, 1


def single_device() -> Any:
    """One device for a single-process job (evaluation): XLA when a PJRT device is configured (TPU, or
    CPU in tests), plain CPU otherwise."""
    if os.environ.get("PJRT_DEVICE"):
        try:
            import torch_xla

            return torch_xla.device()
        except ImportError:
            pass
    import torch

    return torch.device("cpu")


def seed_rngs(seed: int, device: Any) -> None:
    """Seed torch's CPU generator (the weights' initialisation, the host's draws) and the XLA device's, which
    torch_xla keeps apart from it and starts at 101 in every process whatever torch was seeded with (its
    ``xm.get_rng_state()``): without it dropout and stochastic depth, drawn on the device, took the same masks at
    every ``--seed``. A resumed run sets both back from its checkpoint afterwards."""
    import torch
    import torch_xla.core.xla_model as xm

    torch.manual_seed(seed)
    xm.set_rng_state(seed, str(device))


def runtime(strategy: Strategy) -> Runtime:
    """This process's place in the job: ``spmd`` (one process per host, a 1-D data mesh over every
    device) or ``replicas`` (one process per device)."""
    import numpy as np
    import torch_xla
    import torch_xla.runtime as xr

    if strategy == "spmd":
        import torch_xla.distributed.spmd as xs

        xr.use_spmd()
        num_devices = xr.global_runtime_device_count()
        mesh = xs.Mesh(np.arange(num_devices), (num_devices,), ("data",))
        emulated = emulated_slice()
        if emulated is not None:  # host k of N in control flow only: a mesh over this host's devices
            index, hosts = emulated
            return Runtime(
                device=torch_xla.device(),
                strategy=strategy,
                num_devices=num_devices * hosts,
                local_devices=num_devices,
                replica_index=index,
                num_replicas=hosts,
                is_master=index == 0,
                mesh=mesh,
                emulated=True,
            )
        return Runtime(
            device=torch_xla.device(),
            strategy=strategy,
            num_devices=num_devices,
            local_devices=xr.addressable_runtime_device_count(),
            replica_index=xr.process_index(),
            num_replicas=xr.process_count(),
            is_master=xr.process_index() == 0,
            mesh=mesh,
        )
    return Runtime(
        device=torch_xla.device(),
        strategy=strategy,
        num_devices=xr.world_size(),
        local_devices=1,
        replica_index=xr.global_ordinal(),
        num_replicas=xr.world_size(),
        is_master=xr.global_ordinal() == 0,
    )


def device_loader(batches: Iterable[BatchT], rt: Runtime) -> Iterable[BatchT]:
    """Move host batches onto the device(s) ahead of use; under SPMD, shard them along the batch axis."""
    import torch_xla.distributed.parallel_loader as pl

    if rt.strategy != "spmd":
        loader: Iterable[BatchT] = pl.MpDeviceLoader(batches, rt.device)  # the same keys, on the device
        return loader
    import torch_xla.distributed.spmd as xs

    minibatch = rt.num_replicas > 1 and not rt.emulated  # each host's slice of one global batch
    spec = {
        "image": xs.ShardingSpec(rt.mesh, ("data", None, None, None), minibatch=minibatch),
        "label": xs.ShardingSpec(rt.mesh, ("data",), minibatch=minibatch),
        "mask": xs.ShardingSpec(rt.mesh, ("data",), minibatch=minibatch),
    }
    sharded: Iterable[BatchT] = pl.MpDeviceLoader(batches, rt.device, input_sharding=spec)
    return sharded
