"""One real `tpustream train --pretrained <uri>` on the digits (resnet18 at 32 px, SPMD over 4 virtual XLA
devices): model.json records the weights and the preprocessing, and evaluate and predict/serving read it back
and agree on the same images. Staged weights on 4 devices: the pair the scenario suite leaves to this test
(tests/integration/test_scenarios.py). All 1,797 digits: on 700 (10 steps at FAST's --lr 0.2 from random
"pretrained" weights) the first run stayed at chance, 0.1."""

import hashlib
import json
import tarfile

import pytest
import torch
from torchvision import models as tv

from tests.common.train import run_train as _run
from tpustream.dataset import write as shards
from tpustream.dataset.manifest import load_manifest
from tpustream.dataset.plan import ShardConfig
from tpustream.serve.classifier import Classifier
from tpustream.storage import io as storage
from tpustream.train.evaluate import evaluate_model, val_predictions

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # resnet18 on XLA CPU: minutes


def metrics_samples(data):
    """How many samples evaluation decides on: the test split when the dataset has one, else val."""
    manifest = load_manifest(data)
    return manifest.num_samples("test") or manifest.num_samples("val")


def _first_val_images(data, count):
    """The first ``count`` val images' bytes in manifest order (the order val_predictions answers in)."""
    manifest = load_manifest(data)
    images = []
    for shard in manifest.split("val").shards:
        with tarfile.open(storage.join(data, shard.path)) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".ppm"):
                    images.append((tar.extractfile(member).read(), member.name))
        if len(images) >= count:
            break
    return images[:count]


def test_train_pretrained_records_the_weights_and_every_reader_preprocesses_alike(tmp_path):
    data = str(tmp_path / "digits")
    shards.create_shards(ShardConfig(source="digits", output=data, num_shards=4), progress=False)
    torch.manual_seed(0)
    weights = tmp_path / "staged" / "resnet18-random.pth"  # stands in for a staged torchvision file
    weights.parent.mkdir()
    torch.save(tv.resnet18(weights=None).state_dict(), weights)
    output = tmp_path / "run"
    result = _run(
        data,
        output,
        "--epochs",
        "1",
        "--model",
        "resnet18",
        "--input-size",
        "32",
        "--pretrained",
        str(weights),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the run starts from --pretrained" in result.stderr
    card = json.loads((output / "model.json").read_text())
    assert card["pretrained"]["uri"] == str(weights)
    assert card["pretrained"]["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert card["pretrained"]["head"] == "fc"
    assert card["small_input_stem"] is False  # the pretrained 7x7 stem kept at 32 px
    assert card["preprocessing"]["crop_size"] == 32
    assert card["preprocessing"]["resize_size"] == round(
        32 * 256 / 224
    )  # resnet18.DEFAULT (IMAGENET1K_V1): 256/224
    assert card["training"]["lr"] == 0.2  # FAST's --lr: given, so no fine-tuning default
    model_pt = torch.load(output / "model.pt", weights_only=True)
    assert model_pt["conv1.weight"].shape == (64, 3, 7, 7)

    # A retraining run given both: --init-from (the previous model, same classes) wins over --pretrained,
    # says so, and starts from the previous model's weights, not the staged file's
    again = tmp_path / "retrain"
    result = _run(
        data, again, "--epochs", "1", "--model", "resnet18", "--input-size", "32", "--pretrained", str(weights),
        "--init-from", str(output),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        f"the run starts from --init-from {output} (same classes), not --pretrained {weights}"
        in result.stderr
    )
    retrained = json.loads((again / "model.json").read_text())
    assert retrained["init"]["from"] == str(output) and retrained["init"]["weights"] == "all"
    assert retrained["pretrained"] is None  # the staged file did not start this run
    assert retrained["small_input_stem"] is False  # ... but its network is the previous model's: the 7x7 stem
    # Every reader builds the network model.json records, not one guessed from how its weights began
    assert evaluate_model(str(again), data, workers=0).num_samples == metrics_samples(data)
    assert Classifier(str(again)).classes == retrained["classes"]

    # A challenger without --pretrained, warm-started from that fine-tuned model, keeps its stem at 32 px
    third = tmp_path / "retrain-no-pretrained"
    result = _run(
        data, third, "--epochs", "1", "--model", "resnet18", "--input-size", "32", "--init-from", str(again),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "has the stock (pretrained) stem at 32 px: the run keeps it" in result.stderr
    third_card = json.loads((third / "model.json").read_text())
    assert third_card["small_input_stem"] is False and third_card["init"]["weights"] == "all"
    assert evaluate_model(str(third), data, workers=0).num_samples == metrics_samples(data)
    assert Classifier(str(third)).classes == third_card["classes"]

    metrics = evaluate_model(str(output), data, workers=0)
    assert metrics.top1 > 0.1  # it learned something in one epoch
    answers, _ = val_predictions(str(output), data, limit=8)
    served = Classifier(str(output))
    results = served.classify(served.render_images(_first_val_images(data, 8)), top_k=5)
    for evaluated, predicted in zip(answers, results, strict=True):
        # the same probabilities; classes compared where they are told apart (a saturated softmax leaves
        # the rest at ~0, where topk's order among equal values is arbitrary)
        assert evaluated.probabilities == pytest.approx(predicted["probabilities"], abs=1e-4)
        distinct = [i for i, p in enumerate(evaluated.probabilities) if p > 1e-4]
        assert [evaluated.class_indices[i] for i in distinct] == [
            predicted["class_indices"][i] for i in distinct
        ]
