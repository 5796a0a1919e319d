"""The compiled pipeline YAML (``--template`` of submit, schedule and preflight) and what they ask of it: one
loader (local or gs://), the parameters it declares, the TPU slice and capacity its train job was compiled for,
which parameters its steps read, whether it has Vertex's email step; and the run's parameter values.

The YAML is kfp's IR (``PipelineSpec``) written by another kfp, perhaps a newer one: it is read as the parsed
document and only here, each question one function, so a change of the IR is one place to look.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, TypeAlias, TypedDict, cast

from tpustream.errors import ConfigError
from tpustream.storage import io as storage

from .tpu import TPU_TYPES

__all__ = [
    "CompiledTemplate",
    "JsonValue",
    "Parameter",
    "RunParameters",
    "compiled_slice",
    "compiled_strategy",
    "compiled_tuning",
    "has_email_step",
    "load_template",
    "pipeline_parameters",
    "reads_parameter",
    "template_parameters",
]

# A pipeline parameter's value as Vertex AI takes it (``PipelineJob(parameter_values=...)``): JSON.
JsonValue: TypeAlias = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]
# A run's parameter values by parameter name (typed as the template declares them: ``parse_parameters``).
RunParameters: TypeAlias = dict[str, JsonValue]


@dataclass(frozen=True)
class CompiledTemplate:
    """A compiled pipeline: ``document`` is its parsed YAML (kfp IR), read only through this module's
    functions."""

    document: dict[str, Any]

    def dags(self) -> list[dict[str, Any]]:
        """The root DAG and every sub-DAG (an If, a ParallelFor, an exit handler, a sub-pipeline)."""
        components = self.document.get("components", {})
        return [self.document.get("root", {}).get("dag", {})] + [
            c["dag"] for c in components.values() if "dag" in c
        ]


def largest_cpu_step(template: CompiledTemplate) -> float:
    """The most vCPUs any CPU step of ``template`` asks Vertex for (its executors' numeric ``cpuLimit``, what
    pipelines/resources.py StepResources compiled in); 0 when no step sets one."""
    executors = template.document.get("deploymentSpec", {}).get("executors", {})
    limits = [
        float(executor.get("container", {}).get("resources", {}).get("cpuLimit", 0))
        for executor in executors.values()
    ]
    return max(limits, default=0.0)


@dataclass(frozen=True, kw_only=True)
class Parameter:
    """One input of the compiled pipeline: ``root.inputDefinitions.parameters.<name>`` in its YAML."""

    name: str
    type: str  # kfp IR parameterType: STRING, NUMBER_INTEGER, NUMBER_DOUBLE, BOOLEAN, LIST, STRUCT
    default: JsonValue = None
    optional: bool = False


def load_template(template: str) -> CompiledTemplate | None:
    """The compiled pipeline YAML, local or gs://; None for one only Vertex reads (https://, Artifact
    Registry) or a local file that does not exist (the caller reports that with its own fix)."""
    import yaml

    if template.startswith("https://"):
        return None
    if storage.is_gcs(template):
        text = storage.read_text(template)
    elif os.path.isfile(template):
        with open(template) as f:
            text = f.read()
    else:
        return None
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"--template {template}: not YAML ({' '.join(str(exc).split())[:200]}): give a compiled pipeline"
        ) from None
    if not isinstance(spec, dict) or "root" not in spec:
        raise ConfigError(f"--template {template}: not a compiled KFP pipeline (no root): compile one first")
    return CompiledTemplate(spec)


class ParameterDefinition(TypedDict, total=False):
    """``root.inputDefinitions.parameters.<name>`` of the IR, the fields read here."""

    parameterType: str
    defaultValue: JsonValue
    isOptional: bool


def _parameters_from(definitions: dict[str, ParameterDefinition]) -> dict[str, Parameter]:
    return {
        name: Parameter(
            name=name,
            type=str(spec.get("parameterType", "STRING")),
            default=spec.get("defaultValue"),
            optional=bool(spec.get("isOptional")) or "defaultValue" in spec,
        )
        for name, spec in definitions.items()
    }


def template_parameters(template: CompiledTemplate) -> dict[str, Parameter]:
    """The pipeline's parameters as a compiled template declares them."""
    root = template.document.get("root", {})
    return _parameters_from(
        cast(dict[str, ParameterDefinition], root.get("inputDefinitions", {}).get("parameters", {}))
    )


def pipeline_parameters() -> dict[str, Parameter]:
    """The parameters of the pipeline this package compiles (``--help``: no template needed, no torch)."""
    from google.protobuf import json_format

    from .training import build_pipeline

    inputs = json_format.MessageToDict(build_pipeline(tpu=None).pipeline_spec.root.input_definitions)
    return _parameters_from(cast(dict[str, ParameterDefinition], inputs.get("parameters", {})))


def _find(node: Any, key: str) -> Any:
    """The first value under ``key`` anywhere in a parsed YAML document, or None."""
    if isinstance(node, dict):
        if key in node:
            return node[key]
        node = list(node.values())
    if isinstance(node, list):
        for child in node:
            found = _find(child, key)
            if found is not None:
                return found
    return None


def compiled_slice(template: CompiledTemplate) -> tuple[str | None, int]:
    """The TPU type a compiled pipeline trains on (None: the CPU image) and its number of hosts: the train
    job's pool, or with the tune switch its trials' (``trial_pool``)."""
    pools = _find(template.document, "worker_pool_specs")
    default = pools.get("runtimeValue", {}).get("constant") if isinstance(pools, dict) else pools
    if compiled_tuning(template):
        default = [_find(template.document, "trial_pool").get("runtimeValue", {}).get("constant") or {}]
    machine = (default or [{}])[0].get("machine_spec", {}) if isinstance(default, list) else {}
    for name, tpu in TPU_TYPES.items():
        wanted = dict(tpu.machine_spec())
        if wanted == {k: v for k, v in machine.items() if k in wanted} and machine:
            return name, tpu.hosts
    return None, 1


def compiled_tuning(template: CompiledTemplate) -> bool:
    """Whether the pipeline was compiled with the tune switch on Vertex (trials on the TPU slice)."""
    found = _find(template.document, "trial_pool")
    return isinstance(found, dict) and "runtimeValue" in found


def compiled_strategy(template: CompiledTemplate) -> str:
    """The train job's scheduling strategy compiled into the template (STANDARD, SPOT)."""
    for dag in template.dags():
        for task in dag.get("tasks", {}).values():
            parameters = task.get("inputs", {}).get("parameters", {})
            if "worker_pool_specs" in parameters:
                constant = parameters.get("strategy", {}).get("runtimeValue", {}).get("constant")
                return str(constant or "STANDARD")
    return "STANDARD"


def reads_parameter(template: CompiledTemplate, name: str) -> bool:
    """Whether any task of the compiled pipeline takes the pipeline parameter ``name`` as an input."""
    wanted = {name, f"pipelinechannel--{name}"}
    components = template.document.get("components", {})
    return any(
        source.get("componentInputParameter") in wanted
        for dag in template.dags()
        for task in dag.get("tasks", {}).values()
        # a group (an If, a ParallelFor, an exit handler, a sub-pipeline) only passes parameters on
        if "dag" not in components.get(task.get("componentRef", {}).get("name", ""), {})
        for source in task.get("inputs", {}).get("parameters", {}).values()
    )


def has_email_step(template: CompiledTemplate) -> bool:
    """Whether the pipeline was compiled with Vertex's email notification (``pipeline compile --notify``)."""
    return any(
        name.startswith("comp-vertex-pipelines-notification-email")
        for name in template.document.get("components", {})
    )
