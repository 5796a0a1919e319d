"""Write-time statistics and the sample index: per-split stats in the manifest, one index line per sample
(content sha256, header size, format, source file), skip reasons, rejected rows, parallel loads."""

import hashlib
import json
import logging
import os
import shutil
import threading
import time

import numpy as np
import pytest
from PIL import Image

from tpustream.artifacts import Manifest, SizeSummary
from tpustream.dataset import shard_writer
from tpustream.dataset import write as shards
from tpustream.dataset.manifest import (
    ShardError,
    has_sample_index,
    iter_sample_index,
    read_manifest,
    verify_shards,
)
from tpustream.dataset.plan import ShardConfig
from tpustream.dataset.tario import iter_tar_samples
from tpustream.image.codec import CorruptImage, UnreadableImage, check_pixels, encode_ppm, prepare_image_bytes
from tpustream.sources.dispatch import open_source
from tpustream.sources.types import Item, Rejected, Source


def _image(path, width, height, seed, fmt=None):
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format=fmt)


def _create(source, output, **kw):
    kw.setdefault("num_shards", 2)
    return shards.create_shards(ShardConfig(source=str(source), output=str(output), **kw), progress=False)


def test_manifest_stats_and_index_describe_every_sample(tmp_path):
    root = tmp_path / "img"
    sizes = {"cat": [(40, 30), (41, 30), (50, 60)], "dog": [(20, 20), (64, 48), (33, 17)]}
    for name, dims in sizes.items():
        for i, (w, h) in enumerate(dims):
            _image(root / "train" / name / f"{i}.png", w, h, seed=10 * len(name) + i)
        _image(root / "val" / name / "v.jpg", 100, 80, seed=len(name), fmt="JPEG")
    manifest, _ = _create(root, tmp_path / "ds")

    train, val = manifest.splits["train"], manifest.splits["val"]
    assert train.stats.formats == {"png": 6} and val.stats.formats == {"jpg": 2}
    # widths 20 33 40 41 50 64, heights 17 20 30 30 48 60, shorter sides 17 20 30 30 48 50: lower medians
    assert train.stats.width == SizeSummary(min=20, median=40, max=64)
    assert train.stats.height == SizeSummary(min=17, median=30, max=60)
    assert train.stats.short_side == SizeSummary(min=17, median=30, max=50)
    assert val.stats.short_side == SizeSummary(min=80, median=80, max=80)
    assert has_sample_index(manifest)

    out = tmp_path / "ds"
    for split in ("train", "val"):
        entries = list(iter_sample_index(str(out), manifest, split))
        assert len(entries) == manifest.num_samples(split)
        for shard in manifest.splits[split].shards:
            index = (out / shard.sample_index).read_bytes()
            assert shard.sample_index_sha256 == hashlib.sha256(index).hexdigest()
            with open(out / shard.path, "rb") as f:
                samples = list(iter_tar_samples(f))
            lines = [json.loads(line) for line in index.decode().splitlines()]
            assert [line["key"] for line in lines] == [key for key, _ in samples]  # same order as the tar
            for line, (_, fields) in zip(lines, samples, strict=True):
                data = fields[line["format"]]
                assert line["sha256"] == hashlib.sha256(data).hexdigest()
                assert Image.open(out / line["source"]).size == (line["width"], line["height"])
                assert (out / line["source"]).read_bytes() == data  # the file the sample came from
                assert line["class"] == manifest.classes[int(fields["cls"])]
    assert sorted(os.listdir(out / "index")) == [
        "train-000000.jsonl",
        "train-000001.jsonl",
        "val-000000.jsonl",
    ]
    assert verify_shards(str(out), progress=False)[1] == []


def test_verify_finds_a_changed_or_missing_index(tmp_path):
    root = tmp_path / "img"
    for i in range(8):
        _image(root / ("a" if i % 2 else "b") / f"{i}.png", 8, 8, seed=i)
    manifest, _ = _create(root, tmp_path / "ds", val_fraction=0.25)
    out = tmp_path / "ds"
    first, second = (s.sample_index for s in manifest.splits["train"].shards)
    (out / first).write_bytes((out / first).read_bytes().replace(b'"width":8', b'"width":9', 1))
    os.unlink(out / second)
    _, problems = verify_shards(str(out), progress=False)
    assert len(problems) == 2
    assert "sample index index/train-000000.jsonl: sha256 differs" in problems[0]
    assert "sample index index/train-000001.jsonl missing" in problems[1]
    with pytest.raises(ShardError, match="index/train-000001.jsonl listed in the manifest is missing"):
        list(iter_sample_index(str(out), manifest, "train"))


def test_skip_reasons_are_counted_and_messages_name_the_file(tmp_path):
    root = tmp_path / "img"
    for i in range(6):
        _image(root / "cat" / f"{i}.png", 16, 16, seed=i)
        _image(root / "dog" / f"{i}.png", 16, 16, seed=100 + i)
    (root / "cat" / "garbage.jpg").write_bytes(b"this is no jpeg")
    (root / "dog" / "cut.png").write_bytes((root / "dog" / "0.png").read_bytes()[:60])
    _image(root / "dog" / "huge.png", 64, 64, seed=7)  # over the 1,024-pixel budget below
    manifest, summary = _create(root, tmp_path / "ds", max_pixels=1024)
    skipped = manifest.skipped
    assert skipped.count == 3 and summary.skipped == 3
    assert skipped.by_reason == {"too-large": 1, "undecodable": 2}
    names = {os.path.basename(e.split(":")[0]) for e in skipped.examples}
    assert names == {"garbage.jpg", "cut.png", "huge.png"}
    assert not any("BytesIO" in e for e in skipped.examples)  # PIL's "cannot identify <_io.BytesIO ...>"


def _memory_source(count=12, *, classes=("a", "b"), fail=None, rejected=(), locator=None, loader=None):
    """Items made in memory: 8x8 PPMs, one distinct image each; ``fail(item)`` may raise instead."""

    def load(item, max_side):
        if fail is not None:
            fail(item)
        return encode_ppm(np.full((8, 8, 3), int(item.ref), dtype=np.uint8)), "ppm"

    items = [Item(i, i % len(classes)) for i in range(count)]
    return Source(
        "memory", "test", list(classes), items, loader or load, rejected=list(rejected), locator=locator
    )


def test_missing_objects_and_rejected_rows_reach_the_manifest(tmp_path):
    def fail(item):
        if item.ref == 3:
            raise UnreadableImage(f"gs://b/img/{item.ref}.jpg: cannot read (404 No such object)")

    rejected = [
        Rejected("gs://b/labels.jsonl:7", "empty-label", "no label in the row"),
        Rejected("gs://b/labels.jsonl:9", "malformed-row", "gs://b/labels.jsonl:9: not JSON"),
    ]
    source = _memory_source(fail=fail, rejected=rejected)
    manifest, summary = shards.create_shards(
        ShardConfig(source="memory", output=str(tmp_path / "ds"), num_shards=2), progress=False, source=source
    )
    skipped = manifest.skipped
    assert skipped.count == 3 and skipped.rejected_rows == 2 and skipped.sample_slots == 1
    assert skipped.by_reason == {"malformed-row": 1, "empty-label": 1, "missing-object": 1}
    assert skipped.examples == [
        "gs://b/img/3.jpg: cannot read (404 No such object)",
        "gs://b/labels.jsonl:7: no label in the row",
        "gs://b/labels.jsonl:9: not JSON",
    ]
    assert summary.skipped == 3


def test_strict_refuses_rejected_rows_before_writing(tmp_path):
    rejected = [Rejected("gs://b/labels.csv:4", "conflicting-labels", "also listed as 'dog' at line 2")]
    with pytest.raises(ShardError) as error:
        shards.create_shards(
            ShardConfig(source="memory", output=str(tmp_path / "ds"), num_shards=2, strict=True),
            progress=False,
            source=_memory_source(rejected=rejected),
        )
    message = str(error.value)
    assert "\n" not in message and "gs://b/labels.csv:4" in message and "conflicting-labels" in message
    assert not (tmp_path / "ds").exists()  # stopped before anything was written


def test_a_class_missing_from_a_split_is_named_at_create(tmp_path, caplog):
    root = tmp_path / "img"
    for c, name in enumerate(("cat", "dog", "fox")):
        for i in range(4):
            _image(root / "train" / name / f"{i}.png", 8, 8, seed=10 * c + i)
    for name in ("cat", "dog"):
        _image(root / "val" / name / "v.png", 8, 8, seed=len(name) + 500)
    with caplog.at_level(logging.WARNING, logger="tpustream.dataset.finalize"):
        manifest, _ = _create(root, tmp_path / "ds")
    assert manifest.splits["val"].class_counts == [1, 1, 0]
    assert any("fox" in r.getMessage() and "0 val samples" in r.getMessage() for r in caplog.records)


def test_overwrite_and_resume_keep_the_index_in_step_with_the_shards(tmp_path):
    root = tmp_path / "img"
    for i in range(40):
        _image(root / ("a" if i % 2 else "b") / f"{i}.png", 8, 8, seed=i)
    out = tmp_path / "ds"
    _create(root, out, num_shards=5)
    assert len(os.listdir(out / "index")) == 6  # 5 train + 1 val
    manifest, _ = _create(root, out, num_shards=2, overwrite=True)
    assert sorted(os.listdir(out / "index")) == [
        "train-000000.jsonl",
        "train-000001.jsonl",
        "val-000000.jsonl",
    ]
    assert verify_shards(str(out), progress=False)[1] == []

    # A shard whose index vanished before the manifest was written is written again, with its index.
    resumed = tmp_path / "resumed"
    calls = {"n": 0}
    source = open_source(str(root))
    real = source.loader

    def crash_after_20(item, max_side):
        calls["n"] += 1
        if calls["n"] > 20:
            raise RuntimeError("power cut")
        return real(item, max_side)

    source.loader = crash_after_20
    config = ShardConfig(source=str(root), output=str(resumed), num_shards=4)
    with pytest.raises(RuntimeError, match="power cut"):
        shards.create_shards(config, progress=False, source=source)
    finished = sorted(os.listdir(resumed / "index"))
    assert finished and not (resumed / "manifest.json").exists()
    os.unlink(resumed / "index" / finished[0])
    manifest, summary = shards.create_shards(config, progress=False)
    assert summary.reused_shards == len(finished) - 1
    assert verify_shards(str(resumed), progress=False)[1] == []
    assert (
        sum(1 for split in ("train", "val") for _ in iter_sample_index(str(resumed), manifest, split)) == 40
    )


def test_a_dataset_written_before_the_index_still_loads_and_verifies(tmp_path):
    root = tmp_path / "img"
    for i in range(10):
        _image(root / ("a" if i % 2 else "b") / f"{i}.png", 8, 8, seed=i)
    out = tmp_path / "ds"
    manifest, _ = _create(root, out)
    old = manifest.to_json()
    for split in old["splits"].values():  # what an earlier tpustream wrote: none of the new fields
        split.pop("stats")
        for shard in split["shards"]:
            shard.pop("sample_index"), shard.pop("sample_index_sha256")
    old["skipped"] = {"count": 0, "sample_slots": 0, "examples": []}
    (out / "manifest.json").write_text(json.dumps(old))
    shutil.rmtree(out / "index")
    assert read_manifest(str(out)) == old and not has_sample_index(Manifest.from_json(old))
    assert verify_shards(str(out), progress=False)[1] == []
    assert Manifest.from_json(old).skipped.by_reason == {}


def test_objects_on_gcs_load_in_parallel_in_plan_order_with_the_pixel_budget(tmp_path):
    """Items located on GCS are fetched LOAD_WINDOW at a time on threads; the shard keeps the plan's order,
    skips stay skips, and the pixel budget (a ContextVar) holds inside the loading threads."""
    lock = threading.Lock()
    state = {"running": 0, "most": 0}

    def load(item, max_side):
        with lock:
            state["running"] += 1
            state["most"] = max(state["most"], state["running"])
        try:
            time.sleep(0.02)  # a GET's latency
            if item.ref % 7 == 3:
                raise CorruptImage(f"gs://b/{item.ref}.jpg: cannot decode image (truncated)")
            check_pixels(8, 8, None, f"gs://b/{item.ref}.jpg")  # the budget in force in this thread
            return encode_ppm(np.full((8, 8, 3), item.ref, dtype=np.uint8)), "ppm"
        finally:
            with lock:
                state["running"] -= 1

    source = _memory_source(40, loader=load, locator=lambda item: f"gs://b/{item.ref}.jpg")
    config = ShardConfig(source="memory", output=str(tmp_path / "ds"), num_shards=1, val_fraction=0.0)
    manifest, _ = shards.create_shards(config, progress=False, source=source)
    assert 1 < state["most"] <= shard_writer.LOAD_WINDOW
    (shard,) = manifest.splits["train"].shards
    with open(tmp_path / "ds" / shard.path, "rb") as f:
        written = [int(fields["ppm"][-1]) for _, fields in iter_tar_samples(f)]
    plan = shards.plan_dataset(source, config)
    expected = [source.items[i].ref for i in plan.shards[0].items if source.items[i].ref % 7 != 3]
    assert written == expected  # the plan's order, the bad ones left out
    assert manifest.skipped.by_reason == {"undecodable": 6}
    entries = list(iter_sample_index(str(tmp_path / "ds"), manifest, "train"))
    assert [e.source for e in entries] == [f"gs://b/{ref}.jpg" for ref in expected]

    # 8x8 = 64 px is over a 63-pixel budget: refused inside the loading threads too
    state["most"] = 0
    with pytest.raises(ValueError, match="max-pixels must be at least 64"):
        ShardConfig(source="memory", output="/unused", max_pixels=63)
    small = ShardConfig(source="memory", output=str(tmp_path / "small"), num_shards=1, val_fraction=0.0)
    spec = shards.plan_dataset(source, small).shards[0]
    record = shard_writer.write_shard(
        source, spec, str(tmp_path / "small"), max_side=None, strict=False, max_pixels=63
    )
    assert record.num_samples == 0 and set(record.skipped_reasons) == {"too-large", "undecodable"}


def test_the_hash_of_every_sample_whichever_path_made_it(tmp_path, monkeypatch):
    """One shard of 700 images: 32x32 PPMs (hashed 256 at a time in the writer's reused buffer, the rest at
    the end), with PNGs and 40x30 PPMs (hashed as loaded) and JPEGs of four sizes among them (their check's
    grey drafts hashed together, by size, but the largest, hashed as loaded): each index line holds
    the hash of the bytes written (phash.perceptual_hash_bytes), in order, whatever batch it was in."""
    import io

    from tpustream.dataset.manifest import SampleIndexEntry, index_path
    from tpustream.dataset.plan import ShardSpec
    from tpustream.image.phash import perceptual_hash_bytes
    from tpustream.sources.builtin import synthetic_cifar_image

    def encoded(i: int) -> tuple[bytes, str]:
        pixels = synthetic_cifar_image(i, i % 10)
        if i % 97 == 5:
            out = io.BytesIO()
            Image.fromarray(pixels).save(out, format="PNG")
            return out.getvalue(), "png"
        if i % 97 == 6:  # drafted to 30x23, 28x28, 63x47 and 125x94 grey by the check
            out = io.BytesIO()
            size = ((120, 90), (224, 224), (500, 375), (1000, 750))[i // 97 % 4]
            Image.fromarray(pixels).resize(size).save(out, format="JPEG")
            return out.getvalue(), "jpg"
        if i % 97 == 7:
            return encode_ppm(np.asarray(Image.fromarray(pixels).resize((40, 30)))), "ppm"
        return encode_ppm(pixels), "ppm"

    count = 700
    images = [encoded(i) for i in range(count)]
    spec = ShardSpec("train", 0, tuple(f"{i:06d}" for i in range(count)), tuple(range(count)), "t")
    expected = [f"{perceptual_hash_bytes(data):016x}" for data, _ in images]
    loaders = {
        "as-made": lambda item, _: images[int(item.ref)],  # hashed from the bytes (a source's own PPMs)
        # checked as an ImageFolder's files are: hashed from the check's decode
        "checked": lambda item, _: prepare_image_bytes(*images[int(item.ref)], None, f"image {item.ref}"),
    }
    monkeypatch.setattr(shard_writer, "_DRAFT_BATCH", 4)  # the 6 small drafts: 4 together, 2 at the end
    for name, loader in loaders.items():
        source = Source("test:mixed", "", ["a"], [Item(i, 0) for i in range(count)], loader)
        shard_writer.write_shard(source, spec, str(tmp_path / name), max_side=None, strict=True)
        lines = (tmp_path / name / index_path(spec.path)).read_text().splitlines()
        entries = [SampleIndexEntry.from_json_line(line) for line in lines]
        assert [e.key for e in entries] == list(spec.keys)
        assert {e.format for e in entries} == {"ppm", "png", "jpg"}
        assert [e.phash for e in entries] == expected, name
    unhashed = tmp_path / "off"
    shard_writer.write_shard(source, spec, str(unhashed), max_side=None, strict=True, perceptual_hashes=False)
    lines = (unhashed / index_path(spec.path)).read_text().splitlines()
    assert all(SampleIndexEntry.from_json_line(line).phash is None for line in lines)
