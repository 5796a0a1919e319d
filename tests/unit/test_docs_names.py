"""The names the docs give are the code's: every dotted ``tpustream.<...>`` path in README.md, docs/*.md and the
package's docstrings and comments imports (a module, or an attribute of one), and every file path the docs name
exists. A module moved or renamed without its prose fails here, naming the file and line to fix.

Format tags written into files (``tpustream.shards/v1``) look like paths but are names on disk: a path followed
by ``/`` or ``-`` is a tag, not a module.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import re
import tokenize
import warnings
from functools import cache
from pathlib import Path

import pytest

from tests.common.package_files import package_modules

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "tpustream"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Deliberate names that look like ours and are not (each says why). Keep it short: a stale name is not one.
EXAMPLES = {
    "tpustream.storage.buckets.get": "the GCS JSON API's method storage.buckets.get (storage/io.py)",
}
# A dotted path: ``tpustream`` and one or more ``.name``, taken whole (atomic), then not a tag (``/v1``, ``-``).
DOTTED = re.compile(r"(?<![\w./-])(?>tpustream(?:\.[A-Za-z_]\w*)+)(?![\w/-])")
# The same path written from inside the package: ``dataset.check_report.percents``, a subpackage, a module and
# a name (``report.anomalies``, ``storage.check_uri`` are as often a variable or an alias: not checked). In the
# Markdown docs only in backquotes, where prose and code samples (``loader.last_report.line``) are not.
SUBPACKAGES = sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists())
_RELATIVE = rf"(?>(?:{'|'.join(SUBPACKAGES)})(?:\.[A-Za-z_]\w*){{2,}})"
RELATIVE = re.compile(rf"(?<![\w./-]){_RELATIVE}(?![\w/-])")
RELATIVE_QUOTED = re.compile(rf"(?<=`){_RELATIVE}(?=`|\(|\[)")
# ``report.html``, ``metrics.json``: a file's name, not a module path
FILE_SUFFIXES = {
    "json",
    "jsonl",
    "html",
    "md",
    "py",
    "pt",
    "pth",
    "txt",
    "tar",
    "csv",
    "yaml",
    "yml",
    "png",
    "jpg",
}
# A file path in the docs: a folder of the repo, or of the package (``loader/config.py``), then ``.py``/``.md``.
FILE_PATH = re.compile(
    r"(?<![\w./-])(?>(?:[A-Za-z_][\w-]*/)+[\w.-]*\.(?:py|md|toml|txt|json|ini|yaml))(?![\w/])"
)


def _package_sources() -> list[Path]:
    """The package's .py files, components/ and pipelines/ included (pyproject's package-dir)."""
    return sorted(package_modules().values())


def _prose(path: Path) -> list[tuple[int, str]]:
    """``path``'s docstrings (any bare string statement: module, class, function, field) and comments, line by
    line."""
    text = path.read_text()
    found = [
        (node.lineno + offset, line)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for offset, line in enumerate(node.value.value.splitlines())
    ]
    found += [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(text).readline)
        if token.type == tokenize.COMMENT
    ]
    return found


def _texts() -> list[tuple[str, int, str]]:
    """(where, line, text) for every doc file's lines and every docstring and comment of the package."""
    texts = [
        (str(doc.relative_to(REPO)), number, line)
        for doc in DOCS
        for number, line in enumerate(doc.read_text().splitlines(), start=1)
    ]
    for path in _package_sources():
        where = str(path.relative_to(REPO))
        texts += [(where, line, text) for line, text in _prose(path)]
    return texts


@cache
def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or a module and attributes of it (a class, a function, a field)."""
    with warnings.catch_warnings():  # a deprecated path resolves too (tpustream.data.ShardLoader), quietly
        warnings.simplefilter("ignore", DeprecationWarning)
        return _resolves(dotted.split("."))


def _resolves(parts: list[str]) -> bool:
    for split in range(len(parts), 0, -1):
        module = ".".join(parts[:split])
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent is not a package
            found = False
        if not found:
            continue
        value: object = importlib.import_module(module)
        for name in parts[split:]:
            fields = getattr(value, "__dataclass_fields__", {})
            if name in fields and not hasattr(value, name):  # a dataclass field without a default
                return True
            if not hasattr(value, name):
                return False
            value = getattr(value, name)
        return True
    return False


def dotted_names(text: str, markdown: bool = False) -> list[str]:
    """The module paths ``text`` names: ``tpustream.x.y``, and ``x.y.z`` when ``x`` is a subpackage."""
    relative = [
        f"tpustream.{name}"
        for name in (RELATIVE_QUOTED if markdown else RELATIVE).findall(text)
        if name.rsplit(".", 1)[1] not in FILE_SUFFIXES
    ]
    return DOTTED.findall(text) + relative


def stale_dotted_names(texts: list[tuple[str, int, str]]) -> list[str]:
    return sorted(
        f"{where}:{line}: {name}"
        for where, line, text in texts
        for name in dotted_names(text, markdown=where.endswith(".md"))
        if name not in EXAMPLES and not resolves(name)
    )


def missing_files(texts: list[tuple[str, int, str]]) -> list[str]:
    """The file paths in ``texts`` that start at a folder of the repo or of the package and do not exist."""
    package = {path.name for path in PACKAGE.iterdir() if path.is_dir()}
    roots = {path.name for path in REPO.iterdir() if path.is_dir()} | package
    return sorted(
        f"{where}:{line}: {path}"
        for where, line, text in texts
        # a docstring's docs/... is another project's (pytorch/xla ``docs/source/...``)
        for path in FILE_PATH.findall(text)
        if path.split("/")[0] in (roots - {"docs"} if where.endswith(".py") else roots)
        and not (REPO / path).exists()
        and not (PACKAGE / path).exists()
    )


def test_the_patterns_take_paths_whole_and_leave_format_tags() -> None:
    text = "``tpustream.dataset.check.check_dataset``, tpustream.shards/v1, `tpustream/loader/config.py`."
    assert DOTTED.findall(text) == ["tpustream.dataset.check.check_dataset"]
    assert DOTTED.findall("tpustream.serving-validation/v1 and tpustream.a.b/v1") == []
    assert FILE_PATH.findall(text) == ["tpustream/loader/config.py"]
    # from inside the package: a subpackage, a module and a name; a variable (``report.anomalies``) is not one
    prose = "``dataset.check_report.percents`` and report.anomalies, report.html, see registry.policy.decide."
    assert dotted_names(prose) == [
        "tpustream.dataset.check_report.percents",
        "tpustream.registry.policy.decide",
    ]
    assert dotted_names(prose, markdown=True) == ["tpustream.dataset.check_report.percents"]


def test_resolves_modules_their_attributes_and_nothing_else() -> None:
    assert resolves("tpustream.dataset.check")
    assert resolves("tpustream.dataset.check.check_dataset")
    assert resolves("tpustream.registry.policy.PromotionPolicy.max_p_value")
    assert resolves("tpustream.dataset.check_result.DataCheckReport.anomalies")  # a field without default
    assert not resolves("tpustream.datacheck")
    assert not resolves("tpustream.dataset.check.nothing_here")
    assert not resolves("tpustream.models.nope")  # a module's attribute, the module not a package


def test_the_checks_find_a_stale_name_and_a_missing_file() -> None:
    texts = [
        ("doc.md", 3, "see `tpustream.shard_plan.plan` in `tpustream/shard_plan.py`, not loader/gone.py"),
        ("tpustream/x.py", 7, "# the reasons (sources.source_types.SKIP_REASONS)"),
    ]
    assert stale_dotted_names(texts) == [
        "doc.md:3: tpustream.shard_plan.plan",
        "tpustream/x.py:7: tpustream.sources.source_types.SKIP_REASONS",
    ]
    assert missing_files(texts) == ["doc.md:3: loader/gone.py", "doc.md:3: tpustream/shard_plan.py"]


@pytest.mark.parametrize("check", [stale_dotted_names, missing_files])
def test_every_name_in_the_docs_and_docstrings_is_real(check) -> None:
    stale = check(_texts())
    assert stale == [], "rename these to the module that holds them now:\n" + "\n".join(stale)
