"""The run outcome record (tpustream/run/outcome.py): what the deciding steps write and the exit step reads."""

import json

import pytest

from tpustream.run.outcome import FORMAT, RunOutcome, read_outcome, record_outcome


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


def test_a_step_that_fails_records_its_task_and_error_line_and_a_retry_that_succeeds_clears_it(tmp_path):
    """What the exit step's notification names (issue 42): no runner's final status says which task failed."""
    from tpustream.errors import ConfigError
    from tpustream.run.outcome import RunFailure, failure_recorded, read_failures

    uri = str(tmp_path / "run" / "run-outcome.json")
    assert read_failures(uri) == []
    with pytest.raises(KeyError), failure_recorded(uri, "write-shards-0-4"):
        raise KeyError("shard 3")
    with pytest.raises(ConfigError), failure_recorded(uri, "evaluate-model"):
        raise ConfigError("model.pt does not match its model.json (resnet18)\nsize mismatch for conv1.weight")
    first, second = read_failures(uri)  # the first to fail first
    assert (first.task, first.error) == ("write-shards-0-4", "KeyError: 'shard 3'")
    assert second.line() == "evaluate-model failed: model.pt does not match its model.json (resnet18)"
    assert first.at <= second.at
    with failure_recorded(uri, "write-shards-0-4"):  # KFP's retry of that task, which succeeds
        pass
    with failure_recorded(
        uri, "write-shards-4-8"
    ):  # another fan-out item's success clears nothing of others'
        pass
    assert [failure.task for failure in read_failures(uri)] == ["evaluate-model"]
    assert isinstance(read_failures(uri)[0], RunFailure)
    with pytest.raises(RuntimeError), failure_recorded("", "promote-model"):  # outside a pipeline: nothing
        raise RuntimeError("x")
    assert sorted(p.name for p in (tmp_path / "run" / "failures").iterdir()) == ["evaluate-model.json"]


def test_an_error_line_is_one_short_line():
    from tpustream.errors import ConfigError
    from tpustream.run.outcome import error_line

    assert error_line(ConfigError("--lr 0: give a positive rate")) == "--lr 0: give a positive rate"
    assert error_line(ValueError("")) == "ValueError"
    assert error_line(OSError("disk full\nmore detail")) == "OSError: disk full"
    assert len(error_line(RuntimeError("x" * 10_000))) == 500


def test_a_failure_that_cannot_be_recorded_still_fails_the_step_with_its_own_error(tmp_path, caplog):
    from tpustream.run.outcome import failure_recorded

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ZeroDivisionError), failure_recorded(str(blocker / "run-outcome.json"), "train-model"):
        1 / 0  # noqa: B018
    assert "could not be recorded" in caplog.text


def test_the_promotion_decisions_code_and_class_are_recorded_and_an_outcome_before_codes_reads(tmp_path):
    uri = tmp_path / "run" / "run-outcome.json"
    record_outcome(
        str(uri), step="evaluate", decision="kept", reason="class 3 drops", code="class-drop", class_index=3
    )
    outcome = read_outcome(str(uri))
    assert outcome is not None and (outcome.code, outcome.class_index) == ("class-drop", 3)
    # an outcome file written before codes: read as before, with no code
    uri.write_text(json.dumps({"format": FORMAT, "step": "evaluate", "decision": "kept", "reason": "worse"}))
    assert read_outcome(str(uri)) == RunOutcome(step="evaluate", decision="kept", reason="worse")
    assert read_outcome(str(uri)).code is None
    with pytest.raises(ValueError, match="code 'lost'"):
        RunOutcome(step="evaluate", decision="kept", reason="", code="lost")  # type: ignore[arg-type]
