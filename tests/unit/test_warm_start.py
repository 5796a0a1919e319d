"""tpustream.train.warm_start on plain (CPU) models: which weights move, which rows of the head are kept, what refuses."""

import json

import pytest
import torch

from tpustream.artifacts import ModelCard
from tpustream.models import build_model, build_network, card_small_input_stem, network_for_card
from tpustream.train.warm_start import WarmStartError, apply_init_weights, load_init_weights


def _artifact(root, classes, *, arch="tiny", input_size=16, seed=1):
    torch.manual_seed(seed)
    model = build_model(arch, num_classes=len(classes), input_size=input_size)
    root.mkdir(parents=True)
    torch.save(model.state_dict(), root / "model.pt")
    card = {"arch": arch, "classes": classes, "input_size": input_size}
    (root / "model.json").write_text(json.dumps(card))
    return model.state_dict()


def _fresh(classes, seed=7, input_size=16):
    torch.manual_seed(seed)
    return build_model("tiny", num_classes=len(classes), input_size=input_size)


def test_same_classes_load_every_weight(tmp_path):
    old = _artifact(tmp_path / "m", ["a", "b", "c"])
    model = _fresh(["a", "b", "c"])
    record = apply_init_weights(
        model, load_init_weights(str(tmp_path / "m")), arch="tiny", classes=["a", "b", "c"], input_size=16
    )
    assert all(torch.equal(model.state_dict()[k], old[k]) for k in old)
    assert record["weights"] == "all" and record["kind"] == "model" and record["head_rows_kept"] == 3


def test_other_classes_keep_the_backbone_and_the_rows_of_classes_both_have(tmp_path):
    old = _artifact(tmp_path / "m", ["cat", "dog", "fox"])
    model = _fresh(["ant", "cat", "dog"])
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    record = apply_init_weights(
        model,
        load_init_weights(str(tmp_path / "m")),
        arch="tiny",
        classes=["ant", "cat", "dog"],
        input_size=16,
    )
    now = model.state_dict()
    head = [k for k in now if k.endswith(".weight")][-1].rsplit(".", 1)[0]
    for key in now:
        if not key.startswith(head + "."):
            assert torch.equal(now[key], old[key]), key  # the backbone came over
    weight, bias = now[f"{head}.weight"], now[f"{head}.bias"]
    assert torch.equal(weight[1], old[f"{head}.weight"][0]) and torch.equal(
        weight[2], old[f"{head}.weight"][1]
    )
    assert torch.equal(bias[2], old[f"{head}.bias"][1])
    assert torch.equal(weight[0], fresh[f"{head}.weight"][0])  # "ant" is new: its row stays as initialised
    assert record == {
        "from": str(tmp_path / "m"), "resolved": str(tmp_path / "m" / "model.pt"), "kind": "model",
        "weights": "backbone", "head_rows_kept": 2, "new_classes": ["ant"], "gone_classes": ["fox"],
    }  # fmt: skip


def test_a_registry_means_its_champion_and_misfits_are_refused(tmp_path):
    registry = tmp_path / "registry"
    _artifact(registry / "versions" / "2", ["a", "b"], seed=3)
    (registry / "champion.json").write_text(json.dumps({"version": 2}))
    init = load_init_weights(str(registry))
    assert init.kind == "champion" and init.resolved == str(registry / "versions" / "2" / "model.pt")
    with pytest.raises(WarmStartError, match="is a tiny, this run trains a resnet18: pass --model tiny"):
        apply_init_weights(_fresh(["a", "b"]), init, arch="resnet18", classes=["a", "b"], input_size=16)
    with pytest.raises(WarmStartError, match="neither a model artifact"):
        load_init_weights(str(tmp_path))
    with pytest.raises(WarmStartError, match="--init-from"):
        load_init_weights(str(tmp_path / "nothing.pt"))


def test_a_stem_built_for_another_input_size_names_the_size_to_pass(tmp_path):
    _artifact(tmp_path / "m", ["a", "b"], arch="resnet18", input_size=224)
    torch.manual_seed(0)
    small = build_model("resnet18", num_classes=2, input_size=32)
    with pytest.raises(WarmStartError, match=r"trained at 224 px, this run at 32.*pass --input-size 224"):
        apply_init_weights(small, load_init_weights(str(tmp_path / "m")), arch="resnet18", classes=["a", "b"],
                           input_size=32)  # fmt: skip


def _stock_stem_card(root, classes, *, input_size=32, recorded=True):
    """A resnet18 fine-tuned at ``input_size`` from pretrained weights: the stock 7x7 stem. A warm-started
    run's card says ``pretrained: null`` (the staged file did not start it), so only ``small_input_stem``
    tells its network apart from a random-init one."""
    torch.manual_seed(3)
    model = build_network("resnet18", num_classes=len(classes), input_size=input_size, small_input_stem=False)
    root.mkdir(parents=True)
    torch.save(model.state_dict(), root / "model.pt")
    card = {"arch": "resnet18", "classes": classes, "input_size": input_size, "pretrained": None}
    if recorded:
        card["small_input_stem"] = False
    (root / "model.json").write_text(json.dumps(card))
    return model.state_dict()


def test_the_model_card_decides_the_stem_not_how_the_weights_began(tmp_path):
    weights = _stock_stem_card(tmp_path / "m", ["a", "b"])
    card = ModelCard.read(str(tmp_path / "m"))
    assert card.pretrained is None and card_small_input_stem(card) is False
    network = network_for_card(card)
    assert tuple(network.conv1.weight.shape) == (64, 3, 7, 7)
    network.load_state_dict(weights)  # strict: every weight fits
    # A card from before the key was written: the stem followed where the weights began
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "model.json").write_text(
        json.dumps({"arch": "resnet18", "classes": ["a", "b"], "input_size": 32})
    )
    old = ModelCard.read(str(tmp_path / "old"))
    assert card_small_input_stem(old) is True
    assert tuple(network_for_card(old).conv1.weight.shape) == (64, 3, 3, 3)


def test_a_warm_start_reads_the_stem_its_weights_were_trained_with(tmp_path):
    _stock_stem_card(tmp_path / "m", ["a", "b"])
    init = load_init_weights(str(tmp_path / "m"))
    assert init.small_input_stem is False  # the trainer builds the champion's stock stem from this
    model = build_network("resnet18", num_classes=2, input_size=32, small_input_stem=False)
    apply_init_weights(model, init, arch="resnet18", classes=["a", "b"], input_size=32)


def test_a_stem_mismatch_at_the_same_size_does_not_advise_the_size_it_already_has(tmp_path):
    _stock_stem_card(tmp_path / "m", ["a", "b"])
    init = load_init_weights(str(tmp_path / "m"))
    small = build_network("resnet18", num_classes=2, input_size=32, small_input_stem=True)
    with pytest.raises(WarmStartError) as refused:
        apply_init_weights(small, init, arch="resnet18", classes=["a", "b"], input_size=32)
    assert "--input-size" not in str(refused.value)
    assert "both at 32 px: the stems differ" in str(refused.value)


def test_the_pipelines_champion_start_says_what_starts_a_first_run(tmp_path, caplog):
    """init_from=champion on a registry with no champion yet: the warning names what the run starts from, the
    pretrained weights when given (the trainer then logs them loaded), random weights otherwise (issue 42)."""
    import logging

    from tpustream.registry.store import ChampionPointer, replace_champion
    from tpustream.train.warm_start import champion_start

    registry = str(tmp_path / "registry")
    with caplog.at_level(logging.WARNING, logger="tpustream.train.warm_start"):
        assert champion_start(registry, "gs://b/weights/resnet18.pth") is None
        assert champion_start(registry, "") is None
    pretrained, scratch = [r.getMessage() for r in caplog.records]
    assert pretrained == (
        f"no champion in {registry} yet: the run starts from the pretrained weights gs://b/weights/resnet18.pth"
    )
    assert "random weights" not in pretrained
    assert scratch == f"no champion in {registry} yet: the run starts from random weights"
    replace_champion(registry, ChampionPointer.from_json({"version": 1, "top1": 0.5}), 0)
    assert champion_start(registry, "gs://b/weights/resnet18.pth") == registry
