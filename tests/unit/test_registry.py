"""The registry's storage primitives on a local directory: strict JSON, the champion pointer's
compare-and-swap, create-only version claims and events, the health check's messages, trained-on markers."""

import json
import os
import threading
from datetime import datetime, timezone

import pytest

from tpustream.registry import store as registry
from tpustream.registry.policy import RegistryError
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
    registry.replace_champion(root, {"version": 1, "top1": float("nan")}, 0)
    pointer, generation = registry.read_pointer(root)
    assert pointer == {"version": 1, "top1": None} and generation != 0
    with pytest.raises(storage.PreconditionFailed):  # another promotion's stale read: must decide again
        registry.replace_champion(root, {"version": 2}, 0)
    registry.replace_champion(root, {"version": 2}, generation)
    assert registry.read_champion(root) == {"version": 2}


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


def test_events_are_logged_in_order_each_a_new_file(tmp_path):
    root = str(tmp_path)
    for number in range(5):
        registry.log_event(root, {"event": "refused", "number": number, "value": float("nan")})
    uris = registry.list_events(root)
    assert len(uris) == 5 and uris == sorted(uris)
    events = [registry.read_event(uri) for uri in uris]
    assert all(event["value"] is None for event in events)  # strict JSON
    by_time = sorted(events, key=lambda event: event["time"])  # names sort by the second; times by the µs
    assert [event["number"] for event in by_time] == list(range(5))
    assert len({event["time"] for event in events}) == 5
    for uri, event in zip(uris, events, strict=True):  # the file name and ``time`` name the same second
        second = datetime.strptime(event["time"], "%Y-%m-%dT%H:%M:%S.%fZ").strftime("%Y%m%dT%H%M%S")
        assert os.path.basename(uri).startswith(second + "-")
    (tmp_path / "events" / "notes.txt").write_text("not an event")
    assert registry.list_events(root) == uris


def test_an_event_is_never_overwritten(tmp_path, monkeypatch):
    root = str(tmp_path)

    class FrozenClock(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2024, 5, 1, 12, 3, 4, 5, tzinfo=timezone.utc)

    class SameId:
        hex = "ab" * 16

    # Force the collision a random id makes all but impossible: the second write must fail, not replace.
    monkeypatch.setattr(registry, "datetime", FrozenClock)
    monkeypatch.setattr(registry.uuid, "uuid4", SameId)
    registry.log_event(root, {"event": "promoted", "version": 1})
    with pytest.raises(storage.PreconditionFailed):
        registry.log_event(root, {"event": "refused"})
    [uri] = registry.list_events(root)
    assert os.path.basename(uri) == "20240501T120304-abababababab.json"
    assert registry.read_event(uri) == {
        "event": "promoted",
        "version": 1,
        "time": "2024-05-01T12:03:04.000005Z",
    }


def test_read_event_raises_on_a_file_that_is_not_json(tmp_path):
    (tmp_path / "bad.json").write_bytes(b"{not json")
    with pytest.raises(ValueError):
        registry.read_event(str(tmp_path / "bad.json"))


def test_champion_status_says_what_is_wrong_and_how_to_repair_it(tmp_path):
    missing = str(tmp_path / "nowhere")
    assert registry.missing_registry(missing) is not None
    assert registry.champion_status(missing) == {
        "registry": missing,
        "champion": None,
        "ok": False,
        "message": f"registry {missing} does not exist: check the path "
        "(a registry directory is created by its first `tpustream promote`)",
    }
    root = str(tmp_path / "registry")
    os.makedirs(root)
    assert registry.missing_registry(root) is None
    assert registry.champion_status(root + "/") == {
        "registry": root,
        "champion": None,
        "ok": True,
        "message": "no champion yet",
    }
    registry.claim_version(root, "aa" * 32, "gs://b/first")
    registry.replace_champion(root, {"version": 1}, 0)
    target = registry.version_uri(root, 1)
    assert registry.champion_status(root)["message"] == (
        f"champion.json names version 1, but {target} lacks model.pt, model.json. Repair: restore that "
        "version's files, or point champion.json at a complete version (present: [1]) taken from the newest "
        f"'promoted' event under {root}/events"
    )
    for name in ("model.pt", "model.json"):
        storage.write_bytes(storage.join(target, name), b"{}")
    status = registry.champion_status(root)
    assert (
        status["ok"] and status["message"] == "champion is version 1" and status["champion"] == {"version": 1}
    )


def test_trained_markers_and_dataset_locations_are_content_addressed(tmp_path):
    fingerprint, settings = "f" * 64, "5" * 64
    assert registry.dataset_uri(str(tmp_path / "datasets") + "/", fingerprint) == str(
        tmp_path / "datasets" / ("f" * 16)
    )
    marker = registry.trained_marker(str(tmp_path / "registry"), fingerprint, settings)
    assert marker == str(tmp_path / "registry" / "trained" / f"{'f' * 16}-{'5' * 12}.json")
    registry.record_trained(marker, dataset="gs://b/datasets/ffff", model="gs://b/run/model", decision="kept")
    record = registry.read_trained(marker)
    assert {key: record[key] for key in ("dataset", "model", "decision")} == {
        "dataset": "gs://b/datasets/ffff",
        "model": "gs://b/run/model",
        "decision": "kept",
    }
    assert record["created"].endswith("Z")


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
