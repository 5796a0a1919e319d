"""Vertex AI import files on the GCS test server: images flat in two buckets, JSONL + CSV, a prefix pattern,
``shards create`` end to end, and the data fingerprint over the files and the images they list."""

import json

import pytest

from tests.common.sources import import_row as _row
from tests.common.sources import noise_jpeg as _jpeg
from tests.fakes.gcs import make_bucket
from tpustream.dataset import fingerprint
from tpustream.dataset import write as shards
from tpustream.dataset.manifest import read_manifest, verify_shards
from tpustream.dataset.plan import ShardConfig
from tpustream.sources.dispatch import open_source
from tpustream.storage import io as storage

pytestmark = pytest.mark.integration


@pytest.fixture
def second_bucket(gcs_server, gcs_bucket) -> str:
    name = f"{gcs_bucket[len('gs://') :]}-photos"
    make_bucket(gcs_server.url, name)
    return f"gs://{name}"


def _upload_lines(uri: str, lines: list[str]) -> None:
    storage.write_bytes(uri, ("\n".join(lines) + "\n").encode())


def _dataset(bucket: str, photos: str) -> str:
    """Daisies and roses flat in ``bucket``/raw, tulips in another bucket; two JSONL files and a CSV."""
    for i in range(22):
        storage.write_bytes(f"{bucket}/raw/IMG_{i:04d}.jpg", _jpeg(i))
    for i in range(10):
        storage.write_bytes(f"{photos}/photos/t-{i}.jpg", _jpeg(100 + i))
    daisy_use = ["training"] * 6 + ["validation", "test", None, None]
    _upload_lines(
        f"{bucket}/labels/part-0.jsonl",
        [
            *(_row(f"{bucket}/raw/IMG_{i:04d}.jpg", "daisy", use) for i, use in enumerate(daisy_use)),
            '{"imageGcsUri": ',  # line 11: bad JSON
            _row(f"{bucket}/raw/gone.jpg", "daisy", "training"),  # line 12: no such object
        ],
    )
    tulip_use = ["training"] * 6 + ["validation", "validation", None, None]
    _upload_lines(
        f"{bucket}/labels/part-1.jsonl",
        [
            *(_row(f"{photos}/photos/t-{i}.jpg", "tulip", use) for i, use in enumerate(tulip_use)),
            _row(f"{bucket}/raw/IMG_0000.jpg", "daisy"),  # a duplicate, same label: merged
            _row(f"{bucket}/raw/IMG_0010.jpg", "tulip"),  # line 12: conflicts with the CSV's rose
        ],
    )
    rose_rows = [f"TRAINING,{bucket}/raw/IMG_{i:04d}.jpg,rose" for i in range(11, 17)]
    storage.write_bytes(
        f"{bucket}/labels/extra.csv",
        "\n".join(
            [
                *rose_rows,  # lines 1-6
                f"test,{bucket}/raw/IMG_0017.jpg,rose",
                f"{bucket}/raw/IMG_0018.jpg,rose",  # two columns: no ML_USE
                f'"{bucket}/raw/IMG_0019.jpg",rose',
                "../raw/IMG_0020.jpg,rose",  # relative to the CSV's own folder: gs://BUCKET/raw/
                f"VALIDATION,{bucket}/raw/IMG_0010.jpg,rose",  # line 11: conflicts with part-1.jsonl:12
                f"TRAINING,{bucket}/raw/IMG_0021.jpg,",  # line 12: no label
            ]
        ).encode(),
    )
    return f"{bucket}/labels/part-*.jsonl,{bucket}/labels/extra.csv"


def test_shards_from_import_files_on_gcs(gcs_bucket, second_bucket):
    spec = _dataset(gcs_bucket, second_bucket)
    source = open_source(spec)
    assert source.classes == ["daisy", "rose", "tulip"]
    assert len(source.items) == 31  # 11 daisies (one missing), 10 roses, 10 tulips
    assert sorted((r.ref, r.reason) for r in source.rejected) == [
        (f"{gcs_bucket}/labels/extra.csv:11", "conflicting-labels"),
        (f"{gcs_bucket}/labels/extra.csv:12", "empty-label"),
        (f"{gcs_bucket}/labels/part-0.jsonl:11", "malformed-row"),
        (f"{gcs_bucket}/labels/part-1.jsonl:12", "conflicting-labels"),
    ]
    assert f"{gcs_bucket}/raw/IMG_0020.jpg" in {item.ref for item in source.items}
    assert "(19 train / 3 val / 2 test / 7 unassigned), 4 rows rejected" in source.description

    out = f"{gcs_bucket}/datasets/flowers"
    manifest, summary = shards.create_shards(
        ShardConfig(source=spec, output=out, num_shards=2, workers=2), progress=False
    )
    assert read_manifest(out) == manifest.to_json() and verify_shards(out, progress=False)[1] == []
    assert manifest.classes == ["daisy", "rose", "tulip"]
    # assigned rows keep their split (ml_use=test rows are the test split); of the unassigned (2 daisies,
    # 3 roses, 2 tulips) one per class goes to val; the missing daisy (training) is skipped when loaded
    assert manifest.splits["train"].class_counts == [7, 8, 7]
    assert manifest.splits["val"].class_counts == [2, 1, 3]
    assert manifest.splits["test"].class_counts == [1, 1, 0]
    assert summary.split_samples == {"train": 22, "val": 6, "test": 2}
    missing = [message for message in manifest.skipped.examples if "gone.jpg" in message]
    assert len(missing) == 1 and f"listed at {gcs_bucket}/labels/part-0.jsonl:12" in missing[0]
    assert manifest.skipped.count in (
        1,
        1 + len(source.rejected),
    )  # + the rows, once the writer counts them
    assert "Vertex AI import file(s)" in manifest.source_description


def test_fingerprint_follows_listed_images_and_import_files_on_gcs(gcs_bucket, second_bucket):
    spec = _dataset(gcs_bucket, second_bucket)
    config = ShardConfig(source=spec, output="/unused")
    objects = fingerprint.source_objects(spec)
    uris = [obj.uri for obj in objects]
    assert len(objects) == 3 + 31 and uris == sorted(uris)
    assert f"{second_bucket}/photos/t-3.jpg" in uris and f"{gcs_bucket}/labels/extra.csv" in uris
    versions = {obj.uri: obj.version for obj in objects}
    assert versions[f"{gcs_bucket}/raw/gone.jpg"] == "missing"
    assert versions[f"{gcs_bucket}/raw/IMG_0001.jpg"].isdigit()  # a GCS generation
    assert f"{gcs_bucket}/raw/IMG_0021.jpg" not in versions  # its row was rejected: not an image of the data
    before = fingerprint.fingerprint(config, objects)

    assert fingerprint.fingerprint(config, fingerprint.source_objects(spec)) == before  # nothing changed
    storage.write_bytes(f"{gcs_bucket}/raw/unlisted.jpg", _jpeg(500))  # beside the images, not listed
    assert fingerprint.fingerprint(config, fingerprint.source_objects(spec)) == before

    storage.write_bytes(f"{second_bucket}/photos/t-3.jpg", _jpeg(103))  # same bytes, a new generation
    replaced = fingerprint.fingerprint(config, fingerprint.source_objects(spec))
    assert replaced != before

    storage.write_bytes(f"{gcs_bucket}/raw/gone.jpg", _jpeg(600))  # the missing image appears
    appeared = fingerprint.fingerprint(config, fingerprint.source_objects(spec))
    assert appeared != replaced

    text = storage.read_bytes(f"{gcs_bucket}/labels/part-1.jsonl").decode()
    storage.write_bytes(f"{gcs_bucket}/labels/part-1.jsonl", text.encode())
    rewritten = fingerprint.fingerprint(config, fingerprint.source_objects(spec))
    assert rewritten != appeared  # the same text uploaded again is a new generation of the import file

    _upload_lines(f"{gcs_bucket}/labels/part-2.jsonl", [json.dumps({"imageGcsUri": "x"})])
    assert (
        fingerprint.fingerprint(config, fingerprint.source_objects(spec)) != rewritten
    )  # a new file matched


def test_an_import_file_on_gcs_names_only_gcs_images(gcs_bucket, tmp_path):
    local = tmp_path / "secret.jpg"
    local.write_bytes(_jpeg(7))  # a readable local file: the row must still not reach it
    for i in range(4):
        storage.write_bytes(f"{gcs_bucket}/raw/IMG_{i}.jpg", _jpeg(i))
    spec = f"{gcs_bucket}/labels/l.csv"
    rows = [f"{gcs_bucket}/raw/IMG_{i}.jpg,{'ab'[i % 2]}" for i in range(3)]
    rows += ["../raw/IMG_3.jpg,b", f"{local},a", f"file://{local},a"]  # lines 4-6
    storage.write_bytes(spec, ("\n".join(rows) + "\n").encode())
    source = open_source(spec)
    assert sorted(str(item.ref) for item in source.items) == [
        f"{gcs_bucket}/raw/IMG_{i}.jpg" for i in range(4)
    ]
    assert [(r.ref, r.reason) for r in source.rejected] == [
        (f"{spec}:5", "local-path"),
        (f"{spec}:6", "local-path"),
    ]
    assert "name images there by gs:// URI" in source.rejected[0].message
