"""The data check (tpustream/dataset/check.py) on small datasets made with create_shards from ImageFolder
directories of generated PNGs: each anomaly found, none on a clean dataset, baselines, thresholds, the CLI."""

import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from tpustream.cli.main import app
from tpustream.dataset import write as shards
from tpustream.dataset.check import DataCheckThresholds, check_dataset
from tpustream.dataset.check_report import percents
from tpustream.dataset.check_result import ANOMALY_CODES
from tpustream.dataset.manifest import manifest_digest
from tpustream.dataset.plan import ShardConfig
from tpustream.run.data_gate import DataCheckFailed, champion_baseline, check_for_pipeline
from tpustream.storage import io as storage


def _folder(root, counts, *, seed=0, size=(12, 10)):
    """An ImageFolder with its own split: ``counts`` = {class: (train images, val images)}, all distinct."""
    rng = np.random.default_rng(seed)
    for name, per_split in counts.items():
        for split, count in zip(("train", "val"), per_split, strict=True):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{i:03d}.png")
    return root


def _dataset(tmp_path, name, counts, *, edit=None, **config):
    """create_shards on a generated folder (``edit(root)`` changes it first); returns the dataset's URI."""
    root = _folder(tmp_path / f"{name}-images", counts, seed=config.pop("seed", 0))
    if edit is not None:
        edit(root)
    out = tmp_path / name
    config.setdefault("num_shards", 2)
    shards.create_shards(ShardConfig(source=str(root), output=str(out), **config), progress=False)
    return str(out)


BALANCED = {"cat": (12, 3), "dog": (12, 3), "fox": (12, 3)}


def _codes(report):
    return [a.code for a in report.anomalies]


def test_a_clean_dataset_has_no_anomalies(tmp_path):
    uri = _dataset(tmp_path, "clean", BALANCED, upsample=3)  # upsampled copies are not duplicates
    report = check_dataset(uri)
    assert report.ok and report.anomalies == [] and report.baseline is None
    facts = report.facts
    assert facts["hash_checks"] and facts["leaked_images"] == 0
    assert facts["splits"]["train"]["samples"] == 3 * 36 and facts["splits"]["train"]["images"] == 36
    assert facts["splits"]["train"]["duplicate_copies"] == 0
    assert facts["splits"]["val"]["formats"] == {"png": 9}
    assert facts["splits"]["val"]["short_side"] == {"min": 10, "median": 10, "max": 10}
    assert facts["skipped"]["rate"] == 0.0
    markdown = report.to_markdown()
    assert "**No anomalies.**" in markdown and "## Anomalies" not in markdown
    assert "| Images in both train and val | 0 | 0 | ok |" in markdown
    document = report.to_json()
    assert document["format"] == "tpustream.datacheck/v1" and document["ok"] is True
    json.dumps(document)  # plain JSON


def test_a_val_image_copied_into_train_is_a_leak_named_by_its_files(tmp_path):
    def leak(root):
        shutil.copy(root / "val/cat/001.png", root / "train/cat/extra.png")

    uri = _dataset(tmp_path, "leaky", BALANCED, edit=leak)
    report = check_dataset(uri)
    assert _codes(report) == ["train-val-leak"]
    (anomaly,) = report.anomalies
    assert "train/cat/extra.png (train)" in anomaly.reason and "val/cat/001.png (val)" in anomaly.reason
    assert anomaly.details["count"] == 1
    markdown = report.to_markdown()
    assert markdown.index("## Anomalies") < markdown.index("## Checks")  # the anomalies first
    assert (
        "train/cat/extra.png" in markdown
        and "| Images in both train and val | 1 | 0 | **anomaly** |" in markdown
    )
    assert "\n" not in report.failure_line() and "data_check=warn" in report.failure_line()
    assert check_dataset(uri, thresholds=DataCheckThresholds(max_leaked_images=1)).ok


def test_exact_duplicates_within_a_split_above_the_fraction(tmp_path):
    def duplicate(root):
        for i in range(2):
            shutil.copy(root / f"train/dog/00{i}.png", root / f"train/dog/copy-{i}.png")

    uri = _dataset(tmp_path, "dups", BALANCED, edit=duplicate)
    report = check_dataset(uri)
    assert _codes(report) == ["duplicate-images"]
    train = report.facts["splits"]["train"]
    assert (train["duplicate_groups"], train["duplicate_copies"], train["images"]) == (2, 2, 38)
    examples = report.anomalies[0].details["examples"]
    groups = sorted([os.path.basename(path) for path in e["sources"]] for e in examples)
    assert groups == [["000.png", "copy-0.png"], ["001.png", "copy-1.png"]]
    assert check_dataset(uri, thresholds=DataCheckThresholds(max_duplicate_fraction=0.06)).ok  # 2/38 = 5.3%
    assert check_dataset(uri, max_examples=1).anomalies[0].details["examples"] == examples[:1]


def test_a_class_without_val_samples(tmp_path):
    uri = _dataset(tmp_path, "no-val-fox", {"cat": (6, 2), "dog": (6, 2), "fox": (6, 0)})
    report = check_dataset(uri)
    assert _codes(report) == ["empty-class"]
    assert report.anomalies[0].details["empty"] == [{"class": "fox", "split": "val"}]
    assert "'fox' (0 val)" in report.anomalies[0].reason


def test_a_dataset_without_val_split(tmp_path):
    root = _folder(tmp_path / "images", {"cat": (6, 0), "dog": (6, 0)})
    shutil.rmtree(root / "val")
    out = tmp_path / "ds"
    shards.create_shards(
        ShardConfig(source=str(root / "train"), output=str(out), num_shards=2, val_fraction=0.0),
        progress=False,
    )
    assert _codes(check_dataset(str(out))) == ["missing-split"]


def test_skipped_rate_above_the_limit(tmp_path):
    def break_some(root):
        for i in range(3):
            (root / f"train/fox/broken-{i}.png").write_bytes(b"\x89PNG\r\n\x1a\n cut short")

    uri = _dataset(tmp_path, "broken", BALANCED, edit=break_some)
    report = check_dataset(uri)
    assert _codes(report) == ["skipped-rate"]
    assert report.facts["skipped"]["rate"] == pytest.approx(3 / 48)
    assert "undecodable 3" in report.anomalies[0].reason and "broken-" in report.anomalies[0].reason
    assert check_dataset(uri, thresholds=DataCheckThresholds(max_skipped_rate=0.07)).ok
    # just past the limit: printed with the decimals that make "above" true (not "6.2% ... above 6.2%")
    (close,) = check_dataset(uri, thresholds=DataCheckThresholds(max_skipped_rate=0.062)).anomalies
    assert close.reason.startswith("6.25% of the source's items") and "above 6.20%" in close.reason
    markdown = check_dataset(uri, thresholds=DataCheckThresholds(max_skipped_rate=0.06249)).to_markdown()
    assert (
        "| Skipped images and rejected rows | 6.250% (3: undecodable 3) | 6.249% | **anomaly** |" in markdown
    )


@pytest.mark.parametrize(
    "value, limit, shown",
    [
        (0.0505, 0.05, ("5.05%", "5.00%")),
        (0.0625, 0.05, ("6.2%", "5.0%")),  # one decimal when it tells them apart
        (0.05, 0.05, ("5.0%", "5.0%")),
        (0.0499, 0.05, ("4.99%", "5.00%")),
        (0.1000001, 0.1, ("10.00001%", "10.00000%")),
        (0.16666, 0.1, ("16.7%", "10.0%")),  # rounded as usual where rounding cannot blur the gap
    ],
)
def test_percents_show_a_value_past_its_limit_as_different(value, limit, shown):
    assert percents(value, limit) == shown


def test_a_class_with_a_few_train_images_is_a_warning_not_an_anomaly(tmp_path):
    """No baseline: a class of 3 train images passes the check, but is said (report, JSON, log, CLI)."""
    uri = _dataset(tmp_path, "tiny", {"cat": (12, 3), "dog": (12, 3), "fox": (3, 1)}, upsample=4)
    report = check_dataset(uri)
    assert report.ok and report.baseline is None  # a warning never fails the check
    (warning,) = report.warnings
    assert warning.code == "tiny-class" and warning.details["classes"] == [
        {"class": "fox", "train_images": 3}
    ]
    assert "1 class(es) with fewer than 10 train images: 'fox' (3)" in warning.reason  # upsampled copies: not
    markdown = report.to_markdown()
    assert "**No anomalies.**" in markdown and "## Warnings" in markdown and "`tiny-class`" in markdown
    assert "| Classes with fewer than 10 train images | 1 | 0 (a warning) | **warning** |" in markdown
    assert report.to_json()["warnings"][0]["code"] == "tiny-class"
    assert check_dataset(uri, thresholds=DataCheckThresholds(min_class_train_samples=3)).warnings == []
    assert check_dataset(uri, thresholds=DataCheckThresholds(min_class_train_samples=0)).warnings == []

    result = CliRunner().invoke(app, ["shards", "check", uri])
    assert result.exit_code == 0, result.output
    assert "WARNING tiny-class: 1 class(es) with fewer than 10 train images" in result.stderr
    assert f"ok: no anomalies in {uri}" in result.stderr

    report_path = str(tmp_path / "report.md")
    found = check_for_pipeline(
        uri, registry="", mode="fail", thresholds=DataCheckThresholds(), report_path=report_path
    )
    assert found is not None and found.ok and [w.code for w in found.warnings] == ["tiny-class"]


def test_imbalanced_classes_get_a_note_naming_the_class_weights_choice(tmp_path, caplog):
    """Not a finding (imbalance is often the data's truth): a class-shares note that names what training
    does about it, --class-weights auto, or that it could."""
    uri = _dataset(tmp_path, "skewed", {"cat": (100, 3), "dog": (24, 3), "fox": (12, 3)}, upsample=2)
    unknown = check_dataset(uri)  # `shards check`: the training run's choice is not known
    assert unknown.ok and not unknown.warnings
    shares = "class shares: max/min 8.3x in train ('cat' 100 images, 'fox' 12)"  # source images, not copies
    assert [n for n in unknown.notes if n.startswith("class shares")] == [
        f"{shares}; consider --class-weights auto (loss weighted by inverse class frequency)"
    ]
    assert unknown.facts["class_balance"]["max_min_ratio"] == pytest.approx(100 / 12)
    report_path = str(tmp_path / "report.md")
    with caplog.at_level("INFO", logger="tpustream.run.data_gate"):
        auto = check_for_pipeline(
            uri,
            registry="",
            mode="fail",
            thresholds=DataCheckThresholds(),
            report_path=report_path,
            class_weights="auto",
        )
    line = f"{shares}; training uses --class-weights auto (loss weighted by inverse class frequency)"
    assert auto is not None and line in auto.notes and line in caplog.text
    with open(report_path) as f:
        assert line in f.read()  # the report's Notes
    plain = check_dataset(uri, class_weights="none")
    assert any("training uses --class-weights none; consider --class-weights auto" in n for n in plain.notes)
    balanced = check_dataset(_dataset(tmp_path, "even", {"cat": (20, 3), "dog": (10, 3)}))  # 2x: no note
    assert not [n for n in balanced.notes if n.startswith("class shares")]


def test_against_a_baseline_new_vanished_shifted_classes_and_a_skipped_rate_jump(tmp_path):
    baseline = _dataset(tmp_path, "baseline", BALANCED)
    same = _dataset(tmp_path, "same", BALANCED, seed=1)  # other images, same classes and shares
    report = check_dataset(same, baseline)
    assert report.ok and report.baseline == baseline
    assert report.facts["baseline"]["share_shifts"][0]["change"] == pytest.approx(0.0)

    typo = _dataset(tmp_path, "typo", {**BALANCED, "foxx": (4, 1)}, seed=2)
    report = check_dataset(typo, baseline)
    assert _codes(report) == ["new-classes"] and "'foxx'" in report.anomalies[0].reason

    gone = _dataset(tmp_path, "gone", {"cat": (12, 3), "dog": (12, 3)}, seed=3)
    report = check_dataset(gone, baseline)
    # a third class gone moves the other two from 1/3 to 1/2 each: 16.7 points
    assert _codes(report) == ["vanished-classes", "class-share-shift"]
    assert report.anomalies[0].details["classes"] == ["fox"]
    assert check_dataset(gone, baseline, DataCheckThresholds(max_class_share_shift=0.2)).anomalies[
        0
    ].code == ("vanished-classes")

    flood = _dataset(tmp_path, "flood", {"cat": (36, 9), "dog": (12, 3), "fox": (12, 3)}, seed=4)
    report = check_dataset(flood, baseline)
    assert _codes(report) == ["class-share-shift"]
    shift = report.anomalies[0].details["shifts"][0]
    assert shift["class"] == "cat" and shift["share"] == pytest.approx(0.6)

    def break_two(root):
        for i in range(2):
            (root / f"train/dog/bad-{i}.jpg").write_bytes(b"not a jpeg")

    worse = _dataset(tmp_path, "worse", BALANCED, edit=break_two, seed=5)  # 2 of 47: 4.3%, under 5%
    report = check_dataset(worse, baseline)
    assert _codes(report) == ["skipped-rate-increase"]
    assert report.facts["baseline"]["skipped_rate"] == 0.0
    markdown = report.to_markdown()
    assert f"Baseline: `{baseline}`" in markdown and "| Skipped rate change | +4.3 points |" in markdown
    assert check_dataset(worse, baseline, DataCheckThresholds(max_skipped_rate_increase=0.05)).ok


def test_a_dataset_written_before_the_sample_index_is_checked_on_its_manifest(tmp_path):
    uri = _dataset(tmp_path, "old", {"cat": (6, 2), "dog": (6, 0)})
    manifest_path = os.path.join(uri, "manifest.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    for split in manifest["splits"].values():
        split.pop("stats")
        for shard in split["shards"]:
            shard.pop("sample_index"), shard.pop("sample_index_sha256")
    manifest["skipped"] = {"count": 0, "sample_slots": 0, "examples": []}
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)
    shutil.rmtree(os.path.join(uri, "index"))
    report = check_dataset(uri)
    assert _codes(report) == ["empty-class"]  # what the manifest alone tells
    assert report.facts["hash_checks"] is False
    assert "Hash checks (exact duplicates, train/val leakage) skipped" in report.notes[0]
    markdown = report.to_markdown()
    assert "not checked (no sample index)" in markdown and "## Notes" in markdown


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_duplicate_fraction": -0.01},
        {"max_skipped_rate": 1.5},
        {"max_class_share_shift": 2.0},
        {"max_skipped_rate_increase": -1.0},
        {"max_leaked_images": -1},
        {"min_class_train_samples": -1},
    ],
)
def test_thresholds_are_validated(kwargs):
    name = next(iter(kwargs)).replace("_", "-")
    with pytest.raises(ValueError, match=f"--{name}"):
        DataCheckThresholds(**kwargs)


def test_anomaly_codes_are_ordered_by_seriousness():
    assert ANOMALY_CODES.index("train-val-leak") < ANOMALY_CODES.index("class-share-shift")


# --------------------------------------------------------------------------- the CLI


def test_cli_check_exits_1_with_one_line_per_anomaly(tmp_path):
    def leak(root):
        shutil.copy(root / "val/dog/000.png", root / "train/dog/leaked.png")
        shutil.copy(root / "train/cat/000.png", root / "train/cat/again.png")

    uri = _dataset(tmp_path, "leaky", BALANCED, edit=leak)
    report_path = tmp_path / "reports" / "check.md"
    runner = CliRunner()
    result = runner.invoke(app, ["shards", "check", uri, "--report", str(report_path)])
    assert result.exit_code == 1, result.output
    assert f"report: {report_path}" in result.stdout
    anomalies = [line for line in result.stderr.splitlines() if line.startswith("ANOMALY")]
    assert [line.split(":")[0] for line in anomalies] == [
        "ANOMALY train-val-leak",
        "ANOMALY duplicate-images",
    ]
    assert "error: 2 anomalies in" in result.stderr and "Traceback" not in result.output
    assert "train/dog/leaked.png" in report_path.read_text()

    warned = runner.invoke(app, ["shards", "check", uri, "--json", "--warn-only", "--max-leaked-images", "1"])
    assert warned.exit_code == 0, warned.output
    document = json.loads(warned.stdout)
    assert [a["code"] for a in document["anomalies"]] == ["duplicate-images"]
    assert document["thresholds"]["max_leaked_images"] == 1

    clean = _dataset(tmp_path, "clean", BALANCED, seed=7)
    ok = runner.invoke(app, ["shards", "check", clean, "--baseline", uri])
    assert ok.exit_code == 0 and "**No anomalies.**" in ok.stdout and f"Baseline: `{uri}`" in ok.stdout

    bad = runner.invoke(app, ["shards", "check", uri, "--max-skipped-rate", "2"])
    assert bad.exit_code == 2 and "--max-skipped-rate must be a fraction in [0, 1]" in bad.stderr
    missing = runner.invoke(app, ["shards", "check", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "no dataset at" in missing.stderr


# --------------------------------------------------------------------------- the pipeline's step


def _registry_with_champion(tmp_path, dataset, digest=None):
    """A registry as promote leaves it: champion.json -> versions/1 whose model.json names its dataset."""
    registry = str(tmp_path / "registry")
    card = {
        "arch": "tiny",
        "classes": ["cat", "dog"],
        "input_size": 32,
        "dataset": {"uri": dataset, "manifest_digest": digest or manifest_digest(dataset)},
    }
    storage.write_bytes(os.path.join(registry, "versions", "1", "model.json"), json.dumps(card).encode())
    storage.write_bytes(os.path.join(registry, "champion.json"), json.dumps({"version": 1}).encode())
    return registry


def test_the_champion_s_training_data_is_the_baseline(tmp_path):
    empty = str(tmp_path / "empty-registry")
    assert champion_baseline(empty) == (None, "no champion yet: the first run has nothing to compare with")
    baseline = _dataset(tmp_path, "baseline", BALANCED)
    assert champion_baseline(_registry_with_champion(tmp_path, baseline)) == (
        baseline,
        "the training data of champion version 1",
    )
    changed, note = champion_baseline(_registry_with_champion(tmp_path / "b", baseline, digest="0" * 64))
    assert changed is None and "changed since it trained" in note
    gone, note = champion_baseline(
        _registry_with_champion(tmp_path / "c", str(tmp_path / "nowhere"), "0" * 64)
    )
    assert gone is None and "is gone" in note


def test_the_pipeline_step_fails_warns_or_stays_off(tmp_path):
    baseline = _dataset(tmp_path, "baseline", BALANCED)
    registry = _registry_with_champion(tmp_path, baseline)
    candidate = _dataset(tmp_path, "typo", {**BALANCED, "foxx": (4, 1)}, seed=2)
    report_path = str(tmp_path / "out" / "report.md")
    step = dict(registry=registry, thresholds=DataCheckThresholds(), report_path=report_path)

    with pytest.raises(DataCheckFailed, match=r"1 anomaly, new-classes: .*'foxx'.*report: gs://r/report.md"):
        check_for_pipeline(candidate, mode="fail", report_uri="gs://r/report.md", **step)
    with open(report_path) as f:
        text = f.read()
    assert (
        "`new-classes`" in text
        and f"Baseline: `{baseline}` (the training data of champion version 1)" in text
    )

    report = check_for_pipeline(candidate, mode="warn", **step)
    assert report is not None and _codes(report) == ["new-classes"]
    assert check_for_pipeline(candidate, mode="off", **step) is None
    with open(report_path) as f:
        assert "Not checked" in f.read()
    with pytest.raises(ValueError, match="data_check 'strict' is not one of fail, warn, off"):
        check_for_pipeline(candidate, mode="strict", **step)


def test_a_test_split_is_counted_and_its_leaks_into_train_or_val_are_found(tmp_path):
    def add_test(root):
        rng = np.random.default_rng(7)  # other pixels than train's and val's
        for name in BALANCED:
            (root / "test" / name).mkdir(parents=True)
            for i in range(2):
                pixels = rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / "test" / name / f"{i:03d}.png")

    clean = check_dataset(_dataset(tmp_path, "clean", BALANCED, edit=add_test))
    assert clean.ok and clean.facts["test_leaked_images"] == 0
    assert clean.facts["splits"]["test"]["samples"] == 6
    assert clean.facts["splits"]["test"]["class_counts"] == {"cat": 2, "dog": 2, "fox": 2}
    assert "| Test images also in train or val | 0 | 0 | ok |" in clean.to_markdown()

    def leak(root):
        add_test(root)
        shutil.copy(root / "train/fox/004.png", root / "test/fox/from-train.png")
        shutil.copy(root / "val/dog/001.png", root / "test/dog/from-val.png")

    report = check_dataset(_dataset(tmp_path, "leaky", BALANCED, edit=leak))
    assert _codes(report) == ["test-leak"]  # train and val are still apart
    (anomaly,) = report.anomalies
    assert anomaly.details["count"] == 2 and report.facts["leaked_images"] == 0
    found = sorted(
        (split, os.path.relpath(path, report.dataset + "-images"))
        for example in anomaly.details["examples"]
        for split, paths in example.items()
        if split != "sha256"
        for path in paths
    )
    assert found == [
        ("test", "test/dog/from-val.png"),
        ("test", "test/fox/from-train.png"),
        ("train", "train/fox/004.png"),
        ("val", "val/dog/001.png"),
    ]
    assert "2 test image(s) are also in train or val" in anomaly.reason
    assert "Test images also in train or val (at most 5):" in report.to_markdown()
    assert check_dataset(report.dataset, thresholds=DataCheckThresholds(max_leaked_images=2)).ok
