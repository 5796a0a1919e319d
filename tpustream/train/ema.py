"""An exponential moving average of the weights, kept on the device and updated inside the compiled step.

A plain lerp of every floating-point parameter and buffer (BatchNorm's running statistics included; its
step counters are copied), as timm's ``ModelEmaV3``: nothing crosses to the host, and the decay, a Python
float, reaches the graph as data (``ema_decay_at``'s warmup changes it each step without a recompile).
``torch.optim.swa_utils.AveragedModel`` was not used: its ``update_parameters`` branches on its device step
counter in Python (``if self.n_averaged == 0``), which syncs the host with the device every step.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["WeightAverage"]


class WeightAverage:
    """The EMA of ``model``'s weights: ``model`` here is the averaged copy, evaluated like any network."""

    def __init__(self, model: Any) -> None:
        self.model = copy.deepcopy(model)
        self.model.eval()
        for parameter in self.model.parameters():
            parameter.requires_grad_(False)
        self._floats: list[tuple[Any, Any]] = []
        self._copied: list[tuple[Any, Any]] = []
        for averaged, live in zip(self._tensors(self.model), self._tensors(model), strict=True):
            (self._floats if averaged.is_floating_point() else self._copied).append((averaged, live))

    @staticmethod
    def _tensors(model: Any) -> list[Any]:
        return [*model.parameters(), *model.buffers()]

    def update(self, decay: float) -> None:
        """averaged = decay * averaged + (1 - decay) * live, in place, as device work (no host sync). The live
        tensors are the network's this average was made from (the step updates them in place)."""
        import torch

        with torch.no_grad():
            averaged = [pair[0] for pair in self._floats]
            torch._foreach_lerp_(averaged, [pair[1].detach() for pair in self._floats], 1.0 - decay)
            for target, source in self._copied:
                target.copy_(source)

    def state_dict(self) -> dict[str, Any]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state)
