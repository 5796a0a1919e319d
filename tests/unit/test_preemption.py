"""The slice-wide stop-step agreement (tpustream/train/preemption.py), hosts as threads over one local directory.

The trainer's use of it, with real host processes under the Vertex emulation, is in
tests/integration/test_pipeline_on_vertex.py; this file pins the protocol: everyone stops at the largest
reported step, a missing host makes the others time out with a message naming it, and files of an
earlier attempt never stop this one.
"""

import json
import logging
import threading
import time

import pytest

from tpustream.storage import io as storage
from tpustream.train.preemption import PREEMPTION_DIR, SigtermFlag, StopAgreement


def _agreement(output, host, hosts, flag=None, *, from_step=0, sync_seconds=10.0):
    return StopAgreement(str(output), host=host, hosts=hosts, from_step=from_step, flag=flag or SigtermFlag(),
                         sync_seconds=sync_seconds, poll_seconds=0.05)  # fmt: skip


def _train(agreement, stops, index, *, step_seconds, told_at=None, total=10_000):
    """A host's loop: one step at a time, asking the agreement after each (as train._run does)."""
    done = 0
    while done < total:
        time.sleep(step_seconds)
        done += 1
        if told_at is not None and done == told_at:
            agreement.flag.requested = True  # what SigtermFlag's handler does on SIGTERM
        agreed = agreement.stop_step(done)
        if agreed is not None and done >= agreed:
            break
    stops[index] = done


def test_one_told_host_stops_every_host_at_the_largest_reported_step(tmp_path):
    hosts = 4
    agreements = [_agreement(tmp_path, k, hosts) for k in range(hosts)]
    stops: dict[int, int] = {}
    # hosts run at different speeds (as emulated hosts do; on a TPU slice they are within a step or two)
    threads = [
        threading.Thread(target=_train, args=(agreements[k], stops, k),
                         kwargs={"step_seconds": 0.002 * (k + 1), "told_at": 30 if k == 2 else None})
        for k in range(hosts)
    ]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(stops) == hosts
    reports = {
        json.loads(storage.read_bytes(str(tmp_path / PREEMPTION_DIR / f"host-{k:05d}.json")))["step"]
        for k in range(hosts)
    }
    assert set(stops.values()) == {max(reports)}, (stops, reports)
    assert max(reports) >= 30 and all(a.agreed == max(reports) and not a.timed_out for a in agreements)
    notice = json.loads(storage.read_bytes(str(tmp_path / PREEMPTION_DIR / "notice.json")))
    assert notice["host"] == 2 and notice["step"] == 30
    agreements[1].close(cleanup=True)  # only process 0 cleans up
    assert storage.list_objects(str(tmp_path / PREEMPTION_DIR))
    agreements[0].close(cleanup=True)
    assert storage.list_objects(str(tmp_path / PREEMPTION_DIR)) == []


def test_a_host_that_never_reports_makes_the_others_time_out_naming_it(tmp_path, caplog):
    hosts = 3  # host 2 never starts
    agreements = [_agreement(tmp_path, k, hosts, sync_seconds=1.0) for k in range(2)]
    stops: dict[int, int] = {}
    threads = [
        threading.Thread(target=_train, args=(agreements[k], stops, k),
                         kwargs={"step_seconds": 0.005, "told_at": 7 if k == 1 else None})
        for k in range(2)
    ]  # fmt: skip
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="tpustream.train.preemption"):
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert 1.0 <= time.monotonic() - started < 10
    assert stops[1] == 7  # each stops at its own step: there is no agreement without host 2
    assert all(a.timed_out for a in agreements) and not agreements[0].flag.requested
    assert caplog.text.count("host(s) 2 did not report their step within 1 s (reported: 0@") == 2
    assert "host 1 stops at its own step 7 without the slice's agreement" in caplog.text
    assert "a re-run resumes from the last committed checkpoint" in caplog.text
    for a in agreements:
        a.close()


def test_one_host_needs_no_files_and_stops_after_the_step_in_flight(tmp_path):
    agreement = _agreement(tmp_path, 0, 1)
    assert agreement.stop_step(3) is None
    agreement.flag.requested = True
    assert agreement.stop_step(4) == 4
    assert not (tmp_path / PREEMPTION_DIR).exists()


def test_files_of_an_attempt_that_resumed_elsewhere_are_ignored_and_removed(tmp_path):
    directory = tmp_path / PREEMPTION_DIR
    directory.mkdir()
    for name, step in (("notice.json", 40), ("host-00001.json", 40)):
        (directory / name).write_text(json.dumps({"host": 1, "step": step, "from_step": 25, "time": 0}))
    other = _agreement(tmp_path, 1, 2, from_step=50)  # not process 0: sees the stale notice, ignores it
    time.sleep(0.3)
    assert not other.requested
    primary = _agreement(tmp_path, 0, 2, from_step=50)
    assert sorted(p.name for p in directory.iterdir()) == []  # process 0 removed them on start
    other.flag.requested = True
    stops: dict[int, int] = {}
    t = threading.Thread(target=_train, args=(primary, stops, 0), kwargs={"step_seconds": 0.001})
    t.start()
    assert other.stop_step(55) >= 55
    t.join(timeout=10)
    assert stops[0] == other.agreed
    for a in (primary, other):
        a.close()


def test_stop_step_is_none_until_someone_is_told(tmp_path):
    agreements = [_agreement(tmp_path, k, 2) for k in range(2)]
    time.sleep(0.2)
    assert [a.stop_step(5) for a in agreements] == [None, None]
    assert not (tmp_path / PREEMPTION_DIR).exists()  # nothing written while nobody is preempted
    for a in agreements:
        a.close()


@pytest.mark.parametrize("sync_seconds", [0, -1])
def test_sync_seconds_must_be_positive(tmp_path, sync_seconds):
    from tpustream.train.config import TrainConfig

    with pytest.raises(ValueError, match="--preemption-sync-seconds"):
        TrainConfig(data="d", output=str(tmp_path), preemption_sync_seconds=sync_seconds)


def test_a_host_waiting_for_process_0_reports_its_final_step_when_another_host_is_preempted(tmp_path):
    """A host that finished its steps and waits for process 0's model.json sees the notice of a
    preemption elsewhere: it reports its final step and stops (exit 75), and process 0, behind it,
    trains on to that step. (It used to report only when SIGTERMed itself: process 0 then timed out
    waiting for its report and exited without a model, and the host waited for model.json forever.)"""
    from types import SimpleNamespace

    from tpustream.train.model_artifact import wait_for_primary
    from tpustream.train.preemption import Preempted

    total = 60
    primary, finished = _agreement(tmp_path, 0, 2, sync_seconds=5.0), _agreement(tmp_path, 1, 2)
    outcome: dict[str, object] = {}

    def wait() -> None:
        try:
            wait_for_primary(str(tmp_path), "digest", total, SimpleNamespace(commit_timeout_minutes=0.25),
                              SimpleNamespace(replica_index=1), finished)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - the test looks at what came out
            outcome["error"] = exc

    waiter = threading.Thread(target=wait)
    waiter.start()
    stops: dict[int, int] = {}
    _train(primary, stops, 0, step_seconds=0.01, told_at=10, total=total)
    waiter.join(timeout=20)
    assert isinstance(outcome.get("error"), Preempted), outcome
    assert stops[0] == primary.agreed == total and not primary.timed_out


def test_process_0_keeps_the_files_until_every_host_knows_the_stop_step(tmp_path):
    """Process 0 agrees, leaves and cleans up at once; host 1, told first, still polls for the reports.
    Removing the files then took process 0's report away before host 1 had read it: host 1 timed out and
    stopped at its own step (the Vertex emulation's multi-host SIGTERM test failed so under load)."""
    told, primary = _agreement(tmp_path, 1, 2, sync_seconds=3.0), _agreement(tmp_path, 0, 2, sync_seconds=3.0)
    told.flag.requested = True
    agreed: dict[str, int] = {}
    waiting = threading.Thread(target=lambda: agreed.setdefault("told", told.stop_step(5)))
    waiting.start()  # writes the notice and its report, then polls for process 0's every 0.2 s
    deadline = time.monotonic() + 5
    while not primary.requested and time.monotonic() < deadline:  # process 0's watcher sees the notice
        time.sleep(0.01)
    assert primary.stop_step(7) == 7  # both reports are there: process 0 stops at 7 ...
    primary.close(cleanup=True)  # ... commits `last` and cleans up, as Trainer.preempted does
    waiting.join(timeout=10)
    assert agreed["told"] == 7 and not told.timed_out
    assert storage.list_objects(str(tmp_path / PREEMPTION_DIR)) == []


def test_process_0_removes_old_confirmations_and_does_not_wait_for_hosts_that_never_reported(tmp_path):
    directory = tmp_path / PREEMPTION_DIR
    directory.mkdir()
    # An attempt that resumed from this same step left a confirmation: it must not count for this one.
    (directory / "agreed-00001.json").write_text(json.dumps({"host": 1, "step": 0, "from_step": 0}))
    primary = _agreement(tmp_path, 0, 3, sync_seconds=1.0)  # hosts 1 and 2 never start
    assert not (directory / "agreed-00001.json").exists()
    primary.flag.requested = True
    assert primary.stop_step(4) == 4 and primary.timed_out  # no host reported within 1 s
    started = time.monotonic()
    primary.close(cleanup=True)  # the others time out on the missing hosts too: nothing to wait for
    assert time.monotonic() - started < 0.5
    assert storage.list_objects(str(directory)) == []
