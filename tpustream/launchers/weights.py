"""The resolve-weights step's launcher (components/weights.py)."""

from __future__ import annotations

from tpustream.run.outcome import failure_recorded

__all__ = ["launch_resolve_weights"]


def launch_resolve_weights(*, pretrained: str, model_name: str, pipeline_root: str, run_outcome: str) -> str:
    """Resolve ``pretrained`` into ``pipeline_root``/weights-cache; returns the SPEC for the train step."""
    with failure_recorded(run_outcome, "resolve-weights"):
        from tpustream.train.pretrained import resolve_ahead

        return resolve_ahead(pretrained, model=model_name, cache=f"{pipeline_root.rstrip('/')}/weights-cache")
