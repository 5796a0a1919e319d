"""The champion's history read back from event files written by hand: the format before events carried
``metric``/``value``/``dataset_digest`` and the one after, corrupt files, order, and the table."""

import json
import logging
import subprocess
import sys

import pytest

from tpustream.registry.history import champion_history, format_history_table
from tpustream.registry.policy import RegistryError

D1, D2 = "d1" * 32, "e2" * 32  # manifest digests of two datasets

OLD_PROMOTED = {  # as promote wrote it before the history keys: the numbers only in the pointer
    "event": "promoted",
    "promoted": True,
    "version": 1,
    "reason": "no champion yet",
    "previous_version": None,
    "candidate": "gs://b/models/first",
    "pointer": {
        "version": 1,
        "model_sha256": "aa" * 32,
        "dataset_digest": D1,
        "metrics": {
            "top1": 0.5,
            "top5": 0.9,
            "loss": 1.25,
            "per_class_accuracy": [0.5, 0.5],
            "num_samples": 10,
        },
        "previous_version": None,
        "promoted": "2024-05-01T12:03:04Z",
    },
    "time": "2024-05-01T12:03:04Z",
}
OLD_REFUSED = {  # ... and the value under the metric's name
    "event": "refused",
    "promoted": False,
    "version": None,
    "reason": "candidate top1 0.4000 vs champion 0.5000: improvement -0.1000 is not above 0",
    "champion_version": 1,
    "candidate": "gs://b/models/worse",
    "top1": 0.4,
    "time": "2024-05-02T08:00:00Z",
}
OLD_ALREADY = {
    "event": "already-champion",
    "promoted": False,
    "version": 1,
    "reason": "already the champion",
    "candidate": "gs://b/models/first",
    "time": "2024-05-02T09:30:00Z",
}
NEW_PROMOTED = {
    "event": "promoted",
    "promoted": True,
    "version": 2,
    "reason": "candidate loss 0.8000 beats champion 1.2500 by +0.4500",
    "previous_version": 1,
    "candidate": "gs://b/models/better",
    "pointer": {**OLD_PROMOTED["pointer"], "version": 2, "previous_version": 1},
    "metric": "loss",
    "value": 0.8,
    "champion_value": 1.25,
    "dataset_digest": D1,
    "dataset": "gs://b/data/d1",
    "metrics_uri": "gs://b/eval/better/metrics.json",
    "time": "2024-05-03T10:00:00.250000Z",
}
NEW_REFUSED = {  # as promote writes it since decisions carry codes
    "event": "refused",
    "promoted": False,
    "version": None,
    "reason": "champion was measured on dataset d1d1d1d1d1d1, the candidate on e2e2e2e2e2e2: evaluate both "
    "on the same shards (tpustream evaluate --registry)",
    "code": "other-dataset",
    "champion_version": 2,
    "candidate": "gs://b/models/other-data",
    "top1": 0.97,
    "metric": "top1",
    "value": 0.97,
    "champion_value": None,
    "dataset_digest": D2,
    "dataset": "gs://b/data/e2",
    "metrics_uri": "gs://b/eval/other/metrics.json",
    "time": "2024-05-03T10:00:00.750000Z",  # the same second as NEW_PROMOTED, after it
}
VERTEX_FAILED = {
    "event": "vertex-upload-failed",
    "version": 2,
    "error": "Forbidden: 403",
    "time": "2024-05-03T10:00:01Z",
}


def write_events(registry, events):
    """Each event in its own file, named as promote names them but in reverse time order: the history must
    sort by ``time``, not by listing order."""
    folder = registry / "events"
    folder.mkdir(parents=True, exist_ok=True)
    for index, event in enumerate(events):
        (folder / f"2099{len(events) - index:04d}T000000-{index:012d}.json").write_text(json.dumps(event))


def test_old_and_new_events_read_as_one_history(tmp_path):
    write_events(tmp_path, [NEW_REFUSED, OLD_ALREADY, NEW_PROMOTED, VERTEX_FAILED, OLD_REFUSED, OLD_PROMOTED])
    history = champion_history(str(tmp_path))
    assert history == [
        {
            "time": "2024-05-01T12:03:04Z",
            "event": "promoted",
            "version": 1,
            "candidate": "gs://b/models/first",
            "dataset_digest": D1,  # from the pointer
            "dataset": None,  # never recorded
            "metric": "top1",  # the default an old event was decided on
            "value": 0.5,
            "champion_value": None,
            "reason": "no champion yet",
            "code": None,  # an event before codes has none
            "class_index": None,
            "champion_version": None,
        },
        {
            "time": "2024-05-02T08:00:00Z",
            "event": "refused",
            "version": None,
            "candidate": "gs://b/models/worse",
            "dataset_digest": None,
            "dataset": None,
            "metric": "top1",  # the key named after the metric
            "value": 0.4,
            "champion_value": None,
            "reason": OLD_REFUSED["reason"],
            "code": None,
            "class_index": None,
            "champion_version": 1,
        },
        {
            "time": "2024-05-02T09:30:00Z",
            "event": "already-champion",
            "version": 1,
            "candidate": "gs://b/models/first",
            "dataset_digest": None,
            "dataset": None,
            "metric": "top1",
            "value": None,
            "champion_value": None,
            "reason": "already the champion",
            "code": None,
            "class_index": None,
            "champion_version": 1,
        },
        {
            "time": "2024-05-03T10:00:00.250000Z",
            "event": "promoted",
            "version": 2,
            "candidate": "gs://b/models/better",
            "dataset_digest": D1,
            "dataset": "gs://b/data/d1",
            "metric": "loss",
            "value": 0.8,
            "champion_value": 1.25,
            "reason": NEW_PROMOTED["reason"],
            "code": None,
            "class_index": None,
            "champion_version": 1,
        },
        {
            "time": "2024-05-03T10:00:00.750000Z",
            "event": "refused",
            "version": None,
            "candidate": "gs://b/models/other-data",
            "dataset_digest": D2,
            "dataset": "gs://b/data/e2",
            "metric": "top1",
            "value": 0.97,
            "champion_value": None,  # measured on other data: not comparable
            "reason": NEW_REFUSED["reason"],
            "code": "other-dataset",
            "class_index": None,
            "champion_version": 2,
        },
    ]  # and no vertex-upload-failed: not a decision
    json.dumps(history, allow_nan=False)  # --json prints it as it is


def test_a_chosen_metric_is_reported_where_the_event_has_it(tmp_path):
    gone = {"metrics_uri": str(tmp_path / "deleted" / "metrics.json")}  # evaluations no longer there
    write_events(tmp_path, [OLD_PROMOTED, OLD_REFUSED, {**NEW_PROMOTED, **gone}, {**NEW_REFUSED, **gone}])
    history = champion_history(str(tmp_path), metric="top5")
    assert [(e["metric"], e["value"], e["champion_value"]) for e in history] == [
        ("top5", 0.9, None),  # a pointer records every metric
        ("top5", None, None),  # a refused event only the one it was decided on
        ("top5", 0.9, None),  # the champion's top5 was not what the decision compared
        ("top5", None, None),
    ]
    assert [e["value"] for e in champion_history(str(tmp_path), metric="loss")] == [1.25, None, 0.8, None]
    with pytest.raises(RegistryError, match="unknown metric 'auc'"):
        champion_history(str(tmp_path), metric="auc")


def test_corrupt_event_files_are_skipped_with_a_warning_naming_them(tmp_path, caplog):
    write_events(tmp_path, [OLD_PROMOTED, NEW_PROMOTED])
    events = tmp_path / "events"
    bad = {
        "truncated.json": '{"event": "promoted", "vers',
        "list.json": "[1, 2]",
        "binary.json": b"\xff\xfe\x00",
        "bad-version.json": json.dumps({**OLD_PROMOTED, "version": "one"}),
        "bad-time.json": json.dumps({**OLD_REFUSED, "time": "yesterday"}),
        "no-time.json": json.dumps({k: v for k, v in OLD_REFUSED.items() if k != "time"}),
        "bad-pointer.json": json.dumps({**OLD_PROMOTED, "pointer": {"metrics": [0.5]}}),
    }
    for name, content in bad.items():
        (events / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    (events / "notes.txt").write_text("not an event")  # not a .json: not read at all
    (events / "future.json").write_text(json.dumps({"event": "retired", "time": "2024-06-01T00:00:00Z"}))
    with caplog.at_level(logging.WARNING, logger="tpustream.registry.history"):
        history = champion_history(str(tmp_path))
    assert [e["version"] for e in history] == [1, 2]  # the good ones, whatever else is there
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == len(bad)
    for name in bad:
        assert any(str(events / name) in message for message in warned), name


def test_a_missing_registry_is_an_error_and_an_empty_one_has_no_history(tmp_path):
    with pytest.raises(RegistryError, match="does not exist: check the path"):
        champion_history(str(tmp_path / "no-such-registry"))
    assert champion_history(str(tmp_path)) == []  # a directory with nothing in it
    (tmp_path / "champion.json").write_text("{}")
    (tmp_path / "events").mkdir()
    assert champion_history(str(tmp_path)) == []


def test_the_table_shows_each_decision_on_one_line_newest_last(tmp_path):
    long_reason = {  # a reason longer than the column, ending in a long URI
        **NEW_REFUSED,
        "reason": "the evaluation is incomplete: it counted 170 of the dataset's 179 val samples (9 missing), "
        "so it cannot be promoted; find the damaged shards with `tpustream shards verify gs://b/data/e2`",
        "time": "2024-05-04T00:00:00Z",
    }
    write_events(tmp_path, [OLD_PROMOTED, OLD_REFUSED, OLD_ALREADY, NEW_PROMOTED, long_reason])
    table = format_history_table(champion_history(str(tmp_path), metric="top1"))
    lines = table.splitlines()
    assert lines[0].split() == ["DATE", "DECISION", "DATASET", "TOP1", "CHAMPION", "REASON"]
    assert len(lines) == 6 and not table.endswith("\n")
    assert lines[1].split()[:7] == ["2024-05-01", "12:03", "UTC", "promoted", "v1", D1[:12], "0.5000"]
    assert lines[1].split("  ")[-1].strip() == "no champion yet"
    assert lines[2].split()[3:6] == ["refused", "-", "0.4000"]  # no digest recorded: "-"
    assert "already champion" in lines[3]
    assert lines[4].split()[3:8] == ["promoted", "v2", D1[:12], "0.5000", "-"]  # decided on loss: no top1
    assert lines[5].startswith("2024-05-04 00:00 UTC  refused") and lines[5].endswith(" ...")
    assert "the evaluation is incomplete: it counted 170 of" in lines[5] and "verify" not in lines[5]
    for header in ("DATASET", "REASON"):  # fixed width: every column starts where its header does
        start = lines[0].index(header)
        assert all(line[start - 2 : start] == "  " and line[start] != " " for line in lines[1:])
    start = lines[0].index("DATASET")
    assert [line[start:].split()[0] for line in lines[1:]] == [D1[:12], "-", "-", D1[:12], D2[:12]]
    assert "0.8000  1.2500" in format_history_table(champion_history(str(tmp_path)))  # each its own metric


def test_the_table_limit_keeps_the_newest(tmp_path):
    write_events(tmp_path, [OLD_PROMOTED, OLD_REFUSED, NEW_PROMOTED, NEW_REFUSED])
    history = champion_history(str(tmp_path))
    newest = format_history_table(history, limit=2).splitlines()
    assert len(newest) == 3 and "promoted  v2" not in newest[1] and "v2" in newest[1]
    assert newest[2].split()[3] == "refused" and D2[:12] in newest[2]
    assert "VALUE" in newest[0] and "loss 0.8000" in newest[1]  # two metrics: each value says which
    assert len(format_history_table(history, limit=10).splitlines()) == 5
    assert format_history_table(history, limit=0).splitlines() == format_history_table([]).splitlines()
    assert format_history_table([]).split() == ["DATE", "DECISION", "DATASET", "VALUE", "CHAMPION", "REASON"]
    with pytest.raises(ValueError, match="limit"):
        format_history_table(history, limit=-1)


def test_the_history_needs_no_torch():
    code = "import sys, tpustream.registry.history; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_champion_history_command_prints_the_table_the_json_and_the_newest(tmp_path):
    from typer.testing import CliRunner

    from tpustream.cli.main import app

    write_events(tmp_path, [NEW_REFUSED, OLD_ALREADY, NEW_PROMOTED, OLD_REFUSED, OLD_PROMOTED])
    runner = CliRunner()
    table = runner.invoke(app, ["champion", "history", str(tmp_path)])
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[0].split()[:3] == ["DATE", "DECISION", "DATASET"]
    assert [line.split()[3] for line in lines[1:]] == [
        "promoted",
        "refused",
        "already",
        "promoted",
        "refused",
    ]
    as_json = runner.invoke(app, ["champion", "history", str(tmp_path), "--json", "--limit", "2"])
    assert as_json.exit_code == 0, as_json.output
    newest = json.loads(as_json.output)
    assert [(e["event"], e["version"], e["dataset_digest"]) for e in newest] == [
        ("promoted", 2, D1),
        ("refused", None, D2),
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no decisions yet" in runner.invoke(app, ["champion", "history", str(empty)]).output
    missing = runner.invoke(app, ["champion", "history", str(tmp_path / "nowhere")])
    assert missing.exit_code != 0 and "does not exist" in missing.output


def test_history_of_another_metric_shows_the_champion_value_its_evaluation_measured(tmp_path):
    """Issue 42: `champion history --metric macro_f1` showed `-` for a champion evaluate had measured: an event
    records the values of the metric it was decided on; the others come from its metrics.json."""
    from typer.testing import CliRunner

    from tpustream.cli.main import app

    evaluation = {
        "format": "tpustream.metrics/v1",
        "dataset": {"uri": "gs://b/data/d1", "manifest_digest": D1, "val_samples": 10},
        "classes": ["a", "b"],
        "candidate": {"top1": 0.4, "top5": 1.0, "loss": 1.3, "macro_f1": 0.3812},
        "champion": {"top1": 0.5, "top5": 1.0, "loss": 1.25, "macro_f1": 0.4567, "version": 1},
    }
    metrics = tmp_path / "eval" / "metrics.json"
    metrics.parent.mkdir()
    metrics.write_text(json.dumps(evaluation))
    refused = {**NEW_REFUSED, "metric": "top1", "value": 0.4, "champion_value": 0.5, "dataset_digest": D1,
               "metrics_uri": str(metrics)}  # fmt: skip
    registry = tmp_path / "registry"
    write_events(registry, [OLD_PROMOTED, refused])
    history = champion_history(str(registry), metric="macro_f1")
    assert [(e["value"], e["champion_value"]) for e in history] == [(None, None), (0.3812, 0.4567)]
    assert [(e["value"], e["champion_value"]) for e in champion_history(str(registry))][1] == (0.4, 0.5)
    shown = CliRunner().invoke(app, ["champion", "history", str(registry), "--metric", "macro_f1"])
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines()[2].split()[5:7] == ["0.3812", "0.4567"]
