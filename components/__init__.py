"""KFP components: one thin adapter per step (artifacts -> URIs -> one call into tpustream -> outputs).

The functions here are plain; ``tpustream.pipelines.steps.build_components`` wraps them with
``dsl.component`` at compile time so the container images are chosen then.
"""

from tpustream.components.check import check_source
from tpustream.components.check_data import check_data
from tpustream.components.deploy import deploy_model
from tpustream.components.evaluate import evaluate_model
from tpustream.components.experiment import join_experiment
from tpustream.components.notify import notify_webhook
from tpustream.components.promote import promote_model
from tpustream.components.shards import finalize_shards, plan_shards, write_shards
from tpustream.components.train import train_model
from tpustream.components.tune import tune_model
from tpustream.components.tune_pick import pick_trial
from tpustream.components.tune_plan import plan_tuning
from tpustream.components.validate_serving import validate_serving
from tpustream.components.weights import resolve_weights

__all__ = [
    "check_source",
    "plan_shards",
    "write_shards",
    "finalize_shards",
    "check_data",
    "resolve_weights",
    "train_model",
    "tune_model",
    "plan_tuning",
    "pick_trial",
    "evaluate_model",
    "validate_serving",
    "promote_model",
    "deploy_model",
    "join_experiment",
    "notify_webhook",
]
