"""Preflight: the IAM, region, quota and parameter mistakes a first Vertex AI run hits, found in seconds.

Without it they surface late or never: a typo in ``--param`` only after credentials, on Vertex; a missing
``iam.serviceAccounts.actAs`` as a refused submit; a TPU type the region does not offer, or a TPU quota of 0,
as a train step that waits in JOB_STATE_QUEUED indefinitely (``Scheduling.timeout`` counts running time
only); Model Registry artifacts in a bucket outside the model's region as a failed upload after training.

Each check gives one ``Finding`` (ok, warn or fail, one line with the fix). This module is the entry point:
``preflight`` runs the parameter checks (parameters.py, no credentials) and then ``check_cloud``, every check
that asks Google, by service: iam.py, buckets.py, quota.py, through the clients of clients.py. A check that
cannot run is a warning saying how to check by hand, never a hang or a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tpustream.storage import io as storage

from ..template import (
    CompiledTemplate,
    RunParameters,
    compiled_slice,
    compiled_strategy,
    compiled_tuning,
    largest_cpu_step,
    load_template,
    template_parameters,
)
from ..tpu import TPU_TYPES
from .buckets import bucket, tensorboard_bucket
from .clients import ApiEndpoints, Google, load_credentials, short
from .findings import FAIL, MODEL_ARTIFACTS_DOC, WARN, Finding, check_tpu_region
from .iam import act_as, project_permissions, service_account_roles
from .parameters import check_parameters
from .quota import cpu_quota, tpu_quota

log = logging.getLogger(__name__)

__all__ = ["check_cloud", "preflight"]


def preflight(
    template: str,
    *,
    project: str,
    region: str,
    pipeline_root: str,
    registry: str | None,
    service_account: str | None,
    parameters: RunParameters,
    schedule: bool = False,
    api_endpoints: ApiEndpoints | None = None,
    timeout: float = 10.0,
) -> list[Finding]:
    """Check a run before it is submitted: parameters first (no credentials), then the cloud.

    Args:
        template: the compiled pipeline YAML (local or gs://; an https:// one is checked by Vertex only).
        project, region: where the run goes.
        pipeline_root, registry: the run's gs:// buckets (``registry`` defaults to ``parameters["registry"]``).
        service_account: the account the run acts as (None: the Compute Engine default, a warning).
        parameters: the run's parameter values, typed (see ``parse_parameters``).
        schedule: also check what creating a schedule needs.
        api_endpoints: the Google APIs to call (default: Google's, or TPUSTREAM_*_ENDPOINT).
        timeout: seconds per remote call.

    Returns:
        One Finding per check, in the order they ran.
    """
    spec = load_template(template)
    declared = template_parameters(spec) if spec is not None else None
    if spec is None and not template.startswith("https://"):
        return [Finding("template", FAIL, f"--template {template}: no such file")]
    default_tensorboard = declared["tensorboard"].default if declared and "tensorboard" in declared else ""
    return check_parameters(declared, parameters) + check_cloud(
        spec,
        tensorboard=str(parameters.get("tensorboard", default_tensorboard) or ""),
        project=project,
        region=region,
        pipeline_root=pipeline_root,
        registry=registry,
        service_account=service_account,
        parameters=parameters,
        schedule=schedule,
        api_endpoints=api_endpoints,
        timeout=timeout,
    )


def check_cloud(
    spec: CompiledTemplate | None,
    *,
    project: str,
    region: str,
    pipeline_root: str,
    registry: str | None,
    service_account: str | None,
    parameters: RunParameters,
    schedule: bool = False,
    api_endpoints: ApiEndpoints | None = None,
    timeout: float = 10.0,
    tensorboard: str = "",
) -> list[Finding]:
    """Every check but the parameters': TPU region, credentials, IAM, buckets (with ``tensorboard``, the
    run's Vertex AI TensorBoard instance, the log bucket's rule too), TPU quota, CPU quota."""
    endpoints = api_endpoints or ApiEndpoints.from_env()
    tpu = compiled_slice(spec)[0] if spec is not None else None
    findings = []
    if spec is None:
        findings.append(
            Finding("tpu-region", WARN, "the template is read by Vertex only: TPU type not checked")
        )
    else:
        findings.append(check_tpu_region(tpu, region))
    credentials, problem = load_credentials(endpoints)
    if problem is not None:
        return findings + [problem]  # every check below would fail the same way
    google = Google(endpoints, credentials, timeout)

    def guarded(check: str, run: Callable[[], Finding | list[Finding]]) -> list[Finding]:
        try:
            found = run()
        except Exception as exc:  # a check that cannot run is a warning with what went wrong, not a traceback
            log.debug("preflight check %s", check, exc_info=exc)
            return [Finding(check, WARN, f"could not check: {short(exc)}")]
        return found if isinstance(found, list) else [found]

    if service_account:
        findings += guarded("act-as", lambda: act_as(google, service_account))
    else:
        findings.append(
            Finding(
                "act-as",
                WARN,
                "no --service-account: the run acts as the Compute Engine default service account; "
                "give a dedicated one with roles/aiplatform.user and storage access",
            )
        )
    findings += guarded("project-permissions", lambda: project_permissions(google, project, schedule))
    given = registry or parameters.get("registry")
    registry = given if isinstance(given, str) else None
    buckets = sorted(
        {
            "gs://" + b.split("/")[2]
            for b in (pipeline_root, registry)
            if isinstance(b, str) and storage.is_gcs(b)
        }
    )
    if service_account:
        findings += guarded(
            "service-account-roles", lambda: service_account_roles(google, project, service_account, buckets)
        )
    findings += guarded(
        "bucket pipeline-root",
        lambda: bucket(
            "pipeline-root",
            pipeline_root,
            region,
            must_be_in_region=False,
            why="the TPU hosts stream shards from it across regions (slower, billed egress)",
        ),
    )
    if tensorboard and tpu is not None:
        findings += guarded("tensorboard-bucket", lambda: tensorboard_bucket(pipeline_root, region))
    if isinstance(registry, str) and storage.is_gcs(registry):
        vertex_model = parameters.get("vertex_model")
        findings += guarded(
            "bucket registry",
            lambda: bucket(
                "registry",
                registry,
                region,
                must_be_in_region=bool(vertex_model),
                why=f"--param vertex_model uploads promoted versions from it to the Model Registry in {region}, "
                f"which needs the artifacts in a bucket in that region ({MODEL_ARTIFACTS_DOC})"
                if vertex_model
                else "promoted models cross regions when served there; with --param vertex_model the Model "
                f"Registry refuses them ({MODEL_ARTIFACTS_DOC})",
            ),
        )
    if tpu is not None:
        spec_of = TPU_TYPES[tpu]
        needed = spec_of.accelerator_count or spec_of.chips  # v2/v3 quota counts cores, v5e/v6e chips
        spot = spec is not None and compiled_strategy(spec) == "SPOT"

        def quota() -> Finding:
            if spec is None or not compiled_tuning(spec):
                return tpu_quota(google, project, region, tpu, needed, spot)
            from tpustream.tune.space import read_space  # a tuning job: parallel_trials slices at once

            space_uri = parameters.get("tune_space")
            parallel = read_space(space_uri if isinstance(space_uri, str) else None).parallel_trials
            return tpu_quota(google, project, region, tpu, needed * parallel, spot, parallel)

        findings += guarded("tpu-quota", quota)
    vcpus = largest_cpu_step(spec) if spec is not None else 0.0
    if vcpus:
        findings += guarded("cpu-quota", lambda: cpu_quota(google, project, region, vcpus))
    return findings
