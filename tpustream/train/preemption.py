"""Preemption: SIGTERM becomes a flag checked between steps, and every host of a slice stops at the SAME step.

One host is usually told first (Spot/Flex-start capacity is reclaimed VM by VM; the maintenance event
reaches hosts at different moments). If that host left the loop on its own while the others entered the
next step's collectives, the slice would hang until Vertex killed it and everything since the last
periodic checkpoint would be lost. So the hosts agree on a stop step through files under
``OUTPUT/_preemption/`` (the storage seam: GCS on a slice, local disk in tests):

1. A host that gets SIGTERM writes ``notice.json`` (create-only; the first one wins).
2. Every host watches for ``notice.json`` in a background thread (one metadata read per
   ``POLL_SECONDS``; nothing else touches storage while no preemption is under way).
3. A host that knows of a preemption reports, at its next step boundary, the steps it has completed in
   ``host-<k>.json``, then waits until all N hosts have reported (at most ``sync_seconds``).
4. The stop step is the largest reported step. A host behind trains on to it (on a slice each step's
   collectives span every host, so the steps up to the largest one were already issued by the host that
   reported it); then process 0 commits ``last`` (``tpustream/train/trainer.py``), and every host exits 75.
5. Each host, once it knows where it stops, writes ``agreed-<k>.json``. Process 0 removes the files only
   when every host has (or ``sync_seconds`` after it left the loop): removing them as soon as process 0
   itself had agreed left a host still reading the reports without process 0's, to time out and stop at
   its own step (seen in the Vertex emulation under load).

No host waits forever: one that does not see every report within ``sync_seconds`` logs which hosts are
missing and stops where it is (process 0 still commits ``last`` at its own, consistent step; exit 75, so
the retry resumes from there). Reports carry the global step the run resumed from, so files left by an
earlier attempt that resumed elsewhere are ignored; process 0 removes them when it starts.

The default ``sync_seconds`` (10) leaves most of the 30 s Compute Engine gives a preempted Spot VM
between the preemption notice and the hard stop (cloud.google.com/compute/docs/instances/spot#preemption)
for the remaining steps and the checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, NoReturn

from tpustream.storage import io as storage

__all__ = [
    "SigtermFlag",
    "StopAgreement",
    "POLL_SECONDS",
    "PREEMPTION_DIR",
    "PREEMPTED_EXIT_CODE",
    "Preempted",
    "exit_preempted",
    "preempted_error",
    "exit_now",
]

log = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: "try again" — the job is restarted and resumes from `last`


class Preempted(RuntimeError):
    """SIGTERM arrived: the current step finished and `last` was written. Exit with PREEMPTED_EXIT_CODE."""


def exit_preempted(exc: Preempted) -> NoReturn:
    """Say why and leave with PREEMPTED_EXIT_CODE at once. ``os._exit``, not ``sys.exit``: the checkpoint is
    committed, and an interpreter teardown with XLA's runtime threads still up can abort (SIGABRT, exit
    134: "terminate called without an active exception"), which Vertex would read as a crash."""
    print(f"tpustream: {exc}; exit {PREEMPTED_EXIT_CODE} (run again to resume)", file=sys.stderr, flush=True)
    exit_now(PREEMPTED_EXIT_CODE)


def exit_now(code: int) -> NoReturn:
    """Flush logs and leave with ``code`` without the interpreter teardown (``exit_preempted``: a
    preempted or interrupted process must not wait on XLA's or the loader's threads)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


POLL_SECONDS = 2.0  # how often each host looks for another host's notice
PREEMPTION_DIR = "_preemption"


class SigtermFlag:
    """Turns SIGTERM (a preemption) and SIGINT (Ctrl-C) into a flag checked between steps: the step in flight
    finishes, `last` is committed, and the run exits as a preempted one (75: run again to resume). A second
    Ctrl-C leaves at once (130), saving nothing more."""

    INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports a Ctrl-C

    def __init__(self) -> None:
        self.requested = False
        self.interrupted = False  # the request came from Ctrl-C
        self._previous: Any = None
        self._previous_int: Any = None

    def __enter__(self) -> SigtermFlag:
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._previous_int = signal.signal(signal.SIGINT, self._handle_int)
            self.requested = getattr(self._previous, "requested", False) is True  # caught early by the CLI
        except ValueError:  # not the main thread: no handler (e.g. inside a test runner thread)
            self._previous = self._previous_int = None
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        log.warning("SIGTERM: finishing the current step, then stopping with the other hosts")
        self.requested = True

    def _handle_int(self, signum: int, frame: Any) -> None:
        if self.interrupted:
            print("tpustream: second Ctrl-C: stopping now, without saving", flush=True)
            exit_now(self.INTERRUPTED_EXIT_CODE)
        log.warning(
            "Ctrl-C: finishing the current step and writing `last`, then stopping (run again to resume; "
            "Ctrl-C again to stop at once without saving)"
        )
        self.interrupted = self.requested = True

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        if self._previous_int is not None:
            signal.signal(signal.SIGINT, self._previous_int)


class StopAgreement:
    """Where this host stops when any host of the job is preempted (see the module docstring).

    ``stop_step(done)`` is called at every step boundary with the steps completed; it returns None while
    nobody is preempted, else the step at which every host stops (>= ``done``). One host (``hosts`` 1)
    needs no files: it stops after the step in flight.
    """

    def __init__(
        self,
        output: str,
        *,
        host: int,
        hosts: int,
        from_step: int,
        flag: SigtermFlag,
        sync_seconds: float,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self.flag = flag
        self.host, self.hosts, self.from_step = host, hosts, from_step
        self.sync_seconds = sync_seconds
        self.directory = storage.join(output, PREEMPTION_DIR)
        self.agreed: int | None = None
        self.timed_out = False
        self._seen = threading.Event()  # another host's notice
        self._closed = threading.Event()
        self._watcher: threading.Thread | None = None
        if hosts > 1:
            if host == 0:
                self._remove_stale()
            if not self._noticed():  # a host started late sees an earlier notice before its first step
                self._watcher = threading.Thread(
                    target=self._watch, args=(poll_seconds,), name="tpustream-preemption", daemon=True
                )
                self._watcher.start()

    @property
    def requested(self) -> bool:
        """This host was told (SIGTERM) or saw another host's notice."""
        return self.flag.requested or self._seen.is_set()

    def stop_step(self, done: int) -> int | None:
        if self.agreed is not None:
            return self.agreed
        if not self.requested:
            return None
        if self.hosts == 1:
            self.agreed = done
            return done
        self.agreed = self._agree(done)
        return self.agreed

    def close(self, *, cleanup: bool = False) -> None:
        """Stop watching; with ``cleanup``, process 0 removes this attempt's files (it has left the loop
        at the agreed step and committed ``last``: the retry must not see them), once every host has
        confirmed that it knows where it stops, or ``sync_seconds`` on."""
        self._closed.set()
        if cleanup and self.host == 0 and self.hosts > 1 and self.agreed is not None:
            # Process 0 timed out: a host never reported, and every other one times out on it as well, so
            # no host is still reading the reports; waiting would only eat the 30 s notice.
            if not self.timed_out:
                confirmed = self._await_all("agreed-", retry_storage_errors=True)
                if len(confirmed) < self.hosts:
                    missing = sorted(set(range(self.hosts)) - set(confirmed))
                    log.warning(
                        "preemption: host(s) %s did not confirm the stop step within %g s; removing %s anyway",
                        ", ".join(map(str, missing)),
                        self.sync_seconds,
                        self.directory,
                    )
            for obj in storage.list_objects(self.directory):
                storage.delete(obj.uri)

    # -- the protocol --------------------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return storage.join(self.directory, name)

    def _watch(self, poll_seconds: float) -> None:
        while not self._closed.wait(poll_seconds):
            if self._noticed():
                return

    def _noticed(self) -> bool:
        """One look for another host's notice (of this attempt); sets the flag when there is one."""
        notice = self._path("notice.json")
        try:
            data = storage.read_bytes(notice)
        except storage.NotFound:
            return False
        except storage.StorageError as exc:  # transient: the next poll tries again
            log.debug("preemption watcher: %s", exc)
            return False
        if not self._current(data):
            return False
        if not self.flag.requested:
            log.warning("another host was preempted (%s): stopping with it", notice)
        self._seen.set()
        return True

    def _current(self, data: bytes) -> bool:
        try:
            return int(json.loads(data).get("from_step", -1)) == self.from_step
        except (ValueError, AttributeError):
            return False

    def _report(self, name: str, done: int, *, create_only: bool = False) -> None:
        body = json.dumps({"host": self.host, "step": done, "from_step": self.from_step, "time": time.time()})
        with contextlib.suppress(
            storage.PreconditionFailed
        ):  # another host's notice came first: one is enough
            storage.write_bytes(self._path(name), body.encode(), create_only=create_only)

    def _agree(self, done: int) -> int:
        stop = self._agree_on(done)
        try:  # process 0 waits for these before it cleans up; without one it only waits longer
            self._report(f"agreed-{self.host:05d}.json", stop)
        except storage.StorageError as exc:
            log.warning("preemption: could not confirm stop step %d (%s)", stop, exc)
        return stop

    def _agree_on(self, done: int) -> int:
        if self.flag.requested:
            self._report("notice.json", done, create_only=True)
        self._report(f"host-{self.host:05d}.json", done)
        steps = self._await_all("host-")
        if len(steps) == self.hosts:
            stop = max(steps.values())
            log.warning(
                "preemption: all %d hosts reported (steps %d..%d): every host stops at step %d",
                self.hosts,
                min(steps.values()),
                stop,
                stop,
            )
            return stop
        missing = sorted(set(range(self.hosts)) - set(steps))
        log.error(
            "preemption: host(s) %s did not report their step within %g s (reported: %s) under %s; "
            "host %d stops at its own step %d without the slice's agreement: a re-run resumes from "
            "the last committed checkpoint",
            ", ".join(map(str, missing)),
            self.sync_seconds,
            ", ".join(f"{h}@{s}" for h, s in sorted(steps.items())) or "none",
            self.directory,
            self.host,
            done,
        )
        self.timed_out = True
        return done

    def _await_all(self, prefix: str, *, retry_storage_errors: bool = False) -> dict[int, int]:
        """Host -> step of this attempt's ``<prefix><k>.json`` files, polled for until every host's is there
        or ``sync_seconds`` have passed (then the ones that came)."""
        found: dict[int, int] = {}
        deadline = time.monotonic() + self.sync_seconds
        while True:
            try:
                self._read_reports(found, prefix)
            except storage.StorageError as exc:
                if not retry_storage_errors:
                    raise
                log.debug("preemption: %s", exc)  # transient: the next poll tries again
            if len(found) == self.hosts or time.monotonic() > deadline:
                return found
            time.sleep(0.2)

    def _read_reports(self, steps: dict[int, int], prefix: str = "host-") -> None:
        """Add this attempt's reports (``prefix``-<k>.json) that have appeared since the last look: a host
        reports once per attempt, so each poll lists the directory and reads only the hosts not yet heard
        from (a file left by an earlier attempt is read again until its host overwrites it)."""
        for obj in storage.list_objects(self.directory):
            name = obj.uri.rsplit("/", 1)[-1]
            if not name.startswith(prefix) or _host_of(name, prefix) in steps:
                continue
            try:
                report = json.loads(storage.read_bytes(obj.uri))
            except (storage.NotFound, ValueError):
                continue
            if report.get("from_step") == self.from_step and isinstance(report.get("step"), int):
                steps[int(report["host"])] = report["step"]

    def _remove_stale(self) -> None:
        """Files of an earlier attempt that resumed from another step: they must not stop this one. And
        every confirmation (``agreed-*``): one left by an attempt that resumed from this same step would
        let this attempt's process 0 clean up before its hosts have read the reports."""
        try:
            objects = storage.list_objects(self.directory)
        except storage.StorageError:
            return
        for obj in objects:
            try:
                name = obj.uri.rsplit("/", 1)[-1]
                stale = name.startswith("agreed-") or not self._current(storage.read_bytes(obj.uri))
            except storage.StorageError:
                continue
            if stale:
                storage.delete(obj.uri)


def _host_of(name: str, prefix: str = "host-") -> int | None:
    """``host-00003.json`` -> 3 (None for a name this protocol did not write)."""
    try:
        return int(name[len(prefix) : -len(".json")])
    except ValueError:
        return None


def preempted_error(stop: StopAgreement, flag: SigtermFlag, *, trained: bool, where: str) -> Preempted:
    """What a process that stopped at ``where`` (the agreed step) says: why, whether the slice agreed, and
    whether `last` was written (``trained``: steps were taken since the run (re)started)."""
    if stop.hosts == 1:
        how = ""
    elif stop.timed_out:
        how = ", stopping without the slice's agreement (see the error above)"
    else:
        how = ", stopping with every host"
    if not trained:
        cause = "Ctrl-C" if flag.interrupted else "SIGTERM"
        cause = cause if flag.requested else "another host's preemption"
        return Preempted(f"{cause} before the first step ({where}){how}: nothing new to save")
    what = "interrupted (Ctrl-C)" if flag.interrupted else "preempted"
    return Preempted(f"{what} at {where}{how}: `last` written")
