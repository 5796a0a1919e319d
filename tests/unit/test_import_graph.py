"""The modules of ``tpustream`` import each other without a cycle, counting imports inside functions too.

A function-level import hides a cycle from Python (nothing fails at import time) but not from the reader:
``serving -> evaluate -> promote -> vertex -> serving`` made every one of those modules depend on all the
others. The graph is read from the source with ``ast``, so the test needs no import and no torch. Imports
under ``if TYPE_CHECKING:`` are left out: they never run, and a type named back is not a dependency.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

PACKAGE = "tpustream"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE
# Known edges that close a cycle, each with why it is still there. Remove an entry when its import goes:
# test_known_cycle_edges_are_still_there fails until then.
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()
# Benchmarks and the loopback GCS server: nothing that runs in production imports them. The CLI's bench commands
# are the one boundary, and only inside the commands, so importing the CLI (``tpustream --help``) does not load them.
BENCH = f"{PACKAGE}.bench"
BENCH_BOUNDARY = f"{PACKAGE}.cli_bench"  # the `tpustream bench` commands


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names ``node`` imports (a module, or a name inside one: resolved by the caller)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the package that holds ``module``
        anchor = module.split(".")
        anchor = anchor if is_package else anchor[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _is_type_checking(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The imports anywhere under ``node`` (module level, in functions, in classes), not type-only ones."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [node]
    children: list[ast.AST] = list(ast.iter_child_nodes(node))
    if _is_type_checking(node):
        assert isinstance(node, ast.If)
        children = list(node.orelse)
    return [found for child in children for found in _import_nodes(child)]


def _is_bench(module: str) -> bool:
    return module == BENCH or module.startswith(f"{BENCH}.")


def _module_level_import_nodes(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is imported: ``_import_nodes`` minus those inside functions."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        return []
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [node]
    return [found for child in ast.iter_child_nodes(node) for found in _module_level_import_nodes(child)]


def _sources() -> list[Path]:
    """The package's .py files, through the links to components/ and pipelines/ (rglob does not follow them)."""
    return sorted(
        Path(folder, name)
        for folder, _, names in os.walk(ROOT, followlinks=True)
        for name in names
        if name.endswith(".py")
    )


def import_graph() -> dict[str, set[str]]:
    """Every module of the package -> the modules of the package it imports, at any depth of its code."""
    paths = {_module_name(path): path for path in _sources()}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets: set[str] = set()
        for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            for name in _imported(node, module, path.name == "__init__.py"):
                # ``from tpustream.x import y``: y is a name in x, or the submodule x.y
                while name and name not in paths:
                    name = name.rpartition(".")[0]
                if name and name != module and name != PACKAGE:  # the package itself is empty
                    targets.add(name)
        graph[module] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as its modules in import order, the first repeated at the end; None if none."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path: list[str] = []
        on_path: set[str] = set()
        stack = [(start, iter(sorted(graph[start])))]
        path.append(start)
        on_path.add(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif child in on_path:
                return [*path[path.index(child) :], child]
            elif child not in done:
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
                on_path.add(child)
    return None


def test_the_graph_is_read_from_every_module() -> None:
    graph = import_graph()
    assert {"tpustream.storage", "tpustream.registry", "tpustream.promote", "tpustream.serving"} <= set(graph)
    assert "tpustream.storage" in graph["tpustream.registry"]  # a module-level import
    assert "tpustream.vertex" in graph["tpustream.promote"]  # a function-level one
    assert "tpustream.transforms" in graph["tpustream.serving"]  # also imported under TYPE_CHECKING
    assert "tpustream.datacheck" not in graph["tpustream.datacheck_report"]  # only under TYPE_CHECKING
    assert "tpustream.bench.peers" in graph["tpustream.bench.load"]  # a subpackage is walked too
    assert "tpustream.bench.load" in graph[BENCH_BOUNDARY]
    # components/ and pipelines/ are in the package (tpustream/components, tpustream/pipelines link to them)
    assert "tpustream.components" in graph["tpustream.pipelines.training"]
    assert "tpustream.pipelines.training" in graph["tpustream.pipelines.local"]


def test_only_the_cli_imports_the_benchmarks() -> None:
    graph = import_graph()
    runtime = {module: targets for module, targets in graph.items() if not _is_bench(module)}
    importers = sorted(module for module, targets in runtime.items() if any(map(_is_bench, targets)))
    assert importers == [BENCH_BOUNDARY], f"only {BENCH_BOUNDARY} may import {BENCH}, not {importers}"


def test_the_cli_imports_the_benchmarks_only_inside_its_commands() -> None:
    path = ROOT / "cli_bench.py"
    names = [
        name
        for node in _module_level_import_nodes(ast.parse(path.read_text(), filename=str(path)))
        for name in _imported(node, BENCH_BOUNDARY, is_package=False)
    ]
    assert not [name for name in names if _is_bench(name)], "import the benchmarks inside the bench commands"


def test_find_cycle_names_the_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_known_cycle_edges_are_still_there() -> None:
    graph = import_graph()
    gone = sorted(edge for edge in KNOWN_CYCLE_EDGES if edge[1] not in graph.get(edge[0], set()))
    assert not gone, f"no longer imported: remove {gone} from KNOWN_CYCLE_EDGES"


def test_tpustream_imports_have_no_cycle() -> None:
    graph = import_graph()
    for importer, imported in KNOWN_CYCLE_EDGES:
        graph[importer].discard(imported)
    cycle = find_cycle(graph)
    if cycle is not None:
        print("import cycle:", " -> ".join(cycle))
    assert cycle is None, f"import cycle: {' -> '.join(cycle or [])}"
