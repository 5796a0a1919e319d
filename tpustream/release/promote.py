"""Champion/challenger promotion: the decision (``tpustream.registry.policy``), then an atomic registry update.

The registry's layout and its primitives are ``tpustream.registry.store``'s. A version is claimed, then filled,
then the pointer is swapped: a crash anywhere leaves the pointer on a complete version, and a retry finds the
claimed version by the model's sha256 and finishes. The candidate's model.pt is checked against the metrics
before a version number is claimed.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tpustream.artifacts import ArtifactError, EvalReport, json_file_uri
from tpustream.registry.events import (
    DecisionEvent,
    DecisionKind,
    UploadFailedEvent,
    log_event,
    log_event_once,
)
from tpustream.registry.policy import (
    DEFAULT_POLICY,
    Decision,
    DecisionCode,
    PromotionPolicy,
    RegistryError,
    champion_to_compare,
    decide_for_metrics,
    is_finite_number,
)
from tpustream.registry.store import (
    ChampionPointer,
    champion_status,
    claim_version,
    fill_version,
    read_champion,
    read_pointer,
    replace_champion,
    version_uri,
)
from tpustream.storage import io as storage

if TYPE_CHECKING:
    from tpustream.vertex.model_registry import PublishedModel, VertexTarget

__all__ = [
    "PromotionOutcome",
    "promote",
    "preview_decision",
    "decide_and_log_refusal",
    # re-exported from tpustream.registry.store: promote's public API before the registry had its own module
    "read_champion",
    "version_uri",
    "champion_status",
]

log = logging.getLogger(__name__)

ALREADY_CHAMPION = "already the champion"  # the reason of promoting the champion's own weights again
_ALREADY = Decision(False, ALREADY_CHAMPION, "already-champion")


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
        ("candidate.model_sha256", metrics.candidate.model_sha256),
        ("dataset.manifest_digest", metrics.dataset.manifest_digest),
    ):
        if not value:
            raise RegistryError(
                f"--metrics {metrics_uri} is not a tpustream metrics.json (it lacks {key}): re-run evaluate"
            )
    return metrics


@dataclass(frozen=True, kw_only=True)
class PromotionOutcome:
    """What ``promote`` did: ``promoted`` (a new champion), ``version`` (the champion now when promoted or
    already the champion; None when refused), ``reason`` (the decision's, or ``ALREADY_CHAMPION``), ``code``
    and ``class_index`` (the decision's: what a reader branches on, never ``reason``), ``previous_version`` (promoted: the champion it replaced, None: there was none), ``champion_version``
    (refused: the champion kept), and ``vertex``: the champion as published to the Vertex AI Model Registry
    (None: no Vertex target, or nothing published: only a champion is)."""

    promoted: bool
    version: int | None
    reason: str
    code: DecisionCode
    class_index: int | None = None
    previous_version: int | None = None
    champion_version: int | None = None
    vertex: PublishedModel | None = None

    @property
    def decision(self) -> Decision:
        """The decision this outcome states (promoted or not, its reason, code and class)."""
        return Decision(self.promoted, self.reason, self.code, self.class_index)


@dataclass(frozen=True, kw_only=True)
class _Candidate:
    """The promotion's inputs, checked: the candidate, its metrics.json (read) and the registry."""

    uri: str
    metrics_uri: str
    metrics: EvalReport
    registry: str

    @property
    def model_sha256(self) -> str:
        return self.metrics.candidate.model_sha256


def promote(
    candidate_uri: str,
    metrics_uri: str,
    registry: str,
    policy: PromotionPolicy = DEFAULT_POLICY,
    *,
    max_attempts: int = 20,
    vertex: VertexTarget | None = None,
) -> PromotionOutcome:
    """Decide by ``policy`` and, if the candidate wins, publish it as the champion atomically.

    With ``vertex`` a promoted model is also uploaded to the Vertex AI Model Registry from its immutable
    registry version, with the serving container, gets the ``champion`` alias there and the evaluation in
    ``metrics_uri`` as a model evaluation (``outcome.vertex``). A candidate that is not promoted is not
    uploaded (``outcome.vertex`` is None): it has no immutable version an endpoint could be pinned to.
    """
    if vertex is not None and not storage.is_gcs(registry):  # refused before anything is promoted
        raise RegistryError(
            f"--vertex-model needs a gs:// registry (Vertex AI reads models from Cloud Storage), not {registry}"
        )
    candidate_uri = storage.check_uri(candidate_uri).rstrip("/")
    registry = storage.check_uri(registry).rstrip("/")
    metrics_uri = json_file_uri(metrics_uri, EvalReport.NAME)
    candidate = _Candidate(
        uri=candidate_uri, metrics_uri=metrics_uri, metrics=_load_metrics(metrics_uri), registry=registry
    )
    outcome = _promote(candidate, policy, max_attempts=max_attempts)
    # A promoted candidate, and the champion again (a retried or re-run promote after an upload failed:
    # the registry moved, Vertex did not). publish() uploads only what Vertex does not have yet.
    if vertex is not None and outcome.version is not None:
        outcome = replace(outcome, vertex=_publish_champion(vertex, candidate, outcome.version, policy))
    return outcome


def _publish_champion(
    vertex: VertexTarget, candidate: _Candidate, version: int, policy: PromotionPolicy
) -> PublishedModel:
    """Upload the champion version to the Vertex AI Model Registry (if not there yet) with its evaluation; a
    failure leaves the registry as it is (the champion stays) and fails loudly with how to repair it."""
    from tpustream.vertex import model_registry as vertex_registry

    labels = {
        "dataset": candidate.metrics.dataset.manifest_digest[:12],
        "tpustream_version": str(version),
        "model_sha256": candidate.model_sha256[:16],
    }
    value = candidate.metrics.candidate.metric(policy.metric)
    if is_finite_number(value):
        labels[f"{policy.metric}_permille"] = str(round(1000 * value))
    try:
        return vertex_registry.publish(
            vertex,
            artifact_uri=version_uri(candidate.registry, version),
            labels=labels,
            evaluation=candidate.metrics,
            metrics_uri=candidate.metrics_uri,
        )
    except Exception as exc:
        log_event(
            candidate.registry, UploadFailedEvent(version=version, error=f"{type(exc).__name__}: {exc}"[:500])
        )
        raise RegistryError(
            f"version {version} is the champion in {candidate.registry}, but publishing it to the "
            f"Vertex AI Model Registry ({vertex.model_name}) failed: {type(exc).__name__}: {exc}. Fix that "
            "(IAM, the bucket's region, the serving image) and run promote again, or retry the pipeline's "
            "promote task: it uploads the champion and imports its evaluation when Vertex does not have them yet"
        ) from exc


def _event(
    candidate: _Candidate,
    current: ChampionPointer | None,
    outcome: PromotionOutcome,
    policy: PromotionPolicy,
    pointer: ChampionPointer | None = None,
) -> DecisionEvent:
    """The decision's event, with what the champion's history needs (``tpustream.registry.history``): the
    metric decided on, the candidate's value, the champion's value on the same data (measured in the evaluate
    run, or recorded at its promotion on the same dataset digest; None when there is none), the dataset."""
    metrics = candidate.metrics
    digest = metrics.dataset.manifest_digest
    champion, champion_digest = champion_to_compare(metrics, current)
    kind: DecisionKind = (
        "promoted" if outcome.promoted else "refused" if outcome.version is None else "already-champion"
    )
    return DecisionEvent(
        event=kind,
        promoted=outcome.promoted,
        version=outcome.version,
        reason=outcome.reason,
        code=outcome.code,
        class_index=outcome.class_index,
        previous_version=outcome.previous_version,
        champion_version=outcome.champion_version,
        candidate=candidate.uri,
        pointer=pointer,
        metric=policy.metric,
        split=metrics.split,  # the split both values were measured on: test when the dataset has one
        value=metrics.candidate.metric(policy.metric),
        champion_value=champion.metric(policy.metric) if champion and champion_digest == digest else None,
        dataset_digest=digest,
        dataset=metrics.dataset.uri or None,
        metrics_uri=candidate.metrics_uri,
    )


# the evaluation numbers a champion pointer records (macro_f1, balanced_accuracy: evaluations before them
# have none), and the split they were measured on
POINTER_METRICS = (
    "top1",
    "top5",
    "loss",
    "macro_f1",
    "balanced_accuracy",
    "per_class_accuracy",
    "num_samples",
)


def _pointer(candidate: _Candidate, number: int, current: ChampionPointer | None) -> ChampionPointer:
    measured = candidate.metrics.candidate.to_json()
    return ChampionPointer(
        version=number,
        model_sha256=candidate.model_sha256,
        dataset_digest=candidate.metrics.dataset.manifest_digest,
        metrics={k: measured[k] for k in POINTER_METRICS if k in measured}
        | {"split": candidate.metrics.split},
        previous_version=current.version if current else None,
        promoted=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def _promote(candidate: _Candidate, policy: PromotionPolicy, *, max_attempts: int) -> PromotionOutcome:
    registry, sha = candidate.registry, candidate.model_sha256
    checked = False
    for _attempt in range(max_attempts):
        current, generation = read_pointer(registry)
        if current is not None and current.model_sha256 == sha:
            outcome = _outcome(_ALREADY, version=current.version)
            log_event(registry, _event(candidate, current, outcome, policy))
            return outcome
        decision = decide_for_metrics(candidate.metrics, current, policy)
        if not decision.promote:
            return _refused(candidate, current, decision, policy)
        if not checked:  # before a version number is claimed: versions/<n> cannot be taken back
            _check_candidate(candidate.uri, candidate.metrics_uri, sha)
            checked = True
        number = claim_version(registry, sha, candidate.uri)
        fill_version(registry, number, candidate.uri, candidate.metrics_uri, sha)
        pointer = _pointer(candidate, number, current)
        try:
            replace_champion(registry, pointer, generation)
        except storage.PreconditionFailed:
            log.info("champion changed while promoting version %d: re-reading and deciding again", number)
            continue
        outcome = _outcome(decision, version=number, previous_version=pointer.previous_version)
        log_event(registry, _event(candidate, current, outcome, policy, pointer))
        return outcome
    raise RegistryError(
        f"gave up after {max_attempts} attempts: the champion pointer keeps changing under {registry}"
    )


def _outcome(
    decision: Decision,
    *,
    version: int | None,
    previous_version: int | None = None,
    champion_version: int | None = None,
) -> PromotionOutcome:
    """The outcome that states ``decision`` (its reason, code and class)."""
    return PromotionOutcome(
        promoted=decision.promote,
        version=version,
        reason=decision.reason,
        code=decision.code,
        class_index=decision.class_index,
        previous_version=previous_version,
        champion_version=champion_version,
    )


def _refused(
    candidate: _Candidate, current: ChampionPointer | None, decision: Decision, policy: PromotionPolicy
) -> PromotionOutcome:
    """A refusal, logged once: the same candidate (its URI, metrics.json and model) refused against the same
    champion for the same reason is one decision however often a step takes it again (a retried task, the
    pipeline's evaluate step and then a promote), as a retried promotion finds its claimed version by sha256."""
    outcome = _outcome(decision, version=None, champion_version=current.version if current else None)
    decided = (
        candidate.uri,
        candidate.metrics_uri,
        candidate.model_sha256,
        str(outcome.champion_version),
        decision.reason,
    )
    key = hashlib.sha256("\n".join(decided).encode()).hexdigest()[:12]
    log_event_once(candidate.registry, _event(candidate, current, outcome, policy), key)
    return outcome


def decide_and_log_refusal(
    candidate_uri: str, metrics_uri: str, registry: str, policy: PromotionPolicy = DEFAULT_POLICY
) -> Decision:
    """The decision `promote` would take now (the pipeline's evaluate step: its branch condition), and a
    refusal logged in the registry's history exactly as `promote` logs one: in the pipeline a refused
    candidate never reaches promote. Logged once per candidate, champion and reason (a retried step logs
    nothing more). A win is only a preview: promote decides again under compare-and-swap and logs it.

    Raises:
        RegistryError: ``metrics_uri`` is missing or not evaluate's metrics.json.
    """
    registry = storage.check_uri(registry).rstrip("/")
    metrics_uri = json_file_uri(metrics_uri, EvalReport.NAME)
    candidate = _Candidate(
        uri=storage.check_uri(candidate_uri).rstrip("/"),
        metrics_uri=metrics_uri,
        metrics=_load_metrics(metrics_uri),
        registry=registry,
    )
    current = read_champion(registry)
    if current is not None and current.model_sha256 == candidate.model_sha256:
        return _ALREADY  # promote logged its promotion: nothing new is decided
    decision = decide_for_metrics(candidate.metrics, current, policy)
    if not decision.promote:
        _refused(candidate, current, decision, policy)
    return decision


def preview_decision(
    metrics: EvalReport, registry: str | None, policy: PromotionPolicy = DEFAULT_POLICY
) -> Decision:
    """The decision `promote` would take now for a metrics.json document (the DAG's branch condition;
    `promote` decides again under compare-and-swap)."""
    current = read_champion(registry) if registry else None
    sha = metrics.candidate.model_sha256
    if current is not None and sha and current.model_sha256 == sha:
        return _ALREADY
    return decide_for_metrics(metrics, current, policy)
