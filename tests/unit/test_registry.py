"""The registry's storage primitives on a local directory: strict JSON, the champion pointer's
compare-and-swap, create-only version claims and events, the health check's messages, trained-on markers."""

import dataclasses
import json
import os
import threading
from datetime import datetime, timezone

import pytest

from tpustream.registry import events as event_log
from tpustream.registry import store as registry
from tpustream.registry.history import champion_history
from tpustream.registry.policy import RegistryError
from tpustream.registry.store import ChampionPointer
from tpustream.storage import io as storage


def test_json_bytes_writes_null_for_every_non_finite_number():
    document = {
        "top1": float("nan"),
        "loss": float("inf"),
        "per_class": [0.5, float("-inf")],
        "pair": (1, 2.5),
    }
    written = registry.json_bytes(document)
    assert b"NaN" not in written and b"Infinity" not in written
    assert json.loads(written) == {"top1": None, "loss": None, "per_class": [0.5, None], "pair": [1, 2.5]}
    assert registry.json_bytes({"a": 1}, indent=1) == b'{\n "a": 1\n}'


def test_the_champion_pointer_is_replaced_only_from_the_generation_read(tmp_path):
    root = str(tmp_path / "registry")
    assert registry.read_pointer(root) == (None, 0) and registry.read_champion(root) is None
    registry.replace_champion(root, ChampionPointer.from_json({"version": 1, "top1": float("nan")}), 0)
    pointer, generation = registry.read_pointer(root)
    assert pointer is not None and pointer.to_json() == {"version": 1, "top1": None} and generation != 0
    second = ChampionPointer.from_json({"version": 2})
    with pytest.raises(storage.PreconditionFailed):  # another promotion's stale read: must decide again
        registry.replace_champion(root, second, 0)
    registry.replace_champion(root, second, generation)
    assert registry.read_champion(root) == second


# champion.json as promote wrote it before the pointer was a type (keys in its order, a NaN loss as null, a
# key this version does not model): it reads into ChampionPointer and writes back byte for byte
OLD_POINTER = (
    '{"version": 3, "model_sha256": "ab12", "dataset_digest": "d1", "metrics": {"top1": 0.9, "top5": 1.0, '
    '"loss": null, "per_class_accuracy": [0.8, null], "num_samples": 40, "split": "val"}, "previous_version": 2, '
    '"promoted": "2026-01-02T03:04:05Z", "note": "restored by hand"}'
)


def test_a_pointer_written_by_the_old_code_reads_and_writes_back_unchanged(tmp_path):
    root = str(tmp_path)
    (tmp_path / "champion.json").write_text(OLD_POINTER)
    pointer = registry.read_champion(root)
    assert pointer is not None
    assert (pointer.version, pointer.previous_version, pointer.dataset_digest) == (3, 2, "d1")
    assert pointer.metrics["split"] == "val" and pointer.extra == {"note": "restored by hand"}
    assert registry.json_bytes(pointer.to_json()).decode() == OLD_POINTER
    _, generation = registry.read_pointer(root)
    registry.replace_champion(root, pointer, generation)
    assert (tmp_path / "champion.json").read_text() == OLD_POINTER


def test_a_corrupt_pointer_says_how_to_restore_it(tmp_path):
    root = str(tmp_path)
    (tmp_path / "champion.json").write_text('{"no": "version"}')
    with pytest.raises(
        RegistryError, match=r"champion.json is corrupt .*newest 'promoted' event under .*events"
    ):
        registry.read_champion(root)


def test_claiming_a_version_is_idempotent_per_model_and_never_reuses_a_number(tmp_path):
    root = str(tmp_path)
    assert registry.claim_version(root, "aa" * 32, "gs://b/first") == 1
    assert registry.claim_version(root, "aa" * 32, "gs://b/first-again") == 1  # the same weights
    assert registry.claim_version(root, "bb" * 32, "gs://b/second") == 2
    versions = registry.list_versions(root)
    assert sorted(versions) == [1, 2]
    assert versions[1]["source"] == "gs://b/first"  # the retry did not rewrite version 1
    assert registry.version_uri(root, 2) == os.path.join(root, "versions", "2")


def test_racing_claims_each_get_their_own_version(tmp_path):
    root = str(tmp_path)
    models = [f"{index:02x}" * 32 for index in range(8)]
    claimed: dict[str, int] = {}
    barrier = threading.Barrier(len(models), timeout=30)

    def claim(sha: str) -> None:
        barrier.wait()  # all list the versions at about the same time: the create-only write decides
        claimed[sha] = registry.claim_version(root, sha, f"candidate-{sha[:2]}")

    threads = [threading.Thread(target=claim, args=(sha,)) for sha in models]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed.values()) == list(range(1, len(models) + 1))
    versions = registry.list_versions(root)
    assert {number: record["model_sha256"] for number, record in versions.items()} == {
        number: sha for sha, number in claimed.items()
    }


def test_filling_a_version_copies_the_candidate_and_checks_its_weights(tmp_path):
    root, candidate = str(tmp_path / "registry"), tmp_path / "candidate"
    candidate.mkdir()
    (candidate / "model.pt").write_bytes(b"weights")
    (candidate / "model.json").write_text("{}")
    (candidate / "metrics.json").write_text("{}")
    sha = storage.sha256(str(candidate / "model.pt"))
    number = registry.claim_version(root, sha, str(candidate))
    registry.fill_version(root, number, str(candidate), str(candidate / "metrics.json"), sha)
    assert sorted(os.listdir(registry.version_uri(root, number))) == [
        "metrics.json",
        "model.json",
        "model.pt",
        "version.json",
    ]
    with pytest.raises(RegistryError, match="changed while it was being promoted"):
        registry.fill_version(root, number, str(candidate), str(candidate / "metrics.json"), "cc" * 32)
    (candidate / "model.json").unlink()
    with pytest.raises(RegistryError, match="lacks model.json: not a complete model artifact"):
        registry.fill_version(root, number, str(candidate), str(candidate / "metrics.json"), sha)


def _refused(reason: str, value: float) -> event_log.DecisionEvent:
    return event_log.DecisionEvent(
        event="refused",
        promoted=False,
        version=None,
        reason=reason,
        code="no-improvement",
        candidate="gs://b/candidate",
        metric="top1",
        split="val",
        value=value,
        champion_value=0.5,
        dataset_digest="d1",
        dataset=None,
        metrics_uri="gs://b/metrics.json",
        champion_version=1,
    )


def test_events_are_logged_in_order_each_a_new_file(tmp_path):
    root = str(tmp_path)
    for number in range(5):
        event_log.log_event(root, _refused(str(number), float("nan")))
    uris = event_log.list_events(root)
    assert len(uris) == 5 and uris == sorted(uris)
    events = [event_log.read_event(uri) for uri in uris]
    assert all(event["value"] is None and event["top1"] is None for event in events)  # strict JSON
    by_time = sorted(events, key=lambda event: event["time"])  # names sort by the second; times by the µs
    assert [event["reason"] for event in by_time] == [str(number) for number in range(5)]
    assert len({event["time"] for event in events}) == 5
    for uri, event in zip(uris, events, strict=True):  # the file name and ``time`` name the same second
        second = datetime.strptime(event["time"], "%Y-%m-%dT%H:%M:%S.%fZ").strftime("%Y%m%dT%H%M%S")
        assert os.path.basename(uri).startswith(second + "-")
    (tmp_path / "events" / "notes.txt").write_text("not an event")
    assert event_log.list_events(root) == uris


def test_a_refused_event_keeps_the_keys_and_order_the_old_writer_gave_it(tmp_path):
    # the old promote wrote {"event", **outcome, "candidate", <metric>: value, **record}: the history reads both
    # (the decision's code follows its reason)
    written = _refused("worse", 0.4).to_json()
    assert list(written) == [
        "event",
        "promoted",
        "version",
        "reason",
        "code",
        "champion_version",
        "candidate",
        "top1",
        "metric",
        "split",
        "value",
        "champion_value",
        "dataset_digest",
        "dataset",
        "metrics_uri",
    ]
    assert written["top1"] == written["value"] == 0.4


def test_a_decisions_code_and_class_go_through_the_event_file_into_the_history(tmp_path):
    """What the decision was travels as its code (and class), never to be parsed back out of ``reason``; an
    event without a class writes none."""
    root = str(tmp_path)
    dropped = dataclasses.replace(_refused("class 1 falls", 0.9), code="class-drop", class_index=1)
    event_log.log_event(root, dropped)
    event_log.log_event(root, _refused("worse", 0.4))
    events = [event_log.read_event(uri) for uri in event_log.list_events(root)]
    first, second = sorted(events, key=lambda event: event["reason"])  # one second: names in any order
    assert (first["code"], first["class_index"]) == ("class-drop", 1)
    assert second["code"] == "no-improvement" and "class_index" not in second
    entries = sorted(champion_history(root), key=lambda entry: entry["reason"])
    assert [(e["reason"], e["code"], e["class_index"]) for e in entries] == [
        ("class 1 falls", "class-drop", 1),
        ("worse", "no-improvement", None),
    ]


def test_an_event_is_never_overwritten(tmp_path, monkeypatch):
    root = str(tmp_path)

    class FrozenClock(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2024, 5, 1, 12, 3, 4, 5, tzinfo=timezone.utc)

    class SameId:
        hex = "ab" * 16

    # Force the collision a random id makes all but impossible: the second write must fail, not replace.
    monkeypatch.setattr(event_log, "datetime", FrozenClock)
    monkeypatch.setattr(event_log.uuid, "uuid4", SameId)
    event_log.log_event(root, event_log.UploadFailedEvent(version=1, error="OSError: boom"))
    with pytest.raises(storage.PreconditionFailed):
        event_log.log_event(root, _refused("worse", 0.4))
    [uri] = event_log.list_events(root)
    assert os.path.basename(uri) == "20240501T120304-abababababab.json"
    assert event_log.read_event(uri) == {
        "event": "vertex-upload-failed",
        "version": 1,
        "error": "OSError: boom",
        "time": "2024-05-01T12:03:04.000005Z",
    }


def test_read_event_raises_on_a_file_that_is_not_json(tmp_path):
    (tmp_path / "bad.json").write_bytes(b"{not json")
    with pytest.raises(ValueError):
        event_log.read_event(str(tmp_path / "bad.json"))


def test_champion_status_says_what_is_wrong_and_how_to_repair_it(tmp_path):
    missing = str(tmp_path / "nowhere")
    assert registry.missing_registry(missing) is not None
    assert registry.champion_status(missing).to_json() == {
        "registry": missing,
        "champion": None,
        "ok": False,
        "message": f"registry {missing} does not exist: check the path "
        "(a registry directory is created by its first `tpustream promote`)",
    }
    root = str(tmp_path / "registry")
    os.makedirs(root)
    assert registry.missing_registry(root) is None
    assert registry.champion_status(root + "/").to_json() == {
        "registry": root,
        "champion": None,
        "ok": True,
        "message": "no champion yet",
    }
    registry.claim_version(root, "aa" * 32, "gs://b/first")
    registry.replace_champion(root, ChampionPointer.from_json({"version": 1}), 0)
    target = registry.version_uri(root, 1)
    assert registry.champion_status(root).message == (
        f"champion.json names version 1, but {target} lacks model.pt, model.json. Repair: restore that "
        "version's files, or point champion.json at a complete version (present: [1]) taken from the newest "
        f"'promoted' event under {root}/events"
    )
    for name in ("model.pt", "model.json"):
        storage.write_bytes(storage.join(target, name), b"{}")
    status = registry.champion_status(root)
    assert status.ok and status.message == "champion is version 1"
    assert status.champion is not None and status.champion.to_json() == {"version": 1}


def test_trained_markers_and_dataset_locations_are_content_addressed(tmp_path):
    fingerprint, settings = "f" * 64, "5" * 64
    assert registry.dataset_uri(str(tmp_path / "datasets") + "/", fingerprint) == str(
        tmp_path / "datasets" / ("f" * 16)
    )
    marker = registry.trained_marker(str(tmp_path / "registry"), fingerprint, settings)
    assert marker == str(tmp_path / "registry" / "trained" / f"{'f' * 16}-{'5' * 12}.json")
    registry.record_trained(marker, dataset="gs://b/datasets/ffff", model="gs://b/run/model", decision="kept")
    record = registry.read_trained(marker)
    assert (record.dataset, record.model, record.decision) == (
        "gs://b/datasets/ffff",
        "gs://b/run/model",
        "kept",
    )
    assert record.created.endswith("Z")


def test_a_version_with_an_unreadable_version_json_is_skipped_not_claimed_again(tmp_path, caplog):
    """A damaged versions/<n>/version.json used to make every later claim retry n forever (the create-only
    write kept failing on the number the readable versions pointed to). Now n stays taken and is named."""
    import threading

    from tpustream.registry.store import claim_version

    registry = str(tmp_path)
    first = claim_version(registry, "aa" * 32, "gs://b/one")
    (tmp_path / "versions" / "2").mkdir(parents=True)
    (tmp_path / "versions" / "2" / "version.json").write_text("{not json")
    claimed: list[int] = []
    worker = threading.Thread(
        target=lambda: claimed.append(claim_version(registry, "bb" * 32, "gs://b/two")), daemon=True
    )
    with caplog.at_level("WARNING", logger="tpustream.registry.store"):
        worker.start()
        worker.join(timeout=20)
    assert not worker.is_alive(), "claim_version loops on the unreadable version"
    assert (first, claimed) == (1, [3])
    assert "version(s) 2 under" in caplog.text and "unreadable version.json" in caplog.text
