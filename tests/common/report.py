"""Report facts built without a run: evaluations, epochs, a manifest, the registry history, and
``sample_facts`` (a whole ReportFacts) with user strings that must come out escaped."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tpustream.artifacts import EvalReport, Manifest, ModelCard
from tpustream.registry.policy import PromotionPolicy, decide
from tpustream.report.build import ReportFacts

EVIL = "<script>alert(1)</script>"
CLASSES = ["cat", "dog", EVIL, "bird & fish"]
PER_CLASS_SAMPLES = 20
PLOT_IDS = [
    "plot-curves",
    "plot-confusion-candidate",
    "plot-confusion-champion",
    "plot-per-class",
    "plot-history",
]


def confusion(correct: list[int]) -> list[list[int]]:
    """A matrix with ``correct[i]`` hits on the diagonal and each class's misses on the next class."""
    size = len(correct)
    matrix = [[0] * size for _ in range(size)]
    for i, hits in enumerate(correct):
        matrix[i][i] = hits
        matrix[i][(i + 1) % size] = PER_CLASS_SAMPLES - hits
    return matrix


def evaluation(correct: list[int], *, loss: float, version: int | None = None) -> dict[str, Any]:
    total = PER_CLASS_SAMPLES * len(correct)
    result = {
        "model": "/runs/7/model",
        "top1": sum(correct) / total,
        "top5": 1.0,
        "loss": loss,
        "num_samples": total,
        "complete": True,
        "per_class_accuracy": [hits / PER_CLASS_SAMPLES for hits in correct],
        "confusion_matrix": confusion(correct),
    }
    if version is not None:
        result["version"] = version
    return result


def epochs(count: int) -> list[dict[str, Any]]:
    return [
        {
            "epoch": n,
            "train_loss": 2.0 / n,
            "val_loss": 2.2 / n,
            "val_top1": 0.5 + 0.1 * n,
            "val_top5": 0.8 + 0.05 * n,
            "val_samples": 80,
            "epoch_seconds": 12.5,
            "samples_per_s": 640.0,
            "data_wait_fraction": 0.03,
            "compiles": 3,
        }
        for n in range(1, count + 1)
    ]


def shard_entry(split: str, index: int) -> dict[str, Any]:
    return {
        "path": f"{split}/{split}-{index:06d}.tar",
        "num_samples": 1,
        "num_bytes": 512,
        "sha256": "0" * 64,
    }


def model_card(fields: dict[str, Any]) -> ModelCard:
    """A model card with ``fields`` (and the input size every card has)."""
    return ModelCard.from_json({"input_size": 32, **fields})


def manifest(classes: list[str]) -> Manifest:
    return Manifest.from_json(
        {
            "format": "tpustream.shards/v1",
            "created": "2025-11-20T10:00:00Z",
            "source": "gs://bucket/import.jsonl",
            "classes": classes,
            "num_classes": len(classes),
            "splits": {
                "train": {
                    "num_samples": 400,
                    "num_bytes": 123456,
                    "class_counts": [100] * len(classes),
                    "shards": [shard_entry("train", 0), shard_entry("train", 1)],
                },
                "val": {
                    "num_samples": 80,
                    "num_bytes": 23456,
                    "class_counts": [20] * len(classes),
                    "shards": [shard_entry("val", 0)],
                },
            },
            "skipped": {
                "count": 3,
                "sample_slots": 3,
                "by_reason": {"undecodable": 2, "malformed-row": 1},
                "rejected_rows": 1,
                "examples": [f"gs://bucket/{EVIL}.jpg: not an image"],
            },
        }
    )


def history(count: int = 4) -> list[dict[str, Any]]:
    """Registry events oldest first: promotions of versions 1..k and a refusal after each."""
    events = []
    for n in range(count):
        promoted = n % 2 == 0
        events.append(
            {
                "time": f"2025-11-{n + 1:02d}T08:00:00Z",
                "event": "promoted" if promoted else "refused",
                "version": n // 2 + 1 if promoted else None,
                "candidate": f"gs://bucket/runs/{n}/model",
                "dataset_digest": "ab" * 32,
                "metric": "top1",
                "value": 0.6 + 0.02 * n,
                "reason": "no champion yet" if n == 0 else f"reason {n} <img src=x>",
                "champion_version": (n // 2 or None) if promoted else n // 2 + 1,
            }
        )
    return events


def sample_facts(**changes: Any) -> ReportFacts:
    """4 classes, 3 epochs, champion version 2; the candidate wins on top-1 but "dog" drops 30 points, more
    than max_class_drop 0.1; a history with promotions and refusals. The decision is the policy's own."""
    candidate = evaluation([19, 12, 17, 16], loss=0.61)  # top-1 0.80
    champion = evaluation([16, 18, 15, 12], loss=0.70, version=2)  # top-1 0.7625
    metrics = EvalReport.from_json(
        {
            "format": "tpustream.metrics/v1",
            "dataset": {"uri": "gs://bucket/data/ab12", "manifest_digest": "ab" * 32, "val_samples": 80},
            "classes": CLASSES,
            "candidate": candidate,
            "champion": champion,
            "champion_note": None,
            "created": "2025-11-20T11:00:00Z",
        }
    )
    policy = PromotionPolicy(max_class_drop=0.1)
    decision = decide(
        metrics.candidate, metrics.champion, candidate_digest="d", champion_digest="d", policy=policy
    )
    facts = ReportFacts(
        model_card=model_card(
            {
                "arch": "resnet18",
                "classes": CLASSES,
                "history": epochs(3),
                "metrics": {"epoch": 3},
                "init": None,
            }
        ),
        metrics=metrics,
        decision=decision,
        policy=policy,
        manifest=manifest(CLASSES),
        history=history(),
    )
    return replace(facts, **changes)
