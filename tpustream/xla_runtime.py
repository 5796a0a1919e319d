"""Where a training process sits in an XLA job, and how its batches reach the devices.

Two strategies: ``spmd`` (one process per host; a 1-D ``data`` mesh over all devices, batches sharded on
their first axis) and ``replicas`` (one process per device, gradients all-reduced).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Runtime", "runtime", "device_loader"]


@dataclass
class Runtime:
    """Where this process sits: device, mesh, how many devices and which data slice it loads."""

    device: Any
    strategy: str
    num_devices: int  # all devices of the job
    local_devices: int
    replica_index: int  # data slice this process loads
    num_replicas: int
    is_master: bool
    mesh: Any = None

    def host_batch(self, per_device: int) -> int:
        return per_device * (self.local_devices if self.strategy == "spmd" else 1)


def runtime(strategy: str) -> Runtime:
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
        return Runtime(
            device=torch_xla.device(), strategy=strategy, num_devices=num_devices,
            local_devices=xr.addressable_runtime_device_count(), replica_index=xr.process_index(),
            num_replicas=xr.process_count(), is_master=xr.process_index() == 0, mesh=mesh,
        )  # fmt: skip
    return Runtime(
        device=torch_xla.device(), strategy=strategy, num_devices=xr.world_size(), local_devices=1,
        replica_index=xr.global_ordinal(), num_replicas=xr.world_size(), is_master=xr.global_ordinal() == 0,
    )  # fmt: skip


def device_loader(batches: Any, rt: Runtime) -> Any:
    """Move host batches onto the device(s) ahead of use; under SPMD, shard them along the batch axis."""
    import torch_xla.distributed.parallel_loader as pl

    if rt.strategy != "spmd":
        return pl.MpDeviceLoader(batches, rt.device)
    import torch_xla.distributed.spmd as xs

    spec = {
        "image": xs.ShardingSpec(rt.mesh, ("data", None, None, None), minibatch=rt.num_replicas > 1),
        "label": xs.ShardingSpec(rt.mesh, ("data",), minibatch=rt.num_replicas > 1),
        "mask": xs.ShardingSpec(rt.mesh, ("data",), minibatch=rt.num_replicas > 1),
    }
    return pl.MpDeviceLoader(batches, rt.device, input_sharding=spec)
