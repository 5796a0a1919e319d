"""Vertex AI import files (JSONL, CSV) as a SOURCE, on local files: parsing, rejected rows, splits, loading."""

import json
import os
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.common.sources import import_row as _row
from tests.common.sources import noise_jpeg as _jpeg
from tpustream.dataset import fingerprint
from tpustream.dataset.plan import ShardConfig, plan_dataset
from tpustream.image.codec import CorruptImage, UnreadableImage
from tpustream.sources.dispatch import open_source, source_kind
from tpustream.sources.import_files import import_file_objects, import_files_source
from tpustream.sources.types import SKIP_REASONS, Item, Source, SourceError
from tpustream.storage import io as storage


def _images(directory, count: int) -> list[str]:
    """``count`` small JPEGs flat in ``directory`` (no class folders), their paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i in range(count):
        path = os.path.join(directory, f"IMG_{i:04d}.jpg")
        with open(path, "wb") as f:
            f.write(_jpeg(i))
        paths.append(str(path))
    return paths


def _write(path, lines: list[str]) -> str:
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


def test_jsonl_rows_become_items_with_splits_and_sorted_classes(tmp_path):
    images = _images(tmp_path / "raw", 6)
    spec = _write(
        tmp_path / "labels.jsonl",
        [
            _row(images[5], "tulip", "training"),
            _row(images[0], "daisy", "TRAINING"),
            _row(images[1], "daisy", "validation"),
            "",  # a blank line is not a row
            _row(images[2], "rose", "test"),
            _row(images[3], "rose"),
            _row(images[4], "tulip", "unassigned"),
        ],
    )
    assert source_kind(spec) == "import-files"
    source = open_source(spec)
    assert source.classes == ["daisy", "rose", "tulip"]
    assert [item.ref for item in source.items] == sorted(images)  # sorted by URI, not row order
    by_ref = {item.ref: item for item in source.items}
    assert (by_ref[images[0]].label, by_ref[images[0]].split) == (0, "train")
    assert by_ref[images[1]].split == "val" and by_ref[images[2]].split == "test"  # test is its own split
    assert by_ref[images[3]].split is None and by_ref[images[4]].split is None
    assert source.rejected == []
    assert source.description == (
        f"Vertex AI import file(s) {spec}: 6 images, 3 classes (2 train / 1 val / 1 test / 2 unassigned), 0 rows "
        "rejected"
    )
    data, ext = source.load(by_ref[images[5]])
    assert ext == "jpg" and data == Path(images[5]).read_bytes()
    assert source.locate(by_ref[images[5]]) == images[5]


def test_row_order_does_not_change_the_dataset(tmp_path):
    images = _images(tmp_path / "raw", 8)
    rows = [_row(path, "ab"[i % 2]) for i, path in enumerate(images)]
    first = import_files_source(_write(tmp_path / "a.jsonl", rows))
    second = import_files_source(_write(tmp_path / "b.jsonl", rows[::-1]))
    assert first.items == second.items and first.classes == second.classes == ["a", "b"]


def test_csv_mixes_two_and_three_columns_quoted_fields_and_case(tmp_path):
    images = _images(tmp_path / "raw", 5)
    (tmp_path / "raw" / "with, comma.jpg").write_bytes(_jpeg(99))
    text = (
        f"TRAINING,{images[0]},daisy\n"
        f"validation,{images[1]},rose\n"
        f"{images[2]},daisy\n"  # no ML_USE column: unassigned
        f",{images[3]},rose\n"  # an empty ML_USE: unassigned
        f'Test,"{tmp_path}/raw/with, comma.jpg","rose"\r\n'
        f"test,{images[4]}\n"  # ML_USE,GCS_FILE_PATH: no label
    )
    (tmp_path / "labels.csv").write_text(text)
    source = open_source(str(tmp_path / "labels.csv"))
    splits = {
        os.path.basename(str(item.ref)): (source.classes[item.label], item.split) for item in source.items
    }
    assert splits == {
        "IMG_0000.jpg": ("daisy", "train"),
        "IMG_0001.jpg": ("rose", "val"),
        "IMG_0002.jpg": ("daisy", None),
        "IMG_0003.jpg": ("rose", None),
        "with, comma.jpg": ("rose", "test"),
    }
    assert [(r.ref, r.reason) for r in source.rejected] == [(f"{tmp_path}/labels.csv:6", "empty-label")]


def test_bad_rows_are_rejected_with_file_and_line_never_raised(tmp_path):
    images = _images(tmp_path / "raw", 6)
    spec = _write(
        tmp_path / "labels.jsonl",
        [
            _row(images[0], "daisy", "training"),  # 1: good
            '{"imageGcsUri": "gs://b/x.jpg", ',  # 2: bad JSON
            json.dumps({"classificationAnnotation": {"displayName": "daisy"}}),  # 3: no imageGcsUri
            _row(images[1], ""),  # 4: empty label
            _row(images[2], None),  # 5: no annotation at all
            _row(images[3], "daisy"),  # 6: conflict with 7
            _row(images[3], "rose"),  # 7
            _row(images[4], "rose", "holdout"),  # 8: unknown ml_use
            _row("pipe:cat /etc/passwd", "rose"),  # 9: refused scheme
            _row("s3://bucket/x.jpg", "rose"),  # 10
            "[1, 2]",  # 11: not an object
            _row(images[5], "rose"),  # 12: good
            _row(images[3], "daisy"),  # 13: a third row of the conflicting image: rejected too
        ],
    )
    source = import_files_source(spec)
    assert sorted(str(item.ref) for item in source.items) == [images[0], images[5]]
    reasons = {int(r.ref.rsplit(":", 1)[1]): r.reason for r in source.rejected}
    assert reasons == {
        2: "malformed-row",
        3: "malformed-row",
        4: "empty-label",
        5: "empty-label",
        6: "conflicting-labels",
        7: "conflicting-labels",
        8: "malformed-row",
        9: "malformed-row",
        10: "malformed-row",
        11: "malformed-row",
        13: "conflicting-labels",
    }
    assert all(r.ref.startswith(f"{spec}:") and r.reason in SKIP_REASONS for r in source.rejected)
    conflict = next(r for r in source.rejected if r.ref.endswith(":7"))
    assert images[3] in conflict.message and "daisy and as rose" in conflict.message
    assert "pipe:" in next(r for r in source.rejected if r.ref.endswith(":9")).message
    assert source.classes == ["daisy", "rose"]  # daisy still has a valid row (line 1)
    assert "2 images" in source.description and "11 rows rejected" in source.description


def test_csv_wrong_column_counts_and_bad_ml_use(tmp_path):
    images = _images(tmp_path / "raw", 2)
    text = f"TRAINING,{images[0]},daisy\nTRAINING,{images[1]},daisy,rose\nHOLDOUT,{images[1]},daisy\n,,rose\n"
    (tmp_path / "l.csv").write_text(text)
    source = import_files_source(str(tmp_path / "l.csv"))
    assert len(source.items) == 1
    assert [(r.ref.rsplit(":", 1)[1], r.reason) for r in source.rejected] == [
        ("2", "malformed-row"),
        ("3", "malformed-row"),
        ("4", "malformed-row"),
    ]
    assert "single-label" in source.rejected[0].message


def test_duplicates_with_the_same_label_are_one_item(tmp_path, caplog):
    images = _images(tmp_path / "raw", 2)
    spec = _write(
        tmp_path / "l.jsonl",
        [
            _row(images[0], "a", "training"),
            _row(images[0], "a", "test"),
            _row(images[1], "a"),
            _row(images[0], "a"),
        ],
    )
    with caplog.at_level("INFO", logger="tpustream.sources.import_files"):
        source = import_files_source(spec)
    assert len(source.items) == 2 and source.rejected == []
    assert source.items[0].split == "train"  # the first row's ml_use
    assert "2 duplicate row(s) merged" in caplog.text and "2 with another ml_use" in caplog.text


def test_a_multi_label_row_is_counted_not_fatal(tmp_path):
    images = _images(tmp_path / "raw", 2)
    one = {"imageGcsUri": images[0], "classificationAnnotations": [{"displayName": "daisy"}]}
    two = {
        "imageGcsUri": images[1],
        "classificationAnnotations": [{"displayName": "a"}, {"displayName": "b"}],
    }
    single = import_files_source(_write(tmp_path / "one.jsonl", [json.dumps(one)]))
    assert single.classes == ["daisy"]  # one label in the multi-label form is still single-label
    source = import_files_source(_write(tmp_path / "multi.jsonl", [json.dumps(one), json.dumps(two)]))
    assert [item.ref for item in source.items] == [images[0]]
    [rejected] = source.rejected
    assert (rejected.ref, rejected.reason) == (f"{tmp_path}/multi.jsonl:2", "multi-label")
    assert "2 labels (a, b)" in rejected.message and "single-label" in rejected.message


def test_relative_and_file_uris_resolve_against_the_import_file(tmp_path, monkeypatch):
    images = _images(tmp_path / "data" / "raw", 3)
    spec = _write(
        tmp_path / "data" / "labels.jsonl",
        [
            _row("raw/IMG_0000.jpg", "a"),
            _row("./raw/../raw/IMG_0001.jpg", "a"),
            _row(f"file://{images[2]}", "b"),
        ],
    )
    monkeypatch.chdir(tmp_path)  # elsewhere: relative paths follow the import file, not the cwd
    source = import_files_source(os.path.relpath(spec))
    assert [item.ref for item in source.items] == images
    assert all(source.load(item)[1] == "jpg" for item in source.items)


def test_several_files_and_a_pattern_make_one_dataset(tmp_path):
    images = _images(tmp_path / "raw", 4)
    labels = tmp_path / "labels"
    labels.mkdir()
    a = _write(labels / "export-0.jsonl", [_row(images[0], "a", "training"), _row(images[1], "b")])
    b = _write(labels / "export-1.jsonl", [_row(images[2], "a"), _row(images[3], "c", "validation")])
    _write(labels / "other.jsonl", ["not json"])  # not matched by export-*
    (labels / "sub").mkdir()
    c = _write(labels / "sub" / "export-2.csv", [f"{images[0]},a"])  # a duplicate, same label
    listed = import_files_source(f"{a}, {b}")
    pattern = import_files_source(f"{labels}/export-*.jsonl")
    assert listed.items == pattern.items and len(listed.items) == 4 and pattern.classes == ["a", "b", "c"]
    assert f"{a}, {b}:" in pattern.description
    mixed = import_files_source(f"{labels}/export-*.jsonl,{labels}/sub/*.csv")  # '*' reaches sub-folders
    assert mixed.items == listed.items and c in mixed.description
    every = import_files_source(f"file://{labels}/*.jsonl")
    assert len(every.rejected) == 1 and every.rejected[0].ref == f"{labels}/other.jsonl:1"


@pytest.mark.parametrize(
    "make_spec, message",
    [
        (lambda d: f"{d}/nope.jsonl", "nope.jsonl does not exist"),
        (lambda d: f"{d}/*.csv", "no file matches"),
        (lambda d: f"{d}/a*b*.csv", "more than one"),
        (lambda d: _write(d / "empty.jsonl", [""]), "no valid row in 1 import file"),
        (lambda d: _write(d / "bad.jsonl", ["{", _row("x.jpg", "")]), r"2 rejected \(e.g. .*bad.jsonl:1"),
        (lambda d: f"{d}/x.jsonl,pipe:cat.csv", "pipe:"),
    ],
)
def test_unusable_sources_fail_with_one_clear_error(tmp_path, make_spec, message):
    with pytest.raises(SourceError, match=message):
        open_source(make_spec(tmp_path))


def test_missing_or_corrupt_images_fail_when_loaded_naming_the_row(tmp_path):
    images = _images(tmp_path / "raw", 1)
    (tmp_path / "raw" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    spec = _write(
        tmp_path / "l.jsonl",
        [_row(images[0], "a"), _row(str(tmp_path / "raw" / "gone.jpg"), "a"), _row("raw/broken.jpg", "a")],
    )
    source = import_files_source(spec)
    by_name = {os.path.basename(str(item.ref)): item for item in source.items}
    with pytest.raises(UnreadableImage, match=rf"gone.jpg \(listed at {spec}:2\).*does not exist"):
        source.load(by_name["gone.jpg"])
    with pytest.raises(CorruptImage, match=rf"broken.jpg \(listed at {spec}:3\): cannot decode"):
        source.load(by_name["broken.jpg"])


def test_not_utf8_and_csv_errors_are_rows_not_crashes(tmp_path):
    images = _images(tmp_path / "raw", 2)
    path = tmp_path / "l.jsonl"
    path.write_bytes(_row(images[0], "a").encode() + b"\n" + b'{"imageGcsUri": "\xff\xfe.jpg"}\n')
    source = import_files_source(str(path))
    assert len(source.items) == 1 and [r.reason for r in source.rejected] == ["malformed-row"]
    assert "UTF-8" in source.rejected[0].message
    csv_path = tmp_path / "l.csv"
    huge = "x" * 200_000  # over the csv module's field limit: the rest of the file cannot be read
    csv_path.write_text(f"\ufeff{images[1]},b\n{huge}.jpg,a\n{images[0]},a\n", encoding="utf-8")  # BOM first
    source = import_files_source(str(csv_path))
    assert [item.ref for item in source.items] == [images[1]]
    assert [(r.ref, r.reason) for r in source.rejected] == [(f"{csv_path}:2", "malformed-row")]
    assert "rest of the file not read" in source.rejected[0].message
    unclosed = tmp_path / "q.csv"
    unclosed.write_text(f'{images[1]},b\n"{images[0]},a\n{images[0]},a\n')
    source = import_files_source(str(unclosed))
    assert [(r.ref, r.reason) for r in source.rejected] == [(f"{unclosed}:2", "malformed-row")]
    assert "unclosed quote" in source.rejected[0].message


# --------------------------------------------------------------------------- the plan's split


def _mixed_source(assigned: dict[int, str], total: int, classes: int = 2) -> Source:
    items = [Item(f"img-{i:04d}", i % classes, assigned.get(i)) for i in range(total)]
    return Source("mixed", "mixed", [str(c) for c in range(classes)], items, lambda item, side: (b"", "ppm"))


def test_rows_without_ml_use_are_split_by_the_default_fraction_and_the_others_keep_theirs():
    assigned = {i: "train" for i in range(0, 40)} | {i: "val" for i in range(40, 50)}
    source = _mixed_source(assigned, 250)  # 200 unassigned rows, 100 per class
    plan = plan_dataset(source, ShardConfig(source="mixed", output="/unused", num_shards=4))
    val = {i for spec in plan.shards_of("val") for i in spec.items}
    train = {i for spec in plan.shards_of("train") for i in spec.items}
    assert set(range(40)) <= train and set(range(40, 50)) <= val
    unassigned_val = sorted(val - set(range(40, 50)))
    assert len(unassigned_val) == 20  # 0.1 of the 200 unassigned, stratified: 10 per class
    assert Counter(source.items[i].label for i in unassigned_val) == {0: 10, 1: 10}
    assert train | val == set(range(250)) and not train & val
    again = plan_dataset(source, ShardConfig(source="mixed", output="/unused", num_shards=4))
    assert [s.fingerprint for s in again.shards] == [s.fingerprint for s in plan.shards]


def test_an_explicit_val_fraction_resplits_every_item():
    source = _mixed_source({i: "train" for i in range(100)}, 200)
    plan = plan_dataset(source, ShardConfig(source="mixed", output="/unused", num_shards=4, val_fraction=0.5))
    assert plan.split_counts == {"train": 100, "val": 100}
    val = {i for spec in plan.shards_of("val") for i in spec.items}
    assert val & set(range(100))  # assigned rows are re-split too, as --val-fraction does for every source


def test_fully_split_sources_keep_their_split_and_plan():
    source = _mixed_source({i: "train" if i % 5 else "val" for i in range(100)}, 100)
    plan = plan_dataset(source, ShardConfig(source="mixed", output="/unused", num_shards=2))
    assert plan.split_counts == {"train": 80, "val": 20}
    # the first draw of the seed's rng is still the train permutation: no split draw came before it
    rng = np.random.default_rng(0)
    expected = rng.permutation(np.array([i for i in range(100) if i % 5], dtype=np.int64))
    assert [i for spec in plan.shards_of("train") for i in spec.items] == expected.tolist()


# --------------------------------------------------------------------------- fingerprint and scale


def test_fingerprint_follows_the_import_file_and_the_images(tmp_path):
    images = _images(tmp_path / "raw", 3)
    _images(tmp_path / "raw2", 1)
    spec = _write(
        tmp_path / "l.jsonl",
        [_row(images[0], "a"), _row(images[1], "b"), _row(str(tmp_path / "raw2" / "IMG_0000.jpg"), "b")],
    )
    config = ShardConfig(source=spec, output="/unused")
    objects = fingerprint.source_objects(spec)
    assert [obj.uri for obj in objects] == sorted(
        [spec, images[0], images[1], f"{tmp_path}/raw2/IMG_0000.jpg"]
    )
    assert all(obj.version and obj.version != "missing" for obj in objects)
    before = fingerprint.fingerprint(config, objects)
    assert fingerprint.fingerprint(config, fingerprint.source_objects(spec)) == before  # nothing changed
    os.utime(images[2], ns=(1, 1))  # an image the file does not list: no change
    assert fingerprint.fingerprint(config, fingerprint.source_objects(spec)) == before
    with open(images[1], "wb") as f:  # a listed image replaced
        f.write(_jpeg(1000))
    os.utime(images[1], ns=(time.time_ns() + 10**9,) * 2)
    replaced = fingerprint.fingerprint(config, fingerprint.source_objects(spec))
    assert replaced != before
    with open(spec, "a") as f:  # the import file edited
        f.write(_row(images[2], "a") + "\n")
    os.utime(spec, ns=(time.time_ns() + 2 * 10**9,) * 2)
    assert fingerprint.fingerprint(config, fingerprint.source_objects(spec)) != replaced


def test_fingerprint_marks_missing_images(tmp_path):
    images = _images(tmp_path / "raw", 1)
    spec = _write(tmp_path / "l.jsonl", [_row(images[0], "a"), _row(f"{tmp_path}/gone/x.jpg", "a")])
    objects = {obj.uri: obj for obj in import_file_objects(spec)}
    assert objects[f"{tmp_path}/gone/x.jpg"] == storage.ObjectInfo(f"{tmp_path}/gone/x.jpg", 0, "missing")
    assert objects[images[0]].version != "missing"


def test_a_large_jsonl_lists_quickly(tmp_path):
    rows = 100_000
    with open(tmp_path / "big.jsonl", "w") as f:
        for i in range(rows):
            ml_use = ("training", "validation", "test")[i % 3]
            f.write(_row(f"gs://big/raw/IMG_{i:07d}.jpg", f"class-{i % 50}", ml_use) + "\n")
    started = time.perf_counter()
    source = import_files_source(str(tmp_path / "big.jsonl"))
    seconds = time.perf_counter() - started
    assert len(source.items) == rows and len(source.classes) == 50
    assert seconds < 10, f"{rows} rows took {seconds:.1f} s"  # ~1 s here; a loose bound on a shared machine


@pytest.mark.parametrize(
    "image, expected",
    [
        ("gs://other/raw/a.jpg", "gs://other/raw/a.jpg"),
        ("raw/a.jpg", "gs://b/labels/raw/a.jpg"),
        ("../raw/a.jpg", "gs://b/raw/a.jpg"),
        ("/mnt/disk/a.jpg", "local path in an import file on GCS"),
        ("file:///mnt/disk/../a.jpg", "local path in an import file on GCS"),
        ("../../a.jpg", "outside the import file's bucket"),
        ("gs://bucket-only", "names a bucket"),
        ("s3://b/a.jpg", "unsupported URI scheme"),
    ],
)
def test_images_in_an_import_file_on_gcs_resolve_within_its_bucket(image, expected):
    from tpustream.sources.import_rows import BadRow, resolve

    if expected.startswith(("gs://", "/")):
        assert resolve(image, "gs://b/labels") == expected
    else:
        with pytest.raises(BadRow, match=expected):
            resolve(image, "gs://b/labels")


# --------------------------------------------------------------------------- hostile import files


def test_hostile_jsonl_rows_are_counted_never_raised(tmp_path):
    images = _images(tmp_path / "raw", 2)
    spec = _write(
        tmp_path / "hostile.jsonl",
        [
            _row(images[0], "a"),  # 1: good
            _row(f"{tmp_path}/raw/x\x00.jpg", "a"),  # 2: NUL in the path (open() would raise ValueError)
            _row(f"{tmp_path}/raw/x\x1b[2J.jpg", "a"),  # 3: an escape sequence
            "[" * 100_000 + "]" * 100_000,  # 4: json would recurse past Python's limit
            '{"imageGcsUri": "' + "x" * (2 << 20) + '"}',  # 5: a 2 MiB line: refused unread
            '{"imageGcsUri": "[[[[[[[[[[[[[[[[[[[[.jpg", "classificationAnnotation": {"displayName": "a"}}',  # 6
            _row(images[1], "b\n"),  # 7: fine: the label is stripped
            _row(images[1], "b\x07c"),  # 8: a control character in the label
            json.dumps({"imageGcsUri": "hello world"}),  # 9: garbage, not an unlabelled image
            _row(images[1], None),  # 10: an unlabelled image
        ],
    )
    source = import_files_source(spec)
    reasons = {int(r.ref.rsplit(":", 1)[1]): r.reason for r in source.rejected}
    assert reasons == {
        2: "malformed-row",
        3: "malformed-row",
        4: "malformed-row",
        5: "malformed-row",
        8: "malformed-row",
        9: "malformed-row",
        10: "empty-label",
    }
    messages = {int(r.ref.rsplit(":", 1)[1]): r.message for r in source.rejected}
    assert "U+0000" in messages[2] and "U+001B" in messages[3]
    assert "nested deeper than 16" in messages[4] and "longer than 1,048,576 characters" in messages[5]
    assert len(messages[5]) < 200  # the line is not quoted back
    # brackets inside a string are no nesting: row 6 is an image path (it does not exist: skipped when loaded)
    assert {str(item.ref) for item in source.items} == {
        images[0],
        images[1],
        f"{tmp_path}/[[[[[[[[[[[[[[[[[[[[.jpg",
    }
    assert source.classes == ["a", "b"]


def test_hostile_csv_rows_are_counted_and_a_header_is_skipped(tmp_path, caplog):
    images = _images(tmp_path / "raw", 2)
    text = (
        "ml_use,gcs_file_path,label\n"  # 1: a header: skipped, not counted
        f"training,{images[0]},a\n"  # 2
        "garbage\n"  # 3: one column, no path: malformed, not empty-label
        + "x"
        * (2 << 20)
        + "\n"  # 4: too long
        f"{tmp_path}/raw/x\x01.jpg,a\n"  # 5: a control character
        f"{images[1]},b\n"  # 6
        "image,label\n"  # 7: a header-like row past the first is a row (no such image: read as a path)
    )
    (tmp_path / "l.csv").write_text(text)
    with caplog.at_level("INFO", logger="tpustream.sources"):
        source = import_files_source(str(tmp_path / "l.csv"))
    assert f"{tmp_path}/l.csv:1 is a header row" in caplog.text
    assert [(r.ref.rsplit(":", 1)[1], r.reason) for r in source.rejected] == [
        ("3", "malformed-row"),
        ("4", "malformed-row"),
        ("5", "malformed-row"),
    ]
    assert sorted(str(item.ref) for item in source.items) == sorted([*images, f"{tmp_path}/image"])


@pytest.mark.parametrize("header", ["image,label", "ml_use,gcs_file_path,label", "path"])
def test_a_csv_holding_only_a_header_is_one_clear_error(tmp_path, header):
    (tmp_path / "h.csv").write_text(header + "\n")
    with pytest.raises(
        SourceError, match=r"no valid row in 1 import file.*1 header row\(s\) skipped \(.*h.csv:1\)"
    ):
        open_source(str(tmp_path / "h.csv"))


def test_a_fifo_named_as_an_image_is_skipped_not_waited_on(tmp_path):
    images = _images(tmp_path / "raw", 4)
    os.mkfifo(tmp_path / "raw" / "fifo.jpg")  # nobody ever writes to it: opening it to read would block
    rows = [_row(image, "ab"[i % 2]) for i, image in enumerate(images)]
    spec = _write(
        tmp_path / "l.jsonl", [*rows, _row(f"{tmp_path}/raw/fifo.jpg", "a"), _row("/dev/zero", "b")]
    )
    source = import_files_source(spec)
    fifo = next(item for item in source.items if str(item.ref).endswith("fifo.jpg"))
    with pytest.raises(UnreadableImage, match="is a FIFO, not a regular file"):
        source.load(fifo)
    with pytest.raises(UnreadableImage, match="/dev/zero is a device, not a regular file"):
        source.load(next(item for item in source.items if item.ref == "/dev/zero"))
    from tpustream.dataset import write as shards

    manifest, _ = shards.create_shards(
        ShardConfig(source=spec, output=str(tmp_path / "out"), num_shards=1, val_fraction=0.25),
        progress=False,
    )
    assert manifest.skipped.by_reason == {"missing-object": 2}
    assert sum(split.num_samples for split in manifest.splits.values()) == 4


def test_a_source_whose_images_all_fail_writes_no_dataset(tmp_path):
    spec = _write(tmp_path / "l.jsonl", [_row(f"{tmp_path}/gone-{i}.jpg", "ab"[i % 2]) for i in range(4)])
    from tpustream.dataset import write as shards
    from tpustream.dataset.manifest import ShardError

    with pytest.raises(
        ShardError, match=r"l.jsonl'.*no train sample could be written \(0 in total; 4 skipped"
    ):
        shards.create_shards(
            ShardConfig(source=spec, output=str(tmp_path / "out"), num_shards=1), progress=False
        )
    assert not storage.exists(str(tmp_path / "out" / "manifest.json"))


def test_no_train_samples_suggests_val_fraction(tmp_path):
    images = _images(tmp_path / "raw", 2)
    spec = _write(tmp_path / "l.jsonl", [_row(images[0], "a", "validation"), _row(images[1], "b", "test")])
    from tpustream.dataset.manifest import ShardError

    with pytest.raises(ShardError, match="no training samples.*give --val-fraction F to re-split"):
        plan_dataset(import_files_source(spec), ShardConfig(source=spec, output=str(tmp_path / "out")))


def test_shards_create_answers_hostile_import_files_with_one_line(tmp_path):
    from typer.testing import CliRunner

    from tpustream.cli.main import app

    images = _images(tmp_path / "raw", 4)
    header_only = _write(tmp_path / "header.csv", ["image,label"])
    hostile = _write(
        tmp_path / "hostile.jsonl",
        [
            *(_row(image, "ab"[i % 2], "training") for i, image in enumerate(images)),
            _row(f"{tmp_path}/raw/x\x00.jpg", "a"),
            "[" * 50_000 + "]" * 50_000,
        ],
    )
    runner = CliRunner()
    result = runner.invoke(
        app, ["shards", "create", "--source", header_only, "--output", str(tmp_path / "o1")]
    )
    assert result.exit_code == 2 and "header row(s) skipped" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "o1" / "manifest.json").exists()
    args = ["shards", "create", "--source", hostile, "--output", str(tmp_path / "o2"), "--workers", "1"]
    result = runner.invoke(app, [*args, "--val-fraction", "0.5"])
    assert result.exit_code == 0, result.output
    assert "wrote 4 samples" in result.output and "2 rows rejected" in result.output


def test_an_annotation_without_display_name_is_malformed_not_unlabelled(tmp_path):
    images = _images(tmp_path / "raw", 2)
    typo = {"imageGcsUri": images[1], "classificationAnnotation": {"display_name": "a"}}
    source = import_files_source(_write(tmp_path / "l.jsonl", [_row(images[0], "a"), json.dumps(typo)]))
    [rejected] = source.rejected
    assert (
        rejected.reason == "malformed-row" and "no displayName (keys: ['display_name'])" in rejected.message
    )


def test_test_rows_stay_test_under_val_and_test_fractions(caplog):
    assigned = {i: "test" for i in range(0, 20)} | {i: "train" for i in range(20, 100)}
    source = _mixed_source(assigned, 200)  # 100 rows without ml_use
    config = ShardConfig(source="mixed", output="/unused", num_shards=4, val_fraction=0.2, test_fraction=0.3)
    with caplog.at_level("WARNING"):
        plan = plan_dataset(source, config)
    test = sorted(i for spec in plan.shards_of("test") for i in spec.items)
    assert test == list(range(20))  # the user's ml_use=test rows, exactly: never re-split, never carved more
    assert "has its own test split (20 items): --test-fraction 0.3 is not applied" in caplog.text
    assert plan.split_counts == {"train": 144, "val": 36, "test": 20}  # val: 0.2 of the 180 others, per class
    # without --val-fraction the own split is kept: the unassigned rows get the default 0.1 to val
    plan = plan_dataset(source, ShardConfig(source="mixed", output="/unused", num_shards=4))
    assert plan.split_counts == {"train": 170, "val": 10, "test": 20}
