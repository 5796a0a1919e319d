"""tpustream/train/ema.py: the weights' EMA is a lerp of every float parameter and buffer toward the live
network's, its integer buffers copied, the live network untouched (on CPU torch; on XLA: the trainer's
integration test)."""

import torch
from torch import nn

from tpustream.train.ema import WeightAverage


def test_the_average_lerps_toward_the_live_weights_and_copies_counters():
    torch.manual_seed(0)
    live = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    ema = WeightAverage(live)
    start = {k: v.clone() for k, v in ema.state_dict().items()}
    with torch.no_grad():
        for parameter in live.parameters():
            parameter.add_(1.0)
    live.train()
    live(torch.randn(4, 3))  # BatchNorm's running statistics and its counter move
    ema.update(0.75)
    for name, value in ema.state_dict().items():
        target = live.state_dict()[name]
        if value.is_floating_point():
            assert torch.allclose(value, 0.75 * start[name] + 0.25 * target), name
        else:
            assert torch.equal(value, target), name
    assert not any(p.requires_grad for p in ema.model.parameters())
    assert all(p.requires_grad for p in live.parameters())
    assert not torch.equal(ema.state_dict()["0.weight"], live.state_dict()["0.weight"])  # differs from raw
