"""The run report's near-duplicates across splits: each val or test image the data check found within a few
bits of a train image's perceptual hash (``near-leak``, tpustream/dataset/check.py), side by side with that
train image, its distance and both source files, so a person sees at a glance whether the held-out image is
the training image re-saved, resized or edited. Shown when the run got past the data check with such pairs
(under ``max_leaked_images``, or ``data_check=warn``). The pairs come from the check-data step's JSON, which it
writes beside its Markdown artifact (``tpustream.dataset.check_result.data_check_json_uri``); the thumbnails
as the mistakes gallery makes them (``tpustream.report.mistakes.thumbnails``): the held-out image from its
split's shards, the train image from train's. No torch.
"""

from __future__ import annotations

import html
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tpustream.artifacts import Manifest
from tpustream.dataset.check_result import REPORT_FORMAT, NearLeakPair, data_check_json_uri
from tpustream.report.mistakes import thumbnails
from tpustream.storage import io as storage

if TYPE_CHECKING:
    from tpustream.dataset.check_result import DataCheckReport

__all__ = ["NEAR_LEAKS_SHOWN", "NearLeaksGallery", "near_leaks_gallery", "near_leaks_html"]

log = logging.getLogger(__name__)

NEAR_LEAKS_SHOWN = 24  # pairs, the surest first (two pictures each: as many pictures as the mistakes gallery)


@dataclass(frozen=True, kw_only=True)
class NearLeaksGallery:
    """What the section shows: the first ``pairs`` of ``total`` near-leaks (per split in ``leaked``) found
    within ``max_distance`` bits, and ``thumbnails`` per split (split -> key -> JPEG data URI)."""

    max_distance: int
    leaked: dict[str, int]
    total: int
    pairs: tuple[NearLeakPair, ...]
    thumbnails: dict[str, dict[str, str]] = field(default_factory=dict)


def near_leaks_gallery(
    data_check: str | DataCheckReport | None,
    dataset_uri: str,
    manifest: Manifest,
    *,
    shown: int = NEAR_LEAKS_SHOWN,
) -> NearLeaksGallery | None:
    """The near-leak pairs of the run's data check with their thumbnails, the first ``shown``; None when
    there were none, the check did not look for them, or its JSON is not there (a check-data step before it,
    ``data_check=off``) or cannot be read: nothing here fails the report.

    Args:
        data_check: the check-data step's report: the URI of its Markdown (the JSON is read beside it) or the
            ``DataCheckReport`` itself; None: no data check.
        dataset_uri: the dataset the check and the run read (the thumbnails come from its shards).
        manifest: its manifest.
        shown: how many pairs get a figure.
    """
    if data_check is None or isinstance(data_check, str) and not data_check:
        return None
    report: dict[str, Any] | None = (
        _read_json(data_check_json_uri(data_check))
        if isinstance(data_check, str)
        else dict(data_check.to_json())
    )
    if report is None:
        return None
    near = (report.get("facts") or {}).get("near_duplicates")
    if not isinstance(near, dict) or near.get("status") != "checked" or not near.get("pairs"):
        return None
    try:
        pairs = tuple(_pair(row) for row in near["pairs"])
        leaked = {str(split): int(count) for split, count in dict(near.get("leaked") or {}).items()}
        max_distance = int(near["max_distance"])
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("report: no near-duplicates section (the data check's pairs are malformed: %s)", exc)
        return None
    picked = pairs[:shown]
    wanted: dict[str, list[str]] = {}
    for pair in picked:
        wanted.setdefault(pair["split"], []).append(pair["key"])
        wanted.setdefault("train", []).append(pair["train_key"])
    return NearLeaksGallery(
        max_distance=max_distance,
        leaked=leaked,
        total=sum(leaked.values()) or len(pairs),
        pairs=picked,
        thumbnails={split: thumbnails(dataset_uri, manifest, split, keys) for split, keys in wanted.items()},
    )


def _read_json(uri: str) -> dict[str, Any] | None:
    """The check's JSON at ``uri``; None (logged) when it is not there or not a data check report."""
    try:
        report = json.loads(storage.read_text(uri))
    except storage.NotFound:
        log.info("report: no near-duplicates section (%s does not exist: a check-data step before it)", uri)
        return None
    except (storage.StorageError, ValueError) as exc:
        log.warning("report: no near-duplicates section (%s cannot be read: %s)", uri, exc)
        return None
    if not isinstance(report, dict) or report.get("format") != REPORT_FORMAT:
        log.warning("report: no near-duplicates section (%s is not a %s report)", uri, REPORT_FORMAT)
        return None
    return report


def _pair(row: Any) -> NearLeakPair:
    return {
        "split": str(row["split"]),
        "source": str(row["source"]),
        "key": str(row["key"]),
        "train_source": str(row["train_source"]),
        "train_key": str(row["train_key"]),
        "distance": int(row["distance"]),
    }


def _picture(uri: str | None, key: str) -> str:
    if uri and uri.startswith("data:image/jpeg;base64,"):
        return f'<img src="{uri}" alt="{html.escape(key)}" loading="lazy">'
    return '<div class="nopic">no picture</div>'


def near_leaks_html(gallery: NearLeaksGallery) -> str:
    """The section's body: a sentence, then one row per pair: the held-out image, the train image, the
    distance and both sources."""
    escape = html.escape
    rows = []
    for pair in gallery.pairs:
        split = pair["split"]
        held_out = gallery.thumbnails.get(split, {}).get(pair["key"])
        train = gallery.thumbnails.get("train", {}).get(pair["train_key"])
        rows.append(
            '<div class="near-pair">'
            f'<figure class="mistake">{_picture(held_out, pair["key"])}<figcaption>{escape(split)}<br>'
            f"<code>{escape(pair['source'])}</code><br>key <code>{escape(pair['key'])}</code></figcaption>"
            "</figure>"
            f'<div class="near-distance">~ {pair["distance"]} bit{"" if pair["distance"] == 1 else "s"}</div>'
            f'<figure class="mistake">{_picture(train, pair["train_key"])}<figcaption>train<br>'
            f"<code>{escape(pair['train_source'])}</code><br>key <code>{escape(pair['train_key'])}</code>"
            "</figcaption></figure></div>"
        )
    splits = " and ".join(f"{count} {escape(split)}" for split, count in gallery.leaked.items() if count)
    more = f", the first {len(gallery.pairs)} shown" if gallery.total > len(gallery.pairs) else ""
    return (
        f'<p class="note">{gallery.total} held-out image(s) ({splits}) are within {gallery.max_distance} bits '
        "of a train image's perceptual hash without being byte copies: re-saved, resized or edited copies, "
        f"whose scores measure images training saw. Each beside its nearest train image{more}; the surest "
        "(fewest bits) first. Exclude them (<code>tpustream shards create --exclude-keys</code>) or move "
        "them to train.</p>"
        f'<div class="near-pairs">{"".join(rows)}</div>'
    )
