"""Samples left out or relabelled when shards are written (tpustream/dataset/label_edits.py; ``shards create
--exclude-keys FILE --relabel FILE``): named by source or by key in the dataset being replaced."""

import pytest
from typer.testing import CliRunner

from tpustream.cli import app
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
    with pytest.raises(ConfigError, match=r"--exclude-keys names 2 sample\(s\) not in digits .*: 99999, no-such; name samples"):
        apply_label_edits(source, edits, dataset_uri=str(tmp_path))
    with pytest.raises(ConfigError, match=r"--relabel names classes digits does not have: 7,eleven; its classes are 0, 1"):
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
