"""Champion/challenger promotion: the decision (``promotion_policy``), then an atomic registry update.

The registry's layout and its primitives are ``tpustream.registry.store``'s. A version is claimed, then filled,
then the pointer is swapped: a crash anywhere leaves the pointer on a complete version, and a retry finds the
claimed version by the model's sha256 and finishes. The candidate's model.pt is checked against the metrics
before a version number is claimed.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tpustream.artifacts import ArtifactError, EvalReport, json_file_uri
from tpustream.registry.policy import (
    METRICS,
    Decision,
    QualityFloor,
    RegistryError,
    champion_to_compare,
    decide_for_metrics,
    is_finite_number,
)
from tpustream.registry.store import (
    champion_status,
    claim_version,
    fill_version,
    log_event,
    read_champion,
    read_pointer,
    replace_champion,
    version_uri,
)
from tpustream.storage import io as storage

__all__ = [
    "promote",
    "preview_decision",
    # re-exported from tpustream.registry.store: promote's public API before the registry had its own module
    "read_champion",
    "version_uri",
    "champion_status",
]

log = logging.getLogger(__name__)

ALREADY_CHAMPION = "already the champion"  # the outcome of promoting the champion's own weights again


def _check_candidate(candidate_uri: str, metrics_uri: str, model_sha256: str) -> None:
    """Refuse, before any version number is claimed, a candidate that is incomplete or is not the model
    the metrics measured: versions/<n> is immutable, so nothing may be written there for it."""
    missing = [
        name for name in ("model.pt", "model.json") if not storage.exists(storage.join(candidate_uri, name))
    ]
    if missing:
        raise RegistryError(
            f"candidate {candidate_uri} lacks {', '.join(missing)}: not a complete model artifact"
        )
    actual = storage.sha256(storage.join(candidate_uri, "model.pt"))
    if actual != model_sha256:
        raise RegistryError(
            f"{candidate_uri}/model.pt (sha256 {actual[:12]}) is not the model {metrics_uri} measured "
            f"(sha256 {model_sha256[:12]}): the metrics belong to a different model; "
            "re-run tpustream evaluate on this candidate"
        )


def _load_metrics(metrics_uri: str) -> EvalReport:
    try:
        metrics = EvalReport.read(metrics_uri)
    except storage.NotFound as exc:
        raise RegistryError(f"--metrics {metrics_uri} does not exist: run tpustream evaluate first") from exc
    except ArtifactError as exc:
        raise RegistryError(
            f"--metrics {metrics_uri} is not a tpustream metrics.json ({exc}): re-run evaluate"
        ) from exc
    # what a decision needs: which model was measured, on which data
    for key, value in (
        ("candidate.model_sha256", metrics.candidate.get("model_sha256")),
        ("dataset.manifest_digest", metrics.dataset.manifest_digest),
    ):
        if not value:
            raise RegistryError(
                f"--metrics {metrics_uri} is not a tpustream metrics.json (it lacks {key}): re-run evaluate"
            )
    return metrics


def promote(
    candidate_uri: str,
    metrics_uri: str,
    registry: str,
    *,
    metric: str = "top1",
    min_delta: float = 0.0,
    max_class_drop: float | None = None,
    floor: QualityFloor | None = None,
    max_attempts: int = 20,
    vertex: Any = None,
    max_p_value: float | None = None,
) -> dict[str, Any]:
    """Decide and, if the candidate wins, publish it as the champion atomically. Returns the outcome.

    With ``vertex`` (a ``tpustream.vertex.model_registry.VertexTarget``) a promoted model is also uploaded to the Vertex AI
    Model Registry from its immutable registry version, with the serving container, gets the ``champion``
    alias there and the evaluation in ``metrics_uri`` as a model evaluation (``outcome["vertex"]``). A
    candidate that is not promoted is not uploaded (``outcome["vertex"]`` is None): it has no immutable
    version an endpoint could be pinned to. ``floor``: what the candidate must reach to be promoted at all,
    the first model of a registry included. ``max_p_value``: a gain over the champion must be this unlikely
    by chance (McNemar's exact test on the samples both were scored on; None: not required).
    """
    if vertex is not None and not storage.is_gcs(registry):  # refused before anything is promoted
        raise RegistryError(
            f"--vertex-model needs a gs:// registry (Vertex AI reads models from Cloud Storage), not {registry}"
        )
    outcome = _promote(
        candidate_uri,
        metrics_uri,
        registry,
        metric=metric,
        min_delta=min_delta,
        max_class_drop=max_class_drop,
        floor=floor,
        max_attempts=max_attempts,
        max_p_value=max_p_value,
    )
    if vertex is not None:
        outcome["vertex"] = None
        # A promoted candidate, and the champion again (a retried or re-run promote after an upload failed:
        # the registry moved, Vertex did not). publish() uploads only what Vertex does not have yet.
        if outcome["promoted"] or outcome["reason"] == ALREADY_CHAMPION:
            outcome["vertex"] = _publish_champion(vertex, outcome, metric)
    for key in ("registry", "candidate", "dataset_digest", "model_sha256", "value", "metrics", "metrics_uri"):
        outcome.pop(key, None)
    return outcome


def _publish_champion(vertex: Any, outcome: dict[str, Any], metric: str) -> dict[str, Any]:
    """Upload the champion version to the Vertex AI Model Registry (if not there yet) with its evaluation; a
    failure leaves the registry as it is (the champion stays) and fails loudly with how to repair it."""
    from tpustream.vertex import model_registry as vertex_registry

    labels = {
        "dataset": outcome["dataset_digest"][:12],
        "tpustream_version": str(outcome["version"]),
        "model_sha256": outcome["model_sha256"][:16],
    }
    if is_finite_number(outcome["value"]):
        labels[f"{metric}_permille"] = str(round(1000 * outcome["value"]))
    artifact = version_uri(outcome["registry"], outcome["version"])
    try:
        return vertex_registry.publish(
            vertex,
            artifact_uri=artifact,
            labels=labels,
            evaluation=outcome["metrics"],
            metrics_uri=outcome["metrics_uri"],
        )
    except Exception as exc:
        failure = {
            "event": "vertex-upload-failed",
            "version": outcome["version"],
            "error": f"{type(exc).__name__}: {exc}"[:500],
        }
        log_event(outcome["registry"], failure)
        raise RegistryError(
            f"version {outcome['version']} is the champion in {outcome['registry']}, but publishing it to the "
            f"Vertex AI Model Registry ({vertex.model_name}) failed: {type(exc).__name__}: {exc}. Fix that "
            "(IAM, the bucket's region, the serving image) and run promote again, or retry the pipeline's "
            "promote task: it uploads the champion and imports its evaluation when Vertex does not have them yet"
        ) from exc


def _decision_record(
    metrics: EvalReport, current: dict[str, Any] | None, *, metric: str, metrics_uri: str
) -> dict[str, Any]:
    """What every decision event records for the champion's history (``tpustream.registry.history``): the metric
    decided on, the candidate's value, the champion's value on the same data (measured in the evaluate
    run, or recorded at its promotion on the same dataset digest; None when there is none), the dataset."""
    digest = metrics.dataset.manifest_digest
    try:
        champion, champion_digest = champion_to_compare(metrics, current)
    except (KeyError, TypeError):  # a hand-repaired pointer without its metrics: the log must not fail on it
        champion, champion_digest = None, None
    return {
        "metric": metric,
        "split": metrics.split,  # the split both values were measured on: test when the dataset has one
        "value": metrics.candidate.get(metric),
        "champion_value": champion.get(metric) if champion and champion_digest == digest else None,
        "dataset_digest": digest,
        "dataset": metrics.dataset.uri or None,
        "metrics_uri": metrics_uri,
    }


def _promote(
    candidate_uri: str,
    metrics_uri: str,
    registry: str,
    *,
    metric: str,
    min_delta: float,
    max_class_drop: float | None,
    floor: QualityFloor | None,
    max_attempts: int,
    max_p_value: float | None = None,
) -> dict[str, Any]:
    if metric not in METRICS:
        raise RegistryError(f"unknown metric {metric!r}: choose one of {', '.join(METRICS)}")
    candidate_uri = storage.check_uri(candidate_uri).rstrip("/")
    registry = storage.check_uri(registry).rstrip("/")
    metrics_uri = json_file_uri(metrics_uri, EvalReport.NAME)
    metrics = _load_metrics(metrics_uri)
    candidate = metrics.candidate
    digest = metrics.dataset.manifest_digest
    sha = candidate["model_sha256"]
    context = {
        "registry": registry,
        "candidate": candidate_uri,
        "dataset_digest": digest,
        "model_sha256": sha,
        "value": candidate.get(metric),
        "metrics": metrics.to_json(),  # for the Vertex AI model evaluation
        "metrics_uri": metrics_uri,
    }
    checked = False
    for _attempt in range(max_attempts):
        current, generation = read_pointer(registry)
        record = _decision_record(metrics, current, metric=metric, metrics_uri=metrics_uri)
        if current is not None and current.get("model_sha256") == sha:
            outcome = {"promoted": False, "version": current["version"], "reason": ALREADY_CHAMPION}
            log_event(
                registry, {"event": "already-champion", **outcome, "candidate": candidate_uri, **record}
            )
            return {**outcome, **context}
        decision = decide_for_metrics(
            metrics,
            current,
            metric=metric,
            min_delta=min_delta,
            max_class_drop=max_class_drop,
            floor=floor,
            max_p_value=max_p_value,
        )
        if not decision.promote:
            outcome = {
                "promoted": False,
                "version": None,
                "reason": decision.reason,
                "champion_version": current["version"] if current else None,
            }
            log_event(
                registry,
                {
                    "event": "refused",
                    **outcome,
                    "candidate": candidate_uri,
                    metric: candidate.get(metric),  # the format before ``record``: kept for its readers
                    **record,
                },
            )
            return {**outcome, **context}
        if not checked:  # before a version number is claimed: versions/<n> cannot be taken back
            _check_candidate(candidate_uri, metrics_uri, sha)
            checked = True
        number = claim_version(registry, sha, candidate_uri)
        fill_version(registry, number, candidate_uri, metrics_uri, sha)
        pointer = {
            "version": number,
            "model_sha256": sha,
            "dataset_digest": digest,
            "metrics": {
                k: candidate[k]
                for k in (
                    "top1",
                    "top5",
                    "loss",
                    "macro_f1",
                    "balanced_accuracy",
                    "per_class_accuracy",
                    "num_samples",
                )
                if k in candidate  # macro_f1, balanced_accuracy: evaluations before them have none
            }
            | {"split": metrics.split},
            "previous_version": current["version"] if current else None,
            "promoted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        try:
            replace_champion(registry, pointer, generation)
        except storage.PreconditionFailed:
            log.info("champion changed while promoting version %d: re-reading and deciding again", number)
            continue
        outcome = {
            "promoted": True,
            "version": number,
            "reason": decision.reason,
            "previous_version": pointer["previous_version"],
        }
        log_event(
            registry,
            {"event": "promoted", **outcome, "candidate": candidate_uri, "pointer": pointer, **record},
        )
        return {**outcome, **context}
    raise RegistryError(
        f"gave up after {max_attempts} attempts: the champion pointer keeps changing under {registry}"
    )


def preview_decision(
    metrics: EvalReport,
    registry: str | None,
    *,
    metric: str = "top1",
    min_delta: float = 0.0,
    max_class_drop: float | None = None,
    floor: QualityFloor | None = None,
    max_p_value: float | None = None,
) -> Decision:
    """The decision `promote` would take now for a metrics.json document (the DAG's branch condition;
    `promote` decides again under compare-and-swap)."""
    current = read_champion(registry) if registry else None
    sha = metrics.candidate.get("model_sha256")
    if current is not None and sha and current.get("model_sha256") == sha:
        return Decision(False, ALREADY_CHAMPION)
    return decide_for_metrics(
        metrics,
        current,
        metric=metric,
        min_delta=min_delta,
        max_class_drop=max_class_drop,
        floor=floor,
        max_p_value=max_p_value,
    )
