"""The import circles between tpustream's modules: the strongly connected components of the module import
graph, read from the source with ``ast`` (no import, no torch).

    .venv/bin/python tools/import_circles.py          # circles of imports that run (in functions too)
    .venv/bin/python tools/import_circles.py --types  # also counting imports under ``if TYPE_CHECKING:``

An import inside a function counts (it runs, later); one under ``if TYPE_CHECKING:`` does not, unless
``--types``: it never runs, and naming a type back is what TYPE_CHECKING is for. A circle that shows only with
``--types`` is one a type needs; a circle without it is a dependency both ways. Prints each circle's modules
on one line and the count last; exits 1 when a circle of imports that run is found.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import tomllib

PACKAGE = "tpustream"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE


def _modules() -> dict[str, Path]:
    """Every module -> its file: ``tpustream/`` and the folders pyproject.toml's package-dir installs under it
    (components/, pipelines/)."""
    setuptools = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {
        PACKAGE: ROOT,
        **{name: ROOT.parent / folder for name, folder in setuptools["package-dir"].items()},
    }
    found: dict[str, Path] = {}
    for package, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            found[".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return found


def _is_type_checking(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST, types: bool) -> list[ast.Import | ast.ImportFrom]:
    """The imports anywhere under ``node``; those under ``if TYPE_CHECKING:`` only when ``types``."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [node]
    children = list(ast.iter_child_nodes(node))
    if _is_type_checking(node) and not types:
        assert isinstance(node, ast.If)
        children = list(node.orelse)
    return [found for child in children for found in _imports(child, types)]


def _imported(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: set[str]
) -> list[str]:
    """The dotted names ``node`` imports: a module, or a name inside one (the caller resolves which).

    ``from pkg import mod`` names the submodule only, as ``import pkg.mod`` would: the package's ``__init__``
    runs first either way, and counting it would make every lazy package front part of its modules' circles.
    """
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the package that holds ``module``
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    names = [f"{base}.{alias.name}" for alias in node.names]
    return names if all(name in modules for name in names) else [base, *names]


def import_graph(types: bool) -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports (components/ and pipelines/ included)."""
    paths = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), filename=str(path)), types):
            for name in _imported(node, module, path.name == "__init__.py", set(paths)):
                while name and name not in paths:  # ``from x import y``: y is a name in x or the module x.y
                    name = name.rpartition(".")[0]
                if name and name not in (module, PACKAGE):
                    targets.add(name)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", action="store_true", help="count imports under `if TYPE_CHECKING:` too")
    args = parser.parse_args()
    found = circles(import_graph(types=args.types))
    for component in found:
        print(" ".join(component))
    print(f"{len(found)} import circle(s)" + (" (type-only imports counted)" if args.types else ""))
    return 1 if found and not args.types else 0


if __name__ == "__main__":
    sys.exit(main())
