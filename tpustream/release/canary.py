"""The canary's arithmetic and its record, pure: how an endpoint's traffic splits when a model joins it
(``canary_split``: the serving models keep the rest in their proportions, whole percents by largest
remainder), and what ``tpustream.release.deploy`` writes into the endpoint's labels for rollback to read back
(``CanaryRecord``: the canary and the split it was deployed into)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from tpustream.errors import ConfigError

__all__ = ["NEW_MODEL", "CanaryRecord", "canary_split"]

NEW_MODEL = "0"  # DeployModelRequest.traffic_split's key for the model being deployed
_CANARY_MODEL = "tpustream-canary-model"
_CANARY_VERSION = "tpustream-canary-version"
_PREVIOUS = "tpustream-previous-"  # + deployed model id -> its share before the canary


@dataclass(frozen=True)
class CanaryRecord:
    """What rollback undoes: the canary (a model version) and the split it was deployed into."""

    model_id: str
    version_id: str
    previous: dict[str, int] = field(default_factory=dict)  # deployed model id -> share before the canary

    def labels(self) -> dict[str, str]:
        """As endpoint labels (keys: a lowercase letter first, then [a-z0-9_-], at most 63 characters)."""
        out = {_CANARY_MODEL: self.model_id, _CANARY_VERSION: self.version_id}
        out.update({f"{_PREVIOUS}{deployed_id}": str(share) for deployed_id, share in self.previous.items()})
        return out

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> CanaryRecord | None:
        if _CANARY_MODEL not in labels or _CANARY_VERSION not in labels:
            return None
        previous = {
            key[len(_PREVIOUS) :]: int(value)
            for key, value in labels.items()
            if key.startswith(_PREVIOUS) and value.isdigit()
        }
        return cls(labels[_CANARY_MODEL], labels[_CANARY_VERSION], previous)


def _without_record(labels: Mapping[str, str]) -> dict[str, str]:
    return {
        key: value
        for key, value in labels.items()
        if key not in (_CANARY_MODEL, _CANARY_VERSION) and not key.startswith(_PREVIOUS)
    }


def _scale(shares: Mapping[str, int], total: int) -> dict[str, int]:
    """``shares`` re-scaled to whole numbers that sum to ``total``, in their proportions: largest remainder
    rounding, a tie going to the larger share, then to the one listed first."""
    weight = sum(shares.values())
    if weight <= 0:
        raise ConfigError(f"no traffic to re-scale in {dict(shares)}")
    exact = {key: Fraction(share * total, weight) for key, share in shares.items()}
    out = {key: int(value) for key, value in exact.items()}  # floor: shares are non-negative
    leftover = total - sum(out.values())
    for key in sorted(shares, key=lambda k: (out[k] - exact[k], -shares[k]))[:leftover]:
        out[key] += 1
    return out


def canary_split(serving: Mapping[str, int], percent: int) -> dict[str, int]:
    """The endpoint's traffic split once a new model (key ``NEW_MODEL``) takes ``percent``: the models in
    ``serving`` (deployed model id -> current share) keep the rest in their proportions, the total is 100."""
    if not 0 <= percent <= 100:
        raise ConfigError(f"--traffic {percent}: a share of the endpoint's traffic in percent, 0 to 100")
    rest = {key: share for key, share in serving.items() if share > 0}
    if not rest and percent != 100:
        raise ConfigError(f"nothing else serves: the new model must take 100%, not {percent}%")
    split = _scale(rest, 100 - percent) if percent < 100 else dict.fromkeys(rest, 0)
    split[NEW_MODEL] = percent
    return split
