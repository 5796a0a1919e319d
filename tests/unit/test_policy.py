"""The batched augmentation policies (tpustream/image/policy.py): each sample draws its own op, magnitude and
erased box as torchvision draws them for one image, over the policy's whole op set, and each op's pixels equal
torchvision's functional op for that sample's op and magnitude."""

from __future__ import annotations

import collections

import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as F

from tpustream.image.policy import (
    ERASING_FILL,
    apply_batch_policy,
    apply_ops,
    apply_policy,
    draw_policy,
    erase,
    op_names,
)
from tpustream.image.transforms import Augment

REFERENCES = {"trivial": v2.TrivialAugmentWide(), "randaugment": v2.RandAugment()}


def _images(count: int, size: int, seed: int = 0) -> torch.Tensor:
    """Noise, and smooth ramps (where shears, rotations and blurs land between levels)."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (count, 3, size, size), dtype=torch.uint8, generator=generator)
    ramp = (torch.arange(size) * 255 // (size - 1)).to(torch.uint8)
    images[: count // 2, 0] = ramp[None, :]
    images[: count // 2, 1] = ramp[:, None]
    return images


def _torchvision(policy: str, image: torch.Tensor, op: str, magnitude: float) -> torch.Tensor:
    """torchvision's own mapping of (op, magnitude) to its functional op, on one image."""
    reference = REFERENCES[policy]
    return reference._apply_image_or_video_transform(
        image, op, magnitude, interpolation=InterpolationMode.NEAREST, fill=reference._fill
    )


@pytest.mark.parametrize("policy", ["trivial", "randaugment"])
def test_the_op_sets_are_torchvisions(policy):
    assert op_names(policy) == tuple(type(REFERENCES[policy])._AUGMENTATION_SPACE)
    assert len(op_names(policy)) == 14 and op_names("none") == ()


@pytest.mark.parametrize("policy, rounds", [("trivial", 1), ("randaugment", 2)])
def test_every_sample_draws_its_own_op_over_the_whole_op_set(policy, rounds):
    """Over 2,800 samples under a fixed seed: every op drawn, about uniformly (a v2 transform called on a batch
    would draw one op for all of it); TrivialAugmentWide's magnitudes over all 31 bins and both signs,
    RandAugment's at bin 9 alone, either sign."""
    names = op_names(policy)
    draws = draw_policy(policy, 0.0, 2800, 32, 32, seed=7)
    assert len(draws.ops) == len(draws.magnitudes) == rounds
    for ops, magnitudes in zip(draws.ops, draws.magnitudes, strict=True):
        counts = collections.Counter(names[op] for op in ops)
        assert set(counts) == set(names)
        assert all(150 <= count <= 250 for count in counts.values()), counts  # 200 expected each
        shear = {magnitude for op, magnitude in zip(ops, magnitudes, strict=True) if names[op] == "ShearX"}
        table = torch.linspace(0.0, 0.99 if policy == "trivial" else 0.3, 31).tolist()
        if policy == "trivial":
            assert {abs(m) for m in shear} == set(table) and min(shear) < 0 < max(shear)
        else:
            assert shear == {table[9], -table[9]}
        unsigned = {
            magnitude for op, magnitude in zip(ops, magnitudes, strict=True) if names[op] == "Equalize"
        }
        assert unsigned == {0.0}
    assert draws.erase == (None,) * 2800
    assert draw_policy(policy, 0.0, 64, 32, 32, seed=7).ops[0] == draws.ops[0][:64]  # prefix: same generator
    assert (
        draw_policy(policy, 0.0, 64, 32, 32, seed=8).ops != draw_policy(policy, 0.0, 64, 32, 32, seed=7).ops
    )


def test_random_erasing_draws_a_box_per_sample_at_its_probability():
    """RandomErasing at 0.25 over 4,000 samples: about a quarter erased, each box inside the image, of 2-33% of
    its area (rounding aside) and an aspect ratio in 0.3-3.3, at every position along both sides."""
    draws = draw_policy("none", 0.25, 4000, 32, 32, seed=3)
    boxes = [box for box in draws.erase if box is not None]
    assert 900 <= len(boxes) <= 1100
    for top, left, height, width in boxes:
        assert top >= 0 and top + height <= 32 and left >= 0 and left + width <= 32
        assert 0 < height < 32 and 0 < width < 32
        assert 0.015 <= height * width / 1024 <= 0.36
    assert {top for top, _, _, _ in boxes} >= set(range(20)) <= {left for _, left, _, _ in boxes}
    assert draws.ops == ()
    everything = draw_policy("none", 1.0, 500, 32, 32, seed=3).erase
    assert all(box is not None for box in everything)


@pytest.mark.parametrize(
    "policy, size, bins",
    [
        ("trivial", 32, range(31)),
        ("trivial", 17, range(31)),  # an odd side: the centre falls on a pixel
        ("trivial", 224, (0, 1, 13, 20, 30)),  # bin 20: a rotation by 90 degrees
        ("randaugment", 32, (9,)),
        ("randaugment", 224, (9,)),
    ],
)
def test_each_op_equals_torchvisions_functional_op_per_sample(policy, size, bins):
    """Every op at every magnitude bin it can draw (at 224 px, some), both signs, all in one batch of mixed ops,
    each sample equal to torchvision's functional op at its own op and magnitude."""
    names = op_names(policy)
    space = type(REFERENCES[policy])._AUGMENTATION_SPACE
    ops: list[int] = []
    magnitudes: list[float] = []
    for index, (magnitudes_fn, signed) in enumerate(space.values()):
        table = magnitudes_fn(31, size, size)
        values = [0.0] if table is None else sorted({float(table[b]) for b in bins})
        for value in values:
            for sign in (1, -1) if signed and value else (1,):
                ops.append(index)
                magnitudes.append(sign * value)
    images = _images(len(ops), size)
    out = images.clone()
    apply_ops(out, names, tuple(ops), tuple(magnitudes))
    for i, (op, magnitude) in enumerate(zip(ops, magnitudes, strict=True)):
        expected = _torchvision(policy, images[i], names[op], magnitude)
        assert torch.equal(out[i], expected), (names[op], magnitude)


def test_erasing_equals_torchvisions_erase():
    images = _images(3, 32)
    out = images.clone()
    erase(out, ((2, 5, 10, 7), None, (0, 0, 31, 1)))
    value = torch.tensor(ERASING_FILL, dtype=torch.float32)[:, None, None]
    assert torch.equal(out[0], F.erase(images[0], 2, 5, 10, 7, value))
    assert torch.equal(out[1], images[1])
    assert torch.equal(out[2], F.erase(images[2], 0, 0, 31, 1, value))


@pytest.mark.parametrize("policy", ["trivial", "randaugment"])
def test_a_batch_is_each_sample_through_torchvision_with_its_draws(policy):
    """The whole batched path (``apply_policy``, as the loader's workers call it): each sample equals
    torchvision's ops in turn at its drawn magnitudes, then its erased box; and the same seed, the same pixels."""
    images = _images(48, 32, seed=1)
    augment = Augment(output_size=32, train=True, policy=policy, random_erasing=0.5)
    out = images.clone()
    apply_policy(out, augment, seed=11)
    draws = draw_policy(policy, 0.5, 48, 32, 32, seed=11)
    names = op_names(policy)
    value = torch.tensor(ERASING_FILL, dtype=torch.float32)[:, None, None]
    for i in range(48):
        expected = images[i]
        for ops, magnitudes in zip(draws.ops, draws.magnitudes, strict=True):
            expected = _torchvision(policy, expected, names[ops[i]], magnitudes[i])
        if draws.erase[i] is not None:
            expected = F.erase(expected, *draws.erase[i], value)
        assert torch.equal(out[i], expected), i
    again = images.clone()
    apply_batch_policy(again, policy, 0.5, seed=11)
    assert torch.equal(again, out)
    assert sum(box is not None for box in draws.erase) in range(12, 37)


def test_no_policy_leaves_the_batch_and_the_global_generator_alone():
    images = _images(8, 32)
    state = torch.random.get_rng_state()
    out = images.clone()
    apply_policy(out, Augment(output_size=32, train=True), seed=1)
    assert torch.equal(out, images)
    apply_policy(out, Augment(output_size=32, train=True, policy="trivial", random_erasing=0.5), seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)  # drawn from the batch's own generator
