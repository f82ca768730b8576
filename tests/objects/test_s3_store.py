"""``S3ObjectStore`` against a real S3 server (versitygw, the session's ``s3_server``):
the calls boto3 makes to AWS S3, MinIO or Ceph, answered by a real implementation."""

from __future__ import annotations

import logging
import uuid

import boto3
import pytest
from botocore.config import Config

from pyrula_stream.errors import ConfigurationError
from pyrula_stream.objects.s3 import S3ObjectStore, store_from_url
from pyrula_stream.objects.s3_server import LocalS3
from pyrula_stream.objects.store import ObjectStore
from tests.conftest import S3_TEST_BUCKET

MiB = 1024 * 1024


@pytest.fixture
def store(s3_server: LocalS3) -> S3ObjectStore:
    """A store under a prefix of its own, so tests never see each other's objects."""
    return store_from_url(s3_server.store_url(S3_TEST_BUCKET, f"t-{uuid.uuid4().hex[:8]}"))


def raw_client(server: LocalS3) -> object:
    return boto3.client(
        "s3",
        endpoint_url=server.endpoint_url,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )


def test_put_get_exists_list_delete(store: S3ObjectStore) -> None:
    assert isinstance(store, ObjectStore)
    assert store.name == "s3"
    store.put("ab/one", b'{"a": 1}', "application/json")
    store.put("cd/two", b"two", "text/plain")
    assert store.get("ab/one") == b'{"a": 1}'
    assert store.exists("ab/one") and not store.exists("ab/nothing")
    listed = {info.key: info for info in store.list()}
    assert set(listed) == {"ab/one", "cd/two"}  # keys without the store's prefix
    assert listed["cd/two"].size == 3 and listed["cd/two"].modified_ms > 0
    assert [info.key for info in store.list("cd/")] == ["cd/two"]
    store.delete("ab/one")
    assert not store.exists("ab/one")
    assert [info.key for info in store.list()] == ["cd/two"]


def test_missing_key_is_key_error_and_deleting_it_is_fine(store: S3ObjectStore) -> None:
    with pytest.raises(KeyError):
        store.get("zz/missing")
    store.delete("zz/missing")  # a sweep that runs twice
    store.delete("zz/missing")


def test_same_bytes_twice_leave_one_object(store: S3ObjectStore) -> None:
    store.put("ee/same", b"x" * 1000, "application/json")
    store.put("ee/same", b"x" * 1000, "application/json")
    assert [(i.key, i.size) for i in store.list()] == [("ee/same", 1000)]
    assert store.get("ee/same") == b"x" * 1000


def test_a_big_object_goes_up_in_parts_and_comes_back_in_pieces(
    store: S3ObjectStore, s3_server: LocalS3
) -> None:
    data = bytes(range(256)) * (12 * MiB // 256)  # 12 MiB: two 8 MiB parts
    store.put("ff/big", data, "application/octet-stream")
    head = raw_client(s3_server).head_object(  # type: ignore[attr-defined]
        Bucket=S3_TEST_BUCKET, Key=store.prefix + "ff/big"
    )
    assert head["ETag"].strip('"').endswith("-2")  # S3's mark of a two-part upload
    assert head["ContentType"] == "application/octet-stream"
    pieces = list(store.iter_chunks("ff/big", chunk_size=MiB))
    assert len(pieces) >= 12 and max(map(len, pieces)) <= MiB
    assert b"".join(pieces) == data
    assert store.get("ff/big") == data


def test_a_missing_bucket_is_a_configuration_error_naming_it(s3_server: LocalS3) -> None:
    gone = store_from_url(s3_server.store_url("no-such-bucket"))
    with pytest.raises(ConfigurationError, match="s3://no-such-bucket/"):
        gone.put("aa/x", b"x", "text/plain")


def test_credentials_stay_out_of_errors_reprs_and_logs(
    s3_server: LocalS3, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    wrong_secret = "wrong" + uuid.uuid4().hex
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong_secret)
    caplog.set_level(logging.DEBUG)
    store = store_from_url(s3_server.store_url(S3_TEST_BUCKET, "creds"))
    with pytest.raises(ConfigurationError, match="refused") as refused:
        store.put("aa/x", b"x", "text/plain")
    shown = f"{refused.value} {store!r} {caplog.text}"
    assert wrong_secret not in shown
    assert s3_server.secret_key not in repr(s3_server)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    anonymous = store_from_url(s3_server.store_url(S3_TEST_BUCKET, "creds"))
    with pytest.raises(ConfigurationError, match="no credentials; set AWS_ACCESS_KEY_ID"):
        anonymous.get("aa/x")


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("s3://key:secret@bucket/p", "must not hold credentials"),
        ("s3://bucket/p?secret=x", "unknown option"),
        ("s3:///p", "no bucket"),
        ("s3://bucket/p?path_style=maybe", "path_style"),
        ("s3://bucket/p?endpoint=127.0.0.1:9000", "expected http"),
    ],
)
def test_bad_store_urls_say_what_is_wrong(url: str, error: str) -> None:
    with pytest.raises(ConfigurationError, match=error) as refused:
        store_from_url(url)
    assert "secret" not in str(refused.value).replace("unknown option(s) secret", "")


def test_a_url_names_bucket_prefix_endpoint_and_addressing() -> None:
    store = store_from_url("s3://bkt/some/prefix?endpoint=http://127.0.0.1:1&region=eu-west-1")
    assert (store.bucket, store.prefix, store.region) == ("bkt", "some/prefix/", "eu-west-1")
    assert store._client.meta.config.s3["addressing_style"] == "path"
    aws = store_from_url("s3://bkt/p")
    assert aws._client.meta.config.s3["addressing_style"] == "auto"
    hosted = store_from_url("s3://bkt/p?endpoint=https://s3.example&path_style=0")
    assert hosted._client.meta.config.s3["addressing_style"] == "virtual"
    assert "secret" not in repr(store)
