"""The distribution installs one top-level package, ``tpustream``: the KFP components and the pipeline are
``tpustream.components`` and ``tpustream.pipelines`` (links to the repository's top-level folders,
docs/ARCHITECTURE.md "One namespace"), so nothing named ``components`` or ``pipelines`` can clash with a
user's own packages."""

import ast
import importlib
import os
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["components", "pipelines"])
def test_the_subpackage_is_the_top_level_folder(name):
    link = ROOT / "tpustream" / name
    assert link.is_symlink() and os.readlink(link) == f"../{name}", f"tpustream/{name} must link to ../{name}"
    module = importlib.import_module(f"tpustream.{name}")
    assert Path(module.__file__).resolve().parent == ROOT / name


def test_only_tpustream_is_installed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["tool"]["setuptools"]["packages"]["find"]["include"] == ["tpustream*"]
    assert config["tool"]["mypy"]["files"] == [
        "tpustream"
    ]  # the links: components and pipelines checked once


def test_no_module_imports_the_old_top_level_names():
    offenders = []
    for folder in ("tpustream", "components", "pipelines", "tests", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                names = (
                    [alias.name for alias in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and not node.level
                    else []
                )
                offenders += [
                    f"{path.relative_to(ROOT)}:{node.lineno} {n}"
                    for n in names
                    if n.split(".")[0] in ("components", "pipelines")
                ]
    assert not offenders, "import tpustream.components / tpustream.pipelines instead: " + ", ".join(offenders)
