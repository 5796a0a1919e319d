"""The data check against a baseline: what moved since (``baseline_checks``: new and vanished classes, class
shares, the skipped rate); and the per-class image counts both sides are measured with. Which dataset is the
baseline of a pipeline run (the champion's training data) is the run's gate, ``run.data_gate.champion_baseline``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream.artifacts import Manifest
from tpustream.dataset.check_report import percents
from tpustream.dataset.check_result import Anomaly, DataCheckFacts, ShareShift

if TYPE_CHECKING:
    from tpustream.dataset.check_thresholds import DataCheckThresholds

__all__ = ["baseline_checks", "class_images", "shares", "skipped_rate"]


def class_images(manifest: Manifest) -> dict[str, int]:
    """Source images per class over every split (train counts divided by the upsample factor)."""
    upsample = max(1, manifest.upsample)
    images = dict.fromkeys(manifest.classes, 0)
    for split, info in manifest.splits.items():
        for name, count in zip(manifest.classes, info.class_counts, strict=True):
            images[name] += count // upsample if split == "train" else count
    return images


def skipped_rate(manifest: Manifest) -> float:
    """Skipped images and rejected rows per source item (the images written plus the ones skipped)."""
    images, skipped = sum(class_images(manifest).values()), manifest.skipped
    return skipped.count / (images + skipped.count) if images + skipped.count else 0.0


def shares(images: dict[str, int]) -> dict[str, float]:
    """Each class's fraction of the images."""
    total = sum(images.values())
    return {name: count / total if total else 0.0 for name, count in images.items()}


def baseline_checks(
    manifest: Manifest,
    baseline: Manifest,
    rate: float,
    thresholds: DataCheckThresholds,
    facts: DataCheckFacts,
    max_examples: int,
) -> list[Anomaly]:
    """New and vanished classes, class shares that moved, a skipped rate that rose: vs the baseline."""
    anomalies: list[Anomaly] = []
    images, base_images = class_images(manifest), class_images(baseline)
    new = [name for name in images if name not in base_images]
    vanished = [name for name in base_images if name not in images]
    own_shares, base_shares = shares(images), shares(base_images)
    shifts: list[ShareShift] = sorted(
        (
            {
                "class": name,
                "baseline": base_shares[name],
                "share": own_shares[name],
                "change": own_shares[name] - base_shares[name],
            }
            for name in images
            if name in base_shares
        ),
        key=lambda s: (-abs(s["change"]), s["class"]),
    )
    base_rate = skipped_rate(baseline)
    facts["baseline"] = {
        "classes": len(base_images),
        "images": sum(base_images.values()),
        "new_classes": new,
        "vanished_classes": vanished,
        "share_shifts": shifts,
        "baseline_shares": base_shares,
        "skipped_rate": base_rate,
    }
    for code, names, what in (
        ("new-classes", new, "not in the baseline (a new class, or a typo'd folder or label?)"),
        ("vanished-classes", vanished, "of the baseline are gone (an export or a folder missing?)"),
    ):
        if names:
            listed = ", ".join(repr(n) for n in names[:max_examples]) + (
                " ..." if len(names) > max_examples else ""
            )
            anomalies.append(Anomaly(code, f"{len(names)} class(es) {what}: {listed}", {"classes": names}))
    moved = [s for s in shifts if abs(s["change"]) > thresholds.max_class_share_shift]
    if moved:
        limit = thresholds.max_class_share_shift
        listed = ", ".join(
            f"{s['class']!r} {s['baseline']:.1%} -> {s['share']:.1%} "
            f"({'+' if s['change'] > 0 else '-'}{percents(abs(s['change']), limit, ' points')[0]})"
            for s in moved[:max_examples]
        )
        anomalies.append(
            Anomaly(
                "class-share-shift",
                f"{len(moved)} class(es) moved more than {limit * 100:g} points in "
                f"share of the images vs the baseline: {listed}",
                {"shifts": moved},
            )
        )
    if rate - base_rate > thresholds.max_skipped_rate_increase:
        rise, limit_shown = percents(rate - base_rate, thresholds.max_skipped_rate_increase, " points")
        anomalies.append(
            Anomaly(
                "skipped-rate-increase",
                f"the skipped rate rose {rise}, from {base_rate:.1%} (baseline) to {rate:.1%}, more than "
                f"{limit_shown}: something upstream changed",
                {"baseline": base_rate, "rate": rate},
            )
        )
    return anomalies
