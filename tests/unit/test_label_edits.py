"""Samples left out or relabelled when shards are written (tpustream/dataset/label_edits.py; ``shards create
--exclude-keys FILE --relabel FILE``): named by source or by key in the dataset being replaced."""

import pytest
from typer.testing import CliRunner

from tpustream.artifacts import LabelEditsApplied
from tpustream.cli import app
from tpustream.dataset.fanout import config_from_pipeline, finalize_dataset, shard_ranges, write_shard_range
from tpustream.dataset.label_edits import LabelEdits, apply_label_edits, read_label_edits
from tpustream.dataset.manifest import iter_sample_index, load_manifest
from tpustream.dataset.plan import ShardConfig
from tpustream.dataset.write import create_shards
from tpustream.errors import ConfigError
from tpustream.sources.builtin import digits_source


def _write(path, text):
    path.write_text(text)
    return str(path)


def test_the_files_are_read_with_comments_and_blank_lines_skipped(tmp_path):
    exclude = _write(tmp_path / "drop.txt", "# checked by hand\n12\n\n  40 \n")
    relabel = _write(tmp_path / "fix.csv", "7,1\n# a comment\n00000031, 3\n")
    edits = read_label_edits(exclude, relabel)
    assert edits == LabelEdits(exclude=frozenset({"12", "40"}), relabel={"7": "1", "00000031": "3"})
    assert read_label_edits(None, None) == LabelEdits()


@pytest.mark.parametrize(
    ("exclude", "relabel", "message"),
    [
        (None, "7\n", r"fix.csv:1: '7' is not a CSV row key,class"),
        (None, "7,1\n7,2\n", r"fix.csv:2: 7 is given two classes, 1 and 2"),
        ("7\n", "7,1\n", r"7 both excluded \(--exclude-keys\) and relabelled \(--relabel\)"),
    ],
)
def test_bad_files_are_refused_naming_the_line(tmp_path, exclude, relabel, message):
    drop = _write(tmp_path / "drop.txt", exclude) if exclude else None
    with pytest.raises(ConfigError, match=message):
        read_label_edits(drop, _write(tmp_path / "fix.csv", relabel))
    with pytest.raises(ConfigError, match="--exclude-keys .*none.txt does not exist"):
        read_label_edits(str(tmp_path / "none.txt"), None)


def test_samples_named_by_source_are_dropped_or_given_their_new_class(tmp_path):
    source = digits_source()  # an item's source is its index in the digits: "17"
    edited = apply_label_edits(
        source, LabelEdits(exclude=frozenset({"3", "5"}), relabel={"7": "1"}), dataset_uri=str(tmp_path)
    )
    assert len(edited.items) == len(source.items) - 2
    refs = {item.ref: item.label for item in edited.items}
    assert 3 not in refs and 5 not in refs and refs[7] == 1 != source.items[7].label
    assert apply_label_edits(source, LabelEdits(), dataset_uri=str(tmp_path)) is source


def test_unknown_samples_and_classes_are_named_in_the_error(tmp_path):
    source = digits_source()
    edits = LabelEdits(exclude=frozenset({"3", "no-such", "99999"}))
    with pytest.raises(
        ConfigError,
        match=r"--exclude-keys names 2 sample\(s\) not in digits .*: 99999, no-such; name samples",
    ):
        apply_label_edits(source, edits, dataset_uri=str(tmp_path))
    with pytest.raises(
        ConfigError, match=r"--relabel names classes digits does not have: 7,eleven; its classes are 0, 1"
    ):
        apply_label_edits(source, LabelEdits(relabel={"7": "eleven"}), dataset_uri=str(tmp_path))


def test_the_next_run_drops_and_relabels_samples_named_by_their_key_in_the_dataset_it_replaces(tmp_path):
    data = str(tmp_path / "digits")
    create_shards(ShardConfig(source="digits", output=data, num_shards=2), progress=False)
    manifest = load_manifest(data)
    first, second = list(iter_sample_index(data, manifest, "val"))[:2]
    new_class = "0" if second.label != "0" else "1"
    exclude = _write(tmp_path / "drop.txt", first.key + "\n")
    relabel = _write(tmp_path / "fix.csv", f"{second.key},{new_class}\n")
    config = ShardConfig(
        source="digits", output=data, num_shards=2, overwrite=True, exclude_keys=exclude, relabel=relabel
    )
    create_shards(config, progress=False)
    again = load_manifest(data)
    assert sum(again.num_samples(split) for split in ("train", "val")) == 1797 - 1
    written = {
        entry.source: entry.label
        for split in ("train", "val")
        for entry in iter_sample_index(data, again, split)
    }
    assert first.source not in written and written[second.source] == new_class


def test_the_cli_takes_both_files_and_names_an_unknown_key(tmp_path):
    exclude = _write(tmp_path / "drop.txt", "00000042\n")
    result = CliRunner().invoke(
        app,
        [
            "shards",
            "create",
            "--source",
            "digits",
            "--output",
            str(tmp_path / "d"),
            "--exclude-keys",
            exclude,
        ],
    )
    assert result.exit_code != 0 and "not in digits (by source) nor in the dataset at" in result.output
    assert "(by key): 00000042;" in result.output


def test_the_manifest_records_what_was_applied(tmp_path):
    data = str(tmp_path / "digits")
    exclude = _write(tmp_path / "drop.txt", "3\n5\n")
    relabel = _write(tmp_path / "fix.csv", "7,1\n")
    config = ShardConfig(source="digits", output=data, num_shards=2, exclude_keys=exclude, relabel=relabel)
    manifest, _ = create_shards(config, progress=False)
    assert (
        load_manifest(data).label_edits
        == manifest.label_edits
        == LabelEditsApplied(
            exclude_keys=exclude, relabel=relabel, excluded=["3", "5"], relabelled={"7": "1"}
        )
    )
    plain = str(tmp_path / "plain")
    manifest, _ = create_shards(ShardConfig(source="digits", output=plain, num_shards=2), progress=False)
    assert manifest.label_edits is None and "label_edits" not in manifest.to_json()  # its bytes as before


def test_the_pipelines_shard_steps_apply_the_files_by_source(tmp_path):
    """plan -> write ranges -> finalize, as the pipeline's tasks call them: every task applies the edits."""
    data = str(tmp_path / "dataset")
    exclude = _write(tmp_path / "drop.txt", "3\n5\n")
    relabel = _write(tmp_path / "fix.csv", "7,1\n")
    config = config_from_pipeline(
        source="digits",
        output=data,
        num_shards=2,
        val_fraction=-1.0,
        upsample=1,
        seed=0,
        exclude_keys=exclude,
        relabel=relabel,
    )
    assert (config.exclude_keys, config.relabel) == (exclude, relabel)
    for start, end in shard_ranges(config, 2):
        write_shard_range(config, start, end)
    manifest = finalize_dataset(config)
    assert sum(manifest.num_samples(split) for split in manifest.splits) == 1797 - 2
    written = {
        entry.source: entry.label
        for split in manifest.splits
        for entry in iter_sample_index(data, manifest, split)
    }
    assert "3" not in written and "5" not in written and written["7"] == "1"
    assert manifest.label_edits is not None and manifest.label_edits.excluded == ["3", "5"]


def test_the_pipeline_refuses_a_bad_file_naming_the_parameter_before_any_shard_is_written(tmp_path):
    """A sample the source lacks, or a key (the pipeline names samples by source only), stops the plan step."""
    data = tmp_path / "dataset"
    exclude = _write(tmp_path / "drop.txt", "3\n00000042\nno-such.png\n")
    relabel = _write(tmp_path / "fix.csv", "7,eleven\n")

    def plan(**files):
        config = config_from_pipeline(
            source="digits", output=str(data), num_shards=2, val_fraction=-1.0, upsample=1, seed=0, **files
        )
        return shard_ranges(config, 2)

    with pytest.raises(ConfigError) as refused:
        plan(exclude_keys=exclude)
    message = str(refused.value)
    assert message.startswith(f"exclude_keys {exclude} names 2 sample(s) not in digits (by source): ")
    assert "00000042, no-such.png;" in message and "the pipeline names samples by source only" in message
    with pytest.raises(
        ConfigError, match=r"^relabel .*fix\.csv names classes digits does not have: 7,eleven"
    ):
        plan(relabel=relabel)
    with pytest.raises(ConfigError, match=r"^relabel .*none\.csv does not exist"):
        plan(relabel=str(tmp_path / "none.csv"))
    assert not data.exists() or not any(data.rglob("*.tar"))  # nothing written
