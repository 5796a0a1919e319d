"""Run a GCPC launcher task against the recording Vertex endpoint on loopback: the train task's (GCPC's real
CustomJob launcher behind pipelines/tpu.py's FRESH_JOB_LAUNCHER) or the tune switch's (GCPC's real
HyperparameterTuningJob launcher behind pipelines/steps.py's TUNING_JOB_LAUNCHER; both poll through
job_remote_runner).

Vertex runs ``python3 -u -c SCRIPT ARGS`` (the compiled command) in the GCPC image with the task's resolved
arguments. This shim runs that same script with the same arguments, changing only what cannot work here
(said in each line): the API host and credentials
(``{location}-aiplatform.googleapis.com`` over gRPC with application default credentials -> the
recording endpoint over REST, anonymously) and the 20 s polling interval.
"""

import functools
import os
import sys

from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform_v1
from google_cloud_pipeline_components.container.v1.gcp_launcher import job_remote_runner


def _client(*args: object, **kwargs: object) -> aiplatform_v1.JobServiceClient:
    return aiplatform_v1.JobServiceClient(
        credentials=AnonymousCredentials(),
        transport="rest",
        client_options={"api_endpoint": os.environ["VERTEX_EMULATOR_URL"]},  # Vertex's API host: unreachable
    )


if __name__ == "__main__":
    job_remote_runner.aiplatform.gapic.JobServiceClient = functools.wraps(aiplatform_v1.JobServiceClient)(
        _client
    )
    job_remote_runner._POLLING_INTERVAL_IN_SECONDS = 0.5  # 20 s on Vertex: only the wait is shorter
    script, args = sys.argv[1], sys.argv[2:]
    sys.argv = ["-c", *args]  # as `python3 -c SCRIPT ARGS` sets it
    exec(compile(script, "<the task's command>", "exec"), {"__name__": "__main__"})
