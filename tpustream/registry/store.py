"""The model registry's storage: where each record lives, and the primitives that read and write it.

Layout (docs/ARCHITECTURE.md):
    REGISTRY/versions/<n>/     immutable: version.json (claimed create-only), model.pt, model.json, metrics.json
    REGISTRY/champion.json     pointer, replaced only by compare-and-swap on its generation
    REGISTRY/events/<time>-<id>.json   append-only log (each event a create-only object: ``registry.events``)
    REGISTRY/trained/<fingerprint[:16]>-<settings[:12]>.json   "this dataset was trained on with these settings"
    DATASETS_ROOT/<fingerprint[:16]>   a content-addressed dataset (the pipeline's default root: REGISTRY/datasets)
A version is claimed, then filled, then the pointer is swapped (``tpustream.release.promote`` takes the decision in
between): a crash anywhere leaves the pointer on a complete version, and a retry finds the claimed version by
the model's sha256 and finishes. Every JSON file written here is strict JSON: a non-finite number is written
as null (``json_bytes``). No torch: the CLI's registry commands and ``--help`` stay fast.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tpustream.artifacts import json_bytes  # defined with the files it writes; re-exported, its old home
from tpustream.registry.errors import RegistryError
from tpustream.storage import io as storage

__all__ = [
    "CHAMPION",
    "ChampionPointer",
    "ChampionStatus",
    "TrainedRecord",
    "json_bytes",
    "read_champion",
    "read_pointer",
    "replace_champion",
    "version_uri",
    "list_versions",
    "claim_version",
    "fill_version",
    "missing_registry",
    "champion_status",
    "dataset_uri",
    "trained_marker",
    "record_trained",
    "read_trained",
]

log = logging.getLogger(__name__)

CHAMPION = "champion.json"


# --------------------------------------------------------------------------- the champion pointer


@dataclass(frozen=True, kw_only=True)
class ChampionPointer:
    """``champion.json``: which version is the champion, the numbers it was promoted on and on which data.

    ``metrics``: its numbers at its promotion (top1, top5, loss, macro_f1, balanced_accuracy,
    per_class_accuracy, num_samples, and ``split``: what they were measured on); ``dataset_digest``: the
    manifest digest of those shards. Only ``version`` is required (a hand-repaired pointer may hold nothing
    else); keys the file lacked are not written back (``absent``), keys no field models are kept (``extra``),
    so a pointer reads and writes back as it was.
    """

    version: int
    model_sha256: str = ""
    dataset_digest: str | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)
    previous_version: int | None = None
    promoted: str = ""  # when, ISO-8601 UTC to the second
    extra: Mapping[str, Any] = field(default_factory=dict)
    absent: frozenset[str] = field(default=frozenset(), repr=False)

    _KEYS: ClassVar[tuple[str, ...]] = (
        "version",
        "model_sha256",
        "dataset_digest",
        "metrics",
        "previous_version",
        "promoted",
    )

    @classmethod
    def from_json(cls, document: Any) -> ChampionPointer:
        """A parsed champion.json. Raises KeyError, TypeError or ValueError when it is not a pointer."""
        if not isinstance(document, Mapping):
            raise TypeError(f"a pointer is a JSON object, not {type(document).__name__}")
        metrics = document.get("metrics")
        previous = document.get("previous_version")
        return cls(
            version=int(document["version"]),
            model_sha256=str(document.get("model_sha256") or ""),
            dataset_digest=None
            if document.get("dataset_digest") is None
            else str(document["dataset_digest"]),
            metrics=dict(metrics) if isinstance(metrics, Mapping) else {},
            previous_version=None if previous is None else int(previous),
            promoted=str(document.get("promoted") or ""),
            extra={key: value for key, value in document.items() if key not in cls._KEYS},
            absent=frozenset(key for key in cls._KEYS if key not in document),
        )

    def to_json(self) -> dict[str, Any]:
        """The pointer as promote writes it, keys in its order."""
        known = {
            "version": self.version,
            "model_sha256": self.model_sha256,
            "dataset_digest": self.dataset_digest,
            "metrics": dict(self.metrics),
            "previous_version": self.previous_version,
            "promoted": self.promoted,
        }
        return {**{key: value for key, value in known.items() if key not in self.absent}, **self.extra}


def read_champion(registry: str) -> ChampionPointer | None:
    """The champion pointer of ``registry`` (``champion.json``), or None when there is no champion yet."""
    data, _ = read_pointer(registry)
    return data


def read_pointer(registry: str) -> tuple[ChampionPointer | None, int]:
    """The champion pointer and its generation (``(None, 0)``: no champion), for ``replace_champion``.

    Raises:
        RegistryError: champion.json is not a pointer (the message says how to restore it).
    """
    raw, generation = storage.read_with_generation(storage.join(registry, CHAMPION))
    if raw is None:
        return None, 0
    try:
        pointer = ChampionPointer.from_json(json.loads(raw))
    except (ValueError, KeyError, TypeError) as exc:
        raise RegistryError(
            f"{storage.join(registry, CHAMPION)} is corrupt ({exc}): restore it from the newest 'promoted' event "
            f"under {storage.join(registry, 'events')}"
        ) from exc
    return pointer, generation


def replace_champion(registry: str, pointer: ChampionPointer, generation: int) -> None:
    """Make ``pointer`` the champion pointer if the pointer still has ``generation`` (0: there is none).

    Raises:
        storage.PreconditionFailed: another promotion replaced it first: re-read, decide again, retry.
    """
    storage.replace_if_generation(storage.join(registry, CHAMPION), json_bytes(pointer.to_json()), generation)


# --------------------------------------------------------------------------- versions


def version_uri(registry: str, version: int) -> str:
    """The immutable directory of ``version``: ``REGISTRY/versions/<n>``."""
    return storage.join(registry, "versions", str(int(version)))


def list_versions(registry: str) -> dict[int, dict[str, Any]]:
    """Every claimed version's number -> its version.json (unreadable ones left out)."""
    out = {}
    for obj in storage.list_objects(storage.join(registry, "versions")):
        if obj.uri.endswith("/version.json"):
            try:
                record = json.loads(storage.read_bytes(obj.uri))
                out[int(record["version"])] = record
            except (ValueError, KeyError, storage.NotFound):
                continue
    return out


def _claimed_numbers(registry: str) -> set[int]:
    """Every version number with a version.json object, readable or not (``versions/<n>/version.json``)."""
    numbers = set()
    for obj in storage.list_objects(storage.join(registry, "versions")):
        parts = obj.uri.rstrip("/").split("/")
        if len(parts) >= 2 and parts[-1] == "version.json" and parts[-2].isdigit():
            numbers.add(int(parts[-2]))
    return numbers


def claim_version(registry: str, model_sha256: str, source: str) -> int:
    """The version holding this model (idempotence), or a new one claimed create-only (races pick n+1).

    A number whose version.json cannot be read is still taken: it is never claimed again (a version is
    immutable), and the next free number is above it."""
    while True:
        versions = list_versions(registry)
        for number, record in versions.items():
            if record.get("model_sha256") == model_sha256:
                return number
        claimed = _claimed_numbers(registry)
        unreadable = sorted(claimed - set(versions))
        if unreadable:
            log.warning(
                "version(s) %s under %s have an unreadable version.json: skipped (never reused); repair or "
                "remove them",
                ", ".join(map(str, unreadable)),
                storage.join(registry, "versions"),
            )
        number = max(claimed | set(versions), default=0) + 1
        record = {
            "version": number,
            "model_sha256": model_sha256,
            "source": source,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        try:
            storage.write_bytes(
                storage.join(version_uri(registry, number), "version.json"),
                json_bytes(record),
                create_only=True,
            )
            return number
        except storage.PreconditionFailed:
            continue  # another promotion took this number


def fill_version(registry: str, number: int, candidate_uri: str, metrics_uri: str, model_sha256: str) -> None:
    """Copy the candidate's model.pt and model.json and its metrics.json into claimed version ``number``.

    Raises:
        RegistryError: the candidate lacks a file, or its model.pt is not ``model_sha256`` any more.
    """
    target = version_uri(registry, number)
    for name in ("model.pt", "model.json"):
        try:
            storage.copy(storage.join(candidate_uri, name), storage.join(target, name))
        except storage.NotFound as exc:
            raise RegistryError(
                f"candidate {candidate_uri} lacks {name}: not a complete model artifact"
            ) from exc
    storage.copy(metrics_uri, storage.join(target, "metrics.json"))
    copied = storage.sha256(storage.join(target, "model.pt"))
    if copied != model_sha256:
        raise RegistryError(
            f"{candidate_uri}/model.pt changed while it was being promoted (sha256 {copied[:12]} vs "
            f"{model_sha256[:12]}): re-run tpustream evaluate on it, then promote again"
        )


# --------------------------------------------------------------------------- health


def missing_registry(registry: str) -> str | None:
    """Why ``registry`` cannot exist at all (a mistyped path, a bucket that does not exist), else None."""
    if storage.prefix_exists(registry):
        return None
    if storage.is_gcs(registry):
        return f"registry {registry} is in a bucket that does not exist: create the bucket or fix the URI"
    return (
        f"registry {registry} does not exist: check the path "
        "(a registry directory is created by its first `tpustream promote`)"
    )


@dataclass(frozen=True, kw_only=True)
class ChampionStatus:
    """A registry's champion and its health: ``ok`` when the registry exists and the version the pointer
    names is complete (an empty registry is healthy); ``message`` says which, or what to repair."""

    registry: str
    champion: ChampionPointer | None
    ok: bool
    message: str

    def to_json(self) -> dict[str, Any]:
        """As ``tpustream champion show`` prints it."""
        champion = None if self.champion is None else self.champion.to_json()
        return {"registry": self.registry, "champion": champion, "ok": self.ok, "message": self.message}


def champion_status(registry: str) -> ChampionStatus:
    """The champion pointer plus a health check: does the registry exist, and the version it names, complete?
    An existing directory or bucket prefix with no champion.json is an empty registry, and healthy."""
    registry = storage.check_uri(registry).rstrip("/")
    problem = missing_registry(registry)
    if problem:
        return ChampionStatus(registry=registry, champion=None, ok=False, message=problem)
    pointer = read_champion(registry)
    if pointer is None:
        return ChampionStatus(registry=registry, champion=None, ok=True, message="no champion yet")
    target = version_uri(registry, pointer.version)
    missing = [name for name in ("model.pt", "model.json") if not storage.exists(storage.join(target, name))]
    if missing:
        versions = sorted(list_versions(registry))
        return ChampionStatus(
            registry=registry,
            champion=pointer,
            ok=False,
            message=f"champion.json names version {pointer.version}, but {target} lacks {', '.join(missing)}. "
            f"Repair: restore that version's files, or point champion.json at a complete version "
            f"(present: {versions or 'none'}) taken from the newest 'promoted' event under {registry}/events",
        )
    return ChampionStatus(
        registry=registry, champion=pointer, ok=True, message=f"champion is version {pointer.version}"
    )


# --------------------------------------------------------------------------- datasets and trained-on markers


def dataset_uri(datasets_root: str, fingerprint: str) -> str:
    """Where the dataset of a source ``fingerprint`` lives: content-addressed, ``DATASETS_ROOT/<fp[:16]>``."""
    return storage.join(storage.check_uri(datasets_root).rstrip("/"), fingerprint[:16])


def trained_marker(registry: str, fingerprint: str, settings_digest: str) -> str:
    """Where "trained on the dataset of ``fingerprint`` with these settings" is recorded in ``registry``."""
    return storage.join(
        storage.check_uri(registry).rstrip("/"),
        "trained",
        f"{fingerprint[:16]}-{settings_digest[:12]}.json",
    )


@dataclass(frozen=True, kw_only=True)
class TrainedRecord:
    """A trained-on marker: ``model`` was trained on ``dataset`` and evaluated, with ``decision``'s reason."""

    dataset: str
    model: str
    decision: str
    created: str


def record_trained(marker: str, *, dataset: str, model: str, decision: str) -> None:
    """Record that ``model`` was trained on ``dataset`` and evaluated: later runs on the same data skip."""
    record = {
        "dataset": dataset,
        "model": model,
        "decision": decision,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    storage.write_bytes(marker, json.dumps(record, indent=1).encode(), content_type="application/json")


def read_trained(marker: str) -> TrainedRecord:
    """The record ``record_trained`` wrote at ``marker``.

    Raises:
        storage.NotFound: there is none. ValueError: it is not JSON.
    """
    record = json.loads(storage.read_bytes(marker))
    return TrainedRecord(
        dataset=str(record.get("dataset") or ""),
        model=str(record.get("model") or ""),
        decision=str(record.get("decision") or ""),
        created=str(record.get("created") or ""),
    )
