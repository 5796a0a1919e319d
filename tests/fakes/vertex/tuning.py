"""Hyperparameter tuning jobs (Vertex AI Vizier) in the Vertex fake: CreateHyperparameterTuningJob and
GetHyperparameterTuningJob, the job's trials run one after another through ``trial_runner``.

What the service does with a job, as aiplatform_v1 documents it (types/hyperparameter_tuning_job.py,
types/study.py, types/custom_job.py) and the Vertex docs describe it ("Hyperparameter tuning overview",
"Create a hyperparameter tuning job"):

- each trial gets parameter values from the study spec and runs ``trial_job_spec`` as a CustomJob of its own
  (``Trial.custom_job``) whose base output directory is ``<base_output_directory>/<trial id>``, so its
  containers see ``AIP_MODEL_DIR=<base>/<trial id>/model/`` (CustomJobSpec.base_output_directory), and whose
  containers get the trial's values appended to their args as ``--<parameter_id>=<value>`` ("Vertex AI sets
  command-line arguments for each hyperparameter", Prepare training code: command-line arguments);
- the trial reports its metric the cloudml-hypertune way: JSON lines in the file ``CLOUD_ML_HP_METRIC_FILE``
  names (cloudml-hypertune's ``HyperTune.report_hyperparameter_tuning_metric``; tpustream/tune/hypertune.py
  writes the same lines), each ``{"<metric id>": "<value>", "global_step": "<step>", ...}``; each becomes a
  ``Measurement`` (``step_count``, ``metrics``) and ``final_measurement`` is the best or the last of them as
  ``StudySpec.measurement_selection_type`` says (unspecified: the last);
- a trial that succeeds with a measurement is SUCCEEDED; one whose job failed, or that reported nothing, is
  INFEASIBLE with ``infeasible_reason`` ("set to INFEASIBLE when it's done but missing the final_measurement").

What is not Vizier: the values are drawn at random from each parameter's range (its scale respected), seeded by
the job's name, as ``RANDOM_SEARCH`` draws them: Vizier's default Bayesian optimisation is a service, not a
library here. Trials run one at a time even when ``parallel_trial_count`` allows more (the machine running
the tests has a few cores), up to ``max_trial_count``; no trial is stopped early (whether the decay curve
stops one is Vizier's call); the job fails when every trial failed or ``max_failed_trial_count`` (> 0) did.
``CLOUD_ML_HP_METRIC_FILE`` is set to a file of the fake's own (on Vertex the container's default path
``/tmp/hypertune/output.metrics`` is read; here trials share one machine).
"""

from __future__ import annotations

import json
import math
import random
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fakes.vertex.rules import _now, tpu_job_hosts, validate_body


def suggest(study_spec: Any, rng: random.Random) -> list[dict[str, Any]]:
    """One trial's ``Trial.Parameter`` list (as JSON) for the v1 ``StudySpec`` ``study_spec``: a value drawn
    from each parameter's range, uniformly on its scale (UNIT_LOG_SCALE: uniform in log space)."""
    from google.cloud import aiplatform_v1 as v1

    log_scale = v1.StudySpec.ParameterSpec.ScaleType.UNIT_LOG_SCALE
    values = []
    for parameter in study_spec.parameters:
        kind = v1.StudySpec.ParameterSpec.pb(parameter).WhichOneof("parameter_value_spec")
        spec = getattr(parameter, kind)
        value: float | str
        if kind == "double_value_spec":
            low, high = spec.min_value, spec.max_value
            if parameter.scale_type == log_scale:
                value = math.exp(rng.uniform(math.log(low), math.log(high)))
            else:
                value = rng.uniform(low, high)
        elif kind == "integer_value_spec":
            value = float(rng.randint(int(spec.min_value), int(spec.max_value)))
        else:  # discrete (numbers) or categorical (strings)
            value = rng.choice(list(spec.values))
        values.append({"parameterId": parameter.parameter_id, "value": value})
    return values


def trial_flags(parameters: list[dict[str, Any]], study_spec: Any) -> list[str]:
    """The args Vertex appends for a trial: ``--<parameter_id>=<value>``, an INTEGER parameter's value as a
    whole number, a DOUBLE or DISCRETE one as a decimal, a CATEGORICAL one as its text."""
    from google.cloud import aiplatform_v1 as v1

    kinds = {
        p.parameter_id: v1.StudySpec.ParameterSpec.pb(p).WhichOneof("parameter_value_spec")
        for p in study_spec.parameters
    }
    flags = []
    for entry in parameters:
        value = entry["value"]
        if kinds[entry["parameterId"]] == "integer_value_spec":
            text = str(int(value))
        elif isinstance(value, str):
            text = value
        else:
            text = repr(float(value))
        flags.append(f"--{entry['parameterId']}={text}")
    return flags


def read_measurements(path: Path, metric_id: str) -> list[dict[str, Any]]:
    """The ``Measurement``s (as JSON) of a cloudml-hypertune metric file: one per line that reports
    ``metric_id``, ``global_step`` its step count; none when the trial wrote no file."""
    if not path.exists():
        return []
    measurements = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        if metric_id in entry:
            measurements.append(
                {
                    "stepCount": str(int(entry.get("global_step", 0))),  # int64: a string in JSON
                    "metrics": [{"metricId": metric_id, "value": float(entry[metric_id])}],
                }
            )
    return measurements


def final_measurement(measurements: list[dict[str, Any]], study_spec: Any) -> dict[str, Any] | None:
    """The trial's final measurement: the best of ``measurements`` for the metric's goal under
    BEST_MEASUREMENT, else the last (LAST_MEASUREMENT; unspecified "will be treated as LAST_MEASUREMENT")."""
    from google.cloud import aiplatform_v1 as v1

    if not measurements:
        return None
    selection = v1.StudySpec.MeasurementSelectionType.BEST_MEASUREMENT
    if study_spec.measurement_selection_type != selection:
        return measurements[-1]
    sign = 1.0 if study_spec.metrics[0].goal == v1.StudySpec.MetricSpec.GoalType.MAXIMIZE else -1.0
    return max(measurements, key=lambda m: sign * m["metrics"][0]["value"])


class TuningJobsMixin:
    """VertexRecorder's hyperparameter tuning jobs (its state lives there: ``tuning_jobs``, ``trial_runner``,
    ``jobs`` for the trials' CustomJobs, ``tuning_lock``)."""

    tuning_jobs: dict[str, dict]
    tuning_lock: threading.Lock
    jobs: dict[str, dict]
    trial_runner: Callable[[dict, int, dict[str, str]], tuple[bool, str]] | None

    def _create_tuning_job(self, parent: str, body: dict) -> dict:
        """JobService.CreateHyperparameterTuningJob: the body was checked (``check``); the job starts."""
        name = f"{parent}/hyperparameterTuningJobs/{5000 + len(self.tuning_jobs)}"
        with self.tuning_lock:
            self.tuning_jobs[name] = {
                "body": body,
                "state": "JOB_STATE_PENDING",
                "trials": [],
                "error": None,
                "createTime": _now(),
                "times": {},
                "metric_dir": Path(tempfile.mkdtemp(prefix="vertex-hptune-")),
            }
        threading.Thread(target=self._run_tuning_job, args=(name,), daemon=True).start()
        return self._tuning_job_json(name)

    def _tuning_job_json(self, name: str) -> dict:
        """The job as GetHyperparameterTuningJob answers it: the request's fields and the service's."""
        from google.cloud import aiplatform_v1 as v1

        with self.tuning_lock:
            job = self.tuning_jobs[name]
            reply = {
                **job["body"],
                "name": name,
                "state": job["state"],
                "createTime": job["createTime"],
                **job["times"],
                "trials": json.loads(json.dumps(job["trials"])),  # a copy: the runner appends
            }
            if job["error"]:
                reply["error"] = job["error"]
        validate_body(v1.HyperparameterTuningJob, reply)  # the fake answers only fields Vertex has
        return reply

    def _update_tuning_job(self, name: str, **fields: Any) -> None:
        with self.tuning_lock:
            self.tuning_jobs[name].update(fields)

    def _run_tuning_job(self, name: str) -> None:
        from google.cloud import aiplatform_v1 as v1

        job = self.tuning_jobs[name]
        body = job["body"]
        parsed = v1.HyperparameterTuningJob.from_json(json.dumps(body))  # enums as names or numbers
        study = parsed.study_spec
        metric_id = study.metrics[0].metric_id
        rng = random.Random(name)
        base = body["trialJobSpec"].get("baseOutputDirectory", {}).get("outputUriPrefix", "").rstrip("/")
        self._update_tuning_job(name, state="JOB_STATE_RUNNING", times={"startTime": _now()})
        failed = succeeded = 0
        for number in range(1, parsed.max_trial_count + 1):
            trial_id = str(number)
            parameters = suggest(study, rng)
            flags = trial_flags(parameters, study)
            pools = [
                {**pool, "containerSpec": {**pool["containerSpec"],
                                           "args": [*pool["containerSpec"].get("args", []), *flags]}}
                for pool in body["trialJobSpec"]["workerPoolSpecs"]
            ]  # fmt: skip
            spec = {**body["trialJobSpec"], "workerPoolSpecs": pools}
            if base:
                spec["baseOutputDirectory"] = {"outputUriPrefix": f"{base}/{trial_id}"}
            trial_job = {
                "displayName": f"{body.get('displayName', 'tuning')}-trial-{trial_id}",
                "jobSpec": spec,
            }
            custom_job = (
                f"{name.rsplit('/hyperparameterTuningJobs/', 1)[0]}/customJobs/{1000 + len(self.jobs)}"
            )
            hosts = tpu_job_hosts(trial_job)
            self.jobs[custom_job] = {
                "body": trial_job,
                "state": "JOB_STATE_RUNNING",
                "hosts": hosts,
                "error": None,
            }
            trial: dict[str, Any] = {
                "id": trial_id, "state": "ACTIVE", "parameters": parameters, "startTime": _now(),
                "customJob": custom_job,
            }  # fmt: skip
            with self.tuning_lock:
                job["trials"].append(trial)
            metric_file = job["metric_dir"] / f"trial-{trial_id}.metrics"
            env = {"CLOUD_ML_TRIAL_ID": trial_id, "CLOUD_ML_HP_METRIC_FILE": str(metric_file)}
            if self.trial_runner is None:
                ok, message = False, "no trial runner: the fake accepts the job but runs no trial"
            else:
                try:
                    ok, message = self.trial_runner(trial_job, hosts, env)
                except Exception as exc:  # the emulation itself broke: the trial fails with why
                    ok, message = False, f"trial runner: {exc!r}"
            self.jobs[custom_job].update(
                state="JOB_STATE_SUCCEEDED" if ok else "JOB_STATE_FAILED",
                error=None if ok else {"code": 13, "message": message},
            )
            measurements = read_measurements(metric_file, metric_id)
            final = final_measurement(measurements, study)
            with self.tuning_lock:
                trial["endTime"] = _now()
                if measurements:
                    trial["measurements"] = measurements
                if ok and final is not None:
                    trial.update(state="SUCCEEDED", finalMeasurement=final)
                    succeeded += 1
                else:
                    reason = message if not ok else f"the trial reported no {metric_id} measurement"
                    trial.update(state="INFEASIBLE", infeasibleReason=reason)
                    failed += 1
            limit = parsed.max_failed_trial_count
            if limit and failed >= limit:
                break
        error = None
        if not succeeded or (parsed.max_failed_trial_count and failed >= parsed.max_failed_trial_count):
            error = {"code": 9, "message": f"{failed} trial(s) failed; see each trial's infeasibleReason"}
        self._update_tuning_job(
            name,
            state="JOB_STATE_FAILED" if error else "JOB_STATE_SUCCEEDED",
            error=error,
            times={**job["times"], "endTime": _now()},
        )
        shutil.rmtree(job["metric_dir"], ignore_errors=True)
