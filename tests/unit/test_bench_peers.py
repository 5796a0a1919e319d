"""A peer whose package is absent is one ``skipped`` line with its install hint, and is neither written nor run."""

import importlib.util

import pytest

from tpustream.bench import peers as bench_peers


@pytest.fixture
def absent(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Modules that find_spec (as bench_peers calls it) reports as not installed."""
    modules: set[str] = set()
    real = importlib.util.find_spec
    monkeypatch.setattr(
        bench_peers.importlib.util, "find_spec", lambda name, *a: None if name in modules else real(name, *a)
    )
    return modules


def test_a_missing_peer_is_a_skipped_line_with_its_install_hint(absent, tmp_path):
    absent.update({"webdataset", "litdata", "grain", "streaming"})
    assert bench_peers.skipped_lines() == [
        {"bench": "load", "pipeline": "webdataset-webloader", "skipped": "webdataset not installed: pip install -e ."},
        {"bench": "load", "pipeline": "litdata", "skipped": "litdata not installed: pip install -e '.[bench]'"},
        {"bench": "load", "pipeline": "grain", "skipped": "grain not installed: pip install -e '.[bench]'"},
        {"bench": "load", "pipeline": "mosaic-streaming",
         "skipped": "streaming not installed: pip install -e '.[bench-mosaic]'"},
    ]  # fmt: skip

    def no_samples():
        raise AssertionError("no writer should read the samples")

    assert bench_peers.write_peer_formats(str(tmp_path), no_samples) == {}
    assert not any(tmp_path.iterdir())
    assert bench_peers.peer_pipelines(["a.tar"], 32, 8, 0, True, {}) == {}


def test_only_the_missing_peers_are_skipped(absent):
    absent.add("grain")
    skipped = {line["pipeline"] for line in bench_peers.skipped_lines()}
    assert "grain" in skipped and "webdataset-webloader" not in skipped  # webdataset: a main dependency
    assert set(bench_peers.peer_pipelines(["a.tar"], 32, 8, 0, True, {})) == {
        "webdataset-webloader", "webdataset-webloader+our-decoder"
    }  # fmt: skip
