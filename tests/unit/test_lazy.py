"""tpustream._lazy: one helper for every package's lazy public face (PEP 562 module ``__getattr__``/``__dir__``)."""

from __future__ import annotations

import ast
import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from tests.common.package_files import REPO, package_modules
from tpustream._lazy import lazy_front

ROOT = Path(__file__).resolve().parents[2] / "tpustream"


@pytest.fixture
def front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A package ``lazyfront`` whose ``__init__`` is a lazy front over ``heavy`` and ``sub.deep``."""
    package = tmp_path / "lazyfront"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text(
        textwrap.dedent(
            """
            from tpustream._lazy import lazy_front

            PLAIN = 1
            _HOMES = {"Heavy": "heavy", "deep": "sub.deep"}
            __all__ = ["Heavy", "deep"]
            __getattr__, __dir__ = lazy_front(__name__, _HOMES, moved={"Old": "lazyfront.heavy"})
            """
        )
    )
    (package / "heavy.py").write_text("class Heavy: ...\n\n\nclass Old: ...\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "deep.py").write_text("def deep() -> int:\n    return 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("lazyfront")
    for name in [name for name in sys.modules if name == "lazyfront" or name.startswith("lazyfront.")]:
        del sys.modules[name]


def test_a_name_is_imported_from_its_home_when_first_asked_for(front) -> None:
    assert "lazyfront.heavy" not in sys.modules
    assert front.Heavy.__module__ == "lazyfront.heavy"
    assert "lazyfront.heavy" in sys.modules
    assert front.deep() == 7  # a home below a subpackage


def test_dir_lists_the_lazy_names_beside_the_modules_own(front) -> None:
    names = dir(front)
    assert {"Heavy", "deep", "PLAIN", "lazy_front"} <= set(names)
    assert "Old" not in names and names == sorted(names)
    assert "lazyfront.heavy" not in sys.modules  # dir imports nothing


def test_an_unknown_name_is_an_attribute_error_naming_the_module(front) -> None:
    with pytest.raises(AttributeError, match="module 'lazyfront' has no attribute 'nope'"):
        front.nope  # noqa: B018
    assert not hasattr(front, "nope")


def test_a_moved_name_warns_with_its_new_path_and_still_works(front) -> None:
    with pytest.warns(DeprecationWarning, match=r"lazyfront\.Old moved to lazyfront\.heavy\.Old"):
        old = front.Old
    assert old.__name__ == "Old"


def test_a_name_both_public_and_moved_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\['Heavy'\] are both public and moved"):
        lazy_front("lazyfront", {"Heavy": "heavy"}, moved={"Heavy": "lazyfront.old"})


def test_every_lazy_front_of_the_package_uses_the_helper() -> None:
    sources = list(package_modules().values())  # components/ and pipelines/ too
    own = [
        str(path.relative_to(REPO))
        for path in sources
        if path.name != "_lazy.py"
        for node in ast.parse(path.read_text()).body  # module level: a method __getattr__ is not a front
        if isinstance(node, ast.FunctionDef) and node.name in ("__getattr__", "__dir__")
    ]
    assert own == [], "write `__getattr__, __dir__ = lazy_front(__name__, _HOMES)` (tpustream/_lazy.py)"
    fronts = [path for path in sources if "lazy_front(__name__" in path.read_text()]
    assert len(fronts) >= 15
