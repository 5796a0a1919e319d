"""Vertex AI Experiments: pipeline runs that join an experiment compare side by side, with their metrics.

One association, two routes. A run joins when its ``system.PipelineRun`` metadata context becomes a child of
the experiment's ``system.Experiment`` context; the experiment then reads each run's parameters and the
``system.Metrics`` artifacts its steps recorded (the train and evaluate steps' metrics) by itself (aiplatform
``pipeline_jobs.py``, ``PipelineJob._query_experiment_row``), so nothing is logged again here.

- ``pipeline submit --experiment``: aiplatform's documented way, ``PipelineJob.submit(experiment=...)``. It
  gets or creates the experiment before the run is created, then adds the run's context
  (``_ExperimentLoggable._associate_to_experiment``, ``metadata/experiment_resources.py``).
- ``pipeline schedule --experiment``: Vertex's scheduler creates each run from the schedule's
  ``createPipelineJobRequest``; neither it nor the v1 ``PipelineJob`` has an experiment field
  (``aiplatform_v1/types/schedule.py``, ``pipeline_job.py``), and aiplatform's ``create_schedule`` takes no
  experiment. So the name travels as the pipeline parameter ``experiment``, and a step of the run calls
  ``join_experiment`` with the run's own project, location and job ID (pipeline placeholders, resolved by
  Vertex when the step runs), which makes the same association from inside the run.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from typing import Any

from tpustream.errors import ConfigError, TpustreamError

__all__ = ["ExperimentError", "check_experiment_name", "get_or_create_experiment", "join_experiment"]

log = logging.getLogger(__name__)

# An experiment is a metadata context whose ID is its name: "4-128 characters ... /[a-z][0-9]-/"
# (aiplatform_v1 CreateContextRequest.context_id).
_EXPERIMENT_NAME = re.compile(r"^[a-z0-9-]{4,128}$")


class ExperimentError(TpustreamError, RuntimeError):
    """A run could not join its Vertex AI Experiment; the message says which and why."""


def check_experiment_name(name: str, flag: str = "--experiment") -> str:
    """Refuse a name Vertex AI cannot give an experiment (naming ``flag``); return it unchanged."""
    if not _EXPERIMENT_NAME.match(name):
        raise ConfigError(
            f"{flag} {name!r} is not a Vertex AI Experiment name: 4 to 128 lowercase letters, digits and "
            "hyphens (e.g. tpustream-resnet50)"
        )
    return name


def get_or_create_experiment(aiplatform: Any, name: str) -> Any:
    """The experiment ``name`` in the project and region ``aiplatform`` was initialised for, created if missing."""
    check_experiment_name(name)
    return aiplatform.Experiment.get_or_create(name)


def join_experiment(
    experiment: str,
    *,
    project: str,
    location: str,
    pipeline_job_id: str,
    api_endpoint: str | None = None,
) -> str | None:
    """Add the running pipeline job ``pipeline_job_id`` to ``experiment`` (created if missing); "" does nothing.

    Meant for a step of the run itself, called with the ``experiment`` pipeline parameter and the placeholders
    ``_placeholders.PROJECT_ID_PLACEHOLDER``, ``_placeholders.LOCATION_PLACEHOLDER`` (GCPC) and
    ``dsl.PIPELINE_JOB_ID_PLACEHOLDER`` (kfp), from which GCPC itself builds a run's resource name
    (``v1/model/upload_model/component.py``). A run already in the experiment (submitted with
    ``--experiment``) is left as it is. The run's service account needs ``aiplatform.metadataStores.*``
    (``roles/aiplatform.user``).

    Args:
        experiment: The experiment's name; "" when the run joins none.
        project: The run's project.
        location: The run's region.
        pipeline_job_id: The run's ID, the last part of its resource name.
        api_endpoint: Another Vertex AI API endpoint (default: TPUSTREAM_VERTEX_ENDPOINT, else Google's).

    Returns:
        The experiment's metadata context resource name, or None when ``experiment`` is "".
    """
    if not experiment:
        return None
    from tpustream.vertex import model_registry as vertex

    check_experiment_name(experiment, "experiment")
    place = vertex.place_from_env(project, location)
    aiplatform = vertex.init(replace(place, api_endpoint=api_endpoint) if api_endpoint else place)
    name = f"projects/{project}/locations/{location}/pipelineJobs/{pipeline_job_id}"
    run_context = aiplatform.PipelineJob.get(name).gca_resource.job_detail.pipeline_run_context.name
    if not run_context:  # Vertex makes it when the run starts: a step of the run always finds it
        raise ExperimentError(
            f"pipeline job {name} has no run context yet: it cannot join experiment {experiment!r}"
        )
    joined = get_or_create_experiment(aiplatform, experiment)
    run = aiplatform.Context(run_context)  # read now: its parents as the metadata store has them
    if joined.resource_name in run.parent_contexts:
        log.info("%s is already in experiment %s", name, experiment)
    else:
        aiplatform.Context(joined.resource_name).add_context_children([run])
        log.info("%s joined experiment %s", name, experiment)
    return str(joined.resource_name)
