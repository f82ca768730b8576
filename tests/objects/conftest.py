"""Both stores for the tests that must hold on each: a local directory and the session's
real S3 server (started only when an S3 case runs)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from pyrula_stream.objects import LocalObjectStore, ObjectStore
from pyrula_stream.objects.s3 import store_from_url
from tests.conftest import S3_TEST_BUCKET


@pytest.fixture(params=["local", "s3"])
def object_store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """A fresh store of each kind: a directory, or a prefix of its own in the S3 bucket."""
    if request.param == "local":
        return LocalObjectStore(tmp_path / "objects")
    server = request.getfixturevalue("s3_server")
    return store_from_url(server.store_url(S3_TEST_BUCKET, f"t-{uuid.uuid4().hex[:8]}"))
