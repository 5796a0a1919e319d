"""What a run report shows, as plain data: ``ReportFacts``, the run's documents as their files hold them
(``tpustream.report.build.build_report_facts`` reads them), and what they say before any wording: whether top-5
is worth showing, the champion's evaluation, the registry's history oldest first.

What both documents state from them is apart: the verdict and the per-class rows in ``tpustream.report.verdict``,
numbers and shared lines in ``tpustream.report.formatting``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tpustream.artifacts import EvalReport, Evaluation, Manifest, ModelCard
from tpustream.registry.history import HistoryEntry
from tpustream.registry.policy import Decision, PromotionPolicy
from tpustream.release.promote import PromotionOutcome

if TYPE_CHECKING:
    from tpustream.report.label_issues import LabelErrorsGallery
    from tpustream.report.mistakes import Mistake
    from tpustream.report.near_leaks import NearLeaksGallery
    from tpustream.tune.record import TuningRecord

__all__ = ["ReportFacts", "history_oldest_first", "shows_top5"]


def shows_top5(num_classes: int) -> bool:
    """Whether top-5 accuracy says anything: only with more than 5 classes. With 5 or fewer every top 5 holds
    the label, so top-5 is 100% by construction; metrics.json keeps it (the contract), the report, the KFP
    metrics and `tpustream evaluate` do not show it."""
    return num_classes > 5


@dataclass(frozen=True, kw_only=True)
class ReportFacts:
    """Everything a run report shows, as plain data: the documents as their files hold them.

    Attributes:
        model_card: the candidate's model card (``tpustream.train.evaluate.load_model_card``): ``arch``,
            ``classes``, ``history`` (one dict per epoch: ``epoch``, ``train_loss``, ``val_loss``, ``val_top1``,
            ``val_top5``, ``val_samples``, ``epoch_seconds``, ``samples_per_s``, ``data_wait_fraction``,
            ``compiles``), ``metrics`` (the best epoch), ``init`` (a warm start's origin, None: random).
        metrics: evaluate's ``metrics.json``: ``classes``, ``candidate`` and ``champion`` (None when not
            measured) each with ``top1``, ``top5``, ``loss``, ``num_samples``, ``per_class_accuracy`` (None per
            class: no val sample), ``confusion_matrix``; ``champion_note``; ``dataset``.
        decision: promote or keep, and why (``tpustream.release.promote.preview_decision``, or the promote outcome's).
        policy: the promotion policy the decision was taken with (its metric, min_delta, max_class_drop).
        outcome: what ``tpustream.release.promote.promote`` returned when the promote step ran; None when it
            did not run.
        manifest: the dataset's manifest (``tpustream.dataset.manifest.load_manifest``); None: not shown.
        data_check_markdown: the check data step's Markdown report (``DataCheckReport.to_markdown()``, the
            step's ``report`` artifact), shown as its own section; None: no section.
        history: the champion's history (``tpustream.registry.history.champion_history``): dicts with ``time``,
            ``event`` ("promoted", "refused", "already-champion"), ``version``, ``candidate``,
            ``dataset_digest``, ``metric``, ``value``, ``reason``, ``champion_version``; None: no section.
        mistakes: the candidate's most confident wrong predictions (``tpustream.report.mistakes.pick_mistakes``) and
            ``thumbnails`` (key -> JPEG data URI) for them; None: no per-sample scores, no section.
        label_errors: the candidate's likely label errors with their thumbnails
            (``tpustream.report.label_issues.label_errors_gallery``); None: no label_issues.json, no section.
        tuning: the hyperparameter search that chose the candidate (its tuning.json,
            ``tpustream.report.trials.read_candidate_tuning``); None: not tuned, no section.
        near_leaks: the data check's near-duplicates across splits, each pair with its two thumbnails
            (``tpustream.report.near_leaks.near_leaks_gallery``); None: none found or no check JSON, no section.
    """

    model_card: ModelCard
    metrics: EvalReport
    decision: Decision
    policy: PromotionPolicy = field(default_factory=PromotionPolicy)
    outcome: PromotionOutcome | None = None
    manifest: Manifest | None = None
    data_check_markdown: str | None = None
    history: list[HistoryEntry] | None = None
    mistakes: list[Mistake] | None = None
    thumbnails: dict[str, str] = field(default_factory=dict)
    label_errors: LabelErrorsGallery | None = None
    tuning: TuningRecord | None = None
    near_leaks: NearLeaksGallery | None = None

    @property
    def champion(self) -> Evaluation | None:
        """The champion's evaluation; None: not measured (``metrics.champion_note`` says why) or no champion."""
        return self.metrics.champion


def history_oldest_first(facts: ReportFacts) -> list[HistoryEntry]:
    """The history oldest first (ISO-8601 times sort as text)."""
    return sorted(facts.history or [], key=lambda event: str(event.get("time") or ""))
