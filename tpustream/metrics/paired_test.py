"""How sure a promotion is: candidate and champion scored on the same samples, compared pair by pair.

McNemar's exact test looks only at the discordant pairs, the samples one model gets right and the other
wrong: if the models were equally good, each such sample would be the candidate's with probability 1/2, so
the two-sided p-value is that of a fair coin giving a split at least as uneven (twice the smaller binomial
tail, at most 1). "+25 points" on 24 images, 6 right only by the candidate and none only by the champion, is
p = 0.031; 12 discordant split 9 to 3 (the same +25 points) is p = 0.15.
Pure: no numpy needed, exact integer arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["SIGNIFICANCE", "PairedTest", "mcnemar_exact_p", "paired_test"]

SIGNIFICANCE = 0.05  # the level the words of ``PairedTest.described`` refer to (--max-p-value is the user's)


def mcnemar_exact_p(candidate_only: int, champion_only: int) -> float:
    """Two-sided exact McNemar p-value for ``candidate_only`` samples only the candidate gets right and
    ``champion_only`` only the champion does (1.0 when there is no discordant pair)."""
    if candidate_only < 0 or champion_only < 0:
        raise ValueError("discordant counts are never negative")
    discordant = candidate_only + champion_only
    if not discordant:
        return 1.0
    smaller = min(candidate_only, champion_only)
    tail = sum(math.comb(discordant, i) for i in range(smaller + 1))
    return min(1.0, 2 * tail / 2**discordant)


@dataclass(frozen=True, kw_only=True)
class PairedTest:
    """Top-1 right/wrong of both models on the samples both were scored on."""

    num_samples: int  # samples scored by both (matched by key)
    candidate_only: int  # right by the candidate only
    champion_only: int  # right by the champion only
    p_value: float  # McNemar's exact, two-sided

    def to_json(self) -> dict[str, Any]:
        return {
            "test": "mcnemar-exact",
            "num_samples": self.num_samples,
            "candidate_only_correct": self.candidate_only,
            "champion_only_correct": self.champion_only,
            "p_value": self.p_value,
        }

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> PairedTest:
        return cls(
            num_samples=int(document["num_samples"]),
            candidate_only=int(document["candidate_only_correct"]),
            champion_only=int(document["champion_only_correct"]),
            p_value=float(document["p_value"]),
        )

    def described(self) -> str:
        """The test in words: its numbers, how sure they make the difference, and a warning when too few
        samples differ for any outcome to be significant."""
        numbers = (
            f"McNemar exact p={self.p_value:.3g} on {self.num_samples} paired samples "
            f"({self.candidate_only} right only by the candidate, {self.champion_only} only by the champion)"
        )
        discordant = self.candidate_only + self.champion_only
        if mcnemar_exact_p(discordant, 0) > SIGNIFICANCE:
            return (
                f"{numbers}: too few samples tell the models apart ({discordant}) for any result to be "
                f"significant at {SIGNIFICANCE}; evaluate on more data to separate them"
            )
        if self.p_value <= SIGNIFICANCE / 5:
            return f"{numbers}: very unlikely to be chance"
        if self.p_value <= SIGNIFICANCE:
            return f"{numbers}: unlikely to be chance (significant at {SIGNIFICANCE})"
        return f"{numbers}: could well be chance (not significant at {SIGNIFICANCE})"


def paired_test(candidate: Iterable[tuple[str, bool]], champion: Iterable[tuple[str, bool]]) -> PairedTest:
    """McNemar's exact test on ``(sample key, top-1 right)`` of both models, matched by key (the loader's
    order differs between runs with workers); samples scored by one model only are left out."""
    theirs = dict(champion)
    both = candidate_only = champion_only = 0
    for key, right in candidate:
        if key not in theirs:
            continue
        both += 1
        if right and not theirs[key]:
            candidate_only += 1
        elif theirs[key] and not right:
            champion_only += 1
    return PairedTest(
        num_samples=both,
        candidate_only=candidate_only,
        champion_only=champion_only,
        p_value=mcnemar_exact_p(candidate_only, champion_only),
    )
