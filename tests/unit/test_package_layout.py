"""The package's public faces: each subpackage's ``__all__`` resolves, and the old paths of 0.x still work, warning.

Run in a fresh interpreter where an import's side effects matter (what gets loaded), so that this process's
earlier imports do not hide them.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

PACKAGES = [
    "storage", "image", "sources", "dataset", "loader", "metrics", "registry",
    "train", "serve", "vertex", "release", "run", "report",
]  # fmt: skip


@pytest.mark.parametrize("name", PACKAGES)
def test_every_public_name_of_a_package_resolves_to_its_home(name: str) -> None:
    package = importlib.import_module(f"tpustream.{name}")
    assert package.__all__, f"tpustream.{name} exports nothing"
    for public in package.__all__:
        value = getattr(package, public)
        assert getattr(value, "__module__", "").startswith(f"tpustream.{name}."), (public, value)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        package.nope  # noqa: B018


def test_importing_every_package_loads_no_torch() -> None:
    code = (
        "import sys, importlib\n"
        f"for name in {PACKAGES!r}: importlib.import_module('tpustream.' + name)\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:3])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_old_train_config_path_warns_and_still_works() -> None:
    import tpustream.train
    from tpustream.train.config import TrainConfig

    with pytest.warns(DeprecationWarning, match=r"tpustream\.train\.config\.TrainConfig"):
        old = tpustream.train.TrainConfig
    assert old is TrainConfig


def test_the_old_data_module_warns_and_still_gives_the_loader() -> None:
    import tpustream.data
    from tpustream.loader import ShardLoader

    with pytest.warns(DeprecationWarning, match=r"tpustream\.loader\.shard_loader\.ShardLoader"):
        old = tpustream.data.ShardLoader
    assert old is ShardLoader
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError):
            tpustream.data.nope  # noqa: B018


@pytest.mark.parametrize("name", PACKAGES)
def test_no_public_name_is_shadowed_by_a_submodule_of_the_same_name(name: str) -> None:
    # once ``tpustream.x.y`` is imported, ``tpustream.x.y`` is the module: a function ``y`` exported lazily would
    # then resolve to the module or the function depending on what ran first
    package = importlib.import_module(f"tpustream.{name}")
    submodules = {path.stem for path in Path(package.__file__).parent.glob("*.py")}
    assert set(package.__all__) & submodules == set()


def test_the_files_format_tags_are_not_module_paths_and_did_not_move() -> None:
    # The format tags written into every file (manifest.json, metrics.json, ...) look like module paths but are
    # names on disk: the move into packages must not rewrite them, or every dataset, registry and run written
    # before it stops reading ("re-create the dataset with this version"). These are the tags of 0.x.
    from tpustream.artifacts.eval_report import METRICS_FORMAT
    from tpustream.artifacts.manifest import MANIFEST_FORMAT
    from tpustream.artifacts.model_card import MODEL_FORMAT
    from tpustream.dataset.check_result import REPORT_FORMAT
    from tpustream.dataset.fingerprint import FINGERPRINT_FORMAT
    from tpustream.serve.predict.parts import PART_FORMAT, SUMMARY_FORMAT
    from tpustream.serve.validate import VALIDATION_FORMAT
    from tpustream.sources.vertex_dataset import EXPORT_FORMAT

    assert (MANIFEST_FORMAT, METRICS_FORMAT, MODEL_FORMAT) == (
        "tpustream.shards/v1", "tpustream.metrics/v1", "tpustream.model/v1",
    )  # fmt: skip
    assert (REPORT_FORMAT, FINGERPRINT_FORMAT, VALIDATION_FORMAT, EXPORT_FORMAT) == (
        "tpustream.datacheck/v1", "tpustream.fingerprint/v1", "tpustream.serving-validation/v1",
        "tpustream.vertex_export/v1",
    )  # fmt: skip
    assert (PART_FORMAT, SUMMARY_FORMAT) == ("tpustream.predictions-part/v1", "tpustream.predictions/v1")
