"""The preflight's bucket checks: the run's buckets exist, the caller can read them, and they keep their data
where the run's region needs it (the pipeline root near the TPU hosts, the registry in the Model Registry's
region, the TensorBoard log bucket regional and in the run's region)."""

from __future__ import annotations

from tpustream.storage import io as storage

from .findings import (
    FAIL,
    OK,
    TENSORBOARD_BUCKET_DOC,
    WARN,
    Finding,
    bucket_serves_region,
)

__all__ = ["bucket", "tensorboard_bucket"]


def bucket(name: str, uri: str, region: str, *, must_be_in_region: bool, why: str) -> Finding:
    """The bucket of ``uri`` exists, the caller can read it, and it keeps its data where ``region`` needs."""
    check = f"bucket {name}"
    bucket = uri[len("gs://") :].split("/", 1)[0]
    try:
        info = storage.bucket_info(uri, timeout=15.0)
    except storage.NotFound:
        return Finding(
            check,
            FAIL,
            f"gs://{bucket} does not exist: gcloud storage buckets create gs://{bucket} --location={region}",
        )
    except storage.StorageError as exc:
        return Finding(
            check,
            FAIL,
            f"{exc}: grant yourself roles/storage.legacyBucketReader on gs://{bucket} (or roles/storage.admin)",
        )
    if bucket_serves_region(info.location, region, info.data_locations):
        return Finding(check, OK, f"gs://{bucket} is in {info.location} ({info.location_type})")
    return Finding(
        check,
        FAIL if must_be_in_region else WARN,
        f"gs://{bucket} is in {info.location}, not in {region}: {why}; use a bucket in {region} "
        f"(gcloud storage buckets create gs://NEW --location={region}) or run in the bucket's region",
    )


def tensorboard_bucket(pipeline_root: str, region: str) -> Finding:
    """The TPU job's log directory is under the pipeline root (pipelines/training.py, TRAIN_JOB_OUTPUT), and
    "Set up Vertex AI TensorBoard" requires its bucket to be regional (not multi- or dual-region) and in the
    region of the training job and the TensorBoard instance (the instance's region is checked against the
    run's by ``check_tensorboard``)."""
    bucket = pipeline_root[len("gs://") :].split("/", 1)[0]
    info = storage.bucket_info(pipeline_root, timeout=15.0)
    location_type = (info.location_type or "").lower()
    fix = (
        f"give --pipeline-root a bucket created with --location={region} "
        f"(gcloud storage buckets create gs://NEW --location={region}), or run without --param tensorboard "
        f"({TENSORBOARD_BUCKET_DOC})"
    )
    if location_type != "region":
        return Finding(
            "tensorboard-bucket",
            FAIL,
            f"gs://{bucket} is a {location_type or 'non-regional'} bucket ({info.location}): Vertex AI "
            f"TensorBoard needs the job's log directory in a regional bucket in {region}; {fix}",
        )
    if info.location.lower() != region.lower():
        return Finding(
            "tensorboard-bucket",
            FAIL,
            f"gs://{bucket} is in {info.location}, the training job and TensorBoard in {region}: Vertex AI "
            f"TensorBoard needs the log bucket in their region; {fix}",
        )
    return Finding(
        "tensorboard-bucket", OK, f"gs://{bucket} is a regional bucket in {region}, as TensorBoard needs"
    )
