"""What Vertex AI accepts, as the fake checks it: request bodies parsed as the aiplatform v1 protos
(``validate_body``, the message each REST call carries), the classification metrics schema, the TPU rules of
a CustomJob, its TensorBoard rules, a Schedule's tick, a traffic split; ``Refused`` for a documented rule a
request breaks. Also the two helpers every part of the fake shares (the GCS stand-in's client, a timestamp).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re


def _request_message(method: str, rest: str) -> type | None:
    """The aiplatform v1 message a request body must parse as (REST mapping of the v1 API)."""
    from google.cloud import aiplatform_v1 as v1

    if method == "PATCH" and re.match(r"^/endpoints/[^/:]+$", rest):
        return v1.Endpoint  # UpdateEndpoint: body "endpoint"
    if method != "POST":
        return None
    if rest == "/endpoints":
        return v1.Endpoint  # CreateEndpoint: body "endpoint"
    if re.match(r"^/endpoints/[^/:]+:deployModel$", rest):
        return v1.DeployModelRequest
    if re.match(r"^/endpoints/[^/:]+:undeployModel$", rest):
        return v1.UndeployModelRequest
    if re.match(r"^/models/[^/]+/evaluations:import$", rest):
        return v1.ImportModelEvaluationRequest
    if rest == "/batchPredictionJobs":
        return v1.BatchPredictionJob  # CreateBatchPredictionJob: body "batch_prediction_job"
    if rest == "/metadataStores":
        return v1.MetadataStore  # CreateMetadataStore: body "metadata_store"
    if re.match(r"^/metadataStores/[^/]+/contexts$", rest):
        return v1.Context  # CreateContext: body "context"
    if re.match(r"^/metadataStores/[^/]+/contexts/[^/:]+:addContextChildren$", rest):
        return v1.AddContextChildrenRequest
    if rest == "/pipelineJobs":
        return v1.PipelineJob
    if rest == "/schedules":
        return v1.Schedule
    if rest == "/customJobs":
        return v1.CustomJob
    if rest == "/hyperparameterTuningJobs":
        return v1.HyperparameterTuningJob  # CreateHyperparameterTuningJob: body "hyperparameter_tuning_job"
    if rest == "/models:upload":
        return v1.UploadModelRequest
    if rest.endswith(":mergeVersionAliases"):
        return v1.MergeVersionAliasesRequest
    if re.match(r"^/datasets/[^/]+:export$", rest):
        return v1.ExportDataRequest
    return None


def validate_body(message: type, body: dict) -> None:
    """Parse ``body`` as Vertex does; raises ParseError on an unknown field or a wrong type."""
    from google.protobuf import json_format

    json_format.ParseDict(body, message.pb(message()), ignore_unknown_fields=False)


# The fields of Vertex's classification metrics schema (gs://google-cloud-aiplatform/schema/modelevaluation/
# classification_metrics_1.0.0.yaml): aiplatform v1 REST "SchemaModelevaluationMetricsClassificationEvaluation
# Metrics" and its ConfidenceMetrics / ConfusionMatrix, as GCPC's google.ClassificationMetrics artifact schema
# also lists them (google_cloud_pipeline_components/types/artifact_types.py)
_CLASSIFICATION_FIELDS = {"auPrc", "auRoc", "logLoss", "confidenceMetrics", "confusionMatrix"}
_CONFIDENCE_FIELDS = {
    "confidenceThreshold",
    "maxPredictions",
    "recall",
    "precision",
    "falsePositiveRate",
    "f1Score",
    "f1ScoreMicro",
    "f1ScoreMacro",
    "recallAt1",
    "precisionAt1",
    "falsePositiveRateAt1",
    "f1ScoreAt1",
    "truePositiveCount",
    "falsePositiveCount",
    "falseNegativeCount",
    "trueNegativeCount",
    "confusionMatrix",
}
CLASSIFICATION_SCHEMA = (
    "gs://google-cloud-aiplatform/schema/modelevaluation/classification_metrics_1.0.0.yaml"
)


def classification_metrics_problem(metrics: object) -> str | None:
    """Why ``metrics`` does not follow the classification metrics schema, or None."""

    def numbers(entry: dict, where: str) -> str | None:
        for key, value in entry.items():
            if key != "confusionMatrix" and (not isinstance(value, int | float) or isinstance(value, bool)):
                return f"{where}.{key} is not a number"
        return (
            confusion(entry["confusionMatrix"], f"{where}.confusionMatrix")
            if "confusionMatrix" in entry
            else None
        )

    def confusion(matrix: object, where: str) -> str | None:
        if not isinstance(matrix, dict) or set(matrix) - {"annotationSpecs", "rows"}:
            return f"{where} must be {{annotationSpecs, rows}}"
        specs, rows = matrix.get("annotationSpecs", []), matrix.get("rows", [])
        if any(not isinstance(spec, dict) or set(spec) - {"id", "displayName"} for spec in specs):
            return f"{where}.annotationSpecs items must be {{id, displayName}}"
        if len(rows) != len(specs) or any(len(row) != len(specs) for row in rows):
            return f"{where}.rows must be {len(specs)} x {len(specs)}, one row and column per annotation spec"
        if any(
            not isinstance(cell, int | float) or cell < 0 or cell != int(cell) for row in rows for cell in row
        ):
            return f"{where}.rows must hold counts"
        return None

    if not isinstance(metrics, dict):
        return "metrics must be an object"
    unknown = set(metrics) - _CLASSIFICATION_FIELDS
    if unknown:
        return f"metrics has fields the classification schema does not: {sorted(unknown)}"
    for index, entry in enumerate(metrics.get("confidenceMetrics", [])):
        if not isinstance(entry, dict) or set(entry) - _CONFIDENCE_FIELDS:
            return f"confidenceMetrics[{index}] has fields the schema does not: {sorted(set(entry) - _CONFIDENCE_FIELDS)}"
        problem = numbers(entry, f"confidenceMetrics[{index}]")
        if problem:
            return problem
    return numbers({k: v for k, v in metrics.items() if k != "confidenceMetrics"}, "metrics")


class Refused(Exception):
    """A request Vertex refuses for a rule it documents (not a parse error): the HTTP status and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def _split_problem(split: dict, deployed: set[str], new_id: str | None = None) -> str | None:
    """Why Vertex refuses ``split`` (an Endpoint's or a request's trafficSplit), or None."""
    allowed = deployed | ({new_id} if new_id else set())
    if set(split) - allowed:
        return f"trafficSplit names {sorted(set(split) - allowed)}, which are not deployed on the endpoint"
    if any(not isinstance(v, int) or v < 0 for v in split.values()):
        return "trafficSplit values must be non-negative integers"
    if split and sum(split.values()) != 100:
        return f"trafficSplit must add up to 100, got {sum(split.values())} ({split})"
    return None


def _gcs_client():  # noqa: ANN202 - google.cloud.storage.Client
    """A client of the GCS stand-in (STORAGE_EMULATOR_HOST), where Vertex's fake reads and writes objects."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage  # type: ignore[attr-defined]

    return storage.Client(  # type: ignore[attr-defined]
        project="test",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": os.environ["STORAGE_EMULATOR_HOST"]},
    )


def _now() -> str:
    return (
        datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


TPU_MACHINES = re.compile(r"^(cloud-tpu|ct\d+\w*-\w+-(\d+)t)$")


def tpu_job_hosts(body: dict) -> int:
    """Check a CustomJob's worker pools and capacity against Vertex's documented TPU rules; returns the number of TPU
    VMs (hosts) its one pool runs on (1 for a non-TPU job). Raises ValueError as Vertex would reject it.

    Rules (https://cloud.google.com/vertex-ai/docs/training/training-with-tpu-vm; google-cloud-aiplatform
    utils/worker_spec_utils.py "TPU jobs only allow 1 replica"): a TPU job has one worker pool with
    replica_count 1; cloud-tpu (v2/v3) takes acceleratorType TPU_V2|TPU_V3 x 8; the ct5lp/ct6e types need a
    tpuTopology whose chip count is a multiple of the VM's chips (the "-Nt" suffix): chips / N hosts, and
    a slice of more than one VM is made of 4-chip VMs.
    """
    from google.cloud import aiplatform_v1 as v1

    job = v1.CustomJob.from_json(json.dumps(body))  # enums may come as names or numbers
    pools = [p for p in job.job_spec.worker_pool_specs if p.machine_spec.machine_type]
    if not any(TPU_MACHINES.match(p.machine_spec.machine_type) for p in pools):
        return 1
    if len(pools) != 1 or pools[0].replica_count != 1:
        raise ValueError(
            f"TPU jobs allow one worker pool with replicaCount 1, got {len(pools)} pool(s) with replica counts "
            f"{[p.replica_count for p in pools]}"
        )
    spec = pools[0].machine_spec
    strategy = job.job_spec.scheduling.strategy
    if (
        strategy == v1.Scheduling.Strategy.FLEX_START
    ):  # "Schedule training jobs based on resource availability"
        raise ValueError(
            "the Dynamic Workload Scheduler (FLEX_START) for custom training requires GPUs, not TPUs"
        )
    if spec.machine_type == "cloud-tpu":
        accelerators = (v1.AcceleratorType.TPU_V2, v1.AcceleratorType.TPU_V3)
        if spec.accelerator_type not in accelerators or spec.accelerator_count != 8:
            raise ValueError("cloud-tpu needs acceleratorType TPU_V2 or TPU_V3 with acceleratorCount 8")
        return 1
    if not spec.tpu_topology:
        raise ValueError(f"machineType {spec.machine_type} needs machineSpec.tpuTopology")
    chips = math.prod(int(n) for n in spec.tpu_topology.split("x"))
    per_vm = int(TPU_MACHINES.match(spec.machine_type).group(2))  # type: ignore[union-attr]
    if chips % per_vm or (chips > per_vm and per_vm != 4):
        raise ValueError(f"tpuTopology {spec.tpu_topology} does not fit machineType {spec.machine_type}")
    if (
        strategy == v1.Scheduling.Strategy.SPOT and chips > per_vm
    ):  # "Use Spot VMs with training", Limitations
        raise ValueError("Using Spot VMs with TPU Pods isn't supported (a multi-host tpuTopology with SPOT)")
    return chips // per_vm


def tuning_job_problem(body: dict) -> str | None:
    """Why Vertex refuses a HyperparameterTuningJob (parsed already as the v1 proto), or None.

    Rules (aiplatform_v1 types/hyperparameter_tuning_job.py and types/study.py, the fields marked "Required",
    and the REST reference of projects.locations.hyperparameterTuningJobs): a display name, a study spec with
    at least one metric and one parameter, parameter IDs unique, ``max_trial_count`` and
    ``parallel_trial_count`` positive; a range's min not above its max, and ``UNIT_LOG_SCALE`` on a strictly
    positive range ("The entire feasible space must be strictly positive", StudySpec.ParameterSpec.ScaleType).
    The trial job spec is a CustomJobSpec: the TPU rules of ``tpu_job_hosts`` hold for it."""
    from google.cloud import aiplatform_v1 as v1

    job = v1.HyperparameterTuningJob.from_json(json.dumps(body))
    spec = job.study_spec
    if not job.display_name:
        return "displayName is required"
    if not spec.metrics or not spec.parameters:
        return "studySpec needs at least one metric and one parameter"
    ids = [p.parameter_id for p in spec.parameters]
    if len(set(ids)) != len(ids) or not all(ids):
        return f"studySpec.parameters need unique, non-empty parameterIds, got {ids}"
    if job.max_trial_count < 1 or job.parallel_trial_count < 1:
        return "maxTrialCount and parallelTrialCount must be positive"
    log_scale = v1.StudySpec.ParameterSpec.ScaleType.UNIT_LOG_SCALE
    for parameter in spec.parameters:
        kind = v1.StudySpec.ParameterSpec.pb(parameter).WhichOneof("parameter_value_spec")
        if kind in ("double_value_spec", "integer_value_spec"):
            bounds = getattr(parameter, kind)
            if bounds.min_value > bounds.max_value:
                return f"parameter {parameter.parameter_id}: minValue {bounds.min_value} > maxValue"
            if parameter.scale_type == log_scale and bounds.min_value <= 0:
                return f"parameter {parameter.parameter_id}: UNIT_LOG_SCALE needs minValue > 0"
        elif kind is None:
            return f"parameter {parameter.parameter_id} has no value spec"
    if not job.trial_job_spec.worker_pool_specs:
        return "trialJobSpec.workerPoolSpecs is required"
    tpu_job_hosts({"jobSpec": body.get("trialJobSpec", {})})  # raises ValueError as Vertex refuses
    return None


TENSORBOARD_NAME = re.compile(r"^projects/[^/]+/locations/(?P<location>[^/]+)/tensorboards/[^/]+$")


def tensorboard_problem(body: dict, location: str) -> str | None:
    """Why Vertex refuses a CustomJob's ``jobSpec.tensorboard`` in ``location``, or None (none named is fine).

    Rules: the instance's resource name (aiplatform_v1 CustomJobSpec.tensorboard,
    ``projects/{project}/locations/{location}/tensorboards/{tensorboard}``); the instance and the training job
    in one region ("Set up for Vertex AI TensorBoard"); a service account attached ("The Vertex AI TensorBoard
    integration with custom training requires attaching a service account"; aiplatform jobs.py:
    "service_account is required with provided tensorboard")."""
    spec = body.get("jobSpec", {})
    tensorboard = spec.get("tensorboard", "")
    if not tensorboard:
        return None
    match = TENSORBOARD_NAME.match(tensorboard)
    if match is None:
        return f"jobSpec.tensorboard {tensorboard!r} is not projects/P/locations/L/tensorboards/ID"
    if match["location"] != location:
        return f"TensorBoard {tensorboard} is not in the job's region {location}"
    if not spec.get("serviceAccount"):
        return "a CustomJob with a tensorboard needs jobSpec.serviceAccount"
    return None


def schedule_tick(body: dict, active_runs: int) -> str:
    """What Vertex's scheduler does with a Schedule at a cron tick while ``active_runs`` of its runs are in a
    non-terminal state: "start", "queue" or "skip" (aiplatform_v1 types/schedule.py: max_concurrent_run_count
    limits runs being started at once; max_concurrent_active_run_count limits runs in a non-terminal state,
    and allow_queueing queues a tick that the limit holds back instead of skipping it)."""
    from google.cloud import aiplatform_v1 as v1

    schedule = v1.Schedule.from_json(json.dumps(body), ignore_unknown_fields=False)
    limit = schedule.max_concurrent_active_run_count
    if limit and active_runs >= limit:
        return "queue" if schedule.allow_queueing else "skip"
    return "start"
