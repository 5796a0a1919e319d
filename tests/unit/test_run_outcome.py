"""The run outcome record (tpustream/release/outcome.py): what the deciding steps write and the exit step reads."""

import json

import pytest

from tpustream.release.outcome import FORMAT, RunOutcome, read_outcome, record_outcome


def test_an_outcome_is_replaced_by_the_next_step_and_read_back(tmp_path):
    uri = str(tmp_path / "run" / "run-outcome.json")
    assert read_outcome(uri) is None  # no step got that far
    record_outcome(uri, step="check source", decision="training", reason="new data: 500 images")
    record_outcome(uri, step="evaluate", decision="kept", reason="top1 0.80 < champion 0.85", report="r.html")
    outcome = read_outcome(uri)
    assert outcome == RunOutcome(step="evaluate", decision="kept", reason="top1 0.80 < champion 0.85",
                                 report="r.html")  # fmt: skip
    assert outcome.line() == "kept: top1 0.80 < champion 0.85"
    assert json.loads((tmp_path / "run" / "run-outcome.json").read_text())["format"] == FORMAT


def test_outside_a_pipeline_nothing_is_written_and_a_foreign_file_is_ignored(tmp_path):
    record_outcome("", step="promote", decision="promoted", reason="version 1")  # no uri: nothing, no error
    assert list(tmp_path.iterdir()) == []
    other = tmp_path / "run-outcome.json"
    other.write_text(json.dumps({"format": "something/else", "decision": "promoted"}))
    assert read_outcome(str(other)) is None
    with pytest.raises(ValueError, match="decision 'won'"):
        RunOutcome(step="promote", decision="won", reason="")  # type: ignore[arg-type]


def test_a_failed_write_does_not_fail_the_step(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    record_outcome(str(blocker / "run-outcome.json"), step="promote", decision="promoted", reason="v1")
    assert "could not be written" in caplog.text
