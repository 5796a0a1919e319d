"""Infra validation before promotion (``tpustream validate-serving MODEL``; the pipeline's validate step).

A candidate becomes champion only once it has answered in the serving container, the way TFX's
InfraValidator checks a model in its serving binary before pushing it
(https://www.tensorflow.org/tfx/guide/infra_validator): this module

1. starts aiplatform's model server (``python -m google.cloud.aiplatform.prediction.model_server``) on the
   candidate exactly as the serving image does: containers/serve/Dockerfile's ENTRYPOINT and
   ``tpustream.serve.contract.SERVING_ENV``, with the ``AIP_*`` variables Vertex AI sets for a custom container
   (https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements: ``AIP_HTTP_PORT``,
   ``AIP_HEALTH_ROUTE``, ``AIP_PREDICT_ROUTE``, ``AIP_STORAGE_URI``), and waits for its health route;
2. sends it the first ``samples`` val images of the model's dataset, in manifest order, as Vertex sends
   online requests (``{"instances": [{"b64": ...}]}``), and checks each answer against evaluation's own
   answer for the same image (``tpustream.train.evaluate.val_predictions``: the loader and model code path of
   ``tpustream evaluate``): the same top-1 class, the top-1 probability within ``PROBABILITY_TOLERANCE``
   (batches of different sizes may round differently on a CPU);
   It sends the first of them again in AutoML's format (``{"content": ...}``, ``maxPredictions``: the format
   ``tpustream.serve.automl`` adds and the upload declares), whose top-1 must also be evaluation's;
3. sends malformed requests, which must be answered 400 (never 500), briefly, without echoing the body, and
   checks that the server still answers its health route afterwards.

The report (``validation.json``) names the model's sha256; promotion checks it (``require_validated``), so a
validation of another artifact cannot let a candidate through. In the pipeline the step runs in the serving
image (``pipeline compile --serving-image``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from tpustream.errors import TpustreamError
from tpustream.storage import io as storage

if TYPE_CHECKING:
    from tpustream.train.evaluate import ValPrediction

__all__ = [
    "ModelServer",
    "ServingValidationError",
    "ValidationReport",
    "VALIDATION_FILE",
    "require_validated",
    "start_model_server",
    "validate_serving",
]

log = logging.getLogger(__name__)

VALIDATION_FILE = "validation.json"
VALIDATION_FORMAT = "tpustream.serving-validation/v1"
PROBABILITY_TOLERANCE = 1e-3
TIE = 1e-4  # a top-1 that evaluation itself decides by less than this may flip between batch sizes
REQUEST_IMAGES = 16  # images per request: well inside the server's per-request limits
# What a client on the internet may send; each must be a short 400 that does not echo it (issue: a 2 MB body
# came back as a 7 MB error page).
MALFORMED = {
    "not-json": (b"\xff\xfe\x00garbage" * 64, "application/json"),
    "not-an-object": (b"[1, 2, 3]", "application/json"),
    "no-instances": (b'{"instances": []}', "application/json"),
    "not-base64": (b'{"instances": [{"b64": "@@not base64@@"}]}', "application/json"),
    "not-an-image": (
        json.dumps({"instances": [{"b64": base64.b64encode(b"GIF89a" + b"\0" * 64).decode()}]}).encode(),
        "application/json",
    ),
    "automl-mixed-formats": (b'{"instances": [{"b64": "AAAA"}, {"content": "AAAA"}]}', "application/json"),
}
MAX_ERROR_BYTES = 2048


class ServingValidationError(TpustreamError, RuntimeError):
    """The candidate failed validation in the serving container (or could not be validated); the message says
    which check and what to do."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ModelServer:
    """A running model server: its URL, routes, process and log file."""

    url: str
    port: int
    health_route: str
    predict_route: str
    process: subprocess.Popen[bytes]
    log_path: str

    def post(
        self, body: bytes, content_type: str = "application/json", timeout: float = 120
    ) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url + self.predict_route, body, {"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return int(response.status), response.read()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read()

    def healthy(self, timeout: float = 5) -> bool:
        try:
            with urllib.request.urlopen(self.url + self.health_route, timeout=timeout) as response:
                return int(response.status) == 200
        except OSError:
            return False

    def log_tail(self, chars: int = 3000) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return ""


@contextlib.contextmanager
def start_model_server(
    model_uri: str, *, env: dict[str, str] | None = None, timeout: float = 180, log_path: str | None = None
) -> Iterator[ModelServer]:
    """The serving image's entrypoint on ``model_uri`` (a model directory, local or gs://), on a free loopback
    port; yields once its health route answers 200, stops it on exit."""
    from tpustream.serve.contract import HEALTH_ROUTE, PREDICT_ROUTE, SERVING_ENV

    port = _free_port()
    server_env = {**os.environ, **SERVING_ENV, **(env or {})}
    server_env.update(
        AIP_HTTP_PORT=str(port),
        AIP_HEALTH_ROUTE=HEALTH_ROUTE,
        AIP_PREDICT_ROUTE=PREDICT_ROUTE,
        AIP_STORAGE_URI=model_uri,
    )
    server_env.setdefault(
        "VERTEX_CPR_WEB_CONCURRENCY", "1"
    )  # one uvicorn worker process: one model in memory
    server_env.pop("PJRT_DEVICE", None)  # the serving image runs torch on the CPU
    if log_path is None:
        handle, log_path = tempfile.mkstemp(prefix="tpustream-model-server-", suffix=".log")
        os.close(handle)
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "google.cloud.aiplatform.prediction.model_server"],
            env=server_env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    server = ModelServer(f"http://127.0.0.1:{port}", port, HEALTH_ROUTE, PREDICT_ROUTE, process, log_path)
    try:
        deadline = time.monotonic() + timeout
        while not server.healthy(timeout=2):
            if process.poll() is not None:
                raise ServingValidationError(
                    f"the model server exited with {process.returncode} before answering its health route "
                    f"on {model_uri}: the serving container would crash-loop on Vertex. Its log "
                    f"({log_path}) ends:\n{server.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise ServingValidationError(
                    f"the model server did not answer {HEALTH_ROUTE} within {timeout:.0f} s on {model_uri}; "
                    f"its log ({log_path}) ends:\n{server.log_tail()}"
                )
            time.sleep(0.3)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _sha256(uri: str) -> str:
    try:
        return storage.sha256(uri)
    except storage.StorageError as exc:
        raise ServingValidationError(f"{uri}: {exc}: the model artifact is incomplete; re-export it") from exc


def _val_images(data_uri: str, limit: int) -> list[tuple[bytes, int]]:
    """(image bytes, label) of the first ``limit`` val samples, in manifest order (shards in order)."""
    from tpustream.dataset.manifest import load_manifest
    from tpustream.dataset.tario import iter_tar_samples
    from tpustream.image.codec import image_member

    val = load_manifest(data_uri).split("val")
    out: list[tuple[bytes, int]] = []
    for shard in val.shards if val is not None else []:
        uri = storage.join(data_uri, shard.path)
        with storage.open_read(uri) as stream:
            for _, fields in iter_tar_samples(stream, storage.size(uri)):
                ext = image_member(fields)
                if ext is None or "cls" not in fields:
                    continue
                out.append((fields[ext], int(fields["cls"])))
                if len(out) >= limit:
                    return out
    return out


@dataclass(frozen=True, kw_only=True)
class MalformedAnswer:
    """How the server answered one malformed request (``MALFORMED``'s ``case``): its HTTP ``status`` (400 is
    right) and the size of its answer (an error must not echo the request)."""

    case: str
    status: int
    response_bytes: int


@dataclass(frozen=True, kw_only=True)
class ValidationReport:
    """``validation.json``: whether ``model`` (its ``model_sha256``) ``passed`` in the serving container, on
    ``samples`` val images of ``data``: how many it answered as evaluation did (``agreed``; in AutoML's
    request format, ``automl_agreed``), the largest top-1 probability difference, request latencies (ms;
    None: none measured), its startup, its answers to the malformed requests, the ``failures`` (at most 20)
    and its log. ``to_json`` writes the keys and order of before it was a type."""

    model: str
    model_sha256: str
    data: str
    passed: bool
    samples: int
    agreed: int
    max_probability_diff: float
    latency_ms_p50: float | None
    latency_ms_max: float | None
    automl_agreed: int
    startup_s: float
    malformed: list[MalformedAnswer]
    failures: list[str]
    server_log: str | None

    def to_json(self) -> dict[str, Any]:
        return {"format": VALIDATION_FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, document: Any, where: str) -> ValidationReport:
        """A parsed validation.json; ServingValidationError naming ``where`` when it is not one."""
        if not isinstance(document, dict) or document.get("format") != VALIDATION_FORMAT:
            found = document.get("format") if isinstance(document, dict) else type(document).__name__
            raise ServingValidationError(f"{where} is not a serving validation report (format {found!r})")
        try:
            fields = {key: document[key] for key in cls.__dataclass_fields__}
            fields["malformed"] = [MalformedAnswer(**case) for case in fields["malformed"]]
            return cls(**fields)
        except (KeyError, TypeError) as exc:
            raise ServingValidationError(
                f"{where} is not a serving validation report ({type(exc).__name__}: {exc}): validate again"
            ) from exc


@dataclass(frozen=True, kw_only=True)
class _Answers:
    """``_check_answers``' tally of the b64-format requests."""

    agreed: int
    max_probability_diff: float
    latency_ms_p50: float | None
    latency_ms_max: float | None
    failures: list[str]


def _compare(expected: ValPrediction, served: dict[str, Any]) -> str | None:
    """Why a served answer (the server's JSON) differs from evaluation's for the same image, or None."""
    if "error" in served:  # the server failed this instance alone (server.py's per-instance error)
        return f"not answered: {served['error']}"
    want, got = expected.class_indices[0], served.get("class_indices", [None])[0]
    probabilities = expected.probabilities
    if want != got:
        margin = probabilities[0] - probabilities[1] if len(probabilities) > 1 else 1.0
        if margin >= TIE:
            return f"class {got} served, evaluation's top-1 is class {want} (p={probabilities[0]:.4f})"
        return None
    diff = abs(float(served["probabilities"][0]) - probabilities[0])
    if diff > PROBABILITY_TOLERANCE:
        return (
            f"top-1 probability {served['probabilities'][0]:.6f} served, evaluation's {probabilities[0]:.6f}"
        )
    return None


def _check_answers(
    server: ModelServer, images: list[tuple[bytes, int]], expected: list[ValPrediction]
) -> _Answers:
    failures: list[str] = []
    latencies: list[float] = []
    max_diff = 0.0
    agreed = 0
    for start in range(0, len(images), REQUEST_IMAGES):
        chunk = images[start : start + REQUEST_IMAGES]
        body = json.dumps({"instances": [{"b64": base64.b64encode(image).decode()} for image, _ in chunk]})
        began = time.perf_counter()
        status, raw = server.post(body.encode())
        latencies.append((time.perf_counter() - began) * 1000)
        if status != 200:
            failures.append(f"images {start}-{start + len(chunk) - 1}: HTTP {status} {raw[:200]!r}")
            continue
        predictions = json.loads(raw).get("predictions", [])
        if len(predictions) != len(chunk):
            failures.append(f"images {start}-{start + len(chunk) - 1}: {len(predictions)} predictions")
            continue
        for offset, served in enumerate(predictions):
            want = expected[start + offset]
            if want.label != chunk[offset][1]:
                raise ServingValidationError(
                    f"val sample {start + offset}: the shards and evaluation's loader disagree on its label "
                    "(the loader's order changed?): cannot compare answers"
                )
            why = _compare(want, served)
            if why:
                failures.append(f"val sample {start + offset}: {why}")
            else:
                agreed += 1
                if served.get("class_indices", [None])[0] == want.class_indices[0]:
                    max_diff = max(max_diff, abs(float(served["probabilities"][0]) - want.probabilities[0]))
    return _Answers(
        agreed=agreed,
        max_probability_diff=round(max_diff, 7),
        latency_ms_p50=round(statistics.median(latencies), 1) if latencies else None,
        latency_ms_max=round(max(latencies), 1) if latencies else None,
        failures=failures,
    )


def _check_automl(
    server: ModelServer, images: list[tuple[bytes, int]], expected: list[ValPrediction]
) -> tuple[int, list[str]]:
    """The first REQUEST_IMAGES val images in AutoML's request format: how many answered, in its shape, with
    evaluation's top-1, and what went wrong with the others."""
    chunk = images[:REQUEST_IMAGES]
    body = {
        "instances": [{"content": base64.b64encode(image).decode()} for image, _ in chunk],
        "parameters": {"maxPredictions": 2},
    }
    status, raw = server.post(json.dumps(body).encode())
    if status != 200:
        return 0, [f"AutoML-format request: HTTP {status} {raw[:200]!r}"]
    predictions = json.loads(raw).get("predictions", [])
    if len(predictions) != len(chunk):
        return 0, [f"AutoML-format request: {len(predictions)} predictions for {len(chunk)} images"]
    agreed, failures = 0, []
    for index, served in enumerate(predictions):
        if "error" not in served and not {"ids", "displayNames", "confidences"} <= set(served):
            failures.append(f"AutoML-format val sample {index}: not answered in AutoML's shape")
            continue
        if "error" not in served:  # the same answer in the b64 format's words, for _compare
            served = {
                "class_indices": [int(i) for i in served["ids"]],
                "probabilities": served["confidences"],
            }
        why = _compare(expected[index], served)
        if why:
            failures.append(f"AutoML-format val sample {index}: {why}")
        else:
            agreed += 1
    return agreed, failures


def _check_malformed(server: ModelServer) -> tuple[list[MalformedAnswer], list[str]]:
    results: list[MalformedAnswer] = []
    failures: list[str] = []
    for case, (body, content_type) in MALFORMED.items():
        status, raw = server.post(body, content_type)
        results.append(MalformedAnswer(case=case, status=status, response_bytes=len(raw)))
        if status != 400:
            failures.append(f"malformed request {case!r}: HTTP {status}, not 400: {raw[:200]!r}")
        elif len(raw) > MAX_ERROR_BYTES or (len(body) > 64 and body[:64] in raw):
            failures.append(f"malformed request {case!r}: the {len(raw)}-byte error echoes the request")
    if not server.healthy():
        failures.append("the server stopped answering its health route after the malformed requests")
    return results, failures


def validate_serving(
    model_uri: str,
    *,
    data: str | None = None,
    samples: int = 64,
    output: str | None = None,
    timeout: float = 180,
) -> ValidationReport:
    """Validate ``model_uri`` (a model directory, or a registry: its champion) in the serving container.

    ``data``: the dataset whose val images are sent (default: the one model.json names). Returns the report and
    writes it to ``output/validation.json`` when given (last, in one write); raises ServingValidationError
    when a check failed (after writing the report)."""
    from tpustream.serve.classifier import resolve_model_uri
    from tpustream.train.evaluate import EvaluationError, load_model_card, val_predictions

    if samples < 1:
        raise ServingValidationError(f"--samples {samples}: send at least one val image")
    model = resolve_model_uri(model_uri)
    try:
        card = load_model_card(model)
    except EvaluationError as exc:
        raise ServingValidationError(str(exc)) from exc
    data_uri = data or (card.dataset.uri if card.dataset is not None else "")
    if not data_uri:
        raise ServingValidationError(
            f"{model}/model.json names no dataset: give --data (a dataset directory)"
        )
    images = _val_images(data_uri, samples)
    if not images:
        raise ServingValidationError(
            f"--data {data_uri}: no val image to send: give a dataset with a val split"
        )
    try:
        expected, sha256 = val_predictions(model, data_uri, limit=len(images))
    except EvaluationError as exc:
        raise ServingValidationError(str(exc)) from exc
    started = time.perf_counter()
    with start_model_server(model, timeout=timeout) as server:
        startup_s = time.perf_counter() - started
        answers = _check_answers(server, images, expected)
        automl_agreed, automl_failures = _check_automl(server, images, expected)
        malformed, malformed_failures = _check_malformed(server)
        log_path = server.log_path
    failures = answers.failures + automl_failures + malformed_failures
    report = ValidationReport(
        model=model,
        model_sha256=sha256,
        data=data_uri,
        passed=not failures,
        samples=len(images),
        agreed=answers.agreed,
        max_probability_diff=answers.max_probability_diff,
        latency_ms_p50=answers.latency_ms_p50,
        latency_ms_max=answers.latency_ms_max,
        automl_agreed=automl_agreed,
        startup_s=round(startup_s, 1),
        malformed=malformed,
        failures=failures[:20],
        server_log=log_path,
    )
    if output:
        storage.write_bytes(
            storage.join(output.rstrip("/"), VALIDATION_FILE), json.dumps(report.to_json(), indent=2).encode()
        )
    if failures:
        raise ServingValidationError(
            f"{model} failed validation in the serving container ({len(failures)} problem(s); not promotable): "
            + "; ".join(failures[:3])
            + f". Server log: {log_path}"
        )
    log.info(
        "%s answers in the serving container: %d/%d val images as evaluation did, %d malformed requests "
        "refused with 400 (startup %.1f s)",
        model,
        answers.agreed,
        len(images),
        len(malformed),
        startup_s,
    )
    return report


def require_validated(validation_uri: str, candidate_uri: str) -> ValidationReport:
    """The validation report at ``validation_uri`` (a directory holding validation.json, or the file), checked
    to be a pass for the candidate's model.pt; raises ServingValidationError otherwise (promotion stops)."""
    uri = validation_uri.rstrip("/")
    if not uri.endswith(".json"):
        uri = storage.join(uri, VALIDATION_FILE)
    try:
        document = json.loads(storage.read_bytes(uri))
    except storage.NotFound as exc:
        raise ServingValidationError(
            f"--validation {validation_uri}: no {VALIDATION_FILE}: run `tpustream validate-serving` on the "
            "candidate first"
        ) from exc
    except ValueError as exc:
        raise ServingValidationError(f"{uri} is not a validation report ({exc})") from exc
    report = ValidationReport.from_json(document, uri)
    sha256 = _sha256(storage.join(candidate_uri.rstrip("/"), "model.pt"))
    if report.model_sha256 != sha256:
        raise ServingValidationError(
            f"{uri} validated model.pt {report.model_sha256[:12]}, the candidate's is {sha256[:12]}: "
            "validate this candidate"
        )
    if not report.passed:
        raise ServingValidationError(
            f"{uri}: the candidate failed validation in the serving container: {'; '.join(report.failures[:3])}"
        )
    return report
