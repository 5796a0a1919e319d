"""tools/import_circles.py: the import circles between tpustream's modules, as strongly connected components."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "import_circles", Path(__file__).parents[2] / "tools" / "import_circles.py"
)
assert spec is not None and spec.loader is not None
import_circles = importlib.util.module_from_spec(spec)
spec.loader.exec_module(import_circles)


def test_circles_are_the_components_of_more_than_one_module() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"f", "a"}}
    assert import_circles.circles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert import_circles.circles({"a": {"b"}, "b": set()}) == []


def test_no_circle_of_imports_that_run() -> None:
    assert import_circles.circles(import_circles.import_graph(types=False)) == []


def test_the_data_check_and_the_registry_close_no_circle_even_through_types() -> None:
    # DataCheckThresholds (dataset/check_thresholds.py) and RegistryError (registry/errors.py) are leaves now
    in_circles = {
        module
        for circle in import_circles.circles(import_circles.import_graph(types=True))
        for module in circle
    }
    assert not in_circles & {
        "tpustream.dataset.check",
        "tpustream.dataset.check_baseline",
        "tpustream.registry.policy",
        "tpustream.registry.store",
    }


def test_a_package_front_is_not_in_its_submodules_circles() -> None:
    # `from tpustream.vertex import model_registry` names the submodule, not the lazy front that lists it
    graph = import_circles.import_graph(types=True)
    assert "tpustream.vertex.model_registry" in graph["tpustream.vertex.batch_prediction"]
    assert "tpustream.vertex" not in graph["tpustream.vertex.batch_prediction"]
