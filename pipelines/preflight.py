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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpustream import storage
from tpustream.errors import ConfigError, TpustreamError

if TYPE_CHECKING:
    from pipelines.preflight_cloud import ApiEndpoints

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

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Finding:
    """The outcome of one check: ``status`` ok, warn or fail, and one line saying what and the fix
    (positional: a record, built in many places, not a config)."""

    check: str
    status: str
    message: str

    def line(self) -> str:
        return f"{self.status:<4} {self.check}: {self.message}"


class PreflightFailed(TpustreamError, ValueError):
    """A run that would fail or hang on Vertex AI, refused before it is submitted."""

    def __init__(self, findings: list[Finding], hint: str = "") -> None:
        self.findings = findings
        failed = "; ".join(f"{f.check}: {f.message}" for f in findings if f.status == FAIL)
        super().__init__(f"preflight failed: {failed}" + (f" ({hint})" if hint else ""))


def raise_on_failure(findings: list[Finding], hint: str = "") -> None:
    """Raise PreflightFailed if any finding failed (``hint``, what else the user can do, appended)."""
    if any(f.status == FAIL for f in findings):
        raise PreflightFailed(findings, hint)


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

    from pipelines.training import build_pipeline

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


# --------------------------------------------------------------------------- region tables

# Where Vertex AI custom training offers each TPU family, as Google documents it (as of 2026-11; Google adds
# regions, so re-check and update this table): "Vertex AI locations", section "Custom training: accelerators"
# (https://cloud.google.com/vertex-ai/docs/general/locations#accelerators) and "Use Cloud TPU for custom
# training" (https://cloud.google.com/vertex-ai/docs/training/training-with-tpu-vm); a Vertex TPU job runs
# in the zones of "TPU regions and zones" (https://cloud.google.com/tpu/docs/regions-zones). A family
# missing here (a TPU type added to pipelines/tpu.py later) is a warning, not a failure.
TPU_REGIONS: dict[str, frozenset[str]] = {
    "v2": frozenset({"us-central1", "europe-west4", "asia-east1"}),
    "v3": frozenset({"us-central1", "europe-west4"}),
    "v5e": frozenset({"us-central1", "us-south1", "us-west1", "us-west4", "europe-west4", "asia-southeast1"}),
    "v6e": frozenset(
        {"us-central1", "us-east1", "us-east5", "europe-west4", "asia-northeast1", "southamerica-east1"}
    ),
}
TPU_LOCATIONS_DOC = "https://cloud.google.com/vertex-ai/docs/general/locations#accelerators"

# "Import models to Vertex AI", Upload model artifacts to Cloud Storage: the bucket holding a model's
# artifacts must be in the region of the regional endpoint the model is uploaded to. A multi- or
# dual-region bucket whose regions include it serves it too.
MODEL_ARTIFACTS_DOC = "https://cloud.google.com/vertex-ai/docs/model-registry/import-model"

# Cloud Storage "Bucket locations" (https://cloud.google.com/storage/docs/locations): the multi-regions are
# data centers in the named area; the predefined dual-regions are pairs of regions.
_EU_OUTSIDE = {"europe-west2", "europe-west6"}  # London, Zurich: in Europe, not in the EU multi-region
_MULTI_REGIONS: dict[str, Callable[[str], bool]] = {
    "US": lambda region: region.startswith("us-"),
    "EU": lambda region: region.startswith("europe-") and region not in _EU_OUTSIDE,
    "ASIA": lambda region: region.startswith("asia-"),
}
_DUAL_REGIONS = {
    "NAM4": {"us-central1", "us-east1"},
    "EUR4": {"europe-north1", "europe-west4"},
    "EUR5": {"europe-west1", "europe-west2"},
    "EUR7": {"europe-west2", "europe-west3"},
    "EUR8": {"europe-west3", "europe-west6"},
    "ASIA1": {"asia-northeast1", "asia-northeast2"},
}


def bucket_serves_region(location: str, region: str, data_locations: Iterable[str] = ()) -> bool:
    """Whether a bucket at GCS ``location`` keeps its data in ``region`` (itself, or a multi- or
    dual-region containing it; a configurable dual-region names its regions in ``data_locations``)."""
    location, region = location.upper(), region.lower()
    regions = {r.lower() for r in data_locations}
    if regions:
        return region in regions
    if location.lower() == region:
        return True
    if location in _DUAL_REGIONS:
        return region in _DUAL_REGIONS[location]
    contains = _MULTI_REGIONS.get(location)
    return bool(contains and contains(region))


def check_tpu_region(tpu: str | None, region: str) -> Finding:
    """Whether Vertex AI offers the compiled TPU type in ``region`` (TPU_REGIONS; no credentials)."""
    if tpu is None:
        return Finding("tpu-region", OK, "the template trains on the CPU image: no TPU to place")
    family = tpu.split("-")[0]
    regions = TPU_REGIONS.get(family)
    if regions is None:
        return Finding(
            "tpu-region",
            WARN,
            f"no region table for TPU family {family} here: check {TPU_LOCATIONS_DOC} offers {tpu} in "
            f"{region}, then add it to TPU_REGIONS in pipelines/preflight.py",
        )
    if region in regions:
        return Finding("tpu-region", OK, f"Vertex AI offers TPU {family} ({tpu}) in {region}")
    return Finding(
        "tpu-region",
        FAIL,
        f"Vertex AI custom training offers TPU {family} in {', '.join(sorted(regions))}, not {region} "
        f"({TPU_LOCATIONS_DOC}, as recorded 2026-11): pass one of those as --region, or compile for another TPU type",
    )


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
    from pipelines.preflight_cloud import check_cloud

    spec = load_template(template)
    declared = template_parameters(spec) if spec is not None else None
    if spec is None and not template.startswith("https://"):
        return [Finding("template", FAIL, f"--template {template}: no such file")]
    return check_parameters(declared, parameters) + check_cloud(
        spec,
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
