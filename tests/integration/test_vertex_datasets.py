"""A Vertex AI managed image dataset as a SOURCE: the real aiplatform v1 DatasetService client against the
recording endpoint (tests/fakes/vertex/), which exports the dataset's items as JSONL into the GCS test
server; then the import files are read and sharded as any others. Mocked: nothing but Vertex AI itself."""

import io
import json

import numpy as np
import pytest
from google.cloud import aiplatform_v1
from PIL import Image
from typer.testing import CliRunner

from tests.fakes.vertex import TEXT_METADATA_SCHEMA, VertexRecorder
from tpustream.cli.main import app
from tpustream.dataset import fanout, fingerprint
from tpustream.dataset import write as shards
from tpustream.dataset.manifest import read_manifest, verify_shards
from tpustream.dataset.plan import ShardConfig
from tpustream.sources.dispatch import open_source
from tpustream.sources.types import SourceError
from tpustream.sources.vertex_dataset import EXPORT_DIR, EXPORT_MARKER, managed_dataset_objects
from tpustream.storage import io as storage

pytestmark = pytest.mark.integration

DATASET = "projects/p/locations/us-central1/datasets/123"
CLASSES = ("daisy", "rose", "tulip")


def _jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (10, 12, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return out.getvalue()


@pytest.fixture
def recorder(monkeypatch):
    recorder = VertexRecorder()
    monkeypatch.setenv("TPUSTREAM_VERTEX_ENDPOINT", recorder.url)
    yield recorder
    recorder.close()


def _rows(bucket: str, per_class: int = 8) -> list[tuple[str, str, str | None]]:
    """``per_class`` JPEGs a class on the GCS server, with Vertex ml_use labels, + a row whose image is gone."""
    uses = ["training"] * (per_class - 3) + ["validation", "test", None]
    rows = []
    for c, label in enumerate(CLASSES):
        for i, use in enumerate(uses):
            uri = f"{bucket}/raw/{label}/{i:03d}.jpg"
            storage.write_bytes(uri, _jpeg(100 * c + i))
            rows.append((uri, label, use))
    rows.append((f"{bucket}/raw/daisy/gone.jpg", "daisy", "training"))  # listed, never uploaded
    return rows


def _exports(recorder: VertexRecorder) -> list[dict]:
    return [r for r in recorder.requests if r["method"] == "POST" and r["path"].endswith(":export")]


def test_a_managed_dataset_is_exported_once_and_sharded_end_to_end(gcs_bucket, recorder):
    recorder.export_rows_per_file = 10  # Vertex splits a large export into several files
    # a display name with the "," and "*" an import-file SOURCE gives a meaning to: Vertex puts it in the path
    recorder.add_image_dataset(DATASET, _rows(gcs_bucket), display_name="flowers, v2*")
    output = f"{gcs_bucket}/datasets/flowers"

    source = open_source(DATASET, staging=output)
    assert source.spec == DATASET and source.classes == list(CLASSES)
    assert len(source.items) == 25  # 8 per class + the missing image (skipped only when loaded)
    splits = [item.split for item in source.items]
    counts = [splits.count(split) for split in ("train", "val", "test", None)]
    assert counts == [16, 3, 3, 3]  # ml_use=test rows are the test split
    assert "Vertex AI managed dataset" in source.description and "'flowers, v2*'" in source.description

    (export,) = _exports(recorder)
    request = aiplatform_v1.ExportDataRequest.from_json(
        json.dumps(export["body"]), ignore_unknown_fields=False
    )
    (version,) = [obj.version for obj in managed_dataset_objects(DATASET)]
    directory = f"{output}/{EXPORT_DIR}/123/{version}"
    assert request.export_config.gcs_destination.output_uri_prefix == f"{directory}/"
    assert not request.export_config.annotations_filter and recorder.rejected == []
    polls = [r for r in recorder.requests if "/operations/" in r["path"]]
    assert polls and all(r["method"] == "GET" for r in polls)  # the long-running operation was waited on

    marker = json.loads(storage.read_text(f"{directory}/{EXPORT_MARKER}"))
    assert len(marker["exported_files"]) == 3 and marker["exported_files"] == recorder.exports[0]["files"]
    assert all(uri.startswith(f"{directory}/import-files-") for uri in marker["import_files"])

    again = open_source(DATASET, staging=output)  # the plan, each writer and finalize open it again
    assert len(_exports(recorder)) == 1 and again.items == source.items

    manifest, summary = shards.create_shards(
        ShardConfig(source=DATASET, output=output, num_shards=2, workers=2), progress=False, source=again
    )
    assert read_manifest(output) == manifest.to_json() and verify_shards(output, progress=False)[1] == []
    assert manifest.source == DATASET and manifest.classes == list(CLASSES)
    # train: 16 rows less the missing image, + the 3 unassigned (a 0.1 val share of one per class is none)
    assert summary.split_samples == {"train": 18, "val": 3, "test": 3}
    assert [shard.path for shard in manifest.splits["test"].shards] == ["test/test-000000.tar"]
    assert manifest.skipped.by_reason == {"missing-object": 1}
    assert len(_exports(recorder)) == 1


def test_a_changed_dataset_is_exported_again_and_changes_its_fingerprint(gcs_bucket, recorder):
    rows = _rows(gcs_bucket, per_class=4)
    recorder.add_image_dataset(DATASET, rows)
    config = ShardConfig(source=DATASET, output="/unused")
    before = fingerprint.source_objects(DATASET)
    assert [(obj.uri, obj.size) for obj in before] == [(DATASET, 13)]
    assert fingerprint.source_objects(DATASET) == before and _exports(recorder) == []  # GET only, stable
    staging = f"{gcs_bucket}/out"
    first = open_source(DATASET, staging=staging)

    storage.write_bytes(f"{gcs_bucket}/raw/rose/new.jpg", _jpeg(999))
    recorder.add_image_dataset(
        DATASET,
        [*rows, (f"{gcs_bucket}/raw/rose/new.jpg", "rose", "training")],
        update_time="2026-11-02T10:00:00Z",
    )
    after = fingerprint.source_objects(DATASET)
    assert fingerprint.fingerprint(config, after) != fingerprint.fingerprint(config, before)
    second = open_source(DATASET, staging=staging)
    assert len(second.items) == len(first.items) + 1
    first_dir, second_dir = (e["directory"] for e in recorder.exports)
    assert first_dir.split("/")[-2] == before[0].version and second_dir.split("/")[-2] == after[0].version
    assert after[0].version.startswith("20261102T100000.000000Z-")  # the update time, path-safe

    recorder.add_image_dataset(DATASET, rows, update_time="2026-11-02T10:00:00Z")  # relabelled: same time
    assert fingerprint.source_objects(DATASET) != after  # the etag and annotation set moved


def test_an_export_is_redone_when_its_marker_or_files_are_missing(gcs_bucket, recorder):
    recorder.add_image_dataset(DATASET, _rows(gcs_bucket, per_class=4))
    staging = f"{gcs_bucket}/out"
    recorder.fail_exports = 1  # the Vertex AI Service Agent cannot write to the bucket
    with pytest.raises(SourceError, match=r"export to gs://.* failed .*Service Agent") as failed:
        open_source(DATASET, staging=staging)
    assert "\n" not in str(failed.value)
    assert not [o for o in storage.list_objects(staging) if o.uri.endswith(EXPORT_MARKER)]

    source = open_source(DATASET, staging=staging)  # the failed export left no marker: exported again
    (marker,) = [o.uri for o in storage.list_objects(staging) if o.uri.endswith(EXPORT_MARKER)]
    storage.delete(json.loads(storage.read_text(marker))["import_files"][0])
    assert open_source(DATASET, staging=staging).items == source.items  # a listed file gone: exported again
    assert len(_exports(recorder)) == 3


@pytest.mark.parametrize(
    ("problem", "message"),
    [
        ("missing", r"no such Vertex AI dataset \(.*does not exist"),
        ("denied", r"permission denied .*aiplatform"),
    ],
)
def test_a_dataset_that_cannot_be_read_is_a_one_line_source_error(gcs_bucket, recorder, problem, message):
    if problem == "denied":
        recorder.add_image_dataset(DATASET, _rows(gcs_bucket, per_class=4))
        recorder.denied_datasets.add(DATASET)
    for call in (
        lambda: open_source(DATASET, staging=f"{gcs_bucket}/out"),
        lambda: managed_dataset_objects(DATASET),
    ):
        with pytest.raises(SourceError, match=message) as error:
            call()
        assert DATASET in str(error.value) and "\n" not in str(error.value)
        assert "http://" not in str(error.value)  # what Vertex said, not the REST client's request line
    assert _exports(recorder) == []


def test_only_single_label_image_datasets_are_read(gcs_bucket, recorder):
    rows = _rows(gcs_bucket, per_class=4)
    recorder.add_image_dataset(DATASET, rows, metadata_schema_uri=TEXT_METADATA_SCHEMA)
    with pytest.raises(SourceError, match=r"not an image dataset: .*text_1\.0\.0\.yaml"):
        open_source(DATASET, staging=f"{gcs_bucket}/out")
    with pytest.raises(SourceError, match="not an image dataset"):
        managed_dataset_objects(DATASET)
    assert _exports(recorder) == []

    multi = [(uri, [label, "flower"], use) for uri, label, use in rows]
    recorder.add_image_dataset(DATASET, multi, multi_label=True)
    with pytest.raises(
        SourceError, match="ImageClassificationMultiLabel, not ImageClassificationSingleLabel"
    ):
        open_source(DATASET, staging=f"{gcs_bucket}/out")


def test_a_managed_dataset_needs_a_gcs_staging_directory(tmp_path, gcs_bucket, recorder):
    recorder.add_image_dataset(DATASET, _rows(gcs_bucket, per_class=4))
    for staging in (None, str(tmp_path / "out")):
        with pytest.raises(SourceError, match=r"give a gs:// --output"):
            open_source(DATASET, staging=staging)
    with pytest.raises(SourceError, match="bucket gs://no-such-bucket does not exist"):
        open_source(DATASET, staging="gs://no-such-bucket/out")
    assert recorder.requests == []  # refused before any Vertex AI call


def test_shards_create_reads_a_managed_dataset_from_the_cli(gcs_bucket, recorder):
    recorder.add_image_dataset(DATASET, _rows(gcs_bucket, per_class=4))
    output = f"{gcs_bucket}/datasets/cli"
    result = CliRunner().invoke(
        app, ["shards", "create", "--source", DATASET, "--output", output, "--num-shards", "1"]
    )
    assert result.exit_code == 0, result.output
    assert read_manifest(output)["source"] == DATASET and len(_exports(recorder)) == 1


def test_the_pipelines_plan_write_and_finalize_steps_share_one_export(gcs_bucket, recorder):
    recorder.add_image_dataset(DATASET, _rows(gcs_bucket, per_class=4))
    config = fanout.config_from_pipeline(
        source=DATASET, output=f"{gcs_bucket}/datasets/run", num_shards=2, val_fraction=-1, upsample=1, seed=0
    )
    ranges = fanout.shard_ranges(config, shards_per_task=1)
    assert sum(fanout.write_shard_range(config, start, end) for start, end in ranges) == len(ranges)
    manifest = fanout.finalize_dataset(config)
    assert manifest.source == DATASET and sum(manifest.splits["train"].class_counts) == 6
    assert len(_exports(recorder)) == 1


def test_no_credentials_or_no_endpoint_is_a_one_line_source_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TPUSTREAM_VERTEX_ENDPOINT", "http://127.0.0.1:1")  # nothing listens there
    with pytest.raises(SourceError, match=r"reading the dataset at http://127.0.0.1:1 did not complete"):
        managed_dataset_objects(DATASET)
    # the real endpoint, and no application default credentials anywhere (no file, no GCE metadata server)
    monkeypatch.delenv("TPUSTREAM_VERTEX_ENDPOINT")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    with pytest.raises(SourceError, match=r"no Google credentials .*application-default login") as error:
        managed_dataset_objects(DATASET)
    assert "\n" not in str(error.value)
