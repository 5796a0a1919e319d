"""KFP components: one thin adapter per step (artifacts -> URIs -> one call into tpustream -> outputs).

The functions here are plain; ``pipelines.training.build_components`` wraps them with
``dsl.component`` at compile time so the container images are chosen then.
"""

from components.check import check_source
from components.check_data import check_data
from components.deploy import deploy_model
from components.evaluate import evaluate_model
from components.experiment import join_experiment
from components.promote import promote_model
from components.shards import finalize_shards, plan_shards, write_shards
from components.train import train_model
from components.validate_serving import validate_serving

__all__ = [
    "check_source",
    "plan_shards",
    "write_shards",
    "finalize_shards",
    "check_data",
    "train_model",
    "evaluate_model",
    "validate_serving",
    "promote_model",
    "deploy_model",
    "join_experiment",
]
