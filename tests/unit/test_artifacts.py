"""The artifact types: each file the stages hand each other reads and writes back unchanged, older files
still load, a file of another format version is refused with the fix, and the module needs no torch."""

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tpustream.artifacts import (
    MANIFEST_FORMAT,
    METRICS_FORMAT,
    MODEL_FORMAT,
    ArtifactError,
    EvalReport,
    Manifest,
    ModelCard,
)
from tpustream.dataset import write as shards
from tpustream.dataset.manifest import ShardError, load_manifest, read_manifest
from tpustream.dataset.plan import ShardConfig


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A small dataset as ``shards create`` writes it (skipped and ignored files included)."""
    root = tmp_path_factory.mktemp("img")
    for i in range(12):
        folder = root / ("cat" if i % 2 else "dog")
        folder.mkdir(exist_ok=True)
        pixels = np.random.default_rng(i).integers(0, 256, (8 + i, 10, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.png")
    (root / "cat" / "broken.jpg").write_bytes(b"not a jpeg")
    (root / "notes.txt").write_text("not an image")
    out = tmp_path_factory.mktemp("ds")
    shards.create_shards(
        ShardConfig(source=str(root), output=str(out), num_shards=2, val_fraction=0.25), progress=False
    )
    return out


def test_a_written_manifest_reads_and_writes_back_byte_for_byte(dataset, tmp_path):
    data = (dataset / "manifest.json").read_bytes()
    manifest = Manifest.read(str(dataset / "manifest.json"))
    assert manifest.to_json() == json.loads(data)
    assert manifest.to_bytes() == data  # same keys, same order: manifest_digest is unchanged
    manifest.write(str(tmp_path / "manifest.json"))
    assert (tmp_path / "manifest.json").read_bytes() == data
    assert read_manifest(str(dataset)) == json.loads(data)  # the dict form the loader takes


def test_the_manifest_types_its_fields(dataset):
    manifest = load_manifest(str(dataset))
    assert manifest.classes == ["cat", "dog"] and manifest.num_classes == 2
    train = manifest.splits["train"]
    assert train.num_samples == sum(s.num_samples for s in train.shards) == sum(train.class_counts)
    assert (
        manifest.num_samples("val") == manifest.splits["val"].num_samples and manifest.num_samples("x") == 0
    )
    assert all(s.sample_index.startswith("index/") for s in manifest.all_shards())
    assert manifest.has_sample_index()
    assert train.stats is not None and train.stats.formats == {"png": train.num_samples}
    assert manifest.skipped.count == 1 and manifest.skipped.by_reason == {"undecodable": 1}
    assert manifest.ignored_files.count == 1


def _old_manifest(data: dict) -> dict:
    """What the first tpustream wrote: no stats, no sample index, no max_pixels, ``skipped`` count and
    examples only."""
    old = json.loads(json.dumps(data))
    del old["max_pixels"]
    for split in old["splits"].values():
        del split["stats"]
        for shard in split["shards"]:
            del shard["sample_index"], shard["sample_index_sha256"]
    old["skipped"] = {"count": 1, "examples": ["cat/broken.jpg: not an image"]}
    return old


def test_an_older_manifest_loads_with_defaults_and_writes_back_as_it_was(dataset):
    old = _old_manifest(json.loads((dataset / "manifest.json").read_bytes()))
    manifest = Manifest.from_json(old)
    assert not manifest.has_sample_index() and manifest.max_pixels is None
    assert all(split.stats is None for split in manifest.splits.values())
    assert manifest.skipped.sample_slots == 1 and manifest.skipped.by_reason == {}
    assert manifest.to_json() == old


def test_keys_no_type_models_are_kept(dataset):
    data = json.loads((dataset / "manifest.json").read_bytes())
    data["licence"] = "CC-BY"
    data["splits"]["train"]["note"] = {"by": "a later version"}
    data["splits"]["train"]["shards"][0]["compression"] = None
    manifest = Manifest.from_json(data)
    assert manifest.extra == {"licence": "CC-BY"}
    assert manifest.to_json() == data


@pytest.mark.parametrize(
    "document, found",
    [
        (
            {"format": "tpustream.shards/v2", "classes": [], "splits": {}},
            "it has format 'tpustream.shards/v2'",
        ),
        ({"classes": [], "splits": {}}, "it has no 'format'"),
    ],
)
def test_a_manifest_of_another_version_is_refused_with_the_fix(tmp_path, document, found):
    (tmp_path / "manifest.json").write_text(json.dumps(document))
    with pytest.raises(ShardError) as caught:
        load_manifest(str(tmp_path))
    message = str(caught.value)
    assert str(tmp_path / "manifest.json") in message and found in message
    assert f"expected {MANIFEST_FORMAT!r}" in message and "shards create --overwrite" in message


def test_a_malformed_manifest_names_the_field(tmp_path):
    with pytest.raises(
        ArtifactError, match=r"split 'train'.shards\[0\] lacks 'sha256': re-create the dataset"
    ):
        Manifest.from_json(
            {
                "format": MANIFEST_FORMAT,
                "classes": ["a"],
                "splits": {
                    "train": {
                        "num_samples": 1,
                        "num_bytes": 1,
                        "class_counts": [1],
                        "shards": [{"path": "t.tar", "num_samples": 1, "num_bytes": 1}],
                    }
                },
            }
        )
    with pytest.raises(ArtifactError, match="'num_samples' is str '3', expected int"):
        Manifest.from_json(
            {
                "format": MANIFEST_FORMAT,
                "classes": [],
                "splits": {"val": {"num_samples": "3", "num_bytes": 0, "class_counts": [], "shards": []}},
            }
        )


def _card() -> dict:
    """A model.json as the trainer writes it."""
    return {
        "format": MODEL_FORMAT,
        "arch": "tiny",
        "num_classes": 2,
        "classes": ["cat", "dog"],
        "input_size": 32,
        "input_size_reason": "--input-size 32",
        "in_channels": 3,
        "small_input_stem": True,
        "normalization": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "scale": 255},
        "metrics": {"epoch": 2, "val_top1": 0.5, "val_top5": 1.0, "val_loss": 0.69, "val_samples": 4},
        "history": [{"epoch": 1, "val_top1": 0.25}, {"epoch": 2, "val_top1": 0.5}],
        "dataset": {"uri": "/data/ds", "manifest_digest": "ab" * 32},
        "model_sha256": "cd" * 32,
        "steps": 8,
        "training": {"epochs": 2, "lr": 0.1},
        "init": None,
        "compile_cache": None,
        "stopped_early": False,
        "created": "2026-01-01T00:00:00Z",
    }


def test_a_model_card_reads_and_writes_back(tmp_path):
    (tmp_path / "model.json").write_text(json.dumps(_card(), indent=1))
    card = ModelCard.read(str(tmp_path))
    assert card.to_json() == _card()
    assert card.dataset is not None and card.dataset.manifest_digest == "ab" * 32
    assert card.best_top1 == 0.5 and card.input_size == 32
    card.write(str(tmp_path / "again.json"))
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "model.json").read_bytes()


def test_a_model_card_without_a_format_is_read_and_one_of_another_is_refused():
    minimal = {"arch": "tiny", "classes": ["a"], "input_size": 16}
    card = ModelCard.from_json(minimal)
    assert card.dataset is None and card.history == [] and card.in_channels == 3
    assert card.to_json() == {"format": MODEL_FORMAT, **minimal}  # a format is always written
    with pytest.raises(
        ArtifactError, match=r"it has format 'tpustream.model/v0', expected 'tpustream.model/v1'"
    ):
        ModelCard.from_json({**minimal, "format": "tpustream.model/v0"}, "gs://b/m/model.json")
    with pytest.raises(ArtifactError, match="gs://b/m/model.json lacks 'input_size'"):
        ModelCard.from_json({"arch": "tiny", "classes": []}, "gs://b/m/model.json")


def _report() -> dict:
    """A metrics.json as evaluate writes it."""
    measured = {"model": "/m", "model_sha256": "cd" * 32, "top1": 0.5, "loss": None, "num_samples": 4}
    return {
        "format": METRICS_FORMAT,
        "dataset": {"uri": "/data/ds", "manifest_digest": "ab" * 32, "val_samples": 4},
        "classes": ["cat", "dog"],
        "candidate": measured,
        "champion": {**measured, "version": 3},
        "champion_note": None,
        "created": "2026-01-01T00:00:00Z",
    }


def test_an_eval_report_reads_and_writes_back_as_strict_json(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps(_report(), indent=1))
    report = EvalReport.read(str(tmp_path))
    assert report.to_json() == _report() and report.dataset.val_samples == 4
    report.write(str(tmp_path / "again.json"))
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "metrics.json").read_bytes()
    nan = EvalReport.from_json({**_report(), "candidate": {"loss": float("nan")}})
    nan.write(str(tmp_path / "nan.json"))
    assert json.loads((tmp_path / "nan.json").read_text())["candidate"]["loss"] is None


def test_an_eval_report_of_another_version_is_refused():
    with pytest.raises(ArtifactError, match="is not a tpustream metrics.json this version reads"):
        EvalReport.from_json({**_report(), "format": "tpustream.metrics/v2"})
    with pytest.raises(ArtifactError, match="lacks 'candidate'"):
        EvalReport.from_json({"dataset": {}, "classes": []})


def test_the_module_imports_no_torch():
    code = "import sys, tpustream.artifacts; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# metrics.json as evaluate wrote it before its evaluations were a type: evaluate_model's keys in its order (the
# per-sample scores' metrics included), the champion's version and paired test appended, a NaN as null, and a
# key this version does not model
_MEASURED = {
    "model": "/runs/7/model",
    "model_sha256": "cd" * 32,
    "arch": "resnet18",
    "split": "val",
    "top1": 0.75,
    "top5": 1.0,
    "loss": None,
    "num_samples": 4,
    "complete": True,
    "per_class_accuracy": [1.0, 0.5, None],
    "unmeasured_classes": ["owl"],
    "confusion_matrix": [[2, 0, 0], [1, 1, 0], [0, 0, 0]],
    "macro_f1": 0.73,
    "balanced_accuracy": 0.75,
    "auprc": 0.9,
    "auroc": None,
    "per_class": {"precision": [0.67, 1.0, None], "recall": [1.0, 0.5, None]},
    "thresholds": [{"threshold": 0.0, "precision": 0.75, "recall": 0.75, "coverage": 1.0}],
    "scores_top_k": 3,
    "scores": "scores.jsonl.gz",
    "seconds": 1.5,
    "device": "cpu",
}


def test_an_eval_report_written_before_evaluations_were_a_type_reads_and_writes_back_byte_for_byte(tmp_path):
    from tpustream.artifacts import Evaluation

    champion = {**_MEASURED, "top1": 0.5, "version": 3, "paired": {"num_samples": 4, "p_value": 0.5}}
    header = _report()
    document = {
        "format": header["format"],
        "dataset": header["dataset"],
        "classes": ["cat", "dog", "owl"],
        "split": "val",
        "candidate": _MEASURED,
        "champion": champion,
        "champion_note": None,
        "created": header["created"],
    }
    (tmp_path / "metrics.json").write_text(json.dumps(document, indent=1))
    report = EvalReport.read(str(tmp_path))
    assert isinstance(report.candidate, Evaluation) and report.candidate.top1 == 0.75
    assert report.candidate.loss is None and report.candidate.has("loss")  # NaN, stored as null: measured
    assert report.candidate.extra == {"device": "cpu"} and report.champion is not None
    assert (report.champion.version, report.champion.paired) == (3, {"num_samples": 4, "p_value": 0.5})
    report.write(str(tmp_path / "again.json"))
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "metrics.json").read_bytes()
    # an evaluation from before the per-sample scores has no macro-F1: not measured, and not written back
    old = Evaluation.from_json({"top1": 0.5, "loss": 0.7})
    assert not old.has("macro_f1") and old.macro_f1 is None and old.to_json() == {"top1": 0.5, "loss": 0.7}
