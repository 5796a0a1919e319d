"""Evaluation: a model artifact (and the current champion) on a dataset's held-out split, exactly.

The decision split is test when the dataset has one (val picked the candidate's best epoch and stopped its
training early, so its val score is optimistic) and val otherwise; the champion is measured on the same split,
and the candidate also on val when test decides, for reference. Every sample is counted once (the loader's masks); the result records the dataset's manifest
digest and the model's sha256 so promotion can refuse to compare numbers from different data, and
``complete: false`` when samples were missing, which promotion refuses. metrics.json is strict JSON
(a NaN loss is written as null).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from tpustream.artifacts import (
    METRICS_FORMAT,
    ArtifactError,
    Baseline,
    DatasetRef,
    EvalReport,
    Evaluation,
    ModelCard,
)
from tpustream.dataset.manifest import Manifest, ShardError, iter_sample_index, load_manifest, manifest_digest
from tpustream.errors import TpustreamError
from tpustream.loader.batch import BATCH_KEYS
from tpustream.metrics.baseline import majority_baseline
from tpustream.metrics.label_issues import LABEL_ISSUES_NAME, label_issues_from_scores, write_label_issues
from tpustream.metrics.masked import masked_sums, summarize
from tpustream.metrics.paired_test import PairedTest, paired_test
from tpustream.metrics.scores import (
    CHAMPION_SCORES_NAME,
    DECIMALS,
    SCORES_NAME,
    SampleScore,
    metrics_from_scores,
    read_scores,
    scores_top_k,
    write_scores,
)
from tpustream.registry.store import read_champion, version_uri
from tpustream.storage import io as storage
from tpustream.xla_runtime import single_device

__all__ = [
    "EvaluationError",
    "decision_split",
    "METRICS_FORMAT",
    "evaluate_model",
    "evaluate",
    "load_model_card",
    "val_predictions",
]

log = logging.getLogger(__name__)


class EvaluationError(TpustreamError, ValueError):
    """The model or data cannot be evaluated as given; the message says what and what to do."""


def load_model_card(model_uri: str) -> ModelCard:
    """Read and check ``model.json`` of a model artifact directory.

    Raises:
        EvaluationError: there is none, or it is not a model card this version reads.
    """
    uri = storage.join(storage.check_uri(model_uri).rstrip("/"), ModelCard.NAME)
    try:
        return ModelCard.read(uri)
    except storage.NotFound as exc:
        raise EvaluationError(
            f"{uri} does not exist: --model must be a directory written by `tpustream train`"
        ) from exc
    except ArtifactError as exc:
        raise EvaluationError(str(exc)) from exc


def _class_mismatch(card: ModelCard, classes: list[str], model_uri: str, data_uri: str) -> str | None:
    """Why the model cannot be measured on the dataset's labels, or None when their class lists agree."""
    if card.classes == classes:
        return None
    return (
        f"model {model_uri} predicts {len(card.classes)} classes {card.classes[:5]}..., the dataset "
        f"{data_uri} has {len(classes)} {classes[:5]}...: the class sets differ"
    )


def _load_weights(model_uri: str) -> tuple[dict[str, Any], str]:
    from tpustream.train.checkpoint import CheckpointError, load_torch_file

    try:
        return load_torch_file(storage.join(model_uri.rstrip("/"), "model.pt"), what="model weights")
    except CheckpointError as exc:
        raise EvaluationError(f"{exc}: the model artifact is incomplete or corrupt; re-export it") from exc


def decision_split(manifest: Manifest) -> str:
    """The split promotion decides on: test when the dataset has one, else val (datasets without test)."""
    return "test" if manifest.num_samples("test") else "val"


def _split_manifest(card: ModelCard, model_uri: str, data_uri: str, split: str) -> Manifest:
    """The dataset's manifest, once it is known to have ``split`` with the model's classes."""
    try:
        manifest = load_manifest(data_uri)
    except ShardError as exc:
        raise EvaluationError(f"--data {data_uri}: {exc}") from exc
    mismatch = _class_mismatch(card, manifest.classes, model_uri, data_uri)
    if mismatch:
        raise EvaluationError(f"{mismatch}; evaluate on a dataset with the same classes")
    if not manifest.num_samples(split):
        raise EvaluationError(f"--data {data_uri} has no {split} split to evaluate on")
    return manifest


def _load_model(card: ModelCard, model_uri: str, num_classes: int) -> tuple[Any, str]:
    """The artifact's network with its weights (on the CPU), and the sha256 of model.pt."""
    from tpustream.models import network_for_card

    weights, model_digest = _load_weights(model_uri)
    model = network_for_card(card)  # the stem model.json records, however the weights began
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise EvaluationError(
            f"{model_uri}/model.pt does not match its model.json ({card.arch}): {exc}"
        ) from exc
    return model, model_digest


@dataclass
class _ValPass:
    """A model artifact ready to run over one held-out split of a dataset (val or test): what
    ``evaluate_model`` and ``val_predictions`` share, so a check against evaluation runs evaluation's own code."""

    model_uri: str
    data_uri: str
    card: ModelCard
    manifest: Manifest
    classes: list[str]
    device: Any
    model: Any
    model_digest: str
    loader: Any

    @classmethod
    def open(
        cls,
        model_uri: str,
        data_uri: str,
        *,
        batch_size: int,
        workers: int,
        sample_keys: bool = False,
        split: str = "val",
    ) -> _ValPass:
        from tpustream.loader.config import SplitName
        from tpustream.loader.shard_loader import LoaderConfig, ShardLoader

        model_uri = storage.check_uri(model_uri).rstrip("/")
        data_uri = storage.absolute(data_uri)  # metrics.json names it: valid from any directory
        card = load_model_card(model_uri)
        manifest = _split_manifest(card, model_uri, data_uri, split)
        device = single_device()
        model, model_digest = _load_model(card, model_uri, len(manifest.classes))
        loader = ShardLoader(
            LoaderConfig(
                data=data_uri,
                split=cast(SplitName, split),  # _split_manifest found it in the manifest
                batch_size=batch_size,
                input_size=card.input_size,
                val_crop_fraction=card.val_crop_fraction,  # model.json's preprocessing
                num_replicas=1,
                replica_index=0,
                workers=workers,
                sample_keys=sample_keys,
            ),
            manifest=manifest,
        )
        return cls(
            model_uri,
            data_uri,
            card,
            manifest,
            list(manifest.classes),
            device,
            model.to(device).eval(),
            model_digest,
            loader,
        )

    def batches(self) -> Iterator[tuple[Any, Any, Any, list[str] | None]]:
        """(logits as float32, labels, mask, keys) per val batch, on the device (keys: the samples' keys when
        opened with ``sample_keys``, else None); the val split in manifest order (shards in order, samples in
        shard order) when the loader has no workers."""
        import torch

        from tpustream.image.transforms import normalize

        with torch.no_grad():
            for batch in self.loader.epoch(0):
                images, labels, mask = (batch[k].to(self.device) for k in BATCH_KEYS)
                # as the training step normalizes (its constants), not as model.json says: validate-serving
                # then catches a card the server would read differently from training
                yield self.model(normalize(images)).float(), labels, mask, batch.get("key")
                if self.device.type != "cpu":
                    import torch_xla

                    torch_xla.sync()


@dataclass(frozen=True, kw_only=True)
class ValPrediction:
    """Evaluation's answer for one val sample: its ``label``, the top-k ``class_indices`` and their softmax
    ``probabilities``."""

    label: int
    class_indices: list[int]
    probabilities: list[float]


def val_predictions(
    model_uri: str, data_uri: str, *, limit: int, top_k: int = 5
) -> tuple[list[ValPrediction], str]:
    """Evaluation's answers for the first ``limit`` val samples in manifest order: per sample its label, the
    top-k class indices and their softmax probabilities (``tpustream validate-serving`` compares the
    serving container's answers with these); and the sha256 of the model.pt they came from."""
    run = _ValPass.open(model_uri, data_uri, batch_size=min(64, max(1, limit)), workers=0)
    k = min(top_k, len(run.classes))
    out: list[ValPrediction] = []
    for logits, labels, mask, _ in run.batches():
        probabilities, indices = logits.softmax(dim=1).topk(k, dim=1)
        rows = zip(
            labels.cpu().tolist(),
            mask.cpu().tolist(),
            indices.cpu().tolist(),
            probabilities.cpu().tolist(),
            strict=True,
        )
        for label, valid, top, probs in rows:
            if valid and len(out) < limit:
                out.append(ValPrediction(label=int(label), class_indices=top, probabilities=probs))
        if len(out) >= limit:
            break
    return out, run.model_digest


class _ScoreCollector:
    """Each batch's top-k classes and probabilities, kept on the device and read back once at the end (a
    per-batch read would make every TPU step wait for the host)."""

    def __init__(self, num_classes: int) -> None:
        self.k = scores_top_k(num_classes)
        self.parts: list[tuple[Any, Any, Any, Any]] = []
        self.keys: list[str] = []

    def add(self, logits: Any, labels: Any, mask: Any, keys: list[str] | None) -> None:
        # classes ranked by logit, as masked_sums ranks them (its top-1 is the confusion matrix's)
        indices = logits.topk(self.k, dim=1).indices
        probabilities = logits.softmax(dim=1).gather(1, indices)
        self.parts.append((labels, mask, indices, probabilities))
        self.keys.extend(keys or [])

    def rows(self, classes: list[str], sources: dict[str, str]) -> list[SampleScore]:
        import torch

        labels, mask, indices, probabilities = (
            torch.cat([part[i] for part in self.parts]).cpu().numpy() for i in range(4)
        )
        valid = mask.astype(bool)
        keys = np.asarray(self.keys, dtype=object)[valid] if len(self.keys) == len(valid) else None
        # as written: the metrics evaluate reports are the ones the file gives back
        rounded = np.round(probabilities[valid].astype(np.float64), DECIMALS)
        return [
            SampleScore(
                key=str(keys[row]) if keys is not None else "",
                source=sources.get(str(keys[row]), "") if keys is not None else "",
                label=int(label),
                true_class=classes[int(label)],
                top_classes=[int(index) for index in top],
                probabilities=[float(value) for value in probs],
            )
            for row, (label, top, probs) in enumerate(
                zip(labels[valid], indices[valid], rounded, strict=True)
            )
        ]


def _sample_sources(data_uri: str, manifest: Manifest, split: str) -> dict[str, str]:
    """Sample key -> source file, from ``split``'s sample index ({} for a dataset without one)."""
    if not manifest.has_sample_index():
        return {}
    try:
        return {entry.key: entry.source for entry in iter_sample_index(data_uri, manifest, split)}
    except ShardError as exc:
        log.warning("per-sample scores without source files: %s", exc)
        return {}


def evaluate_model(
    model_uri: str,
    data_uri: str,
    *,
    batch_size: int = 64,
    workers: int = 2,
    scores_uri: str | None = None,
    split: str = "val",
) -> Evaluation:
    """Top-1, top-5, loss, per-class accuracy and the confusion matrix of one model on ``split`` (val or
    test), and the metrics of its per-sample scores (tpustream/metrics/classification.py: per-class
    precision, recall, F1; macro-F1, balanced accuracy, the confidence-threshold table, AU-PRC, AU-ROC).
    ``scores_uri``: also write the scores there (tpustream/metrics/scores.py)."""
    import torch

    run = _ValPass.open(
        model_uri,
        data_uri,
        batch_size=batch_size,
        workers=workers,
        sample_keys=scores_uri is not None,
        split=split,
    )
    model_uri, data_uri, card, device, loader = run.model_uri, run.data_uri, run.card, run.device, run.loader
    classes, model_digest = run.classes, run.model_digest
    expected = run.manifest.num_samples(split)
    num_classes = len(classes)
    confusion = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=device)
    sums = torch.zeros(4, dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
    collector = _ScoreCollector(num_classes)
    started = time.perf_counter()
    for logits, labels, mask, keys in run.batches():
        collector.add(logits, labels, mask, keys)
        batch_sums, predicted = masked_sums(logits, labels, mask, sums.dtype)
        sums += batch_sums
        cells = labels * num_classes + predicted
        confusion += torch.bincount(cells, weights=mask.to(torch.float32), minlength=num_classes**2).to(
            torch.int64
        )
    metrics = summarize(sums)
    matrix = confusion.cpu().numpy().reshape(num_classes, num_classes)
    count = int(matrix.sum())
    report = loader.last_report
    if count != expected:
        log.warning(
            "evaluated %d of the manifest's %d %s samples (%s): this result cannot be promoted; find the "
            "damaged shards with `tpustream shards verify %s`, fix or re-create them, then evaluate again",
            count,
            expected,
            split,
            report.line() if report else "",
            data_uri,
        )
    per_class_total = matrix.sum(axis=1)
    # A class with no sample in the split is not measured (None), not 0% accurate: a 0.0 there would read as a drop
    # of the champion's whole accuracy to max_class_drop.
    per_class = [
        float(hits / total) if total else None
        for hits, total in zip(np.diag(matrix), per_class_total, strict=True)
    ]
    unmeasured = [str(classes[i]) for i, total in enumerate(per_class_total) if not total]
    if unmeasured:
        log.warning(
            "%d class(es) have no %s sample in %s and are not measured: %s (add %s images of them, or "
            "re-create the dataset with a larger --%s-fraction)",
            len(unmeasured),
            split,
            data_uri,
            ", ".join(unmeasured[:10]),
            split,
            split,
        )
    sources = _sample_sources(data_uri, run.manifest, split) if scores_uri is not None else {}
    rows = collector.rows(classes, sources)
    scored = metrics_from_scores(rows, num_classes).to_json()
    if scores_uri is not None:
        write_scores(scores_uri, rows)
        scored["scores"] = scores_uri.rsplit("/", 1)[-1]  # beside metrics.json
    return Evaluation.from_json(  # built as the JSON it is written as: metrics.json keeps its key order
        {
            "model": model_uri,
            "model_sha256": model_digest,
            "arch": card.arch,
            "split": split,
            "top1": metrics["top1"],
            "top5": metrics["top5"],
            "loss": metrics["loss"],
            "num_samples": count,
            "complete": count == expected,
            "per_class_accuracy": per_class,  # None: the class has no sample in the split (not measured)
            "unmeasured_classes": unmeasured,
            "confusion_matrix": matrix.tolist(),
            **scored,  # macro_f1, balanced_accuracy, auprc, auroc, per_class, thresholds, scores_top_k, scores
            "seconds": round(time.perf_counter() - started, 2),
        }
    )


def _paired(output_uri: str) -> PairedTest:
    """McNemar's exact test of the candidate's and the champion's top-1 on the samples both were scored on,
    read from the two scores files evaluate has just written."""

    def right(name: str) -> Iterator[tuple[str, bool]]:
        for row in read_scores(storage.join(output_uri, name)):
            yield row.key, row.top_classes[0] == row.label

    return paired_test(right(SCORES_NAME), right(CHAMPION_SCORES_NAME))


def _write_label_issues(output_uri: str, classes: list[str], split: str) -> None:
    """The candidate's likely label errors on the deciding split (tpustream/metrics/label_issues.py), from the
    scores just written, as ``OUTPUT/label_issues.json``. They inform, they decide nothing: a failure is logged."""
    rows = list(read_scores(storage.join(output_uri, SCORES_NAME)))
    try:
        issues = label_issues_from_scores(rows, classes, split=split)
    except ValueError as exc:  # cleanlab's refusal of these probabilities, or ours
        log.warning("no %s: %s", LABEL_ISSUES_NAME, exc)
        return
    write_label_issues(storage.join(output_uri, LABEL_ISSUES_NAME), issues)
    log.info(
        "%d likely label errors among %d %s samples (%s)",
        len(issues.issues),
        issues.num_samples,
        split,
        LABEL_ISSUES_NAME,
    )


def _majority_baseline(manifest: Manifest, split: str) -> Baseline | None:
    """Always answering the train split's most frequent class, on ``split`` (from the manifest's counts)."""
    train, decided = manifest.split("train"), manifest.split(split)
    if train is None or decided is None:
        return None
    return majority_baseline(manifest.classes, train.class_counts, decided.class_counts)


def evaluate(
    model_uri: str, data_uri: str, output_uri: str, *, registry: str | None = None, workers: int = 2
) -> EvalReport:
    """Evaluate the candidate (and, with ``registry``, the current champion on the same shards) on the
    decision split (``decision_split``: test when the dataset has one, else val), the candidate also on val
    when test decides, and the majority-class baseline on the decision split (``baseline``: always answering
    the train split's most frequent class), and write ``OUTPUT/metrics.json``. Returns it. Beside it: the
    candidate's per-sample scores and its likely label errors on the decision split (``label_issues.json``).

    A champion whose class set differs from the dataset's cannot be measured on it: the result then has
    ``champion: None`` and a ``champion_note`` saying why, and promotion keeps that champion.
    """
    data_uri = storage.absolute(data_uri)  # metrics.json names it: valid from any directory
    digest = manifest_digest(data_uri)
    manifest = load_manifest(data_uri)
    output_uri = storage.check_uri(output_uri).rstrip("/")
    storage.ensure_prefix_writable(output_uri)
    split = decision_split(manifest)
    log.info(
        "evaluating on the %s split (%d samples)%s",
        split,
        manifest.num_samples(split),
        ": the held-out test split decides promotion; val is reported for reference"
        if split == "test"
        else "",
    )
    candidate = evaluate_model(
        model_uri, data_uri, workers=workers, scores_uri=storage.join(output_uri, SCORES_NAME), split=split
    )
    _write_label_issues(output_uri, list(manifest.classes), split)
    val = evaluate_model(model_uri, data_uri, workers=workers) if split == "test" else None
    champion, champion_note = None, None
    if registry:
        current = read_champion(registry)
        if current is not None:
            champion_uri = version_uri(registry, current.version)
            mismatch = _class_mismatch(
                load_model_card(champion_uri), manifest.classes, champion_uri, data_uri
            )
            if mismatch:
                champion_note = f"champion version {current.version} not evaluated: {mismatch}"
                log.warning("%s; it cannot be compared with this candidate", champion_note)
            else:
                champion = evaluate_model(
                    champion_uri,
                    data_uri,
                    workers=workers,
                    scores_uri=storage.join(output_uri, CHAMPION_SCORES_NAME),
                    split=split,
                )
                champion = replace(champion, version=current.version, paired=_paired(output_uri).to_json())
    result = EvalReport(
        dataset=DatasetRef(
            uri=data_uri,
            manifest_digest=digest,
            val_samples=manifest.num_samples("val"),
            test_samples=manifest.num_samples("test") or None,
        ),
        classes=list(manifest.classes),
        split=split,
        candidate=candidate,
        val=val,
        champion=champion,
        champion_note=champion_note,  # why the champion was not measured, when it was not
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        baseline=_majority_baseline(manifest, split),
    )
    result.write(storage.join(output_uri, EvalReport.NAME))
    return result
