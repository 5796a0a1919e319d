"""The search on Vertex AI: a ``HyperparameterTuningJob`` (Vizier) whose trials run the trainer on the TPU slice.

The job is GCPC's ``HyperparameterTuningJobRunOp`` (v1/hyperparameter_tuning_job/component.py), whose launcher
builds the job from one JSON payload (``json_format.ParseDict`` into aiplatform_v1 ``HyperparameterTuningJob``,
container/v1/gcp_launcher/job_remote_runner.py). What goes into it comes from here:

- ``study_spec_metrics`` / ``study_spec_parameters``: the search space (tpustream/tune/space.py) as
  ``StudySpec.MetricSpec`` / ``ParameterSpec`` dicts, the shape GCPC's ``serialize_metrics`` /
  ``serialize_parameters`` produce (``goal`` MAXIMIZE, ``double_value_spec``, ``scale_type`` UNIT_LOG_SCALE...).
- ``STOPPING_SPEC``: automated early stopping, ``StudySpec.decay_curve_stopping_spec`` (Vizier stops a trial
  whose learning curve, its reported measurements by epoch, will not beat the best; ``use_elapsed_duration``
  false: by step, the epoch). GCPC's payload has no slot for it, so pipelines/steps.py splices it into the
  payload's ``study_spec`` (``with_stopping_spec``).
- ``trial_pools``: the TPU job's own worker pool (pipelines/tpu.py: one pool, one replica per slice), its
  container running ``python3 -m tpustream.tune.vertex_trial`` with the run's base ``TrainConfig`` as JSON:
  Vertex appends each trial's values as ``--<parameter_id>=<value>`` and sets ``AIP_MODEL_DIR`` to
  ``<base_output_directory>/<trial id>/model/`` (aiplatform_v1 ``HyperparameterTuningJob.trial_job_spec``), the
  trial's model artifact. The trial reports val top-1 per epoch the cloudml-hypertune way
  (tpustream/tune/hypertune.py).
- ``tuning_record``: the finished job's trials as a ``TuningRecord``: the best finished trial (highest final
  measurement) whose model was written is the candidate, its model artifact used as it trained.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from tpustream.storage import io as storage
from tpustream.train.config import TrainConfig
from tpustream.tune.record import TrialRecord, TuningRecord
from tpustream.tune.space import Parameter, SearchSpace

__all__ = [
    "STOPPING_SPEC",
    "TRIAL_MODULE",
    "study_spec_metrics",
    "study_spec_parameters",
    "trial_pools",
    "read_job_trials",
    "trial_model_dir",
    "tuning_job_body",
    "tuning_record",
]

TRIAL_MODULE = "tpustream.tune.vertex_trial"
STOPPING_SPEC = {"decay_curve_stopping_spec": {"use_elapsed_duration": False}}
_SCALE = {"linear": "UNIT_LINEAR_SCALE", "log": "UNIT_LOG_SCALE"}


def study_spec_metrics(space: SearchSpace) -> list[dict[str, Any]]:
    """The study's metric: val top-1, maximized (``StudySpec.MetricSpec``)."""
    return [{"metric_id": space.metric, "goal": space.goal.upper()}]


def _parameter_spec(parameter: Parameter) -> dict[str, Any]:
    spec: dict[str, Any] = {"parameter_id": parameter.name}
    if parameter.kind == "double":
        spec["double_value_spec"] = {"min_value": parameter.low, "max_value": parameter.high}
    elif parameter.kind == "int":  # int64 in the proto: JSON numbers parse
        spec["integer_value_spec"] = {
            "min_value": int(parameter.low or 0),
            "max_value": int(parameter.high or 0),
        }
    elif parameter.kind == "discrete":
        spec["discrete_value_spec"] = {"values": [float(value) for value in parameter.values]}
    else:
        spec["categorical_value_spec"] = {"values": [str(value) for value in parameter.values]}
    if parameter.kind != "categorical":
        spec["scale_type"] = _SCALE[parameter.scale]
    return spec


def study_spec_parameters(space: SearchSpace) -> list[dict[str, Any]]:
    """The searched parameters (``StudySpec.ParameterSpec``), ``parameter_id`` the ``TrainConfig`` field."""
    return [_parameter_spec(parameter) for parameter in space.parameters]


def trial_pools(
    pool: dict[str, Any], image: str, config: TrainConfig, space: SearchSpace
) -> list[dict[str, Any]]:
    """The trials' worker pools: the TPU job's ``pool`` (machine, replica count, disk) running a trial of
    ``config`` in ``image``; ``--space`` types the values Vertex appends (every number arrives as text)."""
    container = {
        "image_uri": image,
        "command": ["python3", "-m", TRIAL_MODULE],
        "args": [
            f"--config={json.dumps(dataclasses.asdict(config), sort_keys=True)}",
            f"--space={json.dumps(space.to_json(), sort_keys=True)}",
        ],
    }
    return [{**pool, "container_spec": container}]


def tuning_job_body(
    *,
    display_name: str,
    space: SearchSpace,
    pools: list[dict[str, Any]],
    base_output_directory: str,
    service_account: str = "",
    network: str = "",
) -> dict[str, Any]:
    """The ``HyperparameterTuningJob`` GCPC's launcher creates from the pipeline's payload, stopping spec
    spliced in: what the tests check against the aiplatform_v1 proto and the emulation runs."""
    study_spec: dict[str, Any] = {
        "metrics": study_spec_metrics(space),
        "parameters": study_spec_parameters(space),
        "algorithm": "ALGORITHM_UNSPECIFIED",
        "measurement_selection_type": "BEST_MEASUREMENT",
    }
    if space.early_stopping:
        study_spec.update(STOPPING_SPEC)
    return {
        "display_name": display_name,
        "study_spec": study_spec,
        "max_trial_count": space.max_trials,
        "parallel_trial_count": space.parallel_trials,
        "max_failed_trial_count": 0,
        "trial_job_spec": {
            "worker_pool_specs": pools,
            "service_account": service_account,
            "network": network,
            "base_output_directory": {"output_uri_prefix": base_output_directory},
        },
    }


def trial_model_dir(base_output_directory: str, trial_id: str) -> str:
    """Where Vertex points a trial's ``AIP_MODEL_DIR``: ``<base>/<trial id>/model`` (no trailing slash)."""
    return f"{base_output_directory.rstrip('/')}/{trial_id}/model"


def _get(entry: dict[str, Any], snake: str) -> Any:
    """A field of a Trial as JSON, in proto field names or JSON names (camelCase: MessageToDict's default)."""
    if snake in entry:
        return entry[snake]
    head, *rest = snake.split("_")
    return entry.get(head + "".join(part.title() for part in rest))


def tuning_record(
    trials: list[dict[str, Any]], base_output_directory: str, space: SearchSpace
) -> TuningRecord:
    """The finished job's ``trials`` (aiplatform_v1 ``Trial`` as JSON) as a ``TuningRecord``: a SUCCEEDED trial
    whose model.json was written is complete, one without (Vizier stopped it early) pruned, the rest failed.

    Raises:
        TuneError: no trial finished with a model.
    """
    from tpustream.tune.local import hand_on

    records = []
    for trial in trials:
        trial_id = str(trial["id"])
        values = {
            str(_get(p, "parameter_id")): space.parameter(str(_get(p, "parameter_id"))).value(p["value"])
            for p in trial.get("parameters") or []
        }
        final = _get(trial, "final_measurement") or {}
        metric = next(
            (float(m["value"]) for m in final.get("metrics") or [] if _get(m, "metric_id") == space.metric),
            None,
        )
        steps = int(_get(final, "step_count") or 0)
        model = trial_model_dir(base_output_directory, trial_id)
        state = str(trial.get("state", ""))
        if state == "SUCCEEDED" and storage.exists(storage.join(model, "model.json")):
            records.append(
                TrialRecord(
                    id=trial_id,
                    parameters=values,
                    state="complete",
                    metric=metric,
                    epochs_run=steps,
                    model=model,
                )
            )
        else:
            pruned = state in ("SUCCEEDED", "STOPPING")
            reason = (
                "stopped early by Vizier (decay curve)"
                if pruned
                else _get(trial, "infeasible_reason") or state
            )
            records.append(
                TrialRecord(
                    id=trial_id,
                    parameters=values,
                    state="pruned" if pruned else "failed",
                    metric=metric,
                    epochs_run=steps,
                    reason=str(reason),
                )
            )
    return hand_on(base_output_directory, "vertex-vizier", space, tuple(records))


def read_job_trials(gcp_resources: str) -> list[dict[str, Any]]:
    """The trials of the HyperparameterTuningJob that GCPC's launcher recorded in ``gcp_resources`` (its
    ``resources[0].resourceUri``: ``https://<endpoint>/v1/projects/.../hyperparameterTuningJobs/<id>``,
    container/v1/gcp_launcher/job_remote_runner.py ``create_job``), read from that endpoint with aiplatform_v1's
    JobServiceClient (``GetHyperparameterTuningJob``), each as JSON (MessageToDict's names).
    ``TPUSTREAM_VERTEX_ENDPOINT`` overrides the endpoint, as for the other Vertex calls; an ``http://`` one (the
    tests' loopback Vertex) is called without credentials."""
    import os
    from urllib.parse import urlparse

    from google.api_core.client_options import ClientOptions
    from google.cloud.aiplatform_v1 import JobServiceClient
    from google.protobuf import json_format

    resource = json.loads(gcp_resources)["resources"][0]["resourceUri"]
    parsed = urlparse(resource)
    name = parsed.path.split("/v1/", 1)[1]
    endpoint = os.environ.get("TPUSTREAM_VERTEX_ENDPOINT") or parsed.netloc
    credentials = None  # the default: application default credentials, as GCPC's launcher found them
    if endpoint.startswith("http://"):  # a loopback endpoint: no credentials to find or send
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()
    # REST, as the resource URI names it (Vertex's API serves both; a recording endpoint only REST)
    client = JobServiceClient(
        transport="rest", client_options=ClientOptions(api_endpoint=endpoint), credentials=credentials
    )
    job = client.get_hyperparameter_tuning_job(name=name)
    return [json_format.MessageToDict(type(trial).pb(trial)) for trial in job.trials]
