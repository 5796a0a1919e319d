"""The test suite's own layout: no test module imports another (what several share lives in tests/common/,
the stand-ins in tests/fakes/, fixtures in conftest.py), and every helper module sits in one of those two.

A test module imported for its builders drags its fixtures, markers and module-scoped state into the importer,
and a rename of either breaks the other; the imports are read from the source with ``ast`` (functions' bodies
included), so nothing is imported to check them.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
HELPER_HOMES = ("common", "fakes")  # where a module that is not a test module lives


def _modules() -> list[Path]:
    return sorted(path for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts)


def _dotted(path: Path) -> str:
    parts = path.relative_to(TESTS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_test_modules(source: str, module: str) -> list[str]:
    """The modules named ``test_*`` that ``source`` (the text of ``module``, dotted) imports, resolved."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per extra dot
                package = module.split(".")[: -node.level]
                base = ".".join([*package, base] if base else package)
            # `from pkg import test_x` imports a module too
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        found += [name for name in names if name.rsplit(".", 1)[-1].startswith("test_")]
    return sorted(set(found))


def test_no_test_module_imports_another():
    offenders = {
        _dotted(path): imported
        for path in _modules()
        if (imported := imported_test_modules(path.read_text(), _dotted(path)))
    }
    assert offenders == {}, f"move what they share into tests/common/ (or a conftest fixture): {offenders}"


def test_the_import_check_catches_every_form():
    module = "tests.integration.test_b"
    source = """
from tests.integration.test_a import make_model
import tests.unit.test_c
from . import test_d
from .test_e import helper
from ..unit.test_f import thing

def later():
    from tests.unit.test_g import inner
from tests.common.models import make_model
from tests.fakes import gcs
"""
    assert imported_test_modules(source, module) == [
        "tests.integration.test_a",
        "tests.integration.test_d",
        "tests.integration.test_e",
        "tests.unit.test_c",
        "tests.unit.test_f",
        "tests.unit.test_g",
    ]


def test_helper_modules_live_in_common_or_fakes():
    misplaced = [
        str(path.relative_to(TESTS))
        for path in _modules()
        if not path.name.startswith("test_")
        and path.name not in ("__init__.py", "conftest.py")
        and path.relative_to(TESTS).parts[0] not in HELPER_HOMES
    ]
    assert misplaced == [], (
        f"builders go to tests/common/, emulators and loopback servers to tests/fakes/: {misplaced}"
    )
