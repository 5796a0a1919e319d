"""The distribution installs one top-level package, ``tpustream``: the KFP components and the pipeline are
``tpustream.components`` and ``tpustream.pipelines``, installed from the repository's top-level folders by
pyproject.toml's package-dir (docs/ARCHITECTURE.md "One namespace"), so each file has one path and nothing named
``components`` or ``pipelines`` can clash with a user's own packages."""

import ast
import importlib
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


@pytest.mark.parametrize("name", ["components", "pipelines"])
def test_the_subpackage_is_the_top_level_folder(name):
    assert not (ROOT / "tpustream" / name).exists(), f"tpustream/{name}: a second path to {name}/ (remove it)"
    assert SETUPTOOLS["package-dir"][f"tpustream.{name}"] == name
    module = importlib.import_module(f"tpustream.{name}")  # the editable install maps it
    assert Path(module.__file__).resolve().parent == ROOT / name


def _package_folders(package: str, folder: Path) -> set[str]:
    return {
        ".".join((package, *init.parent.relative_to(folder).parts)) for init in folder.rglob("__init__.py")
    }


def test_every_package_folder_is_installed_and_only_tpustream():
    # packages is a list (setuptools' find cannot name a folder under another package name): a new
    # subpackage folder not listed would be missing from the wheel and the images.
    found = _package_folders("tpustream", ROOT / "tpustream")
    for name, folder in SETUPTOOLS["package-dir"].items():
        found |= _package_folders(name, ROOT / folder)
    assert set(SETUPTOOLS["packages"]) == found
    assert all(name.split(".")[0] == "tpustream" for name in SETUPTOOLS["packages"])
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["files"] == ["tpustream", "components", "pipelines"]


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
