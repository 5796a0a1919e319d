"""Preflight: the IAM, region, quota and parameter mistakes a first Vertex AI run hits, found in seconds.

Without it they surface late or never: a typo in ``--param`` only after credentials, on Vertex; a missing
``iam.serviceAccounts.actAs`` as a refused submit; a TPU type the region does not offer, or a TPU quota of 0,
as a train step that waits in JOB_STATE_QUEUED indefinitely (``Scheduling.timeout`` counts running time
only); Model Registry artifacts in a bucket outside the model's region as a failed upload after training.

Each check gives one ``Finding`` (ok, warn or fail, one line with the fix). This module holds the checks that
need no credentials (parameters against the template, the TPU type's region), the tables they use, and the
entry point; ``pipelines/preflight_cloud.py`` the ones that ask Google (IAM, buckets, TPU quota).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpustream.errors import ConfigError
from tpustream.pipelines.preflight_findings import (
    FAIL,
    MODEL_ARTIFACTS_DOC,
    OK,
    TPU_REGIONS,
    WARN,
    Finding,
    PreflightFailed,
    bucket_serves_region,
    check_tpu_region,
    raise_on_failure,
)
from tpustream.storage import io as storage

if TYPE_CHECKING:
    from tpustream.pipelines.preflight_cloud import ApiEndpoints

__all__ = [
    "OK",
    "WARN",
    "FAIL",
    "Finding",
    "Parameter",
    "PreflightFailed",
    "TPU_REGIONS",
    "MODEL_ARTIFACTS_DOC",
    "preflight",
    "check_parameters",
    "check_tpu_region",
    "load_template",
    "template_parameters",
    "pipeline_parameters",
    "parse_parameters",
    "parameters_help",
    "bucket_serves_region",
    "raise_on_failure",
]

# --------------------------------------------------------------------------- parameters (no credentials)


@dataclass(frozen=True, kw_only=True)
class Parameter:
    """One input of the compiled pipeline: ``root.inputDefinitions.parameters.<name>`` in its YAML."""

    name: str
    type: str  # kfp IR parameterType: STRING, NUMBER_INTEGER, NUMBER_DOUBLE, BOOLEAN, LIST, STRUCT
    default: Any = None
    optional: bool = False


_TYPE_WORDS = {
    "STRING": "a string",
    "NUMBER_INTEGER": "an integer",
    "NUMBER_DOUBLE": "a number",
    "BOOLEAN": "true or false",
    "LIST": "a JSON list",
    "STRUCT": "a JSON object",
}


def load_template(template: str) -> dict[str, Any] | None:
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
    return spec


def _parameters_from(definitions: dict[str, Any]) -> dict[str, Parameter]:
    return {
        name: Parameter(
            name=name,
            type=str(spec.get("parameterType", "STRING")),
            default=spec.get("defaultValue"),
            optional=bool(spec.get("isOptional")) or "defaultValue" in spec,
        )
        for name, spec in definitions.items()
    }


def template_parameters(spec: dict[str, Any]) -> dict[str, Parameter]:
    """The pipeline's parameters as a compiled template declares them."""
    return _parameters_from(spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {}))


def pipeline_parameters() -> dict[str, Parameter]:
    """The parameters of the pipeline this package compiles (``--help``: no template needed, no torch)."""
    from google.protobuf import json_format

    from tpustream.pipelines.training import build_pipeline

    inputs = json_format.MessageToDict(build_pipeline(tpu=None).pipeline_spec.root.input_definitions)
    return _parameters_from(inputs.get("parameters", {}))


def _guess(text: str) -> Any:
    """A value whose type the template does not say: JSON when it is JSON (numbers, booleans), else text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _parse(text: str, parameter_type: str) -> Any:
    """``text`` as ``parameter_type``, or ``text`` unchanged when it is not one (check_parameters says so)."""
    if parameter_type == "STRING":
        return text
    if parameter_type == "NUMBER_INTEGER":
        return int(text) if re.fullmatch(r"[+-]?\d+", text.strip()) else text
    if parameter_type == "NUMBER_DOUBLE":
        try:
            return float(text)
        except ValueError:
            return text
    if parameter_type == "BOOLEAN":
        return {"true": True, "false": False}.get(text.strip().lower(), text)
    return _guess(text)


def parse_parameters(declared: dict[str, Parameter] | None, pairs: dict[str, str]) -> dict[str, Any]:
    """``--param`` texts as the values the template's types ask for (``source=123`` stays a string);
    a name the template lacks, or no template, gets a JSON guess."""
    return {
        name: _parse(text, declared[name].type) if declared and name in declared else _guess(text)
        for name, text in pairs.items()
    }


def _type_ok(value: Any, parameter_type: str) -> bool:
    if parameter_type == "STRING":
        return isinstance(value, str)
    if parameter_type == "NUMBER_INTEGER":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if parameter_type == "NUMBER_DOUBLE":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if parameter_type == "BOOLEAN":
        return isinstance(value, bool)
    if parameter_type == "LIST":
        return isinstance(value, list)
    if parameter_type == "STRUCT":
        return isinstance(value, dict)
    return True  # a type this kfp does not know yet: Vertex checks it


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _default(parameter: Parameter) -> Any:
    """The default as the user would type it: KFP stores integer defaults as JSON numbers (0.0)."""
    if parameter.type == "NUMBER_INTEGER" and isinstance(parameter.default, float):
        return int(parameter.default)
    return parameter.default


def check_parameters(declared: dict[str, Parameter] | None, given: dict[str, Any]) -> list[Finding]:
    """Names and types of ``given`` against the template's parameters, with a suggestion for a typo."""
    if declared is None:
        return [
            Finding(
                "parameters",
                WARN,
                "the template is read by Vertex only (https://): names and types of --param are "
                "checked there; give a local or gs:// template to check them now",
            )
        ]
    findings = []
    for name, value in given.items():
        if name not in declared:
            close = difflib.get_close_matches(name, list(declared), n=3, cutoff=0.6)
            fix = (
                f"did you mean {' or '.join(close)}?"
                if close
                else f"the pipeline's parameters: {', '.join(sorted(declared))}"
            )
            findings.append(Finding("parameters", FAIL, f"--param {name}: no such pipeline parameter; {fix}"))
            continue
        parameter = declared[name]
        if not _type_ok(value, parameter.type):
            example = f" (default {json.dumps(_default(parameter))})" if parameter.default is not None else ""
            findings.append(
                Finding(
                    "parameters",
                    FAIL,
                    f"--param {name}={_shown(value)}: {name} takes "
                    f"{_TYPE_WORDS.get(parameter.type, parameter.type)} ({parameter.type}){example}",
                )
            )
    for parameter in declared.values():
        if not parameter.optional and parameter.name not in given:
            findings.append(
                Finding(
                    "parameters",
                    FAIL,
                    f"the pipeline needs --param {parameter.name}=... ({parameter.type}, no default)",
                )
            )
    if not findings:
        findings.append(
            Finding(
                "parameters", OK, f"{len(given)} given, names and types match the template's {len(declared)}"
            )
        )
    return findings


def parameters_help(declared: dict[str, Parameter]) -> str:
    """One line listing the pipeline's parameters (name, type, default), for ``pipeline submit --help``."""

    def describe(p: Parameter) -> str:
        kind = {"NUMBER_INTEGER": "int", "NUMBER_DOUBLE": "float", "BOOLEAN": "bool"}.get(
            p.type, p.type.lower()
        )
        shown = "required" if not p.optional else f"default {json.dumps(_default(p))}"
        return f"{p.name} ({kind}, {shown})"

    ordered = sorted(declared.values(), key=lambda p: (p.optional, p.name))  # the required ones first
    return "Pipeline parameters, set with --param NAME=VALUE: " + "; ".join(describe(p) for p in ordered)


def preflight(
    template: str,
    *,
    project: str,
    region: str,
    pipeline_root: str,
    registry: str | None,
    service_account: str | None,
    parameters: dict[str, Any],
    schedule: bool = False,
    api_endpoints: ApiEndpoints | None = None,
    timeout: float = 10.0,
) -> list[Finding]:
    """Check a run before it is submitted: parameters first (no credentials), then the cloud.

    Args:
        template: the compiled pipeline YAML (local or gs://; an https:// one is checked by Vertex only).
        project, region: where the run goes.
        pipeline_root, registry: the run's gs:// buckets (``registry`` defaults to ``parameters["registry"]``).
        service_account: the account the run acts as (None: the Compute Engine default, a warning).
        parameters: the run's parameter values, typed (see ``parse_parameters``).
        schedule: also check what creating a schedule needs.
        api_endpoints: the Google APIs to call (default: Google's, or TPUSTREAM_*_ENDPOINT).
        timeout: seconds per remote call.

    Returns:
        One Finding per check, in the order they ran.
    """
    from tpustream.pipelines.preflight_cloud import check_cloud

    spec = load_template(template)
    declared = template_parameters(spec) if spec is not None else None
    if spec is None and not template.startswith("https://"):
        return [Finding("template", FAIL, f"--template {template}: no such file")]
    default_tensorboard = declared["tensorboard"].default if declared and "tensorboard" in declared else ""
    return check_parameters(declared, parameters) + check_cloud(
        spec,
        tensorboard=str(parameters.get("tensorboard", default_tensorboard) or ""),
        project=project,
        region=region,
        pipeline_root=pipeline_root,
        registry=registry,
        service_account=service_account,
        parameters=parameters,
        schedule=schedule,
        api_endpoints=api_endpoints,
        timeout=timeout,
    )
