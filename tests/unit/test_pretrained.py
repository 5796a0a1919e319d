"""tpustream.train.pretrained on plain (CPU) models: torchvision-layout files load into every supported backbone with
a new head, a named weight set is fetched once and hash-checked, wrong files are one-line errors."""

import hashlib
import http.server
import io
import json
import struct
import threading

import pytest
import torch
from torchvision import models as tv

from tpustream.models import MODEL_SPECS, build_network
from tpustream.train.pretrained import (
    BASE_URL_ENV,
    MODEL_DEFAULT,
    PretrainedError,
    _hash_prefix,
    resolve,
    resolve_ahead,
)
from tpustream.train.pretrained_load import apply_pretrained, load_state_dict

PRETRAINED_ARCHS = [name for name, spec in MODEL_SPECS.items() if spec.torchvision_arch]


def _torchvision_state(arch, seed=0):
    """The state dict of torchvision's ``arch`` with random weights (1000 classes): stands in for ImageNet's."""
    torch.manual_seed(seed)
    return tv.get_model(arch, weights=None).state_dict()


def _write_safetensors(path, state):
    """A .safetensors file per its published format (8-byte header length, JSON header, raw bytes)."""
    names = {torch.float32: "F32", torch.int64: "I64"}
    header, chunks, offset = {}, [], 0
    for key, tensor in state.items():
        data = tensor.contiguous().numpy().tobytes()
        header[key] = {
            "dtype": names[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks))


@pytest.mark.parametrize("fmt", ["pth", "safetensors"])
@pytest.mark.parametrize("arch", PRETRAINED_ARCHS)
def test_a_torchvision_state_dict_loads_into_the_backbone_and_the_head_is_new(arch, fmt, tmp_path):
    spec = MODEL_SPECS[arch]
    state = _torchvision_state(spec.torchvision_arch)
    path = tmp_path / f"weights.{fmt}"
    if fmt == "pth":
        torch.save(state, path)
    else:
        _write_safetensors(path, state)
    size = max(32, spec.input_size.smallest)  # ViT trains at its weights' 224 px only (no interpolation)
    resolved = resolve(str(path), model=arch, input_size=size)
    weights, digest = load_state_dict(resolved)
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    torch.manual_seed(7)
    model = build_network(arch, num_classes=3, input_size=size, small_input_stem=False)
    fresh_head = model.get_submodule(spec.head).weight.detach().clone()
    record = apply_pretrained(model, weights, arch=arch, resolved=resolved, sha256=digest)
    own = model.state_dict()
    head = {f"{spec.head}.weight", f"{spec.head}.bias"}
    for key, value in state.items():
        if key not in head:
            assert torch.equal(own[key], value), key
    assert own[f"{spec.head}.weight"].shape[0] == 3
    assert torch.equal(own[f"{spec.head}.weight"], fresh_head)  # the head is not the file's
    assert record["sha256"] == digest and record["head"] == spec.head
    # the stock stem at 32 px: the pretrained first convolution keeps its shape
    assert resolved.preprocessing.crop_size == size


def test_a_wrong_architecture_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "r18.pth"
    torch.save(_torchvision_state("resnet18"), path)
    resolved = resolve(str(path), model="resnet50", input_size=32)
    weights, digest = load_state_dict(resolved)
    model = build_network("resnet50", num_classes=3, input_size=32, small_input_stem=False)
    with pytest.raises(PretrainedError) as error:
        apply_pretrained(model, weights, arch="resnet50", resolved=resolved, sha256=digest)
    message = str(error.value)
    assert "\n" not in message and "holds weights for resnet18, not resnet50" in message
    assert "--model resnet18" in message


def test_a_missing_backbone_weight_names_the_key(tmp_path):
    state = _torchvision_state("resnet18")
    del state["layer2.0.conv1.weight"]
    path = tmp_path / "cut.pth"
    torch.save(state, path)
    resolved = resolve(str(path), model="resnet18", input_size=32)
    weights, digest = load_state_dict(resolved)
    model = build_network("resnet18", num_classes=3, input_size=32, small_input_stem=False)
    with pytest.raises(PretrainedError, match=r"lacks 1 backbone weight.*'layer2\.0\.conv1\.weight'"):
        apply_pretrained(model, weights, arch="resnet18", resolved=resolved, sha256=digest)


def test_bad_specs_are_one_line_errors(tmp_path):
    with pytest.raises(PretrainedError, match="names weights for resnet18, this run trains resnet50"):
        resolve("resnet18.IMAGENET1K_V1", model="resnet50", cache=str(tmp_path))
    with pytest.raises(PretrainedError, match="no weight set 'IMAGENET9K' .*resnet50.IMAGENET1K_V2"):
        resolve("resnet50.IMAGENET9K", model="resnet50", cache=str(tmp_path))
    with pytest.raises(PretrainedError, match="model tiny has no published torchvision weights"):
        resolve("DEFAULT", model="tiny", cache=str(tmp_path))
    with pytest.raises(PretrainedError, match="does not exist: stage the weights file"):
        resolve(str(tmp_path / "nothing.pth"), model="resnet18")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{nope")
    with pytest.raises(PretrainedError, match="not a readable .safetensors file"):
        load_state_dict(resolve(str(bad), model="resnet18"))


class _WeightsServer:
    """A loopback HTTP server that stands in for the internet (download.pytorch.org/models/): it serves
    files made in the test, and counts the requests."""

    def __init__(self, files):
        self.files, self.requests = files, []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                server.requests.append(self.path)
                body = server.files.get(self.path.lstrip("/"))
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_named_weight_set_is_fetched_once_and_hash_checked(tmp_path, monkeypatch):
    weights = tv.get_model_weights("resnet18").IMAGENET1K_V1
    file_name = weights.url.rsplit("/", 1)[-1]  # resnet18-f37072fd.pth: f37072fd prefixes its sha256
    prefix = file_name.rsplit(".", 1)[0].rsplit("-", 1)[-1]
    state = _torchvision_state("resnet18")
    # The published file's bytes cannot be made here: torchvision's table entry gets the URL such a file
    # would have (same base URL, the name's hash prefix the test file's own), patched for this test only.
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    own_name = file_name.replace(prefix, hashlib.sha256(data).hexdigest()[:8])
    monkeypatch.setattr(weights.value, "url", weights.url.replace(file_name, own_name))
    server = _WeightsServer({own_name: data})
    monkeypatch.setenv(BASE_URL_ENV, server.url)
    cache = tmp_path / "cache"
    try:
        first = resolve("resnet18.IMAGENET1K_V1", model="resnet18", cache=str(cache))
        second = resolve("IMAGENET1K_V1", model="resnet18", cache=str(cache))
    finally:
        server.close()
    assert server.requests == [f"/{own_name}"]  # one fetch; the second resolution found the cached copy
    assert first.uri == second.uri == str(cache / own_name)
    assert first.sha256 == hashlib.sha256(data).hexdigest() and first.name == "resnet18.IMAGENET1K_V1"
    assert (first.preprocessing.resize_size, first.preprocessing.crop_size) == (256, 224)
    loaded, _ = load_state_dict(first)
    assert torch.equal(loaded["conv1.weight"], state["conv1.weight"])
    # a corrupted cached copy fails its hash check, in one line, on the next read
    (cache / own_name).write_bytes(data[:-10] + b"0123456789")
    with pytest.raises(PretrainedError) as error:
        resolve("resnet18.IMAGENET1K_V1", model="resnet18", cache=str(cache))
    assert "\n" not in str(error.value) and "does not start with" in str(error.value)


def test_a_corrupt_download_is_refused_and_not_cached(tmp_path, monkeypatch):
    weights = tv.get_model_weights("resnet18").IMAGENET1K_V1
    file_name = weights.url.rsplit("/", 1)[-1]
    server = _WeightsServer({file_name: b"not the published weights"})  # stands in for the internet
    monkeypatch.setenv(BASE_URL_ENV, server.url)
    try:
        with pytest.raises(PretrainedError, match="does not start with 'f37072fd'"):
            resolve("resnet18.IMAGENET1K_V1", model="resnet18", cache=str(tmp_path / "cache"))
    finally:
        server.close()
    assert not (tmp_path / "cache" / file_name).exists()


def _served_resnet18(monkeypatch, member="IMAGENET1K_V1"):
    """torchvision's resnet18 ``member`` pointed at a file made here, served by a loopback server that stands
    in for the internet; returns (server, file name, bytes)."""
    weights = tv.get_model_weights("resnet18")[member]
    file_name = weights.url.rsplit("/", 1)[-1]
    buffer = io.BytesIO()
    torch.save(_torchvision_state("resnet18"), buffer)
    data = buffer.getvalue()
    own_name = file_name.replace(_hash_prefix(file_name), hashlib.sha256(data).hexdigest()[:8])
    monkeypatch.setattr(weights.value, "url", weights.url.replace(file_name, own_name))
    server = _WeightsServer({own_name: data})
    monkeypatch.setenv(BASE_URL_ENV, server.url)
    return server, own_name, data


def test_hosts_other_than_process_0_never_fetch_they_wait_for_its_copy(tmp_path, monkeypatch):
    """Every host of a slice resolves --pretrained: process 0 (fetch=True) downloads once, the others
    (fetch=False) wait for its cached copy and read it; the server sees one request whatever the order."""
    server, own_name, data = _served_resnet18(monkeypatch)
    cache = str(tmp_path / "cache")
    others: list = []
    threads = [
        threading.Thread(
            target=lambda: others.append(
                resolve("IMAGENET1K_V1", model="resnet18", cache=cache, fetch=False, wait_seconds=300)
            )
        )
        for _ in range(3)
    ]
    try:
        for thread in threads:
            thread.start()
        primary = resolve("IMAGENET1K_V1", model="resnet18", cache=cache, fetch=True)
        for thread in threads:
            thread.join(timeout=300)
    finally:
        server.close()
    assert server.requests == [f"/{own_name}"]
    assert [r.sha256 for r in others] == [primary.sha256] * 3 == [hashlib.sha256(data).hexdigest()] * 3


def test_a_host_that_may_not_fetch_says_so_when_the_copy_never_comes(tmp_path, monkeypatch):
    server, _, _ = _served_resnet18(monkeypatch)
    try:
        with pytest.raises(PretrainedError) as error:
            resolve("IMAGENET1K_V1", model="resnet18", cache=str(tmp_path), fetch=False, wait_seconds=0)
    finally:
        server.close()
    assert server.requests == []
    message = str(error.value)
    assert "\n" not in message and "process 0 fetches" in message and "tpustream weights fetch" in message


def test_a_gcs_weights_cache_is_filled_once_and_read_after(gcs_bucket, monkeypatch):
    server, own_name, data = _served_resnet18(monkeypatch)
    cache = f"{gcs_bucket}/weights-cache"
    try:
        first = resolve("resnet18.IMAGENET1K_V1", model="resnet18", cache=cache)
        second = resolve("resnet18.IMAGENET1K_V1", model="resnet18", cache=cache, fetch=False)
    finally:
        server.close()
    assert server.requests == [f"/{own_name}"]
    assert (
        first.uri == second.uri == f"{cache}/{own_name}" and second.sha256 == hashlib.sha256(data).hexdigest()
    )
    loaded, _ = load_state_dict(second)
    assert set(loaded) == set(_torchvision_state("resnet18"))


def test_the_pipelines_resolve_step_fetches_the_models_default_set_or_leaves_random_init(
    tmp_path, monkeypatch
):
    """pipelines/training.py's `pretrained` default is MODEL_DEFAULT: the run's model's DEFAULT weights,
    fetched by the CPU step; a model without published weights (tiny) and "" start from random weights."""
    assert tv.get_model_weights("resnet18").DEFAULT is tv.get_model_weights("resnet18").IMAGENET1K_V1
    server, own_name, _ = _served_resnet18(monkeypatch)
    cache = str(tmp_path / "cache")
    try:
        assert resolve_ahead(MODEL_DEFAULT, model="tiny", cache=cache) == ""
        assert resolve_ahead("  ", model="resnet18", cache=cache) == ""
        assert server.requests == []
        assert resolve_ahead(MODEL_DEFAULT, model="resnet18", cache=cache) == MODEL_DEFAULT
        # the train step's hosts then resolve the same SPEC from the cache, fetching nothing
        on_host = resolve(MODEL_DEFAULT, model="resnet18", cache=cache, fetch=False)
    finally:
        server.close()
    assert server.requests == [f"/{own_name}"]
    assert on_host.name == "resnet18.IMAGENET1K_V1" and on_host.uri.endswith(own_name)
    with pytest.raises(PretrainedError, match="no published torchvision weights"):
        resolve_ahead("IMAGENET1K_V1", model="tiny", cache=cache)  # a name the user gave is never ignored


@pytest.mark.parametrize(
    "name",
    ["resnet50-11ad3fa6.pth", "foo-bar.pth", "vit_b_16-c867db91.pth", "a-b-c0ffee.pth", "plain.pth", "x-.pth",
     "my-weights-v2.safetensors", "conv-deadbeef.tar.pth"],
)  # fmt: skip
def test_the_hash_prefix_is_torch_hubs(name):
    from torch.hub import HASH_REGEX

    found = HASH_REGEX.search(name)
    assert _hash_prefix(name) == (found.group(1) if found else "")


def test_weights_fetch_stages_a_named_set_for_train(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from tpustream.cli.main import app

    server, own_name, data = _served_resnet18(monkeypatch)
    try:
        result = CliRunner().invoke(
            app, ["weights", "fetch", "resnet18.IMAGENET1K_V1", "--cache", str(tmp_path)]
        )
        again = CliRunner().invoke(
            app, ["weights", "fetch", "resnet18.IMAGENET1K_V1", "--cache", str(tmp_path)]
        )
        wrong = CliRunner().invoke(app, ["weights", "fetch", "nosuch.V1", "--cache", str(tmp_path)])
    finally:
        server.close()
    assert result.exit_code == 0 and again.exit_code == 0, result.output
    assert server.requests == [f"/{own_name}"]
    assert f"{tmp_path}/{own_name}" in result.output and hashlib.sha256(data).hexdigest() in result.output
    assert (tmp_path / own_name).read_bytes() == data
    assert wrong.exit_code == 2 and "give --model" in wrong.output
