"""McNemar's exact test against scipy's binomial test on constructed cases, and the policy's --max-p-value."""

import pytest
from scipy.stats import binomtest

from tpustream.artifacts import Evaluation
from tpustream.metrics.paired_test import PairedTest, mcnemar_exact_p, paired_test
from tpustream.registry.policy import PromotionPolicy, RegistryError, decide


@pytest.mark.parametrize("candidate_only, champion_only", [(6, 0), (9, 3), (14, 4), (30, 17), (5, 5), (1, 0)])
def test_mcnemar_exact_equals_the_two_sided_binomial_test_on_the_discordant_pairs(
    candidate_only, champion_only
):
    reference = binomtest(candidate_only, candidate_only + champion_only, 0.5).pvalue
    assert mcnemar_exact_p(candidate_only, champion_only) == pytest.approx(reference, rel=1e-12)
    assert mcnemar_exact_p(champion_only, candidate_only) == mcnemar_exact_p(candidate_only, champion_only)


def decide_on(candidate, champion, **kwargs):
    """``decide`` on two evaluations given as metrics.json holds them."""
    return decide(
        Evaluation.from_json(candidate),
        None if champion is None else Evaluation.from_json(champion),
        **kwargs,
    )


def test_no_discordant_pair_is_no_evidence():
    assert mcnemar_exact_p(0, 0) == 1.0
    with pytest.raises(ValueError):
        mcnemar_exact_p(-1, 2)


def test_pairs_are_matched_by_key_whatever_their_order():
    """24 samples: the candidate gets 6 more right than the champion ("+25 points"), in another order."""
    candidate = [(f"s{i:02d}", i < 18) for i in range(24)]
    champion = [(f"s{i:02d}", i < 12) for i in reversed(range(24))] + [("only-champion", True)]
    test = paired_test(candidate, champion)
    assert (test.num_samples, test.candidate_only, test.champion_only) == (24, 6, 0)
    assert test.p_value == pytest.approx(binomtest(6, 6, 0.5).pvalue)
    assert PairedTest.from_json(test.to_json()) == test


def metrics(top1, paired=None):
    entry = {"top1": top1, "top5": 1.0, "loss": 0.5, "per_class_accuracy": [top1]}
    return {**entry, "paired": paired.to_json()} if paired else entry


def test_max_p_value_refuses_a_gain_that_could_be_chance_and_says_how_sure_the_decision_is():
    same = {"candidate_digest": "d", "champion_digest": "d"}
    strict = PromotionPolicy(max_p_value=0.05)
    sure = paired_test([(str(i), i < 18) for i in range(24)], [(str(i), i < 12) for i in range(24)])  # 6 vs 0
    unsure = PairedTest(num_samples=24, candidate_only=9, champion_only=3, p_value=mcnemar_exact_p(9, 3))
    promoted = decide_on(metrics(0.75), metrics(0.5, sure), policy=strict, **same)
    assert (
        promoted.promote and "p=0.0312 on 24 paired samples (6 right only by the candidate" in promoted.reason
    )
    refused = decide_on(metrics(0.75), metrics(0.5, unsure), policy=strict, **same)
    assert not refused.promote and "could be chance" in refused.reason and "p=0.146" in refused.reason
    assert decide_on(metrics(0.75), metrics(0.5, unsure), **same).promote  # off by default; still said
    assert "p=0.146" in decide_on(metrics(0.75), metrics(0.5, unsure), **same).reason
    assert "could well be chance" in decide_on(metrics(0.75), metrics(0.5, unsure), **same).reason
    unpaired = decide_on(metrics(0.75), metrics(0.5), policy=strict, **same)
    assert not unpaired.promote and "same samples" in unpaired.reason
    assert decide_on(metrics(0.75), None, policy=strict, **same).promote  # no champion: nothing to compare
    with pytest.raises(RegistryError, match="--max-p-value 0.0: a probability"):
        PromotionPolicy(max_p_value=0.0)


def test_too_few_differing_samples_are_said_to_be_unable_to_separate_the_models():
    """5 samples right only by the candidate and none by the champion: even this split has p = 0.0625."""
    few = paired_test([(str(i), i < 5) for i in range(400)], [(str(i), False) for i in range(400)])
    assert few.p_value == pytest.approx(0.0625)
    assert "too few samples tell the models apart (5)" in few.described()
    many = PairedTest(num_samples=400, candidate_only=40, champion_only=10, p_value=mcnemar_exact_p(40, 10))
    assert many.described().endswith("very unlikely to be chance")
