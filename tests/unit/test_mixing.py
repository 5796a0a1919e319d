"""tpustream/train/mixing.py: MixUp/CutMix draws (lambda in [0, 1], CutMix's box inside the image and its
lambda the share outside it, the same draw for the same seed and step), the blended pixels, the soft targets
(rows summing to 1) and the soft-target loss, on CPU torch (the compiled step's flat compiles: the
integration test of the trainer)."""

import pytest
import torch
import torch.nn.functional as F

from tpustream.train.mixing import MIX_FIELDS, draw_mix, mix_images, mixed_loss, soft_targets


def _fields(drawn):
    return dict(zip(MIX_FIELDS, drawn, strict=True))


def test_draws_are_mixup_or_cutmix_with_lambda_in_range_and_seeded():
    size = 16
    kinds = set()
    for step in range(200):
        mix = _fields(draw_mix(step, seed=3, mixup_alpha=0.2, cutmix_alpha=1.0, size=size))
        assert 0.0 <= mix["lam"] <= 1.0
        if mix["inside"] == mix["outside"]:  # MixUp: one weight everywhere, lambda
            kinds.add("mixup")
            assert mix["inside"] == mix["lam"]
        else:  # CutMix: the partner inside the box, the image itself outside; lambda = share outside
            kinds.add("cutmix")
            assert (mix["inside"], mix["outside"]) == (0.0, 1.0)
            assert 0 <= mix["x0"] <= mix["x1"] <= size and 0 <= mix["y0"] <= mix["y1"] <= size
            area = (mix["x1"] - mix["x0"]) * (mix["y1"] - mix["y0"])
            assert mix["lam"] == pytest.approx(1 - area / size**2)
    assert kinds == {"mixup", "cutmix"}  # both alphas: each step one or the other
    assert draw_mix(7, seed=3, mixup_alpha=0.2, cutmix_alpha=1.0, size=size) == draw_mix(
        7, seed=3, mixup_alpha=0.2, cutmix_alpha=1.0, size=size
    )
    assert draw_mix(7, seed=4, mixup_alpha=0.2, cutmix_alpha=1.0, size=size) != draw_mix(
        7, seed=3, mixup_alpha=0.2, cutmix_alpha=1.0, size=size
    )
    only_mixup = [_fields(draw_mix(s, seed=0, mixup_alpha=0.2, cutmix_alpha=0.0, size=8)) for s in range(20)]
    assert all(m["inside"] == m["outside"] for m in only_mixup)
    with pytest.raises(ValueError, match="mixup_alpha or cutmix_alpha"):
        draw_mix(0, seed=0, mixup_alpha=0.0, cutmix_alpha=0.0, size=8)


def test_mixed_pixels_and_soft_targets():
    images = torch.stack([torch.full((3, 4, 4), float(value)) for value in (0.0, 10.0, 20.0, 30.0)])
    labels = torch.tensor([0, 1, 2, 1])
    mixup = torch.tensor([0, 0, 0, 0, 0.25, 0.25, 0.25])
    mixed = mix_images(images, mixup)
    assert torch.allclose(mixed[0], torch.full((3, 4, 4), 0.25 * 0 + 0.75 * 30))  # with the batch reversed
    cutmix = torch.tensor([1, 3, 0, 2, 0.0, 1.0, 0.75])  # columns 1-2, rows 0-1: 4 of 16 pixels
    mixed = mix_images(images, cutmix)
    assert mixed.shape == images.shape
    assert mixed[1, :, 0, 1].tolist() == [20.0] * 3 and mixed[1, :, 3, 3].tolist() == [10.0] * 3
    assert int((mixed[1] != 10.0).sum()) == 3 * 4
    targets = soft_targets(labels, cutmix, 3)
    assert torch.allclose(targets.sum(1), torch.ones(4))
    assert targets[0].tolist() == [0.75, 0.25, 0.0]  # its own class 0, its partner's (sample 3) class 1
    assert targets[1].tolist() == [0.0, 0.75, 0.25]


def test_the_soft_target_loss_is_cross_entropy_of_the_mix():
    torch.manual_seed(0)
    logits, labels = torch.randn(4, 3), torch.tensor([0, 1, 2, 1])
    whole = torch.tensor([0, 0, 0, 0, 1.0, 1.0, 1.0])  # lambda 1: the plain labels
    assert torch.allclose(
        mixed_loss(logits, labels, whole, label_smoothing=0.1),
        F.cross_entropy(logits, labels, label_smoothing=0.1),
    )
    half = torch.tensor([0, 0, 0, 0, 0.5, 0.5, 0.5])
    expected = 0.5 * F.cross_entropy(logits, labels, reduction="none") + 0.5 * F.cross_entropy(
        logits, labels.flip(0), reduction="none"
    )
    assert torch.allclose(mixed_loss(logits, labels, half, label_smoothing=0.0), expected.mean())
    weights = torch.tensor([1.0, 2.0, 4.0])
    weighted = mixed_loss(logits, labels, whole, label_smoothing=0.0, class_weights=weights)
    assert torch.allclose(
        weighted, (F.cross_entropy(logits, labels, reduction="none") * weights[labels]).mean()
    )
