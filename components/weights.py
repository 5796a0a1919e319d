"""Resolve weights step: a CPU step before the TPU job fetches --pretrained's named weight set once per run.

Without it every host of a slice would resolve the name itself; with it they read the hash-checked copy in
``pipeline_root``/weights-cache, shared by the runs under that root (tpustream/train/pretrained.py).
"""


def resolve_weights(pretrained: str, model_name: str, pipeline_root: str, run_outcome: str = "") -> str:
    """Fetch a torchvision weights name into the cache and check its hash, or check a weights file URI
    exists; return the SPEC for the train step ("" = random weights: ``pretrained`` empty, or "DEFAULT" for
    a model without published weights)."""
    from tpustream.launchers.weights import launch_resolve_weights

    return launch_resolve_weights(
        pretrained=pretrained, model_name=model_name, pipeline_root=pipeline_root, run_outcome=run_outcome
    )
