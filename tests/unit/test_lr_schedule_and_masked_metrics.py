"""The pure pieces the trainer and evaluate are built on: the LR schedule and the masked metrics.

Plain torch on CPU, no XLA: each function is checked against a computation written out by hand.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tpustream.metrics.masked import masked_mean, masked_sums, summarize
from tpustream.models import (
    CONVNEXT_FINE_TUNE_LR_FACTOR,
    EFFICIENTNET_FINE_TUNE_LR_FACTOR,
    MODEL_SPECS,
    RESNET_FINE_TUNE_LR_FACTOR,
    SGD_FINE_TUNE_LR_FACTOR,
    model_spec,
    sgd_momentum,
)
from tpustream.train.optimizer import default_peak_lr, fine_tune_peak_lr, lr_at


def test_lr_warms_up_linearly_to_the_peak_then_decays_by_cosine_to_zero() -> None:
    peak, warmup, total = 0.4, 4, 20
    warm = [lr_at(step, peak_lr=peak, warmup_steps=warmup, total_steps=total) for step in range(warmup)]
    assert warm == pytest.approx([0.1, 0.2, 0.3, 0.4])  # step 0 already trains: (step + 1) / warmup
    assert lr_at(warmup, peak_lr=peak, warmup_steps=warmup, total_steps=total) == pytest.approx(peak)
    halfway = warmup + (total - warmup) // 2
    assert lr_at(halfway, peak_lr=peak, warmup_steps=warmup, total_steps=total) == pytest.approx(peak / 2)
    assert lr_at(total, peak_lr=peak, warmup_steps=warmup, total_steps=total) == pytest.approx(0.0, abs=1e-12)
    decay = [lr_at(s, peak_lr=peak, warmup_steps=warmup, total_steps=total) for s in range(warmup, total + 1)]
    assert all(a > b for a, b in zip(decay, decay[1:], strict=False)), "the decay never rises"


def test_lr_without_warmup_starts_at_the_peak_and_stays_at_zero_past_the_end() -> None:
    assert lr_at(0, peak_lr=1.0, warmup_steps=0, total_steps=10) == pytest.approx(1.0)
    # a resumed run that trains past its planned steps (more epochs) never gets a negative or rising LR
    assert lr_at(15, peak_lr=1.0, warmup_steps=0, total_steps=10) == pytest.approx(0.0, abs=1e-12)
    # one planned step: no division by zero
    assert math.isfinite(lr_at(0, peak_lr=1.0, warmup_steps=1, total_steps=1))


def test_masked_sums_count_only_the_real_samples() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 7)
    labels = torch.tensor([0, 1, 2, 3, 4, 5])
    logits[0, 0] = 10.0  # sample 0: right at top-1
    logits[1, 1] = -10.0  # sample 1: surely not top-1
    mask = torch.tensor([1, 1, 1, 1, 0, 0])  # the last two are padding (equal full batches per replica)
    sums, predicted = masked_sums(logits, labels, mask, torch.float64)

    real = slice(0, 4)
    loss = F.cross_entropy(logits[real], labels[real], reduction="sum").item()
    top1 = (logits[real].argmax(dim=1) == labels[real]).sum().item()
    top5 = sum(int(labels[i] in logits[i].topk(5).indices) for i in range(4))
    assert sums.dtype == torch.float64
    assert sums.tolist() == pytest.approx([loss, top1, top5, 4.0])
    assert predicted.tolist() == logits.argmax(dim=1).tolist()  # padding predicted too: masked by the caller


def test_masked_mean_is_the_mean_over_the_real_samples_alone() -> None:
    """Issue 46: the train loss of a padded batch: the padding's values (here huge) weigh nothing; a full
    batch's masked mean is its plain mean; nothing real gives 0, not a division by zero."""
    values = torch.tensor([1.0, 2.0, 6.0, 1e6, 1e6])
    mask = torch.tensor([True, True, True, False, False])
    assert masked_mean(values, mask).item() == 3.0
    assert masked_mean(values[:3], mask[:3]).item() == values[:3].mean().item()
    assert masked_mean(values, torch.zeros(5, dtype=torch.bool)).item() == 0.0


def test_summarize_turns_sums_from_several_batches_into_means() -> None:
    logits = torch.tensor([[3.0, 0.0], [0.0, 3.0], [3.0, 0.0]])
    labels = torch.tensor([0, 0, 1])
    first, _ = masked_sums(logits[:2], labels[:2], torch.tensor([1, 1]), torch.float64)
    second, _ = masked_sums(logits[2:], labels[2:], torch.tensor([1]), torch.float64)
    result = summarize(first + second)
    assert result["samples"] == 3
    assert result["top1"] == pytest.approx(1 / 3)
    assert result["top5"] == pytest.approx(1.0)  # two classes: top-5 holds every class
    assert result["loss"] == pytest.approx(F.cross_entropy(logits, labels).item())


def test_summarize_of_nothing_is_zero_samples_not_a_division_by_zero() -> None:
    result = summarize(torch.zeros(4, dtype=torch.float64))
    assert result == {"loss": 0.0, "top1": 0.0, "top5": 0.0, "samples": 0}


def test_the_default_peak_lr_scales_linearly_above_256_and_by_the_square_root_below():
    assert default_peak_lr(256) == pytest.approx(0.1)
    assert default_peak_lr(1024) == pytest.approx(0.4)  # Goyal et al.'s linear rule
    assert default_peak_lr(64) == pytest.approx(0.05)  # sqrt(1/4) x 0.1
    assert default_peak_lr(32) == pytest.approx(0.1 * (32 / 256) ** 0.5)
    assert default_peak_lr(32) > 2.5 * 0.1 * 32 / 256  # where linear scaling starved a small batch


def test_the_fine_tuning_lr_is_the_scaled_default_times_the_model_familys_factor() -> None:
    resnet18 = model_spec("resnet18")
    assert resnet18.fine_tune_lr_factor == RESNET_FINE_TUNE_LR_FACTOR == 0.3  # measured (models.py)
    assert fine_tune_peak_lr(32, resnet18) == pytest.approx(0.1 * (32 / 256) ** 0.5 * 0.3)  # 0.0106
    assert model_spec("convnext_tiny").fine_tune_lr_factor == CONVNEXT_FINE_TUNE_LR_FACTOR == 3.0  # measured
    assert model_spec("efficientnet_b0").fine_tune_lr_factor == EFFICIENTNET_FINE_TUNE_LR_FACTOR == 0.03
    assert fine_tune_peak_lr(16, model_spec("efficientnet_b0")) == pytest.approx(7.5e-4)  # the bench's best
    for spec in MODEL_SPECS.values():  # the measured factors; a tenth for every other family
        resnet = spec.name.startswith("resnet")
        expected = (
            RESNET_FINE_TUNE_LR_FACTOR
            if resnet
            else CONVNEXT_FINE_TUNE_LR_FACTOR
            if spec.name == "convnext_tiny"
            else EFFICIENTNET_FINE_TUNE_LR_FACTOR
            if spec.name.startswith("efficientnet_")
            else SGD_FINE_TUNE_LR_FACTOR
            if spec.optimizer is sgd_momentum
            else 0.1
        )
        assert spec.fine_tune_lr_factor == expected, spec.name
        assert fine_tune_peak_lr(512, spec) == pytest.approx(default_peak_lr(512, spec.base_lr) * expected)
