"""Serving a tpustream model: the Vertex AI Custom Prediction Routine (CPR) handler and predictor that run the
classifier (``tpustream.serve.classifier``: model.pt + model.json -> top-k per image) on each request, hardened
against hostile requests.

The model server is google-cloud-aiplatform's own (``google.cloud.aiplatform.prediction.model_server``:
FastAPI + uvicorn; its ``CprModelServer`` reads ``AIP_HTTP_PORT``, ``AIP_HEALTH_ROUTE``,
``AIP_PREDICT_ROUTE`` and hands ``AIP_STORAGE_URI`` to the handler, which hands it to the predictor's
``load``). It builds the handler and predictor named by ``HANDLER_*`` / ``PREDICTOR_*`` (``SERVING_ENV``,
where ``LocalModel.build_cpr_model`` puts them: google/cloud/aiplatform/prediction/local_model.py). The
handler is ours (``ClassifierHandler``), not the SDK's ``PredictionHandler``, whose ``DefaultSerializer``
(prediction/serializer.py) catches only ``JSONDecodeError`` and echoes the body back, and which runs the
predictor on the event loop (prediction/handler.py), while the server turns any other exception into a 500
carrying its arguments (prediction/model_server.py).
Docs: https://cloud.google.com/vertex-ai/docs/predictions/custom-prediction-routines; the container
contract (health checks, the predict route): https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements;
request size: 1.5 MB on shared public endpoints, 10 MB on dedicated ones:
https://cloud.google.com/vertex-ai/docs/predictions/using-dedicated-endpoints.

Request (Vertex's binary-data convention:
https://cloud.google.com/vertex-ai/docs/predictions/get-online-predictions):
``{"instances": [{"b64": "<base64 image>"}, ...], "parameters": {"top_k": 3}}``, ``Content-Type:
application/json``. Response: ``{"predictions": [{"classes": [...], "class_indices": [...],
"probabilities": [...]}, ...]}``, one per instance in order; a bad instance (not base64, not an image, over
its own byte or pixel budget, undecodable) fails alone: its slot is ``{"error": "instance 3: <why>"}`` and the
others are answered (status 200). Errors are ``{"detail": "<one short line>"}`` that never quote the request
(no byte of the body, no value of it: they say what kind of thing was wrong, and name our own limits; an
unknown parameter's name only when it is a short identifier): 400 for a malformed body (not UTF-8, not JSON,
nested too deeply, integers of more than 30 digits, NaN/Infinity, not an object), a bad request (no
instances, too many, over a request budget, a ``top_k`` that is not an integer from 1 to the model's class
count, a ``parameters`` field other than ``top_k``: a misspelt one is refused, not ignored) or a request whose every instance is bad (the
first one's message), 413 for a body over ``TPUSTREAM_MAX_BODY_BYTES``, 503 with ``Retry-After: 1`` when
the request does not fit the process's in-flight budgets (``admission``), and 500 "internal error, see the server
log" for anything else (the traceback is logged, never sent). ``parameters.top_k`` over the class count is
refused, where ``TPUSTREAM_TOP_K`` (the server's default) is capped at the class count.

AutoML's format too (``tpustream.serve.automl``, Vertex's AutoML image classification schemata): a request
whose instances are ``{"content": "<base64 image>"}`` or ``{"content": "gs://BUCKET/OBJECT"}`` (``mimeType``
optional; the object read with the serving container's credentials, within the image and request budgets,
a missing or unreadable one failing its instance alone) takes ``parameters``
``{"confidenceThreshold": 0.0, "maxPredictions": 10}`` (the schema's defaults; maxPredictions is capped at the
class count) and is answered ``{"predictions": [{"ids": ["3", ...], "displayNames": [...], "confidences":
[...]}, ...]}`` (ids: class indices, as strings). The instances' key chooses the format per request; mixing
``b64`` and ``content`` instances, or one format's parameters with the other's, is a 400. The same limits,
budgets and admission apply, and a bad instance fails alone in its slot (``{"error": ...}``) as above.

Requests are decoded and classified on a thread pool, off uvicorn's event loop, so the health route answers
while a request is being worked on. Budgets are checked from base64 lengths and image headers before any
pixel is decoded, and images are decoded one at a time, each released once its crop is in the uint8 batch
(small images the batched resample takes together, at most 2 x S^2 px each, are kept until the end).

The pieces: ``classifier`` (model artifact -> top-k), ``request`` (the body parsed and checked, nothing
decoded), ``admission`` (the in-flight budgets), ``settings`` (every ``TPUSTREAM_*`` variable, with the memory
they bound), ``automl`` (AutoML's format); this module is the CPR handler and predictor the serving image
names (``SERVING_ENV`` in ``contract``).

``Child process [PID] died`` at start (more than one worker): uvicorn's supervisor (uvicorn/supervisors/
multiprocess.py) pings every worker each 0.5 s and kills one that does not answer within 5 s
(``timeout_worker_healthcheck``, left at its default by the SDK's ``uvicorn.run``); a spawned worker answers only
after re-importing the SDK's model_server module, which took ~4.7 s here on a busy machine, so workers started
together on few cores can miss it and are replaced, before any code of ours runs. See README (Serving).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

from tpustream.serve.automl import (
    AUTOML_KEY,
    B64_KEY,
    AutoMLPrediction,
    BadRequest,
    automl_prediction,
    field_names,
    json_type,
    parse_automl_parameters,
    refuse_automl_parameters,
    request_format,
)
from tpustream.serve.classifier import BadImage, BadModel, Classifier, TopK
from tpustream.serve.request import (
    OWN_PARAMETERS,
    Batch,
    CheckedRequest,
    InstanceError,
    Prediction,
    PredictResponse,
    decode_instance,
    http_error,
    parse_request,
)
from tpustream.serve.settings import Limits, ServerConfig

if TYPE_CHECKING:
    from fastapi import Request, Response

__all__ = ["ClassifierHandler", "ClassifierPredictor", "INTERNAL_ERROR"]

log = logging.getLogger(__name__)

INTERNAL_ERROR = "internal error, see the server log"

try:  # the prediction extra (fastapi, uvicorn, docker) is a dependency; guarded so `--help` stays light
    from google.cloud.aiplatform.prediction.handler import PredictionHandler as _PredictionHandler
    from google.cloud.aiplatform.prediction.predictor import Predictor as _Predictor
except ImportError:  # pragma: no cover - reported by the model server itself
    _Predictor = object  # type: ignore[misc,assignment]
    _PredictionHandler = object  # type: ignore[misc,assignment]


class ClassifierPredictor(_Predictor):
    """The CPR ``Predictor``: ``load`` once per server process, then preprocess -> predict -> postprocess
    per request (on ``ClassifierHandler``'s worker thread; an ``HTTPException`` raised here reaches the
    client as is, anything else becomes a 500 without details)."""

    def load(self, artifacts_uri: str, **kwargs: Any) -> None:
        if not artifacts_uri:
            raise BadModel(
                "AIP_STORAGE_URI is not set: Vertex sets it from the model's artifact_uri; locally, point it "
                "at a model directory or a registry"
            )
        self.limits = Limits.from_env()
        self.classifier = Classifier(artifacts_uri, limits=self.limits)
        log.info(
            "serving %s (%d classes, %d px, sha256 %s; %s)",
            self.classifier.uri,
            len(self.classifier.classes),
            self.classifier.input_size,
            self.classifier.model_sha256[:12],
            self.limits,
        )

    def check(self, prediction_input: Any) -> CheckedRequest:
        """The request's shape, ``parameters.top_k`` and every instance's image bytes and pixel count, read
        from base64 lengths and image headers, no pixel decoded: what the request costs. A bad instance is
        recorded for its slot of the answer; a bad request (or one whose every instance is bad) is a 400."""
        if not isinstance(prediction_input, dict) or not isinstance(prediction_input.get("instances"), list):
            raise http_error(
                400,
                'the request body must be {"instances": [{"b64": "..."}, ...]} (or AutoML\'s [{"content": ...}])',
            )
        instances = prediction_input["instances"]
        if not instances:
            raise http_error(400, "no instances: send at least one image")
        if len(instances) > self.limits.max_instances:
            raise http_error(
                400,
                f"{len(instances)} instances exceed the limit of {self.limits.max_instances} per request "
                "(TPUSTREAM_MAX_INSTANCES): split the request",
            )
        parameters = prediction_input.get("parameters")
        try:
            automl = request_format(instances) == "automl"
            if automl:
                top_k, automl_parameters = None, parse_automl_parameters(parameters)
            else:
                refuse_automl_parameters(parameters)
                top_k, automl_parameters = self._top_k(parameters), None
            images, failed, image_bytes, pixels, fetched = self._images(
                instances, AUTOML_KEY if automl else B64_KEY
            )
        except (BadImage, BadRequest) as exc:
            raise http_error(400, str(exc)) from exc
        checked = CheckedRequest(
            count=len(instances),
            images=images,
            failed=failed,
            top_k=top_k,
            automl=automl_parameters,
            image_bytes=image_bytes,
            pixels=pixels,
            fetched_bytes=fetched,
        )
        checked.raise_if_all_failed()
        return checked

    def _top_k(self, parameters: Any) -> int | None:
        """``parameters.top_k`` of a ``{"b64"}`` request; a field it does not know is refused, not ignored (a
        misspelt ``topk`` would otherwise answer with the default top-k)."""
        if parameters is None:
            return None
        if not isinstance(parameters, dict):
            raise http_error(
                400, f"parameters must be a JSON object {{top_k}}, got a JSON {json_type(parameters)}"
            )
        unknown = [key for key in parameters if key not in OWN_PARAMETERS]
        if unknown:
            raise http_error(
                400,
                f"parameters {field_names(unknown)}: not a parameter of this server's format; "
                'send only top_k with {"b64": ...} instances',
            )
        top_k = parameters.get("top_k")
        if isinstance(top_k, float) and top_k.is_integer() and 1 <= top_k <= 1_000_000:
            # a batch prediction job's model_parameters is a google.protobuf.Value: its numbers are doubles,
            # so {"top_k": 3} arrives as 3.0 (aiplatform_v1 BatchPredictionJob.model_parameters)
            top_k = int(top_k)
        classes = len(self.classifier.classes)
        if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
            kind = json_type(top_k)
            raise http_error(
                400,
                f"parameters.top_k must be a positive integer (at most the model's {classes} classes), got "
                + ("a number that is not one" if kind == "number" else f"a JSON {kind}"),
            )
        if top_k is not None and top_k > classes:  # refused, not capped: the client asked for what isn't
            raise http_error(
                400, f"parameters.top_k exceeds the model's {classes} classes: ask for at most {classes}"
            )
        return top_k

    def _images(
        self, instances: list[Any], key: str = B64_KEY
    ) -> tuple[list[tuple[int, bytes]], dict[int, str], int, int, int]:
        """The (index, image bytes) of every instance that passes its own checks (base64 or its gs:// object,
        size, format, header, per-image pixels), the messages of those that do not, the good ones' total bytes
        and pixels, checked against the request budgets (a request over one is refused before any decoding),
        and the bytes read from Cloud Storage."""
        limits = self.limits
        images: list[tuple[int, bytes]] = []
        failed: dict[int, str] = {}
        total_bytes = total_pixels = fetched = 0
        for index, instance in enumerate(instances):
            try:
                data = decode_instance(instance, index, limits, key)
                pixels = self.classifier.measure(data, f"instance {index}")
            except BadImage as exc:
                failed[index] = str(exc)
                continue
            total_bytes += len(data)
            if isinstance(instance, dict) and str(instance.get(key, "")).startswith("gs://"):
                fetched += len(data)
            if total_bytes > limits.max_request_bytes:
                raise BadImage(
                    f"instances 0-{index}: {total_bytes} image bytes exceed the request budget of "
                    f"{limits.max_request_bytes} (TPUSTREAM_MAX_REQUEST_BYTES): split the request"
                )
            total_pixels += pixels
            if total_pixels > limits.max_request_pixels:
                raise BadImage(
                    f"instances 0-{index}: {total_pixels / 1e6:.1f} MP exceed the request budget of "
                    f"{limits.max_request_pixels / 1e6:.1f} MP (TPUSTREAM_MAX_REQUEST_PIXELS), checked "
                    "from the image headers: split the request or send smaller images"
                )
            images.append((index, data))
        return images, failed, total_bytes, total_pixels, fetched

    def preprocess(self, prediction_input: Any) -> Batch:
        """The checked request's (``check``) images decoded into one uint8 batch; an image that fails to
        decode fails its own instance only."""
        checked = (
            prediction_input if isinstance(prediction_input, CheckedRequest) else self.check(prediction_input)
        )
        failed = dict(checked.failed)
        undecodable: dict[int, str] = {}
        pixels = self.classifier.render_images(
            [(data, f"instance {index}") for index, data in checked.images], failed=undecodable
        )
        for position, message in undecodable.items():
            failed[checked.images[position][0]] = message
        batch = Batch(
            pixels=pixels, count=checked.count, failed=failed, top_k=checked.top_k, automl=checked.automl
        )
        CheckedRequest.raise_if_none_left(checked.count, failed)
        return batch

    def predict(self, instances: Batch) -> list[Prediction]:
        """One answer per instance, in order: its top-k (AutoML's ClassificationPredictionResult for an AutoML
        request), or ``{"error": "<why>"}`` for a bad instance."""
        automl = instances.automl
        results: list[TopK] | list[AutoMLPrediction]
        if automl is None:
            results = self.classifier.classify(instances.pixels, instances.top_k)
        else:  # classify caps maxPredictions at the class count, as the schema allows
            results = [
                automl_prediction(result, automl)
                for result in self.classifier.classify(instances.pixels, automl.max_predictions)
            ]
        answers: Iterator[Prediction] = iter(results)
        return [
            InstanceError(error=instances.failed[index]) if index in instances.failed else next(answers)
            for index in range(instances.count)
        ]

    def postprocess(self, prediction_results: list[Prediction]) -> PredictResponse:
        return PredictResponse(predictions=prediction_results)


def _accepts_json(accept: str) -> bool:
    media = {part.split(";", 1)[0].strip().lower() for part in accept.split(",")}
    return not accept.strip() or bool(media & {"application/json", "application/*", "*/*"})


def _declared_length(request: Request) -> int | None:
    declared = request.headers.get("content-length", "")
    return int(declared) if declared.isdigit() and len(declared) < 20 else None


def _too_large(limit: int) -> Exception:
    return http_error(
        413,
        f"the request body exceeds {limit} bytes (TPUSTREAM_MAX_BODY_BYTES): send fewer or smaller images",
    )


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as more than ``limit`` bytes arrive."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


class ClassifierHandler(_PredictionHandler):
    """The CPR ``Handler`` (HANDLER_MODULE/HANDLER_CLASS): checks the headers; admits the request against
    the process's in-flight budgets (``Admission``: count, body bytes from Content-Length, then pixels from
    the image headers; 503 with Retry-After beyond); reads the body within ``max_body_bytes`` (413); parses
    and checks it strictly on an intake thread (``parse_request``, ``ClassifierPredictor.check``); then
    decodes and classifies on a serving thread, off the event loop that answers health checks. Anything
    unexpected is a 500 without details; its traceback goes to the server log."""

    def __init__(self, artifacts_uri: str, predictor: Any = None) -> None:
        super().__init__(artifacts_uri, predictor=predictor)  # constructs and loads the predictor
        self.config = ServerConfig.from_env()
        torch_threads = self.config.torch_threads_per_thread()
        _set_torch_threads(torch_threads)
        self._pool = ThreadPoolExecutor(
            max_workers=self.config.threads,
            thread_name_prefix="tpustream-predict",
            initializer=_set_torch_threads,
            initargs=(torch_threads,),
        )
        # parsing and header checks (a few ms per MB) while the serving threads decode: a request's pixels
        # are known, and charged, before it waits for a serving thread
        self._intake = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpustream-intake")
        self.admission = self.config.admission(self._classifier.limits)
        log.info(
            "model server: %s, %d torch threads per serving thread; in flight at most %d requests, %d body "
            "bytes, %d pixels",
            self.config,
            torch_threads,
            self.admission.max_requests,
            self.admission.max_body_bytes,
            self.admission.max_pixels,
        )

    async def handle(self, request: Request) -> Response:  # type: ignore[override]  # the SDK's is async too
        from fastapi import HTTPException
        from starlette.requests import ClientDisconnect

        try:
            return await self._handle(request)
        except HTTPException:
            raise
        except ClientDisconnect:
            raise http_error(400, "the client disconnected before sending the whole body") from None
        except Exception:
            log.exception("prediction request failed")
            raise http_error(500, INTERNAL_ERROR) from None

    async def _handle(self, request: Request) -> Response:
        from fastapi import Response

        media_type = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            raise http_error(
                400,
                'unsupported Content-Type: send the body as "application/json" (Vertex\'s predict format)',
            )
        if not _accepts_json(request.headers.get("accept", "")):
            raise http_error(400, 'unsupported Accept: the server answers "application/json"')
        limit = self.config.max_body_bytes
        declared = _declared_length(request)
        if declared is not None and declared > limit:
            raise _too_large(limit)
        # charged before the body is read (a client sending Expect: 100-continue sends it only if admitted)
        ticket = self.admission.admit(limit if declared is None else declared)
        if isinstance(ticket, str):
            raise _busy(ticket)
        admitted = ticket
        handed_over = False  # from then on, the thread holding the request releases its ticket
        try:
            body = await _read_body(request, limit)
            self.admission.resize(admitted, len(body))
            intake = self._intake.submit(self._check, body)
            try:
                checked = await asyncio.wrap_future(intake)
            except asyncio.CancelledError:
                intake.add_done_callback(lambda _: self.admission.release(admitted))
                handed_over = True
                raise
            if checked.fetched_bytes:  # images read from Cloud Storage are held like the body's
                self.admission.resize(admitted, len(body) + checked.fetched_bytes)
            refusal = self.admission.add_pixels(admitted, checked.pixels)
            if refusal is not None:
                raise _busy(refusal)
            future = self._pool.submit(self._answer, checked)
            future.add_done_callback(lambda _: self.admission.release(admitted))
            handed_over = True
        finally:
            if not handed_over:
                self.admission.release(admitted)
        return Response(content=await asyncio.wrap_future(future), media_type="application/json")

    @property
    def _classifier(self) -> ClassifierPredictor:
        return cast(ClassifierPredictor, self._predictor)

    def _check(self, body: bytes) -> CheckedRequest:
        """On the intake thread: parse the body and check the request from its image headers."""
        return self._classifier.check(parse_request(body))

    def _answer(self, checked: CheckedRequest) -> bytes:
        """On a serving thread: decode, predict, postprocess, serialise."""
        predictor = self._predictor
        return json.dumps(predictor.postprocess(predictor.predict(predictor.preprocess(checked)))).encode()


def _set_torch_threads(count: int) -> None:
    import torch

    torch.set_num_threads(count)


def _busy(message: str) -> Exception:
    return http_error(503, message, headers={"Retry-After": "1"})
