"""The model server under hostile requests: aiplatform's real CPR model server (FastAPI + uvicorn, a
subprocess started as Vertex starts it: SERVING_ENV + the AIP_* variables, tpustream.bench.serve.ModelServer)
on a model trained here, with small limits so that every budget is reached quickly.

Malformed bodies are short 400s that quote nothing of the body; budgets refuse a request before decoding it;
images are decoded one at a time (the server's peak RSS is read from /proc); health checks answer while a
heavy request runs; concurrent clients of small requests are all answered, while large bodies over the
in-flight byte budget get a fast 503; a bad instance fails alone; every format shard creation accepts is
served, with the same pixels as the same image in PNG, and a bomb in any of them is refused from its header.
"""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.common.models import make_model
from tpustream.bench.serve import ModelServer, Watch, image_bytes, instances
from tpustream.dataset import write as shards
from tpustream.dataset.plan import ShardConfig
from tpustream.serve import server as serving
from tpustream.serve import settings
from tpustream.serve.admission import Admission, Ticket
from tpustream.serve.contract import SERVING_ENV

pytestmark = pytest.mark.integration

MAX_PIXELS = 1 << 22  # 4 Mi px: 2048 x 2048 per image
SIDE = 2048
LIMITS = {
    "TPUSTREAM_MAX_BODY_BYTES": str(4 << 20),
    "TPUSTREAM_MAX_PIXELS": str(MAX_PIXELS),
    "TPUSTREAM_MAX_REQUEST_PIXELS": str(32 * MAX_PIXELS),  # HEAVY images of SIDE x SIDE, exactly
    "TPUSTREAM_MAX_REQUEST_BYTES": str(2 << 20),
    "TPUSTREAM_SERVING_THREADS": "1",
}
INFLIGHT_BYTES = 4 * (4 << 20)  # the default: 4 bodies of TPUSTREAM_MAX_BODY_BYTES
HEAVY = 32
SMALL_ERROR = 400  # bytes: an error answer is one short line


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adversarial")
    digits = str(tmp / "digits")
    shards.create_shards(ShardConfig(source="digits", output=digits, num_shards=2), progress=False)
    model = make_model(tmp / "model", digits, seed=2, steps=20)
    with ModelServer(model, str(tmp / "server.log"), LIMITS) as server:
        yield server
    assert "Traceback" not in server.log(), server.log()  # nothing reached the generic 500


@pytest.fixture(scope="module")
def big_png():
    return image_bytes(SIDE, SIDE, "PNG")  # 4 Mi px in ~10 KB: costs its full size to decode


@pytest.fixture(scope="module")
def heavy(served, big_png):
    """HEAVY images of 4 Mi px (the request budget exactly), sent once, watched: the server's peak RSS and
    health checks every 50 ms meanwhile."""
    watch = Watch(served, probe_every_s=0.05)
    with watch.watching():
        reply = served.predict(instances([big_png] * HEAVY))
    assert reply.status == 200 and len(reply.json()["predictions"]) == HEAVY, reply.body[:300]
    assert reply.latency_ms > 500, "the heavy request is too light to show anything on this machine"
    return reply, watch


def _rgb(width=48, height=40, seed=0):
    """An RGB image of at most 64 colours: GIF holds it losslessly too."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 4, (height, width, 3)) * 80).astype(np.uint8)


def _encode(pixels, fmt, **save):
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt, **save)
    return out.getvalue()


def _assert_short_refusal(reply, status, body=b""):
    assert reply.status == status, (reply.status, reply.body[:300])
    assert len(reply.body) < SMALL_ERROR, reply.body[:300]
    detail = reply.json()["detail"]
    assert isinstance(detail, str) and detail
    for start in range(0, max(0, len(body) - 32), max(1, len(body) // 16)):
        assert body[start : start + 32] not in reply.body  # no fragment of the body comes back
    return detail


TINY = base64.b64encode(image_bytes(8, 8)).decode()
MALFORMED = {
    "deep-arrays": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "deep-objects": (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "nested too deeply"),
    "invalid-utf8": (b'{"instances": [{"b64": "\xff\xfe\xfd\xfc"}]}', "not UTF-8"),
    "utf16": ('{"instances": []}'.encode("utf-16"), "not UTF-8"),
    "huge-integer": (b'{"instances": [], "parameters": {"top_k": ' + b"7" * 50_000 + b"}}", "50000 digits"),
    "nan": (f'{{"instances": [{{"b64": "{TINY}"}}], "parameters": {{"top_k": NaN}}}}'.encode(), "NaN"),
    "infinity": (f'{{"instances": [{{"b64": "{TINY}"}}], "x": -Infinity}}'.encode(), "Infinity"),
    "float-overflow": (f'{{"instances": [{{"b64": "{TINY}"}}], "x": 1e999}}'.encode(), "range of a double"),
    "top-level-array": (b'[{"b64": "' + TINY.encode() + b'"}]', "must be a JSON object"),
    "top-level-string": (b'"' + b"s" * 5000 + b'"', "must be a JSON object"),
    "raw-binary": (np.random.default_rng(1).bytes(256 << 10), "not UTF-8"),
    "junk-2MB": (b'{"instances": [{"b64": "' + b"QUJD" * (1 << 19), "JSON deserialization failed"),
    "junk-2MB-printable": (bytes(np.random.default_rng(0).integers(33, 127, 2 << 20, np.uint8)), "JSON"),
    "not-base64-2MB": (b'{"instances": [{"b64": "' + b"%%" * (1 << 20) + b'"}]}', "not valid base64"),
    "long-non-instance": (json.dumps({"instances": ["x" * (1 << 20)]}).encode(), 'expected {"b64"'),
    "long-top-k": (
        json.dumps({"instances": [{"b64": TINY}], "parameters": {"top_k": "9" * 10**5}}).encode(),
        "top_k must be a positive integer",
    ),
    # AutoML's format ({"content"} instances, tpustream.serve.automl): the same strictness
    "automl-not-base64-2MB": (
        b'{"instances": [{"content": "' + b"%%" * (1 << 20) + b'"}]}',
        "not valid base64",
    ),
    "automl-long-uri": (
        json.dumps({"instances": [{"content": "gs://" + "b" * 10**5}]}).encode(),
        "Cloud Storage URI",
    ),
    "automl-long-threshold": (
        json.dumps(
            {"instances": [{"content": TINY}], "parameters": {"confidenceThreshold": "9" * 10**5}}
        ).encode(),
        "confidenceThreshold must be a number from 0 to 1, got a JSON string",
    ),
    "automl-huge-max-predictions": (
        f'{{"instances": [{{"content": "{TINY}"}}], "parameters": {{"maxPredictions": 1e300}}}}'.encode(),
        "maxPredictions must be a positive integer",
    ),
    "automl-long-unknown-parameter": (
        json.dumps({"instances": [{"content": TINY}], "parameters": {"k" * 10**5: 1}}).encode(),
        "send only confidenceThreshold and maxPredictions",
    ),
    "long-unknown-parameter": (
        json.dumps({"instances": [{"b64": TINY}], "parameters": {"k" * 10**5: 1}}).encode(),
        "parameters 1 field whose name is not a short identifier: not a parameter",
    ),
    "automl-mixed": (
        json.dumps({"instances": [{"b64": TINY}, {"content": TINY}]}).encode(),
        'mix {"b64": ...} and {"content": ...}',
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_body_is_a_short_400_that_echoes_nothing(served, case):
    body, says = MALFORMED[case]
    detail = _assert_short_refusal(served.predict(body), 400, body)
    assert says in detail, detail
    assert served.health().status == 200


@pytest.mark.parametrize("content_type", ["application/octet-stream", None, "text/plain"])
def test_raw_binary_without_the_json_content_type_is_refused_unread(served, content_type):
    body = os.urandom(1 << 20)
    detail = _assert_short_refusal(served.predict(body, content_type), 400, body)
    assert "Content-Type" in detail


def test_the_json_content_type_with_a_charset_is_served(served):
    reply = served.predict(instances([image_bytes(8, 8)]), "application/json; charset=utf-8")
    assert reply.status == 200 and len(reply.json()["predictions"]) == 1


def test_a_body_over_the_cap_is_a_413_from_its_length_or_as_it_streams(served):
    cap = int(LIMITS["TPUSTREAM_MAX_BODY_BYTES"])
    body = b'{"instances": [' + b" " * cap + b"]}"
    detail = _assert_short_refusal(served.predict(body), 413, body)
    assert "TPUSTREAM_MAX_BODY_BYTES" in detail
    # no Content-Length: the body is counted while it arrives (chunked transfer encoding)
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as conn:
        conn.sendall(
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        chunk = b" " * (1 << 16)
        try:
            for _ in range(cap // len(chunk) + 4):
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and closed before the end
        answer = b""
        try:
            while data := conn.recv(1 << 16):
                answer += data
        except ConnectionResetError:
            pass
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert served.health().status == 200


def test_too_many_instances(served):
    count = settings.SERVING_DEFAULTS["TPUSTREAM_MAX_INSTANCES"] + 1
    detail = _assert_short_refusal(served.predict(instances([image_bytes(8, 8)] * count)), 400)
    assert f"{count} instances exceed the limit" in detail


def test_over_the_request_pixel_budget_is_refused_before_decoding(served, big_png, heavy):
    """HEAVY + 8 images, each within the per-image budget: refused from their headers in a fraction of
    the time the allowed HEAVY take to decode, without the server's memory growing."""
    allowed, _ = heavy
    watch = Watch(served)
    with watch.watching():
        reply = served.predict(instances([big_png] * (HEAVY + 8)))
    detail = _assert_short_refusal(reply, 400)
    assert f"instances 0-{HEAVY}:" in detail and "TPUSTREAM_MAX_REQUEST_PIXELS" in detail
    assert reply.latency_ms < allowed.latency_ms / 4, (reply.latency_ms, allowed.latency_ms)
    assert watch.rss_mb_peak - watch.rss_mb_before < 30  # one image decoded would be 12 MB x 2-3


def test_over_the_request_byte_budget(served):
    noise = _encode(np.random.default_rng(1).integers(0, 256, (500, 500, 3), np.uint8), "PNG")  # 0.75 MB
    detail = _assert_short_refusal(served.predict(instances([noise] * 3)), 400)
    assert "instances 0-2:" in detail and "TPUSTREAM_MAX_REQUEST_BYTES" in detail


def test_automl_requests_meet_the_same_budgets(served, big_png):
    """{"content"} instances are held to the {"b64"} ones' limits: per image, per request, from the headers."""

    def automl(images):
        return json.dumps({"instances": [{"content": base64.b64encode(i).decode()} for i in images]}).encode()

    detail = _assert_short_refusal(served.predict(automl([big_png] * (HEAVY + 1))), 400)
    assert f"instances 0-{HEAVY}:" in detail and "TPUSTREAM_MAX_REQUEST_PIXELS" in detail
    noise = _encode(np.random.default_rng(1).integers(0, 256, (500, 500, 3), np.uint8), "PNG")  # 0.75 MB
    detail = _assert_short_refusal(served.predict(automl([noise] * 3)), 400)
    assert "instances 0-2:" in detail and "TPUSTREAM_MAX_REQUEST_BYTES" in detail
    detail = _assert_short_refusal(served.predict(automl([image_bytes(SIDE + 1, SIDE, "PNG")])), 400)
    assert "instance 0:" in detail and "TPUSTREAM_MAX_PIXELS" in detail
    reply = served.predict(automl([image_bytes(8, 8)]))
    assert reply.status == 200 and list(reply.json()["predictions"][0]) == [
        "ids",
        "displayNames",
        "confidences",
    ]


def test_a_heavy_request_neither_stalls_health_nor_holds_every_image(heavy):
    """Decoding HEAVY images of 4 Mi px takes a while (1.4 s here), during which every health check answers
    within 1 s and a third of the request's time, and the server's peak RSS grows by about one decoded image
    (12 MB as RGB, ~3x that while Pillow converts it: 35-50 MB measured), not HEAVY of them (420 MB)."""
    reply, watch = heavy
    assert watch.health_failures == 0
    assert len(watch.health_ms) >= reply.latency_ms / 1000 * 3  # probes kept being answered throughout
    # on the event loop, a probe would wait for the rest of the request: most of it, for one of them
    slowest = sorted(watch.health_ms)[-5:]
    assert max(watch.health_ms) < min(1000, reply.latency_ms / 3), (reply.latency_ms, slowest)
    grown = watch.rss_mb_peak - watch.rss_mb_before
    assert grown < 120, f"peak RSS grew {grown:.0f} MB during one request"


class HeldRequest:
    """A predict request whose headers declare ``size`` body bytes and ``Expect: 100-continue``: the server
    answers "100 Continue" once it has admitted the request and starts reading the body (or its refusal at
    once); the body is sent only when ``finish`` is called. A request held in flight, with no timing."""

    def __init__(self, served, size):
        self.size = size
        self.conn = socket.create_connection(("127.0.0.1", served.port), timeout=60)
        self.conn.sendall(
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % size
        )
        self.interim = self._read_head()

    def _read_head(self):
        head = b""
        while b"\r\n\r\n" not in head:
            data = self.conn.recv(1)
            if not data:
                break
            head += data
        return head

    def finish(self):
        """Send a valid body of exactly ``size`` bytes (one tiny image, padded); the final answer."""
        body = b'{"instances": [{"b64": "' + TINY.encode() + b'"}]}'
        self.conn.sendall(body + b" " * (self.size - len(body)))
        reply = b""
        while data := self.conn.recv(1 << 16):
            reply += data
        self.conn.close()
        return reply


def test_small_requests_are_answered_while_large_bodies_over_the_byte_budget_get_a_fast_503(served):
    """Requests held in flight (admitted, their bodies not sent) fill most of the in-flight byte budget: one
    more large body is refused at once, before it is read, with Retry-After; a small request still fits and
    is answered; once the held requests finish, the large one is admitted."""
    large = 7 * INFLIGHT_BYTES // 32  # 3.5 MiB: 4 of them fit the 16 MiB budget, a 5th does not
    held = [HeldRequest(served, large) for _ in range(4)]
    try:
        assert all(h.interim.startswith(b"HTTP/1.1 100") for h in held), [h.interim for h in held]
        refused = HeldRequest(served, large)
        assert refused.interim.startswith(b"HTTP/1.1 503"), refused.interim
        assert b"retry-after: 1" in refused.interim.lower()
        refused.conn.close()
        small = served.predict(instances([image_bytes(8, 8)] * 8))
        assert small.status == 200 and len(small.json()["predictions"]) == 8
        body = instances([image_bytes(8, 8)]) + b" " * (large - 200)
        over = served.predict(body)
        detail = _assert_short_refusal(over, 503)
        assert "TPUSTREAM_INFLIGHT_BYTES" in detail and over.headers.get("retry-after") == "1"
        assert served.health().status == 200
    finally:
        answers = [h.finish() for h in held]
    assert all(a.startswith(b"HTTP/1.1 200") for a in answers), [a[:200] for a in answers]
    assert served.predict(body).status == 200  # the budget is free again


def test_eight_concurrent_clients_of_small_requests_are_all_answered(served):
    """8 clients started together (a barrier), each sending requests of 8 small images one after the other:
    every request is answered 200 with its own answer, none refused."""
    import threading

    clients, rounds = 8, 10
    bodies = [
        instances([_encode(_rgb(28 + client, 28, seed=client), "PNG")] * 8) for client in range(clients)
    ]
    expected = [served.predict(body).json() for body in bodies]
    start = threading.Barrier(clients)

    def client(index):
        start.wait()
        return [served.predict(bodies[index]) for _ in range(rounds)]

    with ThreadPoolExecutor(clients) as pool:
        replies = list(pool.map(client, range(clients)))
    statuses = [reply.status for answers in replies for reply in answers]
    assert statuses == [200] * clients * rounds, sorted(statuses)
    for index, answers in enumerate(replies):
        assert all(reply.json() == expected[index] for reply in answers)


def test_concurrent_clients_all_get_their_own_answers(served):
    requests = [
        [_encode(_rgb(20 + client, 20 + i, seed=client * 10 + i), "PNG") for i in range(4)]
        for client in range(6)
    ]
    expected = [served.predict(instances(images, top_k=3)).json() for images in requests]
    assert len({json.dumps(e) for e in expected}) == len(expected)  # distinct answers to tell apart

    def client(index):
        answers = []
        for _ in range(3):
            reply = served.predict(instances(requests[index], top_k=3))
            assert reply.status == 200, reply.body[:300]
            answers.append(reply.json())
        return answers

    with ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(client, range(len(requests))))
    for index, answers in enumerate(results):
        assert answers == [expected[index]] * 3


def _pillow_formats(pixels):
    yield "webp", _encode(pixels, "WEBP", lossless=True)
    yield "bmp", _encode(pixels, "BMP")
    yield "tiff", _encode(pixels, "TIFF")
    yield "tiff-deflate", _encode(pixels, "TIFF", compression="tiff_deflate")
    yield "gif", _encode(pixels, "GIF")
    yield "ppm", _encode(pixels, "PPM")


def test_every_shard_format_is_answered_as_the_same_image_in_png(served):
    """... and as the bytes shard creation stores for it (re-encoded to PNG: what training and evaluation
    read), so a served WebP/BMP/TIFF/GIF gets the answer `tpustream evaluate` gave its shard sample."""
    from tpustream.image.codec import prepare_image_bytes

    pixels = _rgb(48, 40, seed=3)
    png = _encode(pixels, "PNG")
    expected = served.predict(instances([png], top_k=10)).json()["predictions"][0]
    formats = dict(_pillow_formats(pixels))
    stored = [prepare_image_bytes(data, name, None, name)[0] for name, data in formats.items()]
    reply = served.predict(instances([*formats.values(), *stored], top_k=10))
    assert reply.status == 200, reply.body[:300]
    for name, answer in zip(
        [*formats, *(f"{n} as stored" for n in formats)], reply.json()["predictions"], strict=True
    ):
        # one image alone vs in a batch of 16: a forward pass of another batch size sums in another order,
        # so the probabilities agree to rounding, not to the last printed digit
        assert answer["classes"] == expected["classes"], name
        assert answer["probabilities"] == pytest.approx(expected["probabilities"], abs=1e-5), name
    # grey formats: PGM and 16-bit TIFF against an 8-bit PNG of the same grey
    grey = pixels[:, :, 0]
    from PIL import Image

    tiff16 = io.BytesIO()
    Image.fromarray(grey.astype(np.uint16) << 8).save(tiff16, format="TIFF")
    grey_png = _encode(grey, "PNG")
    answers = served.predict(instances([grey_png, _encode(grey, "PPM"), tiff16.getvalue()], top_k=10)).json()
    assert answers["predictions"][1:] == [answers["predictions"][0]] * 2


def test_exif_orientation_of_webp_and_tiff_is_applied_as_shard_creation_does(served):
    from PIL import Image

    pixels = _rgb(48, 32, seed=4)
    upright = _encode(np.ascontiguousarray(np.rot90(pixels, -1)), "PNG")  # orientation 6: 90 clockwise
    exif = Image.Exif()
    exif[0x0112] = 6
    turned = [
        _encode(pixels, "WEBP", lossless=True, exif=exif.tobytes()),
        _encode(pixels, "TIFF", tiffinfo={0x0112: 6}),
    ]
    answers = served.predict(instances([upright, *turned], top_k=10)).json()["predictions"]
    assert answers[1:] == [answers[0]] * 2
    assert (
        served.predict(instances([_encode(pixels, "PNG")], top_k=10)).json()["predictions"][0] != answers[0]
    )


def _forged_webp(width, height):
    """A real lossless WebP whose VP8L header claims ``width`` x ``height``: only a header check sees it."""
    data = bytearray(_encode(_rgb(16, 16), "WEBP", lossless=True))
    assert data[12:16] == b"VP8L"
    bits = int.from_bytes(data[21:25], "little") & ~((1 << 28) - 1)
    data[21:25] = (bits | (width - 1) | ((height - 1) << 14)).to_bytes(4, "little")
    return bytes(data)


def _forged_bmp(width, height):
    data = bytearray(_encode(_rgb(16, 16), "BMP"))
    data[18:22] = width.to_bytes(4, "little")
    data[22:26] = height.to_bytes(4, "little")
    return bytes(data)


def test_a_bomb_in_any_format_is_refused_from_its_header(served):
    side = SIDE + 32  # just over the per-image budget
    bombs = {
        "tiff": image_bytes(side, side, "TIFF", compression="tiff_deflate"),
        "webp": image_bytes(side, side, "WEBP", lossless=True),
        "webp-forged-16383": _forged_webp(16383, 16383),  # 268 MP: what libwebp would allocate a canvas for
        "bmp-forged": _forged_bmp(3000, 3000),
        "gif": image_bytes(side, side, "GIF"),
        "png": image_bytes(side, side, "PNG"),
    }
    for name, bomb in bombs.items():
        assert len(bomb) < 200_000, name
        reply = served.predict(instances([bomb]))
        detail = _assert_short_refusal(reply, 400)
        assert "instance 0:" in detail and "exceeds the pixel budget of 4.2 MP" in detail, (name, detail)
        assert "TPUSTREAM_MAX_PIXELS" in detail and reply.latency_ms < 1000, name
    assert served.health().status == 200


def test_a_damaged_file_of_any_format_fails_its_own_instance_only(served):
    """In a request with good images, a damaged one gets ``{"error": "instance N: undecodable ..."}`` in its
    slot and the others their answers (the same as alone); a request of only damaged images is a 400."""
    pixels = _rgb(48, 40)
    good = _encode(pixels, "PNG")
    alone = served.predict(instances([good])).json()["predictions"][0]
    for name, data in _pillow_formats(pixels):
        cut = data[: len(data) // 2]
        reply = served.predict(instances([good, cut, good]))
        assert reply.status == 200, (name, reply.body[:300])
        first, bad, last = reply.json()["predictions"]
        assert first == last == alone, name
        assert list(bad) == ["error"] and bad["error"].startswith("instance 1: undecodable"), (name, bad)
        _assert_quotes_nothing(reply, cut)
        detail = _assert_short_refusal(served.predict(instances([cut])), 400, cut)
        assert detail.startswith("instance 0: undecodable"), (name, detail)
    detail = _assert_short_refusal(served.predict(instances([b"%PDF-1.4 not an image"])), 400)
    assert detail.startswith("instance 0: not a JPEG, PNG, PPM/PGM/PBM, BMP, GIF, WebP or TIFF image")
    both = _assert_short_refusal(served.predict(instances([b"%PDF-1.4 not an image", good[:40]])), 400)
    assert both.startswith("instance 0: not a JPEG") and "(and 1 more bad instances)" in both


def _assert_quotes_nothing(reply, payload, window=8):
    """No ``window`` consecutive bytes of ``payload`` (nor of its base64 text) appear in the answer."""
    for data in (payload, base64.b64encode(payload)):
        for start in range(max(1, len(data) - window + 1)):
            fragment = data[start : start + window]
            assert fragment not in reply.body, (fragment, reply.body[:300])


def _png_claiming(width, height):
    """A real 16x16 PNG whose IHDR (CRC fixed) claims ``width`` x ``height``: a bomb by its header."""
    import struct
    import zlib

    data = bytearray(_encode(_rgb(16, 16), "PNG"))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def _broken_png_chunk():
    """A PNG whose second chunk's type is not a chunk type: Pillow's message quotes it."""
    data = bytearray(_encode(_rgb(16, 16), "PNG"))
    data[37:41] = b"Q\x01Z\x02"
    return bytes(data)


HOSTILE_PAYLOADS = {
    "text-not-an-image": b"hello\nthis is not an image, it is a secret: 0123456789",
    "pdf": b"%PDF-1.7 secret-document-contents-here 0123456789",
    "truncated-jpeg": image_bytes(64, 48, "JPEG", mode="RGB")[:300],
    "png-broken-chunk": _broken_png_chunk(),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_PAYLOADS))
def test_no_answer_quotes_the_request(served, case):
    """Hostile image bytes, alone and next to a good image, and hostile non-image values: no 8 bytes of them
    (nor of their base64) come back, in a 400 or in an instance's error."""
    payload = HOSTILE_PAYLOADS[case]
    good = image_bytes(8, 8)
    for body in (instances([payload]), instances([good, payload])):
        reply = served.predict(body)
        assert reply.status in (200, 400), reply.body[:300]
        _assert_quotes_nothing(reply, payload)
        if reply.status == 200:
            assert "error" in reply.json()["predictions"][1]
    jpeg_text = base64.b64encode(image_bytes(64, 48, "JPEG", mode="RGB")).decode()
    values = [
        json.dumps({"instances": [jpeg_text]}),  # the base64 itself as the instance
        json.dumps({"instances": [{"image": jpeg_text}]}),
        json.dumps({"instances": [{"b64": TINY}], "parameters": {"top_k": "secret-top-k-0123456789"}}),
        json.dumps({"instances": [{"b64": TINY}], "parameters": {"top_k": [jpeg_text]}}),
    ]
    for body in values:
        reply = served.predict(body.encode())
        assert reply.status == 400, reply.body[:300]
        _assert_quotes_nothing(reply, jpeg_text.encode()[:400])
        _assert_quotes_nothing(reply, b"secret-top-k-0123456789")


def test_a_400_megapixel_png_names_our_pixel_budget(served):
    """Pillow refuses a 400 MP header itself (its DecompressionBombError, above 179 MP): the answer names
    TPUSTREAM_MAX_PIXELS and our budget, not Pillow's internals."""
    detail = _assert_short_refusal(served.predict(instances([_png_claiming(20000, 20000)])), 400)
    assert detail.startswith("instance 0:") and "TPUSTREAM_MAX_PIXELS" in detail, detail
    assert "4.2 MP" in detail and "DecompressionBomb" not in detail and "Image size" not in detail, detail


def test_top_k_over_the_class_count_is_refused_naming_it(served):
    reply = served.predict(instances([image_bytes(8, 8)], top_k=11))
    detail = _assert_short_refusal(reply, 400)
    assert "10 classes" in detail and "at most 10" in detail, detail
    answer = served.predict(instances([image_bytes(8, 8)], top_k=10)).json()["predictions"][0]
    assert len(answer["classes"]) == 10


# ------------------------------------------------------------------ in-process: the parts behind the server


def test_streamed_render_equals_render_batch_of_all_prepared(served, big_png):
    """render_images (one decoded image alive at a time) gives the pixels of ``pixels(prepare(...))``
    (render_batch with batch_alone) for a request mixing small same-shaped, small odd and large images."""
    from tpustream.serve.classifier import Classifier

    classifier = Classifier(served.model)
    images = [_encode(_rgb(8, 8, seed=i), "PNG") for i in range(3)] + [big_png, _encode(_rgb(12, 9), "BMP")]
    images += [_encode(_rgb(8, 8, seed=9), "PPM"), image_bytes(300, 200, "JPEG")]
    named = [(data, f"instance {i}") for i, data in enumerate(images)]
    streamed = classifier.render_images(named)
    assert streamed.equal(classifier.pixels([classifier.prepare(data, name) for data, name in named]))


class ExplodingPredictor(serving.ClassifierPredictor):
    """A predictor whose preprocess fails in an unforeseen way, with the request in the exception."""

    def load(self, artifacts_uri, **kwargs):
        self.limits = settings.Limits()

    def check(self, prediction_input):
        raise RuntimeError(f"secret internals {prediction_input}")


def test_an_unexpected_exception_is_a_500_without_its_text(monkeypatch, caplog):
    """The SDK's server would answer a 500 carrying the exception's arguments (model_server.py); ours says
    "internal error" and logs the traceback."""
    import torch
    from fastapi.testclient import TestClient
    from google.cloud.aiplatform.prediction.model_server import CprModelServer

    env = {**SERVING_ENV, "PREDICTOR_MODULE": __name__, "PREDICTOR_CLASS": "ExplodingPredictor"}
    env.update(
        AIP_HTTP_PORT="8080", AIP_HEALTH_ROUTE="/health", AIP_PREDICT_ROUTE="/predict", AIP_STORAGE_URI="x"
    )
    env["TPUSTREAM_TORCH_THREADS"] = str(torch.get_num_threads())  # the handler sets it: keep this process's
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    client = TestClient(CprModelServer().app)
    reply = client.post(
        "/predict",
        content=b'{"instances": [{"b64": "c2VjcmV0"}]}',
        headers={"Content-Type": "application/json"},
    )
    assert reply.status_code == 500 and reply.json() == {"detail": serving.INTERNAL_ERROR}
    assert "secret" not in reply.text and "RuntimeError" not in reply.text
    assert "secret internals" in caplog.text  # the traceback is in the server's log


def test_a_request_whose_pixels_do_not_fit_the_in_flight_budget_is_a_fast_503(served, monkeypatch):
    """The server's app in-process (TestClient) on the served model, another request holding the whole
    in-flight pixel budget (its ticket taken directly: no timing): a request's pixels, read from its image
    headers, do not fit, so it is a 503 with Retry-After naming TPUSTREAM_INFLIGHT_PIXELS and gives its ticket
    back; once the other is done, the same request is answered."""
    import torch
    from fastapi.testclient import TestClient
    from google.cloud.aiplatform.prediction.model_server import CprModelServer

    budget = 1 << 20
    env = {
        **SERVING_ENV,
        "AIP_HTTP_PORT": "8080",
        "AIP_HEALTH_ROUTE": "/health",
        "AIP_PREDICT_ROUTE": "/predict",
        "AIP_STORAGE_URI": served.model,
        "TPUSTREAM_INFLIGHT_PIXELS": str(budget),
        "TPUSTREAM_TORCH_THREADS": str(torch.get_num_threads()),  # the handler sets it: keep this process's
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    server = CprModelServer()
    admission = server.handler.admission
    client = TestClient(server.app)
    other = admission.admit(0)
    assert isinstance(other, Ticket) and admission.add_pixels(other, budget) is None
    body = instances([image_bytes(64, 48)])
    reply = client.post("/predict", content=body, headers={"Content-Type": "application/json"})
    assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
    assert (
        "TPUSTREAM_INFLIGHT_PIXELS" in reply.json()["detail"]
        and "this request's 3072 px" in reply.json()["detail"]
    )
    assert (admission.requests, admission.body_bytes, admission.pixels) == (1, 0, budget)
    admission.release(other)
    reply = client.post("/predict", content=body, headers={"Content-Type": "application/json"})
    assert reply.status_code == 200 and len(reply.json()["predictions"]) == 1
    assert (admission.requests, admission.body_bytes, admission.pixels) == (0, 0, 0)


def test_settings_come_from_the_environment_and_the_docstring_lists_them(monkeypatch):
    for var, default in settings.SERVING_DEFAULTS.items():
        row = next((line for line in settings.__doc__.splitlines() if line.startswith(f"| `{var}` |")), None)
        assert row is not None, f"{var} is missing from the module docstring's table"
        assert default == 0 or f"| {default} " in row, row
    monkeypatch.setenv("TPUSTREAM_MAX_REQUEST_PIXELS", "1234")
    monkeypatch.setenv("TPUSTREAM_SERVING_QUEUE", "0")
    monkeypatch.setenv("TPUSTREAM_INFLIGHT_BYTES", "5000")
    assert settings.Limits.from_env().max_request_pixels == 1234
    config = settings.ServerConfig.from_env()
    assert config.queue == 0 and config.admission(settings.Limits.from_env()).max_body_bytes == 5000
    # unset: derived from the per-request limits
    default = settings.ServerConfig().admission(settings.Limits(max_request_pixels=1000))
    assert (default.max_requests, default.max_body_bytes, default.max_pixels) == (65, 4 * (16 << 20), 4000)
    monkeypatch.setenv("TPUSTREAM_SERVING_THREADS", "0")
    with pytest.raises(ValueError, match="TPUSTREAM_SERVING_THREADS"):
        settings.ServerConfig.from_env()
    with pytest.raises(ValueError, match="max_pixels"):
        settings.Limits(max_pixels=0)


def test_health_stays_fast_with_threads_busy_decoding(served, big_png):
    """Several heavy requests queued at once (all slots taken): the event loop still answers health."""
    with ThreadPoolExecutor(3) as pool:
        running = [pool.submit(served.predict, instances([big_png] * 8)) for _ in range(3)]
        started = time.monotonic()
        probes = []
        while not all(f.done() for f in running) and time.monotonic() - started < 60:
            probes.append(served.health().latency_ms)
            time.sleep(0.05)
        assert [f.result().status for f in running] == [200, 200, 200]
    assert probes and max(probes) < 1000


def test_admission_holds_what_requests_cost_and_always_admits_one_alone():
    admission = Admission(requests=3, body_bytes=100, pixels=1000)
    big = admission.admit(150)  # over the byte budget, but alone: admitted
    assert isinstance(big, Ticket)
    assert "TPUSTREAM_INFLIGHT_BYTES" in admission.admit(1)
    admission.release(big)
    admission.release(big)  # twice: counted once
    assert (admission.requests, admission.body_bytes) == (0, 0)
    first, second = admission.admit(60), admission.admit(40)
    assert isinstance(first, Ticket) and isinstance(second, Ticket)
    assert "TPUSTREAM_INFLIGHT_BYTES" in admission.admit(1)
    admission.resize(first, 10)  # its body arrived smaller than declared
    third = admission.admit(50)
    assert isinstance(third, Ticket)
    assert "TPUSTREAM_SERVING_QUEUE" in admission.admit(0)
    assert admission.add_pixels(first, 2000) is None  # alone in pixels
    refusal = admission.add_pixels(second, 1)
    assert refusal is not None and "TPUSTREAM_INFLIGHT_PIXELS" in refusal
    admission.release(first)
    assert admission.add_pixels(second, 600) is None and admission.add_pixels(third, 400) is None
    assert admission.add_pixels(admission.admit(0), 1) is not None
    for ticket in (second, third):
        admission.release(ticket)
    assert (admission.requests, admission.body_bytes, admission.pixels) == (1, 0, 0)
