"""The data check's limits: how far a dataset may go before ``dataset.check`` calls it anomalous. A leaf
(only the error types below it), so the check, its baseline side and its report object all name it without
importing each other; ``shards check``'s options and the pipeline's parameters are derived from its fields."""

from __future__ import annotations

from dataclasses import dataclass

from tpustream.dataset.near_duplicates import DEFAULT_MAX_DISTANCE
from tpustream.errors import ConfigError

__all__ = ["DataCheckThresholds"]


@dataclass(frozen=True, kw_only=True)
class DataCheckThresholds:
    """How far a dataset may go before the check calls it anomalous (a finding above its limit).

    The comment above a field says why its default; its docstring is the ``shards check`` option's help."""

    # Extra copies of one image under other names, per distinct image of a split. Scraped and user-uploaded
    # data hold a few (a photo saved twice); a folder uploaded twice or a sync gone wrong is several percent.
    max_duplicate_fraction: float = 0.01
    """Exact copies under other names, per distinct image of a split."""
    # Images (by content) in both train and val. Each one is scored on data the model trained on, inflating
    # val accuracy and so the champion comparison; the count is exact and the fix cheap: none by default.
    max_leaked_images: int = 0
    """Images (by content) in both train and val, and (counted apart) in test and train or val; and
    (counted apart again) val and test images that are near copies of train images (near-leak)."""
    # Skipped images and rejected rows per source item. A truncated upload now and then is normal; one in
    # twenty means the source (or an exporter, or a decoder) broke and the model trains on what is left.
    max_skipped_rate: float = 0.05
    """Skipped images and rejected rows per source item."""
    # A class's share of the images vs the baseline's, absolute (0.10 = 10 points). Fresh data moves shares
    # by a point or two; ten points is a class flooded or half gone, which changes what the model learns.
    max_class_share_shift: float = 0.10
    """A class's share of the images vs --baseline's (absolute, 0.10 = 10 points)."""
    # The skipped rate's rise vs the baseline's, absolute (0.02 = 2 points): a steady trickle of bad files
    # is the source's normal; a jump means something upstream changed since the champion's data.
    max_skipped_rate_increase: float = 0.02
    """Rise of the skipped rate vs --baseline's (absolute)."""
    # Train images of a class (upsampled copies not counted). A class of 3 images is learnt as those 3
    # images, and val measures it on fewer: worth saying, baseline or not; but a new class or a deliberately
    # small one is legitimate, so a warning, never a failure.
    min_class_train_samples: int = 10
    """Warn (never fail) about a class with fewer train images than this (0: no warning)."""
    # From the planted-copy ROC (dataset/near_duplicates.py): at 8 bits 98% of re-saved, resized, shifted and
    # re-lit copies of photos are found, at no false pair among 5,151 pairs of distinct photos (0.08% among
    # the upscaled 8x8 digits' near-identical thumbnails).
    near_duplicate_distance: int = DEFAULT_MAX_DISTANCE
    """Bits (of 64) within which a val or test image's perceptual hash makes it a near copy of a train
    image (near-leak, judged by --max-leaked-images); 0: equal hashes only; -1: exact (sha256) checks only."""

    def __post_init__(self) -> None:
        for name in (
            "max_duplicate_fraction",
            "max_skipped_rate",
            "max_class_share_shift",
            "max_skipped_rate_increase",
        ):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"--{name.replace('_', '-')} must be a fraction in [0, 1], got {value}")
        if self.max_leaked_images < 0:
            raise ConfigError(f"--max-leaked-images must be 0 or more, got {self.max_leaked_images}")
        if not -1 <= self.near_duplicate_distance <= 64:
            raise ConfigError(
                f"--near-duplicate-distance must be -1 (off) to 64 bits, got {self.near_duplicate_distance}"
            )
        if self.min_class_train_samples < 0:
            raise ConfigError(
                f"--min-class-train-samples must be 0 or more, got {self.min_class_train_samples}"
            )
