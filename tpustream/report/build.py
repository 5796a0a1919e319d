"""The run report: what one retraining run did, as a self-contained HTML page and a Markdown summary.

The page answers what a user of a scheduled pipeline asks after a run: was the candidate promoted, and if not
why (which class dropped by how much); did the loss fall; which classes got worse; what data it saw; how the
champion has moved. The Markdown summary holds the same facts as text: it is what the KFP UI shows as a
Markdown artifact.

This module reads and writes; the rest is split by concept: ``tpustream.report.facts`` holds ``ReportFacts``,
``tpustream.report.verdict`` what both documents state of the decision (``Verdict``, the per-class ``ClassRow``),
``tpustream.report.formatting`` how both write numbers and their shared lines, ``tpustream.report.html`` renders
the page (its frame and elements in ``tpustream.report.page``, plots from ``tpustream.report.plots``, the
training recipe from ``tpustream.report.recipe``, the mistakes gallery from ``tpustream.report.mistakes``, the
near-duplicates across splits from ``tpustream.report.near_leaks``),
``tpustream.report.markdown`` the summary.
``build_report_facts`` reads the run's files into a ``ReportFacts``; ``render_report`` is pure;
``write_report`` writes both documents through ``tpustream.storage.io`` (local or gs://); ``write_run_report``
does all three with the registry's history, as the evaluate and promote steps and ``tpustream report`` call it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tpustream.artifacts import ArtifactError, EvalReport, json_file_uri
from tpustream.dataset.manifest import Manifest, load_manifest
from tpustream.errors import TpustreamError
from tpustream.metrics.scores import ScoresError, read_scores
from tpustream.registry.history import HistoryEntry, champion_history
from tpustream.registry.policy import DEFAULT_POLICY, DecisionCode, PromotionPolicy, RegistryError
from tpustream.registry.store import ChampionPointer
from tpustream.release.promote import ALREADY_CHAMPION, PromotionOutcome, preview_decision, read_champion
from tpustream.report.facts import ReportFacts
from tpustream.report.html import render_html
from tpustream.report.label_issues import label_errors_gallery
from tpustream.report.markdown import render_markdown
from tpustream.report.mistakes import Mistake, pick_mistakes, thumbnails
from tpustream.report.near_leaks import near_leaks_gallery
from tpustream.report.trials import read_candidate_tuning
from tpustream.report.verdict import class_rows, verdict_of
from tpustream.storage import io as storage
from tpustream.train.evaluate import load_model_card

if TYPE_CHECKING:
    from tpustream.dataset.check_result import DataCheckReport

__all__ = [
    "ReportError",
    "ReportFacts",
    "build_report_facts",
    "render_report",
    "write_report",
    "write_run_report",
]

log = logging.getLogger(__name__)


class ReportError(TpustreamError, ValueError):
    """The run's files cannot be read into a report; the message says which and what to do."""


# --------------------------------------------------------------------------- reading the run's files


def build_report_facts(
    *,
    model_uri: str,
    metrics_uri: str,
    dataset_uri: str,
    registry: str | None,
    policy: PromotionPolicy,
    outcome: PromotionOutcome | None = None,
    data_check: str | DataCheckReport | None = None,
    history: list[HistoryEntry] | None = None,
) -> ReportFacts:
    """Read a run's model card, metrics and manifest into the facts of its report.

    Args:
        model_uri: the candidate model artifact (the directory holding ``model.json``).
        metrics_uri: evaluate's ``metrics.json``, or the directory holding it.
        dataset_uri: the dataset the run trained and evaluated on (its manifest is read).
        registry: the champion registry; with no ``outcome`` the decision is recomputed against its current
            champion (``tpustream.release.promote.preview_decision``), as the evaluate step did. When the candidate is
            that champion already, the report says it was promoted by this run if the pointer moved after this
            evaluation (``created`` in metrics.json), with the reason ``history`` records, else that it was
            the champion before. None: no registry.
        policy: the run's promotion policy (the decision is recomputed with it when there is no ``outcome``).
        outcome: what ``tpustream.release.promote.promote`` returned, when the promote step ran: the report then
            states it (promoted version or refusal) instead of recomputing the decision.
        data_check: the check data step's report: the URI (local or gs://) of its Markdown (the step's
            ``report`` artifact; its near-leak pairs are read from the JSON beside it,
            ``tpustream.report.near_leaks``), or the ``DataCheckReport`` itself; None: no data check section.
        history: the champion's history (``tpustream.registry.history.champion_history(registry)``); None: no section.

    Returns:
        The facts ``render_report`` and ``write_report`` take.

    Raises:
        ReportError: metrics.json or the data check report is missing or not what evaluate writes.
        EvaluationError, ShardError: the model card or the manifest is missing or corrupt.
    """
    card = load_model_card(model_uri)
    metrics = _read_metrics(metrics_uri)
    manifest = load_manifest(dataset_uri)
    if outcome is None:
        decision = preview_decision(metrics, registry, policy)
        pointer = read_champion(registry) if registry and decision.code == "already-champion" else None
        if pointer is not None:  # the champion now: by this run, or earlier
            outcome = _champion_outcome(pointer, metrics, history or [])
    if outcome is not None:
        decision = outcome.decision
    mistakes, pictures = _mistakes(metrics_uri, metrics, dataset_uri, manifest)
    return ReportFacts(
        model_card=card,
        metrics=metrics,
        decision=decision,
        policy=policy,
        outcome=outcome,
        manifest=manifest,
        data_check_markdown=_data_check_text(data_check),
        history=history,
        mistakes=mistakes,
        thumbnails=pictures,
        label_errors=label_errors_gallery(metrics_uri, dataset_uri, manifest),
        tuning=read_candidate_tuning(model_uri),
        near_leaks=near_leaks_gallery(data_check, dataset_uri, manifest),
    )


def _mistakes(
    metrics_uri: str, metrics: EvalReport, dataset_uri: str, manifest: Manifest
) -> tuple[list[Mistake] | None, dict[str, str]]:
    """The candidate's most confident mistakes, from the per-sample scores evaluate wrote beside metrics.json,
    and their thumbnails; (None, {}) when it wrote none (an evaluation before them) or they cannot be read."""
    name = metrics.candidate.scores
    if not isinstance(name, str) or not name:
        return None, {}
    uri = storage.join(json_file_uri(metrics_uri, EvalReport.NAME).rsplit("/", 1)[0], name)
    try:
        wrong = [
            Mistake(
                key=row.key,
                source=row.source,
                true_class=row.true_class,
                predicted_class=metrics.classes[row.top_classes[0]],
                confidence=row.probabilities[0],
            )
            for row in read_scores(uri)
            if row.top_classes[0] != row.label
        ]
    except (ScoresError, IndexError) as exc:
        log.warning("report: no mistakes section (%s)", exc)
        return None, {}
    picked = pick_mistakes(wrong)
    return picked, thumbnails(dataset_uri, manifest, metrics.split, [mistake.key for mistake in picked])


def _champion_outcome(
    pointer: ChampionPointer, metrics: EvalReport, history: list[HistoryEntry]
) -> PromotionOutcome:
    """The outcome of a run whose candidate is now the champion, as ``promote`` returned it: promoted by this
    run when the pointer moved after this evaluation (its reason and code from the history when given; an
    event before codes, or none: a first champion's code, else a win's), else earlier."""
    version = pointer.version
    if pointer.promoted < (metrics.created or "~"):
        return PromotionOutcome(
            promoted=False, version=version, reason=ALREADY_CHAMPION, code="already-champion"
        )
    promoted = [e for e in history if e["event"] == "promoted" and e["version"] == version]
    entry = promoted[-1] if promoted else None
    first: DecisionCode = "no-champion" if pointer.previous_version is None else "wins"
    return PromotionOutcome(
        promoted=True,
        version=version,
        reason=str(entry["reason"] if entry else "the champion pointer names it"),
        code=(entry.get("code") or first) if entry else first,
        class_index=entry.get("class_index") if entry else None,
        previous_version=pointer.previous_version,
    )


def _read_metrics(metrics_uri: str) -> EvalReport:
    uri = json_file_uri(metrics_uri, EvalReport.NAME)
    try:
        return EvalReport.read(uri)
    except storage.NotFound as exc:
        raise ReportError(f"{uri} does not exist: run `tpustream evaluate` first") from exc
    except ArtifactError as exc:
        raise ReportError(f"{exc} (not an evaluate metrics.json)") from exc


def _data_check_text(data_check: str | DataCheckReport | None) -> str | None:
    if data_check is None or isinstance(data_check, str) and not data_check:
        return None
    if not isinstance(data_check, str):
        return data_check.to_markdown()
    try:
        return storage.read_text(data_check)
    except storage.NotFound as exc:
        raise ReportError(
            f"data check report {data_check} does not exist: pass the check data step's report"
        ) from exc


# --------------------------------------------------------------------------- rendering


def render_report(facts: ReportFacts) -> tuple[str, str]:
    """The run report as (HTML page, Markdown summary).

    Args:
        facts: what to show (``build_report_facts`` reads them from a run's files).

    Returns:
        The HTML page (self-contained: no script, no network fetch) and the Markdown summary.
    """
    rows = class_rows(facts)
    verdict = verdict_of(facts, rows)
    return render_html(facts, verdict, rows), render_markdown(facts, verdict, rows)


def write_report(facts: ReportFacts, html_uri: str, markdown_uri: str) -> tuple[str, str]:
    """Render the report and write the page to ``html_uri`` and the summary to ``markdown_uri``.

    Args:
        facts: what to show.
        html_uri: where the HTML page goes (a local path or gs://), e.g. a KFP ``Output[HTML]``'s path.
        markdown_uri: where the Markdown summary goes, e.g. a KFP ``Output[Markdown]``'s path.

    Returns:
        The (HTML, Markdown) written.
    """
    page, summary = render_report(facts)
    storage.write_bytes(html_uri, page.encode(), content_type="text/html; charset=utf-8")
    storage.write_bytes(markdown_uri, summary.encode(), content_type="text/markdown; charset=utf-8")
    return page, summary


def write_run_report(
    *,
    html_uri: str,
    markdown_uri: str,
    model_uri: str,
    metrics_uri: str,
    dataset_uri: str,
    registry: str | None,
    policy: PromotionPolicy = DEFAULT_POLICY,
    outcome: PromotionOutcome | None = None,
    data_check: str | None = None,
) -> ReportFacts:
    """Read a run's files and the registry's history, and write the report: the one call of the evaluate and
    promote steps and of ``tpustream report``.

    Args:
        html_uri, markdown_uri: where the page and the summary go (``write_report``).
        model_uri, metrics_uri, dataset_uri: the run's model artifact, metrics.json (or its directory) and
            dataset (``build_report_facts``).
        registry: the champion registry: the decision is taken against its champion and its history is
            shown. One that does not exist yet (before the first promotion) has no history; one whose history
            cannot be read is warned about, and the report goes on without that section. None: no registry.
        policy: the run's promotion policy.
        outcome: what ``tpustream.release.promote.promote`` returned, when the promote step ran; None: the decision
            is recomputed (``build_report_facts``).
        data_check: the URI of the check data step's Markdown report; when there is none there (the step did
            not run), or None, the report has no data check section.

    Returns:
        The facts the report shows; ``decision`` is the one it states.

    Raises:
        ReportError, EvaluationError, ShardError: as ``build_report_facts``.
    """
    if data_check and not storage.exists(data_check):
        log.info("no data check report at %s: the run report has no data check section", data_check)
        data_check = None
    facts = build_report_facts(
        model_uri=model_uri,
        metrics_uri=metrics_uri,
        dataset_uri=dataset_uri,
        registry=registry,
        policy=policy,
        outcome=outcome,
        data_check=data_check,
        history=_registry_history(registry) if registry else None,
    )
    write_report(facts, html_uri, markdown_uri)
    log.info("run report: %s", html_uri)
    return facts


def _registry_history(registry: str) -> list[HistoryEntry] | None:
    """The champion's history, oldest first; None when there is none to show: a registry not created yet
    (the first run's), or one that cannot be read (warned: the history is one section, the report goes on)."""
    try:
        return champion_history(registry)
    except RegistryError:  # the registry does not exist (yet): the first promote creates it
        return None
    except Exception as exc:  # network, permissions, credentials: not the report's to fail on
        log.warning(
            "run report without the champion's history: %s cannot be read (%s: %s)",
            registry,
            type(exc).__name__,
            exc,
        )
        return None
