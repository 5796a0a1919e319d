"""The champion's history of a registry on the GCS test server, written by real ``promote`` calls.

No model is trained: promote hashes a candidate's weights and reads its metrics.json, it never loads
the model, so the candidates here are written by hand (as evaluate would leave them)."""

import hashlib
import json
import re

import pytest

from tpustream.registry.history import champion_history, format_history_table
from tpustream.registry.policy import PromotionPolicy, RegistryError
from tpustream.release import promote
from tpustream.storage import io as storage

pytestmark = pytest.mark.integration

DIGEST = "5eed" * 16  # the manifest digest of the shards every candidate here was evaluated on
HISTORY_KEYS = ("metric", "value", "champion_value", "dataset_digest", "dataset", "metrics_uri")


def scores(top1, **extra):
    """A model's evaluation numbers, as metrics.json records them (loss falls as top1 rises)."""
    return {
        "top1": top1,
        "top5": min(1.0, top1 + 0.05),
        "loss": round(2 * (1 - top1), 4),
        "per_class_accuracy": [top1, top1],
        "num_samples": 100,
        "complete": True,
        **extra,
    }


def write_candidate(root, name, *, top1, champion=None):
    """A candidate model (weights, model card) and its metrics.json; ``champion``: the champion's numbers
    measured in the same evaluate run (with its version), as ``evaluate --registry`` records them."""
    model = f"{root}/models/{name}"
    weights = f"weights of {name}".encode() * 64
    storage.write_bytes(f"{model}/model.pt", weights)
    card = {"format": "tpustream.model/v1", "arch": "tiny", "classes": ["cat", "dog"], "input_size": 16}
    storage.write_bytes(f"{model}/model.json", json.dumps(card).encode())
    metrics = {
        "format": "tpustream.metrics/v1",
        "dataset": {"uri": f"{root}/data", "manifest_digest": DIGEST, "val_samples": 100},
        "classes": ["cat", "dog"],
        "candidate": {"model": model, "model_sha256": hashlib.sha256(weights).hexdigest(), **scores(top1)},
        "champion": champion,
        "champion_note": None,
        "created": "2024-05-01T00:00:00Z",
    }
    metrics_uri = f"{root}/eval/{name}/metrics.json"
    storage.write_bytes(metrics_uri, json.dumps(metrics).encode())
    return model, metrics_uri


def events(registry):
    return [json.loads(storage.read_bytes(o.uri)) for o in storage.list_objects(f"{registry}/events")]


def test_history_of_a_promotion_a_refusal_and_a_promotion(gcs_bucket):
    registry = f"{gcs_bucket}/registry"
    assert champion_history(registry) == []  # a prefix in a bucket that exists: an empty registry
    first = write_candidate(gcs_bucket, "first", top1=0.8)
    worse = write_candidate(gcs_bucket, "worse", top1=0.7, champion=scores(0.8, version=1))
    better = write_candidate(gcs_bucket, "better", top1=0.9, champion=scores(0.8, version=1))
    assert [promote.promote(*candidate, registry).version for candidate in (first, worse, better)] == [
        1,
        None,
        2,
    ]

    history = champion_history(registry)
    assert [(e["event"], e["version"], e["champion_version"]) for e in history] == [
        ("promoted", 1, None),
        ("refused", None, 1),
        ("promoted", 2, 1),
    ]
    assert [e["candidate"] for e in history] == [first[0], worse[0], better[0]]
    assert [(e["metric"], e["value"], e["champion_value"]) for e in history] == [
        ("top1", 0.8, None),
        ("top1", 0.7, 0.8),
        ("top1", 0.9, 0.8),
    ]
    assert {(e["dataset_digest"], e["dataset"]) for e in history} == {(DIGEST, f"{gcs_bucket}/data")}
    assert history[0]["reason"] == "no champion yet"
    assert history[1]["reason"].startswith("candidate top1 0.7000 vs champion 0.8000: improvement -0.1000")
    assert history[2]["reason"] == "candidate top1 0.9000 beats champion 0.8000 by +0.1000"
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", e["time"]) for e in history)
    assert [e["time"] for e in history] == sorted(e["time"] for e in history)

    table = format_history_table(history)
    print(table)  # what `tpustream champion history` shows (pytest -s)
    header, *lines = table.splitlines()
    assert header.split() == ["DATE", "DECISION", "DATASET", "TOP1", "CHAMPION", "REASON"]
    assert [line.split()[3:8] for line in lines] == [
        ["promoted", "v1", DIGEST[:12], "0.8000", "-"],
        ["refused", DIGEST[:12], "0.7000", "0.8000", "candidate"],
        ["promoted", "v2", DIGEST[:12], "0.9000", "0.8000"],
    ]
    assert format_history_table(history, limit=1).splitlines()[1:] == lines[-1:]

    storage.write_bytes(f"{registry}/events/20240101T000000-corrupt.json", b'{"event": "promo')
    assert champion_history(registry) == history  # one bad object does not hide the rest
    with pytest.raises(RegistryError, match="bucket that does not exist"):
        champion_history("gs://no-such-bucket/registry")


def test_promote_logs_what_the_history_needs(gcs_bucket):
    registry = f"{gcs_bucket}/registry"
    first = write_candidate(gcs_bucket, "first", top1=0.8)
    promote.promote(*first, registry)
    promote.promote(*first, registry)  # already the champion
    # evaluated without --registry: no champion measured, so the recorded numbers (same digest) are compared
    unmeasured = write_candidate(gcs_bucket, "unmeasured", top1=0.75)
    promote.promote(*unmeasured, registry)
    logged = {e["event"]: e for e in events(registry)}
    assert sorted(logged) == ["already-champion", "promoted", "refused"]
    for event, metrics_uri, value, champion_value in (
        (logged["promoted"], first[1], 0.8, None),
        (logged["already-champion"], first[1], 0.8, 0.8),
        (logged["refused"], unmeasured[1], 0.75, 0.8),
    ):
        assert {key: event[key] for key in HISTORY_KEYS} == {
            "metric": "top1",
            "value": value,
            "champion_value": champion_value,
            "dataset_digest": DIGEST,
            "dataset": f"{gcs_bucket}/data",
            "metrics_uri": metrics_uri,
        }
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", event["time"])
    # the keys readers had before stay
    assert logged["refused"]["top1"] == 0.75 and logged["refused"]["champion_version"] == 1
    assert logged["promoted"]["pointer"]["dataset_digest"] == DIGEST
    assert logged["promoted"]["pointer"]["metrics"]["top1"] == 0.8
    assert logged["promoted"]["previous_version"] is None and logged["promoted"]["version"] == 1
    # on another metric the event names that metric and its values
    better = write_candidate(gcs_bucket, "better", top1=0.9, champion=scores(0.8, version=1))
    assert promote.promote(*better, registry, PromotionPolicy(metric="loss")).promoted
    (newest,) = [e for e in events(registry) if e["event"] == "promoted" and e["version"] == 2]
    assert (newest["metric"], newest["value"], newest["champion_value"]) == ("loss", 0.2, 0.4)
    entry = champion_history(registry)[-1]
    assert (entry["metric"], entry["value"], entry["champion_value"]) == ("loss", 0.2, 0.4)
