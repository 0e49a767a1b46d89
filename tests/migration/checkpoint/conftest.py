"""Fixtures for the checkpoint store: a real S3 server for the whole session, and one store per
test for each implementation (the contract tests run against both)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from migration.checkpoint import LocalStore, Store, open_store
from migration.checkpoint.s3 import S3Store

from .s3server import BUCKET, S3Server, weed_binary

# Small chunks keep the tests fast while still giving every tensor several chunks.
TEST_CHUNK = 1024 * 1024

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "baton-test",
    "AWS_SECRET_ACCESS_KEY": "baton-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A SeaweedFS S3 server on loopback with the test bucket, for the whole session."""
    if weed_binary() is None:
        pytest.skip("SeaweedFS (weed) is not installed")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in S3_ENV.items():
            patch.setenv(name, value)
        server = S3Server(tmp_path_factory.mktemp("weed"))
        server.start()
        try:
            store = S3Store(BUCKET, "bootstrap", endpoint=server.endpoint, retry_seconds=30)
            store.ensure_bucket()
            store.close()
            yield server
        finally:
            server.stop()


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The S3 credentials in the environment, as a workload would get them."""
    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    return s3_server


def new_s3_store(server: S3Server, prefix: str | None = None, **options: object) -> S3Store:
    """A store under a fresh prefix of the test bucket (isolated like a project namespace)."""
    options.setdefault("chunk_size", TEST_CHUNK)
    url = f"s3://{BUCKET}/{prefix or 't-' + uuid.uuid4().hex[:12]}"
    store = open_store(url, endpoint=server.endpoint, **options)
    assert isinstance(store, S3Store)
    return store


def heads_of(store: S3Store) -> list[str]:
    """The keys the store asks about with a HEAD from now on, without its prefix (a list that
    grows as it does)."""
    keys: list[str] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        keys.append(store._strip(params["Key"]))

    store._client.meta.events.register("provide-client-params.s3.HeadObject", record)
    return keys


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """One store of each implementation; every contract test runs against both."""
    if request.param == "local":
        opened: Store = LocalStore(tmp_path / "store", chunk_size=TEST_CHUNK)
    else:
        request.getfixturevalue("s3_env")
        opened = new_s3_store(request.getfixturevalue("s3_server"))
    yield opened
    opened.close()


@pytest.fixture
def other_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A second, empty store of the same kind as `store` (replication target)."""
    kind = request.node.callspec.params.get("store", "local")
    if kind == "local":
        opened: Store = LocalStore(tmp_path / "other", chunk_size=TEST_CHUNK)
    else:
        opened = new_s3_store(request.getfixturevalue("s3_server"))
    yield opened
    opened.close()


def chunk_env() -> dict[str, str]:
    """The environment a subprocess needs to reach the test S3 server."""
    return {**os.environ, **S3_ENV}


def temporaries(root: Path) -> list[str]:
    """Names of the temporary files under `root` (a writer's, or gc's, left behind)."""
    return [p.name for p in root.rglob("*") if ".tmp-" in p.name]
