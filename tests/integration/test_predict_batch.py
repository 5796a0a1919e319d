"""`tpustream predict --output`: a directory and a gs:// prefix of mixed image formats and junk files to JSON
lines in parts (on gs:// and locally), every file left out counted by reason, an interrupted or killed run
resumed with only its missing parts, and a complete output left alone unless --overwrite.

Real parts: the CLI, the GCS-API test server (fake-gcs-server), forked decode workers, a subprocess killed
with SIGKILL, a tiny model trained here on the digits, and the serving Classifier as the reference answers.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.common.models import make_model
from tests.fakes.gcs import FaultProxy, make_bucket
from tpustream.cli.main import app
from tpustream.dataset import write as shards
from tpustream.dataset.plan import ShardConfig
from tpustream.serve import predict
from tpustream.storage import io as storage

pytestmark = pytest.mark.integration

# Every format `shards create` accepts, each image of the folder in the next one.
FORMATS = ("jpg", "jpeg", "png", "ppm", "webp", "bmp", "tiff", "tif", "gif")
PER_CLASS = 6
IMAGES = 10 * PER_CLASS
MAX_PIXELS = "4000000"  # huge.png (3000x3000) is over it
JUNK = {"notes.txt": "not-an-image", "3/README": "not-an-image"}
REFUSED = {"7/corrupt.jpg": "undecodable", "5/truncated.jpg": "undecodable", "huge.png": "too-large"}
SKIPPED = "5 skipped (2 not-an-image, 1 too-large, 2 undecodable)"
runner = CliRunner()


def _mixed_folder(root: Path) -> Path:
    """An ImageFolder of the digits (32x32 RGB) in every format in turn, and JUNK and REFUSED beside them."""
    from PIL import Image
    from sklearn.datasets import load_digits

    data = load_digits()
    counts = dict.fromkeys(range(10), 0)
    for image, label in zip(data.images, data.target, strict=True):
        if counts[int(label)] == PER_CLASS:
            continue
        ext = FORMATS[sum(counts.values()) % len(FORMATS)]
        counts[int(label)] += 1
        pixels = np.kron((image * 255 / 16).astype(np.uint8), np.ones((4, 4), np.uint8))
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).convert("RGB").save(folder / f"{counts[int(label)]:02d}.{ext}")
    (root / "notes.txt").write_text("not an image")
    (root / "3" / "README").write_text("not an image either")
    (root / "7" / "corrupt.jpg").write_bytes(b"this is no JPEG")
    jpeg = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), np.uint8)).save(jpeg, "JPEG")
    (root / "5" / "truncated.jpg").write_bytes(jpeg.getvalue()[: len(jpeg.getvalue()) // 3])
    Image.new("L", (3000, 3000)).save(root / "huge.png")
    return root


@pytest.fixture(scope="module")
def world(gcs_server, tmp_path_factory):
    """A tiny model trained on the digits, and the mixed folder as a local directory and as a gs:// prefix."""
    tmp = tmp_path_factory.mktemp("predict-batch")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
        make_bucket(gcs_server.url, "predict")
        digits = str(tmp / "digits")
        shards.create_shards(ShardConfig(source="digits", output=digits, num_shards=2), progress=False)
        model = make_model(tmp / "model", digits, seed=3, steps=15)
        folder = _mixed_folder(tmp / "images")
        prefix = "gs://predict/images"
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                storage.upload_file(str(path), f"{prefix}/{path.relative_to(folder)}")
        yield types.SimpleNamespace(model=model, folder=str(folder), prefix=prefix)


@pytest.fixture(autouse=True)
def _emulator(gcs_server, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)


def _predict(world, *args: str):
    return runner.invoke(app, ["predict", "--model", world.model, *args])


def _results(output: str) -> list[dict]:
    """Every line of a complete output's parts, in order, checked against its _SUCCESS."""
    summary = predict.read_summary(output)
    assert summary is not None, f"{output} is not complete"
    lines = []
    for part in summary.parts:
        part_lines = storage.read_bytes(storage.join(output, part["path"])).decode().splitlines()
        assert len(part_lines) == part["num_results"]
        lines += [json.loads(line) for line in part_lines]
    return lines


def _images(root: str) -> list[str]:
    """The files under ``root`` predict answers or refuses, in listing order (not the junk)."""
    rels = [str(p.relative_to(root)) for p in Path(root).rglob("*") if p.is_file()]
    return [f"{root}/{rel}" for rel in sorted(rels) if rel not in JUNK]


_ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # Pillow names the BytesIO object of an unidentified image


def _relative(line: dict, root: str) -> dict:
    """A result with its input relative to ``root`` and its error message without object addresses."""
    relative = {**line, "input": line["input"][len(root) + 1 :]}
    if "error" in line:
        relative["error"] = _ADDRESS.sub("", line["error"].replace(root + "/", ""))
    return relative


def _reference(model: str, uris: list[str]) -> list[dict]:
    """The serving classifier's answers for these images, all in one request."""
    from tpustream.serve.classifier import Classifier
    from tpustream.serve.settings import Limits

    classifier = Classifier(model, limits=Limits(max_pixels=int(MAX_PIXELS), top_k=3))
    prepared = [classifier.prepare(storage.read_bytes(uri), uri) for uri in uris]
    return classifier.classify(classifier.pixels(prepared), 3)


def _live_members(group: int) -> list[int]:
    """Processes of a process group that are still running (zombies waiting to be reaped do not count)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError):
            continue
        if int(pgrp) == group and state != "Z":
            live.append(int(stat.parent.name))
    return live


def test_a_directory_and_a_prefix_of_mixed_formats_to_json_lines(world, tmp_path):
    # a local directory -> parts on gs://, decoded by two workers
    out_gcs = "gs://predict/from-directory"
    options = f"--output {out_gcs} --part-size 16 --max-pixels {MAX_PIXELS} --workers 2"
    result = _predict(world, world.folder, *options.split())
    assert result.exit_code == 1, result.output  # three images could not be classified
    summary_line = result.output.strip().splitlines()[-1].strip()  # after a progress bar: its \r residue
    assert summary_line.startswith(f"{IMAGES + 5} inputs: {IMAGES} answered, {SKIPPED}; "), summary_line
    assert f"-> {out_gcs}/predictions-*.jsonl (4 parts, 0 kept from an earlier run; " in summary_line
    summary = predict.read_summary(out_gcs)
    assert summary is not None and summary.failed == 3 and summary.answered == IMAGES
    assert summary.skipped == {"not-an-image": 2, "too-large": 1, "undecodable": 2}
    assert summary.skipped_examples == {"not-an-image": [f"{world.folder}/{name}" for name in sorted(JUNK)]}
    assert [part["path"] for part in summary.parts] == [f"predictions-0000{i}.jsonl" for i in range(4)]
    lines = _results(out_gcs)
    assert [line["input"] for line in lines] == _images(world.folder)  # each image once, in listing order
    refused = {line["input"][len(world.folder) + 1 :]: line["reason"] for line in lines if "error" in line}
    assert refused == REFUSED
    answered = [line for line in lines if "error" not in line]
    assert {line["input"].rsplit(".", 1)[1] for line in answered} == set(FORMATS)  # WebP, BMP, TIFF... too
    assert all(line["true_class"] == line["input"].rsplit("/", 2)[1] for line in answered)
    # the answers the serving classifier gives the same files in one request
    reference = _reference(world.model, [line["input"] for line in answered])
    for line, expected in zip(answered, reference, strict=True):
        assert line["classes"] == expected["classes"] and line["class_indices"] == expected["class_indices"]
        assert line["probabilities"] == pytest.approx(expected["probabilities"], abs=1e-5)

    # the same files under a gs:// prefix -> parts in a local directory, decoded in this process
    out_local = tmp_path / "from-prefix"
    options = f"--output {out_local} --part-size 16 --max-pixels {MAX_PIXELS} --workers 0"
    result = _predict(world, world.prefix, *options.split())
    assert result.exit_code == 1, result.output
    assert f"{IMAGES + 5} inputs: {IMAGES} answered, {SKIPPED}" in result.output
    assert sorted(p.name for p in out_local.iterdir()) == [
        "_SUCCESS",
        "_parts",
        *(f"predictions-0000{i}.jsonl" for i in range(4)),
    ]
    from_prefix = _results(str(out_local))
    assert [_relative(line, world.prefix) for line in from_prefix] == [
        _relative(line, world.folder) for line in lines
    ]
    # and without --output, --json prints these very lines; the skips are counted on stderr
    printed = _predict(world, world.prefix, "--json", "--max-pixels", MAX_PIXELS, "--workers", "1")
    assert printed.exit_code == 1, printed.output
    # stdout and stderr come mixed: a progress bar may appear (a slow run) and leave \r-separated fragments
    out = [line.strip() for line in printed.output.splitlines()]
    printed_json = [json.loads(line) for line in out if line.startswith("{")]
    assert [_relative(line, world.prefix) for line in printed_json] == [
        _relative(line, world.prefix) for line in from_prefix
    ]
    counted = f"skipped 5 of {IMAGES + 5} inputs: 2 not-an-image, 1 too-large, 2 undecodable"
    assert [line for line in out if line.startswith("skipped ")][-1].startswith(counted)


def test_a_file_that_is_not_an_image_is_counted_the_same_named_or_in_a_folder(world):
    """Named on the command line, the folder's junk is ``not-an-image`` as it is when the folder is listed, not
    decoded and counted ``undecodable`` (issue 42); a named broken .jpg is still ``undecodable``."""
    named = [f"{world.folder}/{name}" for name in (*sorted(JUNK), "7/corrupt.jpg", "0/01.jpg")]
    printed = _predict(world, *named, "--json", "--workers", "0")
    assert printed.exit_code == 1, printed.output  # corrupt.jpg could not be classified
    out = [line.strip() for line in printed.output.splitlines()]
    assert [json.loads(line)["input"] for line in out if line.startswith("{")] == named[-2:]
    counted = [line for line in out if line.startswith("skipped ")][-1]
    assert counted.startswith("skipped 3 of 4 inputs: 2 not-an-image, 1 undecodable"), counted


def _predict_process(world, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`tpustream predict` in a fresh process: the same interpreter, environment and torch thread count as the
    killed run, so that its probabilities are computed the same way to the last bit (an in-process run
    inherits whatever thread settings earlier tests left, and conv sums in another order differ in the 6th
    decimal)."""
    command = [sys.executable, "-m", "tpustream.cli", "predict", "--model", world.model, *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def test_a_killed_run_resumes_with_only_its_missing_parts(world, gcs_server, tmp_path):
    output = "gs://predict/killed"
    options = f"--output {output} --part-size 2 --batch-size 1 --max-pixels {MAX_PIXELS} --workers 1"
    args = [world.folder, *options.split()]
    parts = -(-(IMAGES + len(REFUSED)) // 2)
    env = {**os.environ, "STORAGE_EMULATOR_HOST": gcs_server.url}
    with open(tmp_path / "killed.log", "wb") as log:  # the process writes to its own copy
        killed = subprocess.Popen(
            [sys.executable, "-m", "tpustream.cli", "predict", "--model", world.model, *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,  # its own process group: its decode worker can be found after it
        )
    deadline = time.monotonic() + 120
    while not storage.exists(f"{output}/_parts/00001.json"):  # two parts written: kill it
        assert killed.poll() is None, (tmp_path / "killed.log").read_text()
        assert time.monotonic() < deadline, "no part written in 120 s"
        time.sleep(0.01)
    killed.kill()
    killed.wait()
    deadline = time.monotonic() + 10
    while _live_members(killed.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    orphans = _live_members(killed.pid)
    for pid in orphans:  # not left running when the check below fails
        os.kill(pid, signal.SIGKILL)
    assert not orphans, "the decode worker outlived the killed run"
    left = {obj.uri: obj.version for obj in storage.list_objects(output)}
    records = [uri for uri in left if "/_parts/" in uri]
    assert f"{output}/_SUCCESS" not in left and 2 <= len(records) < parts, sorted(left)

    resumed = _predict_process(world, env, *args)
    said = resumed.stdout + resumed.stderr
    assert resumed.returncode == 1, said
    assert f"{IMAGES + 5} inputs: {IMAGES} answered, {SKIPPED}" in said
    assert f"({parts} parts, {len(records)} kept from an earlier run; " in said
    now = {obj.uri: obj.version for obj in storage.list_objects(output)}
    for record in records:  # the kept parts, and their records, were not written again
        jsonl = f"{output}/predictions-{record.rsplit('/', 1)[1][:-5]}.jsonl"
        assert now[record] == left[record] and now[jsonl] == left[jsonl]
    # the same output, to the last digit, as one uninterrupted run computed the same way
    clean = "gs://predict/uninterrupted"
    uninterrupted = _predict_process(world, env, *[clean if arg == output else arg for arg in args])
    assert uninterrupted.returncode == 1, uninterrupted.stdout + uninterrupted.stderr
    assert [_relative(line, world.folder) for line in _results(output)] == [
        _relative(line, world.folder) for line in _results(clean)
    ]


def test_an_interrupted_run_inside_the_prefix_it_predicts_resumes(world, monkeypatch):
    output = f"{world.prefix}/predictions"  # inside the prefix: its own files are not inputs
    options = f"--output {output} --part-size 20 --max-pixels {MAX_PIXELS} --workers 2"
    args = [world.prefix, *options.split()]
    write_bytes = storage.write_bytes
    records: list[str] = []

    def interrupted_at_the_third_record(uri: str, data: bytes, **kwargs) -> None:
        if "/_parts/" in uri:
            if len(records) == 2:
                raise KeyboardInterrupt  # Ctrl-C
            records.append(uri)
        write_bytes(uri, data, **kwargs)

    monkeypatch.setattr(storage, "write_bytes", interrupted_at_the_third_record)
    interrupted = _predict(world, *args)
    assert interrupted.exit_code == 130, interrupted.output  # as a shell reports Ctrl-C
    monkeypatch.setattr(storage, "write_bytes", write_bytes)
    assert not storage.exists(f"{output}/_SUCCESS") and storage.exists(f"{output}/predictions-00002.jsonl")
    resumed = _predict(world, *args)
    assert resumed.exit_code == 1, resumed.output
    assert f"{IMAGES + 5} inputs: {IMAGES} answered, {SKIPPED}" in resumed.output  # none of its own files
    assert "(4 parts, 2 kept from an earlier run; " in resumed.output


def test_a_complete_output_is_left_alone_unless_overwrite(world):
    output = "gs://predict/complete"
    args = [world.folder, "--output", output, "--limit", "20", "--part-size", "8", "--workers", "0"]
    first = _predict(world, *args)
    assert first.exit_code == 0, first.output  # the first 20 images all decode
    assert "20 inputs: 20 answered, 0 skipped (none)" in first.output and "(3 parts, 0 kept" in first.output
    written = {obj.uri: obj.version for obj in storage.list_objects(output)}
    assert len(written) == 7  # 3 parts, 3 records, _SUCCESS

    again = _predict(world, *args)
    assert again.exit_code == 0, again.output
    assert f"{output} is already complete (20 answered, 0 skipped, 3 parts): nothing to do" in again.output
    assert {obj.uri: obj.version for obj in storage.list_objects(output)} == written

    other = _predict(world, *args, "--top-k", "2")
    assert other.exit_code == 2
    assert "already holds the complete predictions of another request (top_k 3 then, 2 now)" in other.output
    assert "--overwrite" in other.output

    smaller = _predict(world, *[arg if arg != "20" else "10" for arg in args], "--overwrite")
    assert smaller.exit_code == 0, smaller.output
    assert "10 inputs: 10 answered" in smaller.output and "(2 parts, 0 kept" in smaller.output
    names = sorted(obj.uri[len(output) + 1 :] for obj in storage.list_objects(output))
    assert names == ["_SUCCESS", "_parts/00000.json", "_parts/00001.json", *_jsonl(2)]  # stale part 2 removed
    assert all(len(line["classes"]) == 3 for line in _results(output))

    storage.write_bytes(f"{output}/notes.txt", b"mine")
    foreign = _predict(world, *args)
    assert (
        foreign.exit_code == 2 and "holds file(s) that are not predictions (e.g. notes.txt)" in foreign.output
    )
    both = _predict(world, *args, "--json")
    assert both.exit_code == 2 and "give one of them" in both.output


def test_an_output_prefix_is_listed_only_as_far_as_its_own_files(world, gcs_server, monkeypatch):
    """``--output gs://…`` lists what its own files can be (its top level, ``_parts/``) and at most one object
    more (issue 43, item 6): a prefix full of other objects is refused after that, not paged through, and a
    file in a sub-folder of a complete output is still found. Counted by the objects the GCS API's list
    answers carry, through a proxy in front of the GCS-API server."""
    from urllib.parse import parse_qs, urlsplit

    proxy = FaultProxy(gcs_server.url, fault_rate=0.0)
    listed: dict[str, list[str]] = {}  # prefix asked for -> the object names answered

    def count(method: str, path: str, body: bytes) -> bytes:
        parts = urlsplit(path)
        if method == "GET" and re.fullmatch(r"/storage/v1/b/[^/]+/o", parts.path):
            prefix = parse_qs(parts.query).get("prefix", [""])[0]
            listed.setdefault(prefix, []).extend(item["name"] for item in json.loads(body).get("items", []))
        return body

    proxy.rewrite = count
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    try:
        for i in range(30):
            storage.write_bytes(f"gs://predict/unrelated/logs/{i:02d}.txt", b"not a prediction")
        listed.clear()
        refused = _predict(world, world.folder, "--output", "gs://predict/unrelated", "--workers", "0")
        answered = [
            name for prefix, names in listed.items() if prefix.startswith("unrelated/") for name in names
        ]
        assert answered == ["unrelated/logs/00.txt"]  # not the 30
        assert refused.exit_code == 2
        assert "holds file(s) that are not predictions (e.g. logs/00.txt)" in refused.output

        output = "gs://predict/listed"
        args = [world.folder, "--output", output, "--limit", "20", "--part-size", "8", "--workers", "0"]
        assert _predict(world, *args).exit_code == 0
        listed.clear()
        again = _predict(world, *args)
        assert again.exit_code == 0 and "is already complete" in again.output
        assert {name for names in listed.values() for name in names} <= {
            f"listed/{name}" for name in ["_SUCCESS", "_parts/00000.json", "_parts/00001.json",
                                          "_parts/00002.json", *_jsonl(3)]}  # fmt: skip
        storage.write_bytes(f"{output}/extra/notes.txt", b"mine")
        nested = _predict(world, *args)
        assert nested.exit_code == 2 and "not predictions (e.g. extra/notes.txt)" in nested.output
    finally:
        proxy.close()


def _jsonl(count: int) -> list[str]:
    return [f"predictions-{i:05d}.jsonl" for i in range(count)]


def test_a_top_k_over_the_class_count_is_said_not_capped_quietly(world, caplog):
    with caplog.at_level("WARNING", logger="tpustream"):
        said = _predict(world, world.folder, "--limit", "2", "--top-k", "12", "--workers", "0")
    assert said.exit_code == 0, said.output
    assert "--top-k 12: the model has 10 classes, so each answer lists all 10" in caplog.text
