"""The packages of ``tpustream`` import each other in one layer order, and its modules without a cycle, counting
imports inside functions too; no module reaches into another package's private names, none of ``report/`` into a
sibling's, and the package's private sibling imports stay few (``python -m tests.unit.test_import_graph`` counts
them).

A function-level import hides a cycle from Python (nothing fails at import time) but not from the reader:
``serving -> evaluate -> promote -> vertex -> serving`` made every one of those modules depend on all the
others. The graph is read from the source with ``ast``, so the test needs no import and no torch. Imports
under ``if TYPE_CHECKING:`` are left out: they never run, and a type named back is not a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.common.package_files import package_modules

PACKAGE = "tpustream"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE
# Known edges that close a cycle, each with why it is still there. Remove an entry when its import goes:
# test_known_cycle_edges_are_still_there fails until then.
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()
# Benchmarks and the loopback GCS server: nothing that runs in production imports them. The CLI's bench commands
# are the one boundary, and only inside the commands, so importing the CLI (``tpustream --help``) does not load them.
BENCH = f"{PACKAGE}.bench"
BENCH_BOUNDARY = f"{PACKAGE}.cli.bench"  # the `tpustream bench` commands
DEV_BOUNDARY = f"{PACKAGE}.cli.dev"  # the `tpustream dev` commands (the loopback GCS server)
# The layer order, lowest first: a package (or shared leaf module) imports only itself and those before it, so
# each can be read, tested and changed knowing only what sits below it. It follows the data flow: the rooms that
# make the data (sources, dataset, loader, models) know no champion; the registry sits above them and below what
# reads a model from it; the run's gates sit above the steps they gate. docs/ARCHITECTURE.md explains each room.
LAYERS = (
    "_lazy",  # the packages' lazy public fronts (imports nothing of tpustream)
    "errors",  # the error types every layer raises
    "storage",  # local paths and gs:// URIs
    "artifacts",  # the typed JSON files the steps pass each other
    "xla_runtime",  # where a process sits in an XLA job
    "image",  # decode, resize, augment
    "metrics",  # loss/accuracy, per-sample scores, classification metrics, the paired test
    "sources",  # every SOURCE form behind one dispatch
    "dataset",  # shard plan, writers, tar reading, manifest, data check, a source's fingerprint
    "loader",  # ShardLoader and its workers
    "data",  # the deprecated ``tpustream.data`` path to the loader
    "models",  # the model zoo (its input sizes come from the dataset's rule)
    "registry",  # the champion pointer, the promotion policy, its history (train warm-starts from the champion)
    "train",  # the trainer, checkpoints, warm starts, pretrained weights, evaluation
    "tune",  # the hyperparameter search: its space, optuna here, the Vertex HyperparameterTuningJob's parts
    "serve",  # the model server, its contract, serving validation, batch predict
    "vertex",  # Vertex AI Model Registry, batch prediction, experiments
    "release",  # promote and deploy
    "run",  # the pipeline run's gates: nothing-new skip, data-check gate, the run's outcome, its notification
    "report",  # the run report
    "launchers",  # each KFP component's body: its parameters and artifacts mapped onto tpustream
    "components",  # the KFP components
    "pipelines",  # the KFP pipelines, preflight, submit
    "cli",  # the ``tpustream`` command
)
# The rooms that make the data, and what they must never ask: whether a champion exists, or what a run decided.
DATA_ROOMS = ("sources", "dataset", "loader", "data", "models")
MODEL_ROOMS = ("registry", "release", "run")


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


def _sources() -> dict[str, Path]:
    """The package's modules -> their .py files, components/ and pipelines/ included (pyproject's package-dir)."""
    return package_modules()


def import_graph() -> dict[str, set[str]]:
    """Every module of the package -> the modules of the package it imports, at any depth of its code."""
    paths = _sources()
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
    assert {
        "tpustream.storage.io",
        "tpustream.registry.store",
        "tpustream.release.promote",
        "tpustream.serve.server",
    } <= set(graph)
    assert "tpustream.storage.io" in graph["tpustream.registry.store"]  # a module-level import
    assert "tpustream.vertex.model_registry" in graph["tpustream.release.promote"]  # a function-level one
    assert (
        "tpustream.image.transforms" in graph["tpustream.serve.classifier"]
    )  # also imported under TYPE_CHECKING
    assert (
        "tpustream.dataset.check_result" not in graph["tpustream.dataset.check_report"]
    )  # only under TYPE_CHECKING
    assert "tpustream.bench.peers" in graph["tpustream.bench.load"]  # a subpackage is walked too
    assert "tpustream.bench.load" in graph[BENCH_BOUNDARY]
    # components/ and pipelines/ are in the package (pyproject.toml's package-dir maps them)
    assert "tpustream.components" in graph["tpustream.pipelines.steps"]
    assert "tpustream.pipelines.training" in graph["tpustream.pipelines.local"]
    assert (
        "tpustream.pipelines.preflight.clients" in graph["tpustream.pipelines.preflight.iam"]
    )  # a sub-subpackage


def _unit(module: str) -> str:
    """The package (or shared leaf module) of ``tpustream`` that holds ``module``."""
    return module.split(".")[1] if module.count(".") else ""


def layer_violations(graph: dict[str, set[str]], layers: tuple[str, ...]) -> list[str]:
    """Each import of ``graph`` that reaches up the layer order, as "importer -> imported"."""
    rank = {unit: index for index, unit in enumerate(layers)}
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if not _is_bench(module)
        for target in targets
        if not _is_bench(target) and rank[_unit(target)] > rank[_unit(module)]
    )


def test_every_package_has_its_place_in_the_layer_order() -> None:
    units = {_unit(module) for module in import_graph() if not _is_bench(module)} - {""}
    assert units - set(LAYERS) == set(), "add the new package to LAYERS, in its place"
    assert set(LAYERS) - units == set(), "a package in LAYERS is gone: remove it"


def test_packages_import_only_down_the_layer_order() -> None:
    assert layer_violations(import_graph(), LAYERS) == []


def test_the_layer_order_follows_the_data_flow() -> None:
    # source -> shards -> loader -> model; then the registry, which training warm-starts from and evaluates
    # against and a release writes; then the run's gates around all of it: the order may gain rooms, not swap these
    flow = ("sources", "dataset", "loader", "models", "registry", "train", "release", "run", "components")
    assert [unit for unit in LAYERS if unit in flow] == list(flow)
    assert max(map(LAYERS.index, DATA_ROOMS)) < min(map(LAYERS.index, MODEL_ROOMS))


def test_the_rooms_that_make_the_data_do_not_ask_the_registry_or_the_run() -> None:
    graph = import_graph()
    asking = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if _unit(module) in DATA_ROOMS
        for target in targets
        if _unit(target) in MODEL_ROOMS
    )
    assert asking == [], "the gate that asks belongs in tpustream/run/, not in the room that makes the data"


def test_layer_violations_names_an_import_up_the_order() -> None:
    graph = {"tpustream.a.x": {"tpustream.b.y"}, "tpustream.b.y": {"tpustream.a.z"}, "tpustream.a.z": set()}
    assert layer_violations(graph, ("a", "b")) == ["tpustream.a.x -> tpustream.b.y"]
    assert layer_violations(graph, ("b", "a")) == ["tpustream.b.y -> tpustream.a.z"]


def private_cross_imports() -> list[str]:
    """``from tpustream.pkg.mod import _name`` where ``pkg`` is not the importer's own package."""
    paths = _sources()
    found = []
    for module, path in paths.items():
        for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            if (
                not isinstance(node, ast.ImportFrom)
                or node.level
                or not (node.module or "").startswith(PACKAGE)
            ):
                continue
            if _unit(node.module or "") == _unit(module):
                continue
            found += [
                f"{module} takes {node.module}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
            ]
    return sorted(found)


def test_no_module_imports_another_packages_private_names() -> None:
    assert private_cross_imports() == [], (
        "make the name public in its package, or move the code that needs it"
    )


# Private sibling imports the whole package may still hold (issue 44: under 40, and none in report/); lower it
# when one goes.
MAX_PRIVATE_SIBLING_IMPORTS = 39
NO_PRIVATE_SIBLING_IMPORTS = (f"{PACKAGE}.report",)  # packages whose modules share only public names


def private_sibling_imports(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """Each ``from <sibling> import _name`` in ``sources`` (module -> (source text, is a package's __init__)):
    a private name taken from another module of the importer's own package, absolute or relative, at any depth
    of its code (in functions and under ``TYPE_CHECKING`` too: a private type is still private), as
    "importer takes sibling._name"."""
    found = []
    for module, (text, is_package) in sources.items():
        package = module if is_package else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _imported(node, module, is_package)[0]
            if source == module or source not in sources or source.rpartition(".")[0] != package:
                continue
            found += [
                f"{module} takes {source}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
            ]
    return sorted(found)


def _package_sources() -> dict[str, tuple[str, bool]]:
    return {module: (path.read_text(), path.name == "__init__.py") for module, path in _sources().items()}


def test_private_sibling_imports_finds_absolute_and_relative_ones() -> None:
    sources = {
        "p.a": ("def _helper(): ...\n_LIMIT = 1\n__all__ = []\n", False),
        "p.b": ("from p.a import _helper, public\nfrom . import a\nfrom .a import __all__\n", False),
        "p.c": ("def f():\n    from .a import _LIMIT\n", False),
        "p.sub.d": ("from p.a import _helper\n", False),  # another package's module: the cross-package test's
        "p": ("from p.a import _helper\n", True),  # the package's front takes from its own modules
    }
    assert private_sibling_imports(sources) == [
        "p takes p.a._helper",
        "p.b takes p.a._helper",
        "p.c takes p.a._LIMIT",
    ]


def test_no_report_module_imports_a_siblings_private_names() -> None:
    found = [
        line
        for line in private_sibling_imports(_package_sources())
        if line.split(" ", 1)[0].startswith(NO_PRIVATE_SIBLING_IMPORTS)
    ]
    assert found == [], (
        "make the name public in the module that owns it, or move the code that needs it there"
    )


def test_private_sibling_imports_stay_few() -> None:
    found = private_sibling_imports(_package_sources())
    assert len(found) <= MAX_PRIVATE_SIBLING_IMPORTS, "\n".join(found)


def test_only_the_cli_imports_the_benchmarks() -> None:
    graph = import_graph()
    runtime = {module: targets for module, targets in graph.items() if not _is_bench(module)}
    importers = sorted(module for module, targets in runtime.items() if any(map(_is_bench, targets)))
    boundaries = [BENCH_BOUNDARY, DEV_BOUNDARY]
    assert importers == boundaries, f"only {' and '.join(boundaries)} may import {BENCH}, not {importers}"


def test_the_cli_imports_the_benchmarks_only_inside_its_commands() -> None:
    for boundary in (BENCH_BOUNDARY, DEV_BOUNDARY):
        path = ROOT / "cli" / f"{boundary.rsplit('.', 1)[1]}.py"
        names = [
            name
            for node in _module_level_import_nodes(ast.parse(path.read_text(), filename=str(path)))
            for name in _imported(node, boundary, is_package=False)
        ]
        assert not [name for name in names if _is_bench(name)], (
            f"import {BENCH} inside the commands of {path}"
        )


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


if __name__ == "__main__":  # the counts: python -m tests.unit.test_import_graph
    from collections import Counter

    imports = private_sibling_imports(_package_sources())
    print(f"private sibling imports in {PACKAGE}/: {len(imports)}")
    for package, count in Counter(line.split(" ", 1)[0].rpartition(".")[0] for line in imports).most_common():
        print(f"  {count:3} in {package}/")
    for source, count in Counter(line.rsplit(" ", 1)[1].rpartition(".")[0] for line in imports).most_common():
        print(f"  {count:3} from {source}")
