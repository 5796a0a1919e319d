"""Shared fixtures: a real GCS-API server for the session, buckets per test, local/GCS roots."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.fakes.gcs import FaultProxy, GcsServer, make_bucket

_bucket_ids = itertools.count()


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsServer]:
    server = GcsServer()
    yield server
    server.close()


@pytest.fixture
def gcs_bucket(gcs_server: GcsServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on the test server; returns ``gs://name``. STORAGE_EMULATOR_HOST points at it."""
    name = f"bucket-{next(_bucket_ids)}"
    make_bucket(gcs_server.url, name)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
    return f"gs://{name}"


@pytest.fixture(params=["local", "gcs"])
def root(request: pytest.FixtureRequest, tmp_path) -> str:  # noqa: ANN001
    """A writable root URI: a temp directory, then a prefix in a bucket on the GCS test server."""
    if request.param == "local":
        return str(tmp_path / "root")
    bucket = request.getfixturevalue("gcs_bucket")
    return f"{bucket}/root"


@pytest.fixture
def fault_proxy(gcs_server: GcsServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A proxy answering 5% of requests with a 503 or a cut body; clients are pointed at it."""
    proxy = FaultProxy(gcs_server.url, fault_rate=0.05, seed=1234)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    yield proxy
    proxy.close()
