"""The package's modules and their files, read from the source tree: ``tpustream/`` and the folders pyproject.toml's
package-dir installs under it (the KFP components and pipelines, in the repository's top-level ``components/`` and
``pipelines/``), for the tests that read the code with ``ast``."""

from __future__ import annotations

from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "tpustream"


def package_folders() -> dict[str, Path]:
    """Each installed package root -> its folder: ``tpustream``, and those package-dir maps from another folder."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {
        PACKAGE: REPO / PACKAGE,
        **{name: REPO / folder for name, folder in setuptools["package-dir"].items()},
    }


def package_modules() -> dict[str, Path]:
    """Every module of the package (a package by its ``__init__``'s name) -> its .py file."""
    found: dict[str, Path] = {}
    for package, folder in package_folders().items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            found[".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return found
