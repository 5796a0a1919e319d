"""Run the whole DAG here, on CPU, through kfp.local (SubprocessRunner without a venv: this Python)."""

import os
from typing import Any

from pipelines.training import build_pipeline

__all__ = ["run_local"]


def run_local(*, root: str, registry: str | None = None, **parameters: Any) -> dict[str, Any]:
    """Run every step locally under ``root`` (pipeline root); returns where things landed.

    Training runs on XLA CPU with 4 virtual devices (SPMD), as on a 4-chip TPU host.
    """
    from kfp import local

    os.environ.setdefault("PJRT_DEVICE", "CPU")
    os.environ.setdefault("CPU_NUM_DEVICES", "4")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    root = os.path.abspath(root)
    registry = registry or os.path.join(root, "registry")
    local.init(
        runner=local.SubprocessRunner(use_venv=False), pipeline_root=os.path.join(root, "pipeline-root")
    )
    pipeline = build_pipeline(tpu=None)
    run = pipeline(registry=registry, **parameters)
    return {"pipeline_root": os.path.join(root, "pipeline-root"), "registry": registry, "data": run.output}
