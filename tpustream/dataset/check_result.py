"""What a data check returns: its findings (``Anomaly``, coded by ``ANOMALY_CODES`` / ``WARNING_CODES``), the
report object (``DataCheckReport``: the anomalies, then the facts they were judged on) and the shapes of those
facts and details as they go into data-check.json (TypedDicts: JSON on the wire, read by key by the Markdown
report, the run report and tests). ``dataset.check`` computes them; ``dataset.check_report`` renders them.

A fact that only some checks produce is ``NotRequired``: ``class_balance`` (two or more train classes), the
hash checks' (a dataset with a sample index; test leakage only with a test split) and ``baseline`` (a baseline).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Literal, NotRequired, TypedDict

from tpustream.dataset.check_thresholds import DataCheckThresholds

__all__ = [
    "ANOMALY_CODES",
    "WARNING_CODES",
    "REPORT_FORMAT",
    "data_check_json_uri",
    "Anomaly",
    "AnomalyDetails",
    "BaselineFacts",
    "ClassBalance",
    "DataCheckFacts",
    "DataCheckJson",
    "DataCheckReport",
    "DuplicateGroup",
    "EmptyClass",
    "LeakExample",
    "NearDuplicateFacts",
    "NearLeakPair",
    "NearStatus",
    "ShareShift",
    "SizeFacts",
    "SIZE_KEYS",
    "SizeKey",
    "SkippedFacts",
    "SplitName",
    "SplitFacts",
    "TinyClass",
]

REPORT_FORMAT = "tpustream.datacheck/v1"


def data_check_json_uri(markdown_uri: str) -> str:
    """Where the pipeline's check-data step writes the report's JSON (``DataCheckReport.to_json()``): beside
    its Markdown artifact, the same name with ``.json`` added; the run report reads the near-leak pairs
    from it (``tpustream.report.near_leaks``)."""
    return f"{markdown_uri}.json"


ANOMALY_CODES = (
    "missing-split",  # the dataset has no train or no val samples at all
    "empty-class",  # a class with 0 train or 0 val samples
    "train-val-leak",  # images (by content) in both train and val
    "test-leak",  # images (by content) in test and in train or val
    "near-leak",  # val or test images whose perceptual hash is near a train image's (not byte-identical)
    "duplicate-images",  # one image under several names within a split
    "skipped-rate",  # skipped images + rejected rows per source item
    "new-classes",  # classes the baseline does not have
    "vanished-classes",  # baseline classes this dataset lacks
    "class-share-shift",  # a class's share of the images moved vs the baseline
    "skipped-rate-increase",  # the skipped rate rose vs the baseline's
)
WARNING_CODES = ("tiny-class",)  # a class with fewer train images than min_class_train_samples


# --------------------------------------------------------------------------- the facts' shapes


class SizeFacts(TypedDict):
    """min / median / max of a size over a split's samples, in pixels (the manifest's ``SizeSummary``)."""

    min: int
    median: int
    max: int


class DuplicateGroup(TypedDict):
    """One image (by content) found under several source names in a split."""

    sha256: str
    sources: list[str]


class SplitFacts(TypedDict):
    """A split's counts and statistics (from the manifest) and, with the hash checks, its duplicates."""

    samples: int
    class_counts: dict[str, int]
    formats: dict[str, int]
    width: NotRequired[SizeFacts]  # the statistics: datasets written before them have none
    height: NotRequired[SizeFacts]
    short_side: NotRequired[SizeFacts]
    images: NotRequired[int]  # the hash checks' (distinct source images)
    duplicate_groups: NotRequired[int]
    duplicate_copies: NotRequired[int]
    duplicate_fraction: NotRequired[float]
    duplicate_examples: NotRequired[list[DuplicateGroup]]


SizeKey = Literal["width", "height", "short_side"]
SIZE_KEYS: tuple[SizeKey, ...] = ("width", "height", "short_side")
SplitName = Literal["train", "val", "test"]

# "class" is a keyword: these are spelled the functional way
EmptyClass = TypedDict("EmptyClass", {"class": str, "split": str})
TinyClass = TypedDict("TinyClass", {"class": str, "train_images": int})
ShareShift = TypedDict("ShareShift", {"class": str, "baseline": float, "share": float, "change": float})


# a leaked image: its hash and its source names in each split that holds it
class LeakExample(TypedDict):
    sha256: str
    train: NotRequired[list[str]]
    val: NotRequired[list[str]]
    test: NotRequired[list[str]]


class NearLeakPair(TypedDict):
    """A val or test image and the train image nearest it by perceptual hash: the source file and the sample
    key (what the run report's thumbnails are read by) of each, and the Hamming distance in bits."""

    split: str  # val or test
    source: str
    key: str
    train_source: str
    train_key: str
    distance: int
    # what matched: "phash" (the whole images' hashes, distance in their bits) or "windows" (thumbnails: a
    # query window of the val/test image and a base window of the train image, a shifted copy)
    match: NotRequired[Literal["phash", "windows"]]


# checked: both sides hashed; exact-only: a split's sample index has no perceptual hashes (written before
# them); off: near_duplicate_distance -1
NearStatus = Literal["checked", "exact-only", "off"]


class NearDuplicateFacts(TypedDict):
    """The near-duplicate check: near copies of train images in val and test, and clusters inside train."""

    status: NearStatus
    max_distance: int
    window_distance: NotRequired[int]  # thumbnails' window hashes (image.phash_windows): bits
    unhashed_splits: list[str]  # the splits whose index lacks hashes (exact-only)
    small_images: dict[str, int]  # per split: images with a side under NEAR_MIN_SIDE (exact-only)
    leaked: NotRequired[dict[str, int]]  # per held-out split: images near a train image (not exact copies)
    pairs: NotRequired[list[NearLeakPair]]  # the nearest train image of each, at most NEAR_PAIRS_LISTED
    train_clusters: NotRequired[int]  # groups of train images linked by near pairs (distinct contents)
    train_clustered_images: NotRequired[int]
    train_largest_cluster: NotRequired[int]


class ClassBalance(TypedDict):
    """The train split's largest class per its smallest (source images)."""

    max_min_ratio: float
    largest: str
    smallest: str
    class_weights: str | None


class SkippedFacts(TypedDict):
    """Skipped images and rejected rows, from the manifest, and their rate per source item."""

    count: int
    sample_slots: int
    by_reason: dict[str, int]
    rejected_rows: int
    examples: list[str]
    rate: float


class BaselineFacts(TypedDict):
    """The baseline dataset, as compared with."""

    classes: int
    images: int
    new_classes: list[str]
    vanished_classes: list[str]
    share_shifts: list[ShareShift]
    baseline_shares: dict[str, float]
    skipped_rate: float


class DataCheckFacts(TypedDict):
    """What the check was judged on, in the order it is found (and written)."""

    manifest_digest: str
    source: str | None
    classes: int
    splits: dict[str, SplitFacts]
    empty_classes: NotRequired[list[EmptyClass]]  # every check sets those three
    tiny_classes: NotRequired[list[TinyClass]]
    class_balance: NotRequired[ClassBalance]
    leaked_images: NotRequired[int]
    leak_examples: NotRequired[list[LeakExample]]
    test_leaked_images: NotRequired[int]
    test_leak_examples: NotRequired[list[LeakExample]]
    hash_checks: NotRequired[bool]
    near_duplicates: NotRequired[NearDuplicateFacts]
    skipped: NotRequired[SkippedFacts]
    baseline: NotRequired[BaselineFacts]
    baseline_note: NotRequired[str]


class AnomalyDetails(TypedDict, total=False):
    """An anomaly's details: the keys its code sets (every one optional, each with one meaning)."""

    splits: list[str]  # missing-split
    empty: list[EmptyClass]  # empty-class
    classes: list[TinyClass] | list[str]  # tiny-class (with ``limit``); new-classes, vanished-classes
    limit: int
    split: str  # duplicate-images (with copies, fraction, examples)
    copies: int
    fraction: float
    # duplicate-images; train-val-leak, test-leak; near-leak (with ``max_distance``)
    examples: list[DuplicateGroup] | list[LeakExample] | list[NearLeakPair]
    count: int  # train-val-leak, test-leak, near-leak, skipped-rate
    max_distance: int
    window_distance: int  # near-leak: thumbnails' window hashes (bits)
    rate: float  # skipped-rate, skipped-rate-increase (with ``baseline``)
    by_reason: dict[str, int]
    baseline: float
    shifts: list[ShareShift]  # class-share-shift


class AnomalyJson(TypedDict):
    code: str
    reason: str
    details: AnomalyDetails


class DataCheckJson(TypedDict):
    """data-check.json: ``DataCheckReport.to_json()``."""

    format: str
    dataset: str
    baseline: str | None
    ok: bool
    anomalies: list[AnomalyJson]
    warnings: list[AnomalyJson]
    thresholds: dict[str, float]
    facts: DataCheckFacts
    notes: list[str]


# --------------------------------------------------------------------------- the findings and the report


@dataclass(frozen=True)
class Anomaly:
    """One finding past its threshold: ``code`` (ANOMALY_CODES), a one-line ``reason``, and its details."""

    code: str
    reason: str
    details: AnomalyDetails = field(default_factory=lambda: AnomalyDetails())

    def to_json(self) -> AnomalyJson:
        return {"code": self.code, "reason": self.reason, "details": copy.deepcopy(self.details)}


@dataclass
class DataCheckReport:
    """What the check found: the anomalies first, then the facts they were judged on."""

    dataset: str
    baseline: str | None
    thresholds: DataCheckThresholds
    anomalies: list[Anomaly]
    facts: DataCheckFacts
    notes: list[str]
    max_examples: int = 5
    warnings: list[Anomaly] = field(
        default_factory=list
    )  # findings that never fail the check (WARNING_CODES)

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def failure_line(self, report_uri: str = "") -> str:
        """One line naming the anomalies, where the report is and what to do."""
        count = len(self.anomalies)
        first = self.anomalies[0]
        more = (
            f" (and {count - 1} more: {', '.join(a.code for a in self.anomalies[1:])})" if count > 1 else ""
        )
        where = f"; report: {report_uri}" if report_uri else ""
        return (
            f"data check of {self.dataset}: {count} anomal{'y' if count == 1 else 'ies'}, {first.code}: "
            f"{first.reason}{more}{where}. Fix the source, or train anyway with data_check=warn"
        )

    def to_json(self) -> DataCheckJson:
        return {
            "format": REPORT_FORMAT,
            "dataset": self.dataset,
            "baseline": self.baseline,
            "ok": self.ok,
            "anomalies": [a.to_json() for a in self.anomalies],
            "warnings": [w.to_json() for w in self.warnings],
            "thresholds": asdict(self.thresholds),
            "facts": self.facts,
            "notes": self.notes,
        }

    def to_markdown(self) -> str:
        from tpustream.dataset.check_report import render_markdown

        return render_markdown(self)
