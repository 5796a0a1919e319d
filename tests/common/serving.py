"""The real aiplatform model server (CPR) in a subprocess on a free loopback port, returned once healthy."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(env: dict[str, str], port: int, log_path) -> subprocess.Popen:
    log = open(log_path, "wb")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(
        [sys.executable, "-m", "google.cloud.aiplatform.prediction.model_server"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"model server exited {process.returncode}:\n{log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{env['AIP_HEALTH_ROUTE']}", timeout=2) as r:
                if r.status == 200:
                    return process
        except OSError:
            time.sleep(0.3)
    process.kill()
    raise AssertionError(f"model server not healthy in 90 s:\n{log_path.read_text()}")


AUTOML_INSTANCE = (
    "google.cloud.aiplatform.v1.schema.predict.instance",
    "ImageClassificationPredictionInstance",
)
AUTOML_PARAMS = ("google.cloud.aiplatform.v1.schema.predict.params", "ImageClassificationPredictionParams")
AUTOML_PREDICTION = ("google.cloud.aiplatform.v1.schema.predict.prediction", "ClassificationPredictionResult")


def parse_schema(body, schema: tuple[str, str]):
    """``body`` parsed into aiplatform's proto message ``schema`` (module, name) as Vertex parses JSON: an
    unknown field or a wrong type raises ParseError."""
    import importlib

    from google.protobuf import json_format

    module, name = schema
    message = getattr(importlib.import_module(module), name)
    return json_format.ParseDict(body, message.pb()(), ignore_unknown_fields=False)
