"""Champion/challenger promotion: a pure decision, then an atomic registry update.

Registry layout (DESIGN.md):
    REGISTRY/versions/<n>/     immutable: version.json (claimed create-only), model.pt, model.json, metrics.json
    REGISTRY/champion.json     pointer, replaced only by compare-and-swap on its generation
    REGISTRY/events/<time>-<id>.json   append-only log (each event a create-only object)
A version is claimed, then filled, then the pointer is swapped: a crash anywhere leaves the pointer
on a complete version, and a retry finds the claimed version by the model's sha256 and finishes.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from tpustream import storage

__all__ = [
    "RegistryError",
    "Decision",
    "METRICS",
    "decide",
    "promote",
    "read_champion",
    "version_uri",
    "champion_status",
    "preview_decision",
]

log = logging.getLogger(__name__)

METRICS = {"top1": True, "top5": True, "loss": False}  # name -> higher is better
CHAMPION = "champion.json"


class RegistryError(ValueError):
    """The registry or the inputs to a promotion are unusable; the message says what and the repair."""


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str


def decide(
    candidate: dict[str, Any],
    champion: dict[str, Any] | None,
    *,
    candidate_digest: str,
    champion_digest: str | None,
    metric: str = "top1",
    min_delta: float = 0.0,
    max_class_drop: float | None = None,
) -> Decision:
    """Promote when there is no champion, or the candidate beats it on ``metric`` by more than zero and at
    least ``min_delta`` on the same dataset digest, with no class dropping more than ``max_class_drop``.
    Ties never promote. Pure: no storage, no clock."""
    if metric not in METRICS:
        raise RegistryError(f"unknown metric {metric!r}: choose one of {', '.join(METRICS)}")
    if champion is None:
        return Decision(True, "no champion yet")
    if champion_digest != candidate_digest:
        return Decision(
            False,
            f"champion was measured on dataset {str(champion_digest)[:12]}, the candidate on {candidate_digest[:12]}: "
            "evaluate both on the same shards (tpustream evaluate --registry)",
        )
    higher_better = METRICS[metric]
    gain = candidate[metric] - champion[metric] if higher_better else champion[metric] - candidate[metric]
    if gain <= 0 or gain < min_delta:
        return Decision(
            False,
            f"candidate {metric} {candidate[metric]:.4f} vs champion {champion[metric]:.4f}: "
            f"improvement {gain:+.4f} is not above 0 and at least --min-delta {min_delta}",
        )
    if max_class_drop is not None:
        drops = [
            (i, champ - cand)
            for i, (cand, champ) in enumerate(
                zip(candidate["per_class_accuracy"], champion["per_class_accuracy"], strict=True)
            )
        ]
        worst = max(drops, key=lambda d: d[1])
        if worst[1] > max_class_drop:
            return Decision(
                False,
                f"class {worst[0]} accuracy drops by {worst[1]:.4f}, more than --max-class-drop {max_class_drop}",
            )
    return Decision(
        True,
        f"candidate {metric} {candidate[metric]:.4f} beats champion {champion[metric]:.4f} by {gain:+.4f}",
    )


# --------------------------------------------------------------------------- registry


def version_uri(registry: str, version: int) -> str:
    return storage.join(registry, "versions", str(int(version)))


def read_champion(registry: str) -> dict[str, Any] | None:
    data, _ = _read_pointer(registry)
    return data


def _read_pointer(registry: str) -> tuple[dict[str, Any] | None, int]:
    raw, generation = storage.read_with_generation(storage.join(registry, CHAMPION))
    if raw is None:
        return None, 0
    try:
        pointer = json.loads(raw)
        int(pointer["version"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RegistryError(
            f"{storage.join(registry, CHAMPION)} is corrupt ({exc}): restore it from the newest 'promoted' event "
            f"under {storage.join(registry, 'events')}"
        ) from exc
    return pointer, generation


def _versions(registry: str) -> dict[int, dict[str, Any]]:
    out = {}
    for obj in storage.list_objects(storage.join(registry, "versions")):
        if obj.uri.endswith("/version.json"):
            try:
                record = json.loads(storage.read_bytes(obj.uri))
                out[int(record["version"])] = record
            except (ValueError, KeyError, storage.NotFound):
                continue
    return out


def _claim_version(registry: str, model_sha256: str, source: str) -> int:
    """The version holding this model (idempotence), or a new one claimed create-only (races pick n+1)."""
    while True:
        versions = _versions(registry)
        for number, record in versions.items():
            if record.get("model_sha256") == model_sha256:
                return number
        number = max(versions, default=0) + 1
        record = {"version": number, "model_sha256": model_sha256, "source": source,
                  "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        try:
            storage.write_bytes(
                storage.join(version_uri(registry, number), "version.json"),
                json.dumps(record).encode(),
                create_only=True,
            )
            return number
        except storage.PreconditionFailed:
            continue  # another promotion took this number


def _fill_version(
    registry: str, number: int, candidate_uri: str, metrics_uri: str, model_sha256: str
) -> None:
    import hashlib

    target = version_uri(registry, number)
    for name in ("model.pt", "model.json"):
        try:
            storage.copy(storage.join(candidate_uri, name), storage.join(target, name))
        except storage.NotFound as exc:
            raise RegistryError(
                f"candidate {candidate_uri} lacks {name}: not a complete model artifact"
            ) from exc
    storage.copy(metrics_uri, storage.join(target, "metrics.json"))
    copied = hashlib.sha256(storage.read_bytes(storage.join(target, "model.pt"))).hexdigest()
    if copied != model_sha256:
        raise RegistryError(
            f"{candidate_uri}/model.pt changed since it was evaluated (sha256 {copied[:12]} vs {model_sha256[:12]}): re-run evaluate"
        )


def _log_event(registry: str, event: dict[str, Any]) -> None:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    event = {**event, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    storage.write_bytes(
        storage.join(registry, "events", f"{stamp}-{uuid.uuid4().hex[:12]}.json"),
        json.dumps(event).encode(),
        create_only=True,
    )


def _load_metrics(metrics_uri: str) -> dict[str, Any]:
    try:
        metrics = json.loads(storage.read_bytes(metrics_uri))
        metrics["candidate"]["model_sha256"]  # noqa: B018 - shape check
        metrics["dataset"]["manifest_digest"]  # noqa: B018
    except storage.NotFound as exc:
        raise RegistryError(f"--metrics {metrics_uri} does not exist: run tpustream evaluate first") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise RegistryError(
            f"--metrics {metrics_uri} is not a tpustream metrics.json ({exc}): re-run evaluate"
        ) from exc
    return metrics


def promote(
    candidate_uri: str,
    metrics_uri: str,
    registry: str,
    *,
    metric: str = "top1",
    min_delta: float = 0.0,
    max_class_drop: float | None = None,
    max_attempts: int = 20,
    vertex: Any = None,
) -> dict[str, Any]:
    """Decide and, if the candidate wins, publish it as the champion atomically. Returns the outcome.

    With ``vertex`` (a ``tpustream.vertex.VertexTarget``) the candidate is also uploaded to the Vertex AI
    Model Registry as a ``challenger`` version, and gets the ``champion`` alias only when promoted here.
    """
    outcome = _promote(candidate_uri, metrics_uri, registry, metric=metric, min_delta=min_delta,
                       max_class_drop=max_class_drop, max_attempts=max_attempts)  # fmt: skip
    if vertex is not None and outcome["reason"] != "already the champion":
        from tpustream import vertex as vertex_registry

        promoted = bool(outcome["promoted"])
        artifact = version_uri(outcome["registry"], outcome["version"]) if promoted else outcome["candidate"]
        labels = {
            "dataset": outcome["dataset_digest"][:12],
            f"{metric}_permille": str(round(1000 * outcome["value"])),
        }
        if promoted:
            labels["tpustream_version"] = str(outcome["version"])
        outcome["vertex"] = vertex_registry.publish(
            vertex, artifact_uri=artifact, promoted=promoted, labels=labels
        )
    for key in ("registry", "candidate", "dataset_digest", "value"):
        outcome.pop(key, None)
    return outcome


def _promote(
    candidate_uri: str, metrics_uri: str, registry: str, *, metric: str, min_delta: float,
    max_class_drop: float | None, max_attempts: int,
) -> dict[str, Any]:  # fmt: skip
    if metric not in METRICS:
        raise RegistryError(f"unknown metric {metric!r}: choose one of {', '.join(METRICS)}")
    candidate_uri = storage.check_uri(candidate_uri).rstrip("/")
    registry = storage.check_uri(registry).rstrip("/")
    if metrics_uri.rstrip("/").endswith(".json"):
        metrics_uri = storage.check_uri(metrics_uri)
    else:
        metrics_uri = storage.join(storage.check_uri(metrics_uri).rstrip("/"), "metrics.json")
    metrics = _load_metrics(metrics_uri)
    candidate = metrics["candidate"]
    digest = metrics["dataset"]["manifest_digest"]
    sha = candidate["model_sha256"]
    context = {
        "registry": registry,
        "candidate": candidate_uri,
        "dataset_digest": digest,
        "value": candidate[metric],
    }
    for _attempt in range(max_attempts):
        current, generation = _read_pointer(registry)
        if current is not None and current.get("model_sha256") == sha:
            outcome = {"promoted": False, "version": current["version"], "reason": "already the champion"}
            _log_event(registry, {"event": "already-champion", **outcome, "candidate": candidate_uri})
            return {**outcome, **context}
        champion_metrics, champion_digest = _champion_to_compare(metrics, current)
        decision = decide(candidate, champion_metrics, candidate_digest=digest, champion_digest=champion_digest,
                          metric=metric, min_delta=min_delta, max_class_drop=max_class_drop)  # fmt: skip
        if not decision.promote:
            outcome = {"promoted": False, "version": None, "reason": decision.reason,
                       "champion_version": current["version"] if current else None}  # fmt: skip
            _log_event(
                registry,
                {"event": "refused", **outcome, "candidate": candidate_uri, metric: candidate[metric]},
            )
            return {**outcome, **context}
        number = _claim_version(registry, sha, candidate_uri)
        _fill_version(registry, number, candidate_uri, metrics_uri, sha)
        pointer = {
            "version": number, "model_sha256": sha, "dataset_digest": digest,
            "metrics": {k: candidate[k] for k in ("top1", "top5", "loss", "per_class_accuracy", "num_samples")},
            "previous_version": current["version"] if current else None,
            "promoted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }  # fmt: skip
        try:
            storage.replace_if_generation(
                storage.join(registry, CHAMPION), json.dumps(pointer).encode(), generation
            )
        except storage.PreconditionFailed:
            log.info("champion changed while promoting version %d: re-reading and deciding again", number)
            continue
        outcome = {"promoted": True, "version": number, "reason": decision.reason,
                   "previous_version": pointer["previous_version"]}  # fmt: skip
        _log_event(registry, {"event": "promoted", **outcome, "candidate": candidate_uri, "pointer": pointer})
        return {**outcome, **context}
    raise RegistryError(
        f"gave up after {max_attempts} attempts: the champion pointer keeps changing under {registry}"
    )


def _champion_to_compare(
    metrics: dict[str, Any], current: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, str | None]:
    """The champion numbers to compare with: measured in the same evaluate run when that run saw the
    current champion, else the ones recorded at its promotion (with their own dataset digest)."""
    if current is None:
        return None, None
    if metrics.get("champion") and metrics["champion"].get("version") == current["version"]:
        return metrics["champion"], metrics["dataset"]["manifest_digest"]
    return current["metrics"], current["dataset_digest"]


def preview_decision(
    metrics: dict[str, Any], registry: str | None, *, metric: str = "top1", min_delta: float = 0.0
) -> Decision:
    """The decision `promote` would take now for a metrics.json document (the DAG's branch condition;
    `promote` decides again under compare-and-swap)."""
    current = read_champion(registry) if registry else None
    candidate = metrics["candidate"]
    if current is not None and current.get("model_sha256") == candidate["model_sha256"]:
        return Decision(False, "already the champion")
    champion, champion_digest = _champion_to_compare(metrics, current)
    return decide(candidate, champion, candidate_digest=metrics["dataset"]["manifest_digest"],
                  champion_digest=champion_digest, metric=metric, min_delta=min_delta)  # fmt: skip


def champion_status(registry: str) -> dict[str, Any]:
    """The champion pointer plus a health check: does the version it names exist and is it complete?"""
    registry = storage.check_uri(registry).rstrip("/")
    pointer = read_champion(registry)
    if pointer is None:
        return {"registry": registry, "champion": None, "ok": True, "message": "no champion yet"}
    target = version_uri(registry, pointer["version"])
    missing = [name for name in ("model.pt", "model.json") if not storage.exists(storage.join(target, name))]
    if missing:
        versions = sorted(_versions(registry))
        return {
            "registry": registry, "champion": pointer, "ok": False,
            "message": f"champion.json names version {pointer['version']}, but {target} lacks {', '.join(missing)}. "
            f"Repair: restore that version's files, or point champion.json at a complete version "
            f"(present: {versions or 'none'}) taken from the newest 'promoted' event under {registry}/events",
        }  # fmt: skip
    return {
        "registry": registry,
        "champion": pointer,
        "ok": True,
        "message": f"champion is version {pointer['version']}",
    }
