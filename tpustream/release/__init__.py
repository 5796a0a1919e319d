"""Releasing a model: ``promote`` (champion/challenger, atomic), ``deploy`` (canary and rollback), ``canary`` the
split's arithmetic and record.

The names below are the package's public API, imported on first use so that importing the package loads nothing
heavy (``tpustream --help`` stays torch-free); the modules themselves are imported by their full path inside tpustream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpustream._lazy import lazy_front

if TYPE_CHECKING:
    from tpustream.release.canary import CanaryRecord
    from tpustream.release.deploy import DeployError, DeployOutcome, rollback
    from tpustream.release.promote import PromotionOutcome, preview_decision

_HOMES = {
    "preview_decision": "promote",
    "PromotionOutcome": "promote",
    "rollback": "deploy",
    "DeployError": "deploy",
    "CanaryRecord": "canary",
    "DeployOutcome": "deploy",
}
__all__ = [
    "PromotionOutcome",
    "preview_decision",
    "CanaryRecord",
    "DeployError",
    "DeployOutcome",
    "rollback",
]

__getattr__, __dir__ = lazy_front(__name__, _HOMES)
