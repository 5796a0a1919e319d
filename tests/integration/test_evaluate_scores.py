"""Evaluate's per-sample scores for real: tiny models trained here (eager CPU) on the bundled digits, the
scores file traced back to the shards' sample index, and the metrics it gives back equal metrics.json's."""

import base64
import io
import json

import pytest
import torch
from PIL import Image
from scipy.stats import binomtest

from tpustream.dataset import write as shards
from tpustream.dataset.manifest import iter_sample_index, load_manifest
from tpustream.dataset.plan import ShardConfig
from tpustream.errors import ConfigError
from tpustream.image.transforms import normalize
from tpustream.loader.shard_loader import LoaderConfig, ShardLoader
from tpustream.metrics.label_issues import label_issues_from_scores, read_label_issues
from tpustream.metrics.scores import metrics_from_scores, read_scores
from tpustream.models import build_model
from tpustream.registry.policy import PromotionPolicy
from tpustream.release import promote
from tpustream.report.build import build_report_facts, render_report
from tpustream.report.mistakes import MISTAKES_PER_CLASS, MISTAKES_TOTAL
from tpustream.storage import io as storage
from tpustream.train import evaluate

pytestmark = pytest.mark.integration

DIGITS = [str(d) for d in range(10)]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("data") / "digits")
    shards.create_shards(ShardConfig(source="digits", output=out, num_shards=4), progress=False)
    return out


def make_model(root, data, *, seed, steps):
    """A tiny model artifact after ``steps`` eager-CPU SGD steps on the train split."""
    torch.manual_seed(seed)
    model = build_model("tiny", num_classes=10, input_size=16)
    loader = ShardLoader(
        LoaderConfig(data=data, batch_size=64, input_size=16, workers=0, num_replicas=1, replica_index=0)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _, batch in zip(range(steps), loader.epoch(0), strict=False):
        loss = torch.nn.functional.cross_entropy(model(normalize(batch["image"])), batch["label"])
        opt.zero_grad()
        loss.backward()
        opt.step()
    root = str(root)
    with open(f"{root}.pt", "wb") as f:
        torch.save(model.state_dict(), f)
    storage.upload_file(f"{root}.pt", storage.join(root, "model.pt"))
    card = {"format": "tpustream.model/v1", "arch": "tiny", "classes": DIGITS, "input_size": 16}
    storage.write_bytes(storage.join(root, "model.json"), json.dumps(card).encode())
    return root


def test_scores_name_every_val_sample_and_give_back_evaluates_metrics(digits, tmp_path):
    registry = str(tmp_path / "registry")
    first = make_model(tmp_path / "first", digits, seed=1, steps=8)  # beats the majority class (~10%)
    out = str(tmp_path / "eval-first")
    evaluate.evaluate(first, digits, out, registry=registry)
    promote.promote(first, f"{out}/metrics.json", registry)
    second = make_model(tmp_path / "second", digits, seed=2, steps=12)
    out = str(tmp_path / "eval-second")
    result = evaluate.evaluate(
        second, digits, out, registry=registry
    )  # 2 loader workers: keys cross processes
    document = json.loads((tmp_path / "eval-second" / "metrics.json").read_text())
    manifest = load_manifest(digits)
    index = {entry.key: entry for entry in iter_sample_index(digits, manifest, "val")}
    for role, name in (("candidate", "scores.jsonl.gz"), ("champion", "champion_scores.jsonl.gz")):
        measured = document[role]
        assert measured["scores"] == name
        rows = list(read_scores(f"{out}/{name}"))
        # every val sample once, traced to its source file and class through the sample index
        assert sorted(row.key for row in rows) == sorted(index)
        for row in rows:
            assert row.source == index[row.key].source and row.true_class == index[row.key].label
            assert row.true_class == DIGITS[row.label] and len(row.top_classes) == 10  # <= 20 classes: all
        recomputed = metrics_from_scores(rows, 10).to_json()
        for key, value in recomputed.items():
            assert measured[key] == value, key  # equal, not close: evaluate computes them from these rows
        # and they agree with the confusion matrix evaluate counts on the device
        matrix = measured["confusion_matrix"]
        assert recomputed["per_class"]["support"] == [sum(row) for row in matrix]
        assert recomputed["per_class"]["predicted"] == [sum(col) for col in zip(*matrix, strict=True)]
        hits = sum(matrix[i][i] for i in range(10))
        assert recomputed["thresholds"][0]["recall"] == pytest.approx(hits / len(rows))
        assert measured["top1"] == pytest.approx(hits / len(rows))
    # the champion was scored on the same samples; the paired test is McNemar's on their discordant pairs
    ours = {row.key: row.top_classes[0] == row.label for row in read_scores(f"{out}/scores.jsonl.gz")}
    theirs = {
        row.key: row.top_classes[0] == row.label for row in read_scores(f"{out}/champion_scores.jsonl.gz")
    }
    assert ours.keys() == theirs.keys()
    only_ours = sum(ours[key] and not theirs[key] for key in ours)
    only_theirs = sum(theirs[key] and not ours[key] for key in ours)
    paired = document["champion"]["paired"]
    assert paired["num_samples"] == len(ours) == document["candidate"]["num_samples"]
    assert (paired["candidate_only_correct"], paired["champion_only_correct"]) == (only_ours, only_theirs)
    if only_ours + only_theirs:
        reference = binomtest(only_ours, only_ours + only_theirs, 0.5).pvalue
        assert paired["p_value"] == pytest.approx(reference, rel=1e-12)
    outcome = promote.promote(second, f"{out}/metrics.json", registry, PromotionPolicy(max_p_value=1e-300))
    assert not outcome.promoted and f"on {len(ours)} paired samples" in outcome.reason
    # the run report's mistakes section reads them: the surest wrong predictions, each with its picture
    facts = build_report_facts(
        model_uri=second,
        metrics_uri=out,
        dataset_uri=digits,
        registry=None,
        policy=PromotionPolicy(),
    )
    wrong = {row.key: row for row in read_scores(f"{out}/scores.jsonl.gz") if row.top_classes[0] != row.label}
    assert facts.mistakes and len(facts.mistakes) <= MISTAKES_TOTAL
    for name in DIGITS:  # each class's surest mistakes (the page's bound not reached with 10 classes)
        ranked = sorted(
            (r for r in wrong.values() if r.true_class == name), key=lambda r: (-r.probabilities[0], r.key)
        )
        shown = [m.key for m in facts.mistakes if m.true_class == name]
        assert shown == [r.key for r in ranked[:MISTAKES_PER_CLASS]]
    for mistake in facts.mistakes:
        row = wrong[mistake.key]
        assert (mistake.confidence, mistake.source) == (row.probabilities[0], row.source)
        assert mistake.predicted_class == DIGITS[row.top_classes[0]] != mistake.true_class
        picture = base64.b64decode(facts.thumbnails[mistake.key].removeprefix("data:image/jpeg;base64,"))
        assert Image.open(io.BytesIO(picture)).format == "JPEG"
    page = render_report(facts)[0]
    assert '<section id="mistakes">' in page and '<section id="precision-recall">' in page
    assert '<figure id="plot-thresholds">' in page  # the threshold curve drawn from evaluate's table
    assert result.candidate.macro_f1 is not None and 0.0 <= result.candidate.balanced_accuracy <= 1.0


def test_evaluate_lists_likely_label_errors_and_the_report_shows_them(digits, tmp_path):
    model = make_model(tmp_path / "model", digits, seed=3, steps=12)
    out = str(tmp_path / "eval")
    result = evaluate.evaluate(model, digits, out)
    scores = {row.key: row for row in read_scores(f"{out}/scores.jsonl.gz")}
    issues = read_label_issues(f"{out}/label_issues.json")
    # the deciding split's out-of-sample scores, by confident learning: the list recomputed from the file
    assert issues == label_issues_from_scores(list(scores.values()), DIGITS, split=result.split)
    assert issues.num_samples == len(scores) == result.candidate.num_samples and issues.issues
    for issue in issues.issues:
        row = scores[issue.key]
        assert (issue.given_class, issue.source) == (row.true_class, row.source)
        assert issue.suggested_class == DIGITS[row.top_classes[0]] != issue.given_class
    confidences = [issue.self_confidence for issue in issues.issues]
    assert confidences == sorted(confidences)  # the most contradicted first
    facts = build_report_facts(
        model_uri=model, metrics_uri=out, dataset_uri=digits, registry=None, policy=PromotionPolicy()
    )
    gallery = facts.label_errors
    assert gallery is not None and gallery.total == len(issues.issues)
    assert [issue.key for issue in gallery.issues] == issues.keys[: len(gallery.issues)]
    assert set(gallery.thumbnails) == {issue.key for issue in gallery.issues}  # each from the shards
    page = render_report(facts)[0]
    assert '<section id="label-errors">' in page and "Likely label errors" in page
    first = gallery.issues[0]
    assert f"labelled <b>{first.given_class}</b>, looks like <b>{first.suggested_class}</b>" in page


def test_the_loader_carries_keys_only_when_asked(digits):
    def first_batch(**options):
        config = LoaderConfig(
            data=digits,
            split="val",
            batch_size=512,
            input_size=16,
            workers=0,
            num_replicas=1,
            replica_index=0,
            **options,
        )
        return next(iter(ShardLoader(config).epoch(0)))

    assert "key" not in first_batch()
    batch = first_batch(sample_keys=True)
    valid = batch["mask"].tolist()
    assert len(batch["key"]) == 512 and all(
        bool(key) == ok for key, ok in zip(batch["key"], valid, strict=True)
    )
    with pytest.raises(ConfigError, match="sample_keys applies to evaluation splits only"):
        LoaderConfig(data=digits, batch_size=8, sample_keys=True)
