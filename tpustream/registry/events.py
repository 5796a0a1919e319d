"""The registry's append-only event log, ``REGISTRY/events/<time>-<id>.json``: one create-only object per
decision promote takes (``DecisionEvent``: promoted, refused, already-champion; a refusal also when the
pipeline's evaluate step takes it, logged once under an ``<id>`` derived from the decision: ``log_event_once``)
and per failed Vertex AI upload (``UploadFailedEvent``). ``tpustream.registry.history`` reads them back, old formats included.

Each event type writes the keys, in the order, that promote wrote before events were types, and a decision
its ``code`` after its ``reason`` (and ``class_index`` where one applies; events before codes have neither);
``log_event`` adds ``time``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from tpustream.artifacts import json_bytes
from tpustream.registry.policy import DecisionCode, Metric
from tpustream.registry.store import ChampionPointer
from tpustream.storage import io as storage

__all__ = [
    "DecisionKind",
    "DecisionEvent",
    "UploadFailedEvent",
    "log_event",
    "log_event_once",
    "list_events",
    "read_event",
]

DecisionKind = Literal["promoted", "refused", "already-champion"]


@dataclass(frozen=True, kw_only=True)
class DecisionEvent:
    """One promotion decision: its outcome (``promoted``, ``version``, ``reason``, its ``code`` and
    ``class_index`` (``tpustream.registry.policy.Decision``'s), and ``previous_version`` when promoted, ``champion_version`` when refused), the ``candidate``'s URI, the new ``pointer`` when
    promoted, and what the champion's history needs: the ``metric`` decided on, the ``split`` both values
    were measured on, the candidate's ``value``, the champion's on the same data (``champion_value``; None:
    not measured there) and the dataset (``dataset_digest``, ``dataset``, ``metrics_uri``)."""

    event: DecisionKind
    promoted: bool
    version: int | None
    reason: str
    code: DecisionCode
    candidate: str
    metric: Metric
    split: str
    value: float | None
    champion_value: float | None
    dataset_digest: str
    dataset: str | None
    metrics_uri: str
    previous_version: int | None = None
    champion_version: int | None = None
    pointer: ChampionPointer | None = None
    class_index: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The event as its file holds it (``time`` aside)."""
        outcome: dict[str, Any] = {
            "promoted": self.promoted,
            "version": self.version,
            "reason": self.reason,
            "code": self.code,
        }
        if self.class_index is not None:
            outcome["class_index"] = self.class_index
        if self.event == "promoted":
            outcome["previous_version"] = self.previous_version
        elif self.event == "refused":
            outcome["champion_version"] = self.champion_version
        extra: dict[str, Any] = {}
        if self.event == "promoted" and self.pointer is not None:
            extra["pointer"] = self.pointer.to_json()
        elif self.event == "refused":
            extra[self.metric] = self.value  # the format before ``metric``/``value``: kept for its readers
        record = {
            "metric": self.metric,
            "split": self.split,
            "value": self.value,
            "champion_value": self.champion_value,
            "dataset_digest": self.dataset_digest,
            "dataset": self.dataset,
            "metrics_uri": self.metrics_uri,
        }
        return {"event": self.event, **outcome, "candidate": self.candidate, **extra, **record}


@dataclass(frozen=True, kw_only=True)
class UploadFailedEvent:
    """Version ``version`` became the champion but publishing it to the Vertex AI Model Registry failed
    (``error``: the exception, cut to 500 characters); promote repairs it when run again."""

    version: int
    error: str

    def to_json(self) -> dict[str, Any]:
        return {"event": "vertex-upload-failed", "version": self.version, "error": self.error}


def log_event(registry: str, event: DecisionEvent | UploadFailedEvent, *, key: str | None = None) -> None:
    """Append ``event`` to the registry's log. ``time`` has microseconds (ISO-8601, UTC): decisions taken
    within one second still sort in the order they were taken (``tpustream.registry.history``). ``key``: the
    file's ``<id>`` (``log_event_once``); None: a random one."""
    now = datetime.now(timezone.utc)  # one reading: the file name and ``time`` name the same second
    stamp = now.strftime("%Y%m%dT%H%M%S")
    document = {**event.to_json(), "time": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    storage.write_bytes(
        storage.join(registry, "events", f"{stamp}-{key or uuid.uuid4().hex[:12]}.json"),
        json_bytes(document),
        create_only=True,
    )


def log_event_once(registry: str, event: DecisionEvent, key: str) -> bool:
    """Append ``event`` unless an event with ``key`` (its file's ``<id>``) is logged already: a retried step
    that takes the same decision again logs it once. Returns whether it was appended.

    The check is a listing, not a lock: a step's retries run one after another (KFP), so no two of them race.
    """
    if any(uri.endswith(f"-{key}.json") for uri in list_events(registry)):
        return False
    log_event(registry, event, key=key)
    return True


def list_events(registry: str) -> list[str]:
    """The URIs of every event file in ``registry``'s log, sorted by name (the second it was logged)."""
    return [o.uri for o in storage.list_objects(storage.join(registry, "events")) if o.uri.endswith(".json")]


def read_event(uri: str) -> Any:
    """The JSON document in event file ``uri`` (an object when tpustream wrote it; old formats too: the
    history reads them).

    Raises:
        storage.StorageError: it cannot be read.
        ValueError: it is not JSON (or not UTF-8).
    """
    return json.loads(storage.read_bytes(uri))
