"""``tpustream bench import`` at a tiny size: every result line is there, with its keys and ratios."""

import json
import os

import pytest
from typer.testing import CliRunner

from tpustream.cli.main import app

pytestmark = pytest.mark.integration


def test_bench_import_prints_list_create_and_parse_lines(monkeypatch):
    monkeypatch.setenv(
        "STORAGE_EMULATOR_HOST", "http://127.0.0.1:1"
    )  # the bench's own server, then this back
    assert CliRunner().invoke(app, ["bench", "import", "--help"]).exit_code == 0
    args = ["bench", "import", "--images", "20", "--rows", "500", "--repeats", "1", "--workers", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    by_stage = {(line["stage"], line["source"]): line for line in lines}
    assert set(by_stage) == {
        ("list", "import-file"),
        ("list", "image-folder"),
        ("shards-create", "import-file"),
        ("shards-create", "image-folder"),
        ("parse", "jsonl-local"),
    }
    for source in ("import-file", "image-folder"):
        listed, created = by_stage[("list", source)], by_stage[("shards-create", source)]
        assert listed["items"] == created["items"] == 20 and listed["rows_per_s"] > 0
        assert created["images_per_s"] > 0 and created["workers"] == 1
    assert by_stage[("list", "image-folder")]["ratio_vs_image_folder"] == 1.0
    ours = by_stage[("shards-create", "import-file")]
    folder = by_stage[("shards-create", "image-folder")]
    assert ours["ratio_vs_image_folder"] == pytest.approx(
        ours["images_per_s"] / folder["images_per_s"], abs=0.02
    )
    parse = by_stage[("parse", "jsonl-local")]
    assert parse["rows"] == 500 and parse["rows_per_s"] > 0
    assert os.environ["STORAGE_EMULATOR_HOST"] == "http://127.0.0.1:1"
