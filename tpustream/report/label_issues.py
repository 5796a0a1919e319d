"""The run report's likely label errors: the samples whose given label the candidate contradicts most
confidently (evaluate's ``label_issues.json``, tpustream/metrics/label_issues.py), each with its thumbnail, its
given and its suggested class, so a person can fix the labels and exclude or relabel them on the next run
(``tpustream shards create --exclude-keys/--relabel``). Thumbnails as the mistakes gallery makes them
(``tpustream.report.mistakes.thumbnails``: from the shards, inlined as data URIs). No torch.
"""

from __future__ import annotations

import html
import logging
from dataclasses import dataclass, field

from tpustream.artifacts import EvalReport, Manifest, json_file_uri
from tpustream.metrics.label_issues import LABEL_ISSUES_NAME, LabelIssue, LabelIssuesError, read_label_issues
from tpustream.report.mistakes import thumbnails
from tpustream.storage import io as storage

__all__ = ["LABEL_ERRORS_SHOWN", "LabelErrorsGallery", "label_errors_gallery", "label_errors_html"]

log = logging.getLogger(__name__)

LABEL_ERRORS_SHOWN = 48  # the most contradicted first; as many as the mistakes gallery, the page stays small


@dataclass(frozen=True, kw_only=True)
class LabelErrorsGallery:
    """What the section shows: the first ``issues`` of ``total`` found among ``num_samples`` of ``split``."""

    split: str
    num_samples: int
    total: int
    issues: tuple[LabelIssue, ...]
    thumbnails: dict[str, str] = field(default_factory=dict)  # key -> JPEG data URI


def label_errors_gallery(
    metrics_uri: str, dataset_uri: str, manifest: Manifest, *, shown: int = LABEL_ERRORS_SHOWN
) -> LabelErrorsGallery | None:
    """The likely label errors evaluate wrote beside ``metrics_uri`` (metrics.json or its directory), the
    first ``shown`` with thumbnails; None when it wrote none (an evaluation before them) or they cannot be read."""
    uri = storage.join(json_file_uri(metrics_uri, EvalReport.NAME).rsplit("/", 1)[0], LABEL_ISSUES_NAME)
    try:
        found = read_label_issues(uri)
    except LabelIssuesError as exc:
        log.info("report: no likely label errors section (%s)", exc)
        return None
    issues = found.issues[:shown]
    return LabelErrorsGallery(
        split=found.split,
        num_samples=found.num_samples,
        total=len(found.issues),
        issues=issues,
        thumbnails=thumbnails(dataset_uri, manifest, found.split, [issue.key for issue in issues]),
    )


def label_errors_html(gallery: LabelErrorsGallery) -> str:
    """The section's body: a sentence and one figure per issue (the mistakes gallery's layout)."""
    escape = html.escape
    if not gallery.issues:
        return (
            f'<p class="note">No likely label error: the candidate contradicts no given label among the '
            f"{gallery.num_samples} {escape(gallery.split)} samples with confidence.</p>"
        )
    cells = []
    for issue in gallery.issues:
        thumbnail = gallery.thumbnails.get(issue.key)
        picture = (
            f'<img src="{thumbnail}" alt="{escape(issue.key)}" loading="lazy">'
            if thumbnail and thumbnail.startswith("data:image/jpeg;base64,")
            else '<div class="nopic">no picture</div>'
        )
        cells.append(
            f'<figure class="mistake label-error">{picture}<figcaption>labelled <b>{escape(issue.given_class)}'
            f"</b>, looks like <b>{escape(issue.suggested_class)}</b> ({100 * issue.self_confidence:.1f}% "
            f"for its label)<br><code>{escape(issue.source or issue.key)}</code><br>key "
            f"<code>{escape(issue.key)}</code></figcaption></figure>"
        )
    more = f", the first {len(gallery.issues)} shown" if gallery.total > len(gallery.issues) else ""
    intro = (
        f'<p class="note">{gallery.total} of {gallery.num_samples} {escape(gallery.split)} samples whose given '
        f"label the candidate contradicts most confidently (confident learning on its out-of-sample scores"
        f"{more}, the least probable label first). Check them: keys to drop go in a file for "
        "<code>tpustream shards create --exclude-keys</code>, corrections in a CSV key,class for "
        "<code>--relabel</code>.</p>"
    )
    return intro + '<div class="mistakes">' + "".join(cells) + "</div>"
