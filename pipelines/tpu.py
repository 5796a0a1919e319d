"""The TPU types the pipeline can train on, as Vertex AI custom training documents them.

One table; ``pipeline compile --help`` and the README list it. Sources:
- "Use Cloud TPU for custom training": https://cloud.google.com/vertex-ai/docs/training/training-with-tpu-vm
  (v2/v3: ``machineType: cloud-tpu`` with ``acceleratorType`` TPU_V2|TPU_V3 and ``acceleratorCount: 8``;
  v5e ``ct5lp-hightpu-{1t,4t,8t}`` and v6e ``ct6e-standard-{1t,4t,8t}`` with ``tpuTopology``, where a
  topology larger than one VM is a multi-host slice of ``ct*-4t`` VMs).
- "Configure compute resources for custom training":
  https://cloud.google.com/vertex-ai/docs/training/configure-compute#tpu
- google-cloud-aiplatform ``utils/worker_spec_utils.py``: ``tpu_topology`` "is required for the TPU v5
  versions" and is "only passed to the chief replica as TPU jobs only allow 1 replica": a slice is ONE
  worker pool with ``replica_count: 1``, however many hosts it has. ``aiplatform_v1`` has accelerator
  enums for v2/v3/v4/v5e but none for v6e: the newer types are named by machine type and topology alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, TypedDict

from tpustream.errors import ConfigError

__all__ = [
    "MachineSpec",
    "ContainerSpec",
    "DiskSpec",
    "WorkerPoolSpec",
    "TpuSpec",
    "TPU_TYPES",
    "tpu_spec",
    "worker_pool_spec",
    "tpu_table_text",
    "CAPACITY",
    "Capacity",
    "CapacityKind",
    "capacity_kind",
    "duration",
    "FRESH_JOB_LAUNCHER",
    "fresh_job_command",
    "PIPELINE_WORKERS",
    "train_hosts",
]


class _Machine(TypedDict):
    machine_type: str


class MachineSpec(_Machine, total=False):
    """A worker pool's ``machine_spec`` as the YAML carries it to Vertex (aiplatform v1 field names)."""

    accelerator_type: str  # v2/v3
    accelerator_count: int
    tpu_topology: str  # v5e, v6e


class ContainerSpec(TypedDict, total=False):
    """A worker pool's ``container_spec``: GCPC builds it for the train component (image, command, args)."""

    image_uri: str
    command: list[str]
    args: list[str]


class DiskSpec(TypedDict):
    boot_disk_type: str
    boot_disk_size_gb: int


class WorkerPoolSpec(TypedDict):
    """One worker pool of the TPU CustomJob (aiplatform v1 ``WorkerPoolSpec``), the train task's input."""

    machine_spec: MachineSpec
    replica_count: int
    container_spec: ContainerSpec
    disk_spec: DiskSpec


@dataclass(frozen=True)
class TpuSpec:
    """One Vertex AI TPU configuration: ``hosts`` TPU VMs of ``machine_type`` in one worker pool."""

    machine_type: str
    chips_per_host: int
    topology: str | None = None  # tpu_topology (v5e, v6e): required by Vertex for these machine types
    accelerator_type: str | None = None  # v2/v3 only (acceleratorType + acceleratorCount)
    accelerator_count: int = 0

    @property
    def chips(self) -> int:
        if self.topology is None:
            return self.chips_per_host
        return math.prod(int(n) for n in self.topology.split("x"))

    @property
    def hosts(self) -> int:
        return self.chips // self.chips_per_host

    def machine_spec(self) -> MachineSpec:
        """The ``MachineSpec`` of the worker pool (aiplatform v1 field names)."""
        spec: MachineSpec = {"machine_type": self.machine_type}
        if self.accelerator_type:
            spec["accelerator_type"] = self.accelerator_type
            spec["accelerator_count"] = self.accelerator_count
        if self.topology:
            spec["tpu_topology"] = self.topology
        return spec


def _single(machine: str, chips: int, topology: str) -> TpuSpec:
    return TpuSpec(machine, chips, topology)


def _slice(machine: str, topology: str) -> TpuSpec:
    return TpuSpec(machine, 4, topology)  # multi-host slices are made of 4-chip VMs


TPU_TYPES: dict[str, TpuSpec] = {
    "v2-8": TpuSpec("cloud-tpu", 4, accelerator_type="TPU_V2", accelerator_count=8),  # 8 cores, 1 host
    "v3-8": TpuSpec("cloud-tpu", 4, accelerator_type="TPU_V3", accelerator_count=8),
    "v5e-1": _single("ct5lp-hightpu-1t", 1, "1x1"),
    "v5e-4": _single("ct5lp-hightpu-4t", 4, "2x2"),
    "v5e-8": _single("ct5lp-hightpu-8t", 8, "2x4"),
    "v5e-16": _slice("ct5lp-hightpu-4t", "4x4"),
    "v5e-32": _slice("ct5lp-hightpu-4t", "4x8"),
    "v5e-64": _slice("ct5lp-hightpu-4t", "8x8"),
    "v5e-128": _slice("ct5lp-hightpu-4t", "8x16"),
    "v5e-256": _slice("ct5lp-hightpu-4t", "16x16"),
    "v6e-1": _single("ct6e-standard-1t", 1, "1x1"),
    "v6e-4": _single("ct6e-standard-4t", 4, "2x2"),
    "v6e-8": _single("ct6e-standard-8t", 8, "2x4"),
    "v6e-16": _slice("ct6e-standard-4t", "4x4"),
    "v6e-32": _slice("ct6e-standard-4t", "4x8"),
    "v6e-64": _slice("ct6e-standard-4t", "8x8"),
    "v6e-128": _slice("ct6e-standard-4t", "8x16"),
    "v6e-256": _slice("ct6e-standard-4t", "16x16"),
}


def tpu_spec(name: str) -> TpuSpec:
    if name not in TPU_TYPES:
        raise ConfigError(f"unknown TPU type {name!r}: choose one of {', '.join(TPU_TYPES)}")
    return TPU_TYPES[name]


# The pipeline's default loader workers per host (its `workers` parameter).
PIPELINE_WORKERS = 8


def train_hosts(tpu: str | None) -> int:
    """The hosts of the train job (1 for the CPU image): compiled into the shard steps, which give each loader
    worker of every host a train shard when ``num_shards`` is 0, auto (hosts x the run's ``workers``: 32 for
    v5e-16 at the default 8; capped by the dataset's train samples; dataset/fanout.py)."""
    return tpu_spec(tpu).hosts if tpu else 1


def worker_pool_spec(spec: TpuSpec, container_spec: ContainerSpec) -> WorkerPoolSpec:
    """The one worker pool of a TPU job: ``replica_count`` 1 whatever the number of hosts (a slice is one
    replica); Vertex runs ``container_spec`` on every host of it."""
    return {
        "machine_spec": spec.machine_spec(),
        "replica_count": 1,
        "container_spec": container_spec,
        "disk_spec": {"boot_disk_type": "pd-ssd", "boot_disk_size_gb": 100},
    }


def tpu_table_text() -> str:
    """One line per TPU type, for ``--help`` and the README."""
    lines = []
    for name, spec in TPU_TYPES.items():
        accel = f" {spec.accelerator_type}x{spec.accelerator_count}" if spec.accelerator_type else ""
        topo = f" topology {spec.topology}" if spec.topology else ""
        hosts = f"{spec.hosts} hosts" if spec.hosts > 1 else "1 host"
        lines.append(f"{name}: {spec.machine_type}{accel}{topo}, {hosts}")
    return "; ".join(lines)


# Capacity: how Vertex provisions the job (CustomJobSpec.scheduling.strategy, aiplatform v1 Scheduling.Strategy).
# What Vertex AI custom training accepts for TPUs, as Google documents it (re-check on upgrade):
# - "Use Spot VMs with training" (https://cloud.google.com/vertex-ai/docs/training/use-spot-vms), Limitations:
#   "Using Spot VMs with TPU Pods isn't supported": Spot on a single TPU VM only, never a multi-host slice.
# - "Schedule training jobs based on resource availability" (Dynamic Workload Scheduler, FLEX_START;
#   https://cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws), Requirements: GPUs (L4, A100, H100,
#   H200, B200) only. tpustream trains on TPUs, so flex-start is refused whatever the type.
CapacityKind = Literal["on-demand", "spot", "flex-start"]
CAPACITY: dict[CapacityKind, str] = {"on-demand": "STANDARD", "spot": "SPOT", "flex-start": "FLEX_START"}
SPOT_DOC = "https://cloud.google.com/vertex-ai/docs/training/use-spot-vms"
FLEX_START_DOC = "https://cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str, flag: str) -> str:
    """``90m``, ``2h``, ``1d`` or ``3600s`` -> a protobuf Duration string (``"5400s"``)."""
    value = text.strip().lower()
    if value[-1:] in _UNITS and value[:-1].isdigit() and int(value[:-1]) > 0:
        return f"{int(value[:-1]) * _UNITS[value[-1]]}s"
    raise ConfigError(f"{flag} {text!r}: give a duration such as 90m, 2h, 1d or 3600s")


def capacity_kind(text: str) -> CapacityKind:
    """``--capacity``'s value as a CapacityKind, or a ConfigError naming the choices."""
    for kind in CAPACITY:
        if text == kind:
            return kind
    raise ConfigError(f"--capacity {text!r}: choose one of {', '.join(CAPACITY)}")


@dataclass(frozen=True, kw_only=True)
class Capacity:
    """Which capacity the TPU job runs on, and how long it may run."""

    kind: CapacityKind = "on-demand"
    """TPU capacity: on-demand; spot (single-host TPU types only: Vertex does not offer Spot VMs for TPU Pods;
    discounted, can be preempted at any time: the step resumes from `last`). flex-start is refused: Vertex's
    Dynamic Workload Scheduler is for GPUs only."""
    timeout: str = "1d"
    """Stop the TPU job after this long (e.g. 36h, 3d): by default a hung job stops costing TPU time after a
    day; raise it for long runs."""

    def __post_init__(self) -> None:
        capacity_kind(self.kind)  # a kind from outside the type checker's sight (a config file, a test)
        duration(self.timeout, "--timeout")

    def check_tpu(self, tpu: str) -> None:
        """Refuse a capacity Vertex AI does not offer for ``tpu`` (the rules above), naming the rule and doc."""
        spec = tpu_spec(tpu)
        if self.kind == "flex-start":
            raise ConfigError(
                "--capacity flex-start: Vertex AI's Dynamic Workload Scheduler for custom training requires "
                f"GPUs (L4, A100, H100, H200, B200), not TPUs ({FLEX_START_DOC}, Requirements): use on-demand"
                + (", or spot on a single-host TPU type" if spec.hosts == 1 else "")
            )
        if self.kind == "spot" and spec.hosts > 1:
            raise ConfigError(
                f"--capacity spot: {tpu} is a multi-host slice ({spec.hosts} hosts), and Vertex AI does not "
                f"support Spot VMs with TPU Pods ({SPOT_DOC}, Limitations): use on-demand, or spot on a "
                "single-host type (v5e-8, v6e-8, ...)"
            )

    @property
    def strategy(self) -> str:
        return CAPACITY[self.kind]

    @property
    def scheduling(self) -> dict[str, str]:
        """GCPC custom-job inputs: strategy and timeout."""
        return {"strategy": self.strategy, "timeout": duration(self.timeout, "--timeout")}


# The train task's launcher, run by Vertex in GCPC's image: GCPC's CustomJob launcher, after one check.
# GCPC's launcher continues polling any job its gcp_resources output already names (remote_runner.py:
# "if the launcher container experienced unexpected termination, such as preemption"), so a KFP retry of
# a task whose job FAILED would re-poll that job and fail again, every retry. A job that ended without
# success is forgotten here, so the retry creates a new CustomJob, which resumes from `last`; a job still
# running or succeeded is polled as before (no second slice for one task).
FRESH_JOB_LAUNCHER = """\
import logging, sys
from google_cloud_pipeline_components.container.v1.custom_job import launcher, remote_runner
from google_cloud_pipeline_components.container.v1.gcp_launcher import job_remote_runner
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
runner = job_remote_runner.JobRemoteRunner("CustomJob", value("--project"), value("--location"), value("--gcp_resources"))
name = runner.check_if_job_exists()
if name:
    state = remote_runner.get_custom_job_with_client(runner.job_client, name).state
    if state.name in ("JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"):
        logging.warning("%s ended %s: this attempt creates a new CustomJob, which resumes from `last`", name, state.name)
        open(value("--gcp_resources"), "w").close()
launcher.main(args)
"""


def fresh_job_command() -> list[str]:
    """The train task's container command: FRESH_JOB_LAUNCHER (GCPC's launcher keeps its own arguments)."""
    return ["python3", "-u", "-c", FRESH_JOB_LAUNCHER]
