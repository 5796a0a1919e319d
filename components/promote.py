"""Promote step: atomic champion swap (re-decides under compare-and-swap)."""

from kfp.dsl import Input, Metrics, Model


def promote_model(
    model: Input[Model], evaluation: Input[Metrics], registry: str, metric: str, min_delta: float,
) -> str:  # fmt: skip
    """Returns the outcome line; the registry's champion.json is the source of truth."""
    from tpustream.promote import promote

    outcome = promote(model.uri, evaluation.uri, registry, metric=metric, min_delta=min_delta)
    return (
        f"promoted version {outcome['version']}"
        if outcome["promoted"]
        else f"not promoted: {outcome['reason']}"
    )
