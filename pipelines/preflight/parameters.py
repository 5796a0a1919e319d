"""The preflight's checks that need no credentials: the run's ``--param`` values typed as the compiled template
declares them, their names and types checked against it (a typo gets a suggestion), and the parameter list
``pipeline submit --help`` prints. pipelines/template.py reads the template.
"""

from __future__ import annotations

import difflib
import json
import re

from ..template import JsonValue, Parameter, RunParameters
from .findings import FAIL, OK, WARN, Finding

__all__ = ["check_parameters", "parameters_help", "parse_parameters"]

_TYPE_WORDS = {
    "STRING": "a string",
    "NUMBER_INTEGER": "an integer",
    "NUMBER_DOUBLE": "a number",
    "BOOLEAN": "true or false",
    "LIST": "a JSON list",
    "STRUCT": "a JSON object",
}


def _guess(text: str) -> JsonValue:
    """A value whose type the template does not say: JSON when it is JSON (numbers, booleans), else text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _parse(text: str, parameter_type: str) -> JsonValue:
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


def parse_parameters(declared: dict[str, Parameter] | None, pairs: dict[str, str]) -> RunParameters:
    """``--param`` texts as the values the template's types ask for (``source=123`` stays a string);
    a name the template lacks, or no template, gets a JSON guess."""
    return {
        name: _parse(text, declared[name].type) if declared and name in declared else _guess(text)
        for name, text in pairs.items()
    }


def _type_ok(value: JsonValue, parameter_type: str) -> bool:
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


def _shown(value: JsonValue) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _default(parameter: Parameter) -> JsonValue:
    """The default as the user would type it: KFP stores integer defaults as JSON numbers (0.0)."""
    if parameter.type == "NUMBER_INTEGER" and isinstance(parameter.default, float):
        return int(parameter.default)
    return parameter.default


def check_parameters(declared: dict[str, Parameter] | None, given: RunParameters) -> list[Finding]:
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
