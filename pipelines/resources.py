"""The CPU steps' CPU and memory limits (``StepResources``), which pipelines/training.py sets on each step.

Every CPU step carries explicit CPU and memory limits, from which Vertex AI Pipelines picks the step's machine
("Specify the machine configuration for a pipeline step"; without them every step runs on e2-standard-4).
They are compile-time constants, not pipeline parameters: kfp 2.17 would compile a parameter into
``resourceCpuLimit: '{{$.inputs.parameters[...]}}'`` alone, without the numeric ``cpuLimit`` that Vertex
documents, and Vertex resolving that placeholder is undocumented (kubeflow/pipelines#6681, kfp 1.8 on Vertex:
it did not; closed as stale). A constant is compiled into both fields.

No kfp here: ``tpustream pipeline compile``'s options are derived from ``StepResources`` (tpustream/cli/
pipeline.py), and ``--help`` imports no kfp.
"""

import re
from dataclasses import dataclass

from tpustream.errors import ConfigError

__all__ = [
    "cpu_count",
    "memory_gb",
    "StepResources",
    "CPU_STEPS",
    "TUNE_STEPS",
    "VERTEX_MAX_CPU",
    "VERTEX_MAX_MEMORY_GB",
]

# What Vertex AI Pipelines accepts for a step ("Specify the machine configuration for a pipeline step"):
# CPU "a number ... or a number followed by m" (1/1000), at most 96; memory "a number, or a number followed by
# K, M or G", at most 624 GB. Vertex "automatically selects the closest match from the supported machine
# types" for the limits given; without them a step runs on e2-standard-4 (4 vCPU, 16 GB).
VERTEX_MAX_CPU = 96
VERTEX_MAX_MEMORY_GB = 624
_CPU = re.compile(r"^(\d+(\.\d+)?|\d+m)$")
_MEMORY = re.compile(r"^(\d+)([KMG]?)$")
_MEMORY_GB = {"": 1e-9, "K": 1e-6, "M": 1e-3, "G": 1.0}  # kfp's _memory_to_float: decimal units

# The pipeline's CPU steps (the compiled YAML's task names): every one gets explicit limits. The train task
# is not one of them: on Vertex it is GCPC's launcher, which only creates and polls the TPU CustomJob.
CPU_STEPS = (
    "check-source",
    "plan-shards",
    "write-shards",
    "finalize-shards",
    "check-data",
    "resolve-weights",
    "evaluate-model",
    "validate-serving",
    "promote-model",
    "deploy-model",
    "join-experiment",
    "notify-webhook",
)
# The tune switch's CPU steps (pipelines/training.py): sized as the other CPU steps, apart from CPU_STEPS so that
# the plain DAG is checked against CPU_STEPS alone.
TUNE_STEPS = ("tune-model", "plan-tuning", "pick-trial")


def cpu_count(cpu: str) -> float:
    """CPUs of a limit string (``"16"``, ``"0.5"``, ``"500m"``)."""
    return int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)


def memory_gb(memory: str) -> float:
    """GB (decimal, as kfp compiles ``memoryLimit``) of a limit string (``"64G"``, ``"512M"``)."""
    number, unit = _MEMORY.match(memory).groups()  # type: ignore[union-attr]
    return int(number) * _MEMORY_GB[unit]


@dataclass(frozen=True, kw_only=True)
class StepResources:
    """CPU and memory limits of the CPU steps, fixed at compile time (the module doc says why).

    ``cpu``/``memory``: every CPU step but evaluate (check source, plan, write, finalize, check data,
    promote), e2-standard-4's size by default: each shard writer is one process, and the fan-out
    (``shards_per_task``) is what scales writing. ``eval_cpu``/``eval_memory``: evaluate, which runs the
    model over the whole val split twice (candidate, champion) on torch CPU. tools/measure_eval.py measured
    3 to 4 img/s per vCPU for resnet50 at 224 px, decoding included: 50,000 val images x 2 take about 1.75
    to 2.4 h on e2-standard-4, so evaluate defaults to 16 vCPU / 64 GB (e2-standard-16's size, so that
    Vertex's closest match is that type), about 26 to 35 min if it scales linearly (README, "Evaluation
    and promotion"). Each default is a machine type's exact size.
    """

    cpu: str = "4"
    """CPU limit of every CPU step but evaluate (check source, plan, write, finalize, check data, promote):
    CPUs (4) or millicores (500m), at most 96. Vertex picks each step's machine from its CPU and memory
    limits."""
    memory: str = "16G"
    """Memory limit of those steps: a size in K, M or G (16G), at most 624G."""
    eval_cpu: str = "16"
    """CPU limit of the evaluate step, which runs the candidate and the champion over the whole val split on
    CPU (README, Evaluation and promotion, has the img/s per core to size it by)."""
    eval_memory: str = "64G"
    """Memory limit of the evaluate step (64G)."""

    def __post_init__(self) -> None:
        for flag, cpu in (("--step-cpu", self.cpu), ("--eval-cpu", self.eval_cpu)):
            if not _CPU.match(cpu) or not 0 < cpu_count(cpu) <= VERTEX_MAX_CPU:
                raise ConfigError(
                    f"{flag} {cpu!r}: give a number of CPUs (4, 0.5) or millicores (500m), more than 0 and "
                    f"at most {VERTEX_MAX_CPU}, the most Vertex AI Pipelines gives a step"
                )
        for flag, memory in (("--step-memory", self.memory), ("--eval-memory", self.eval_memory)):
            if not _MEMORY.match(memory) or not 0 < memory_gb(memory) <= VERTEX_MAX_MEMORY_GB:
                raise ConfigError(
                    f"{flag} {memory!r}: give a size such as 16G or 512M (K, M, G: the units Vertex AI "
                    f"Pipelines documents), more than 0 and at most {VERTEX_MAX_MEMORY_GB}G, the most it gives "
                    "a step"
                )

    def limits(self, step: str) -> tuple[str, str]:
        """(cpu, memory) of the compiled step ``step`` (a CPU_STEPS name)."""
        if step not in CPU_STEPS + TUNE_STEPS:
            raise ConfigError(
                f"{step!r} is not a CPU step of the pipeline ({', '.join(CPU_STEPS + TUNE_STEPS)})"
            )
        return (self.eval_cpu, self.eval_memory) if step == "evaluate-model" else (self.cpu, self.memory)
