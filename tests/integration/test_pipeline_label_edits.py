"""Label fixes through the real kfp.local DAG (issue 45, item 3): `pipeline run-local --exclude-keys FILE
--relabel FILE` writes shards without the excluded samples and with the new labels, its manifest records what
was applied and the run report says so; a file naming samples the source lacks is refused before any step."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tpustream.cli.main import app
from tpustream.dataset.manifest import iter_sample_index, load_manifest

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a whole kfp.local run


def _run_local(root, *options):
    return CliRunner().invoke(
        app,
        [
            *("pipeline", "run-local", "--root", root, "--source", "digits", "--model", "tiny"),
            *("--epochs", "1", "--num-shards", "2", "--param", "shards_per_task=2", *options),
        ],
    )


def test_a_run_with_label_fixes_writes_them_into_its_shards_manifest_and_report(tmp_path):
    drop, fix = tmp_path / "drop.txt", tmp_path / "fix.csv"
    drop.write_text("# label_issues.json's sources, checked by hand\n3\n5\n")
    fix.write_text("7,1\n")  # digits' sources are their indices; 7 is a 7
    root = str(tmp_path / "run")

    unknown = tmp_path / "unknown.txt"
    unknown.write_text("3\n00000042\n")  # a key: the pipeline names samples by source only
    refused = _run_local(root, "--exclude-keys", str(unknown))
    assert refused.exit_code != 0
    assert f"exclude_keys {unknown} names 1 sample(s) not in digits (by source): 00000042" in refused.output
    assert not Path(root).exists()  # refused before the run: nothing written

    result = _run_local(root, "--exclude-keys", str(drop), "--relabel", str(fix))
    assert result.exit_code == 0, result.output
    (dataset,) = Path(root).glob("registry/datasets/*")
    manifest = load_manifest(str(dataset))
    assert manifest.label_edits is not None
    assert (manifest.label_edits.exclude_keys, manifest.label_edits.relabel) == (str(drop), str(fix))
    assert manifest.label_edits.excluded == ["3", "5"] and manifest.label_edits.relabelled == {"7": "1"}
    assert sum(manifest.num_samples(split) for split in manifest.splits) == 1797 - 2
    written = {
        entry.source: entry.label
        for split in manifest.splits
        for entry in iter_sample_index(str(dataset), manifest, split)
    }
    assert "3" not in written and "5" not in written and written["7"] == "1"
    assert json.loads((dataset / "manifest.json").read_text())["label_edits"]["excluded"] == ["3", "5"]
    summaries = [path.read_text() for path in Path(root).glob("pipeline-root/*/*/summary")]
    assert summaries and all(
        "Label fixes applied when it was written: 2 sample(s) left out, 1 relabelled" in text
        for text in summaries
    )
