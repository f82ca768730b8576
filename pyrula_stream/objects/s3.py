"""``S3ObjectStore``: values by reference in S3-compatible object storage, through boto3.

One client for AWS S3, GCS's S3 API (``https://storage.googleapis.com`` with HMAC keys),
MinIO and Ceph RGW. Credentials come from boto3's standard chain (``AWS_ACCESS_KEY_ID``
and ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, the instance or pod role), never from our
settings, and never appear in a repr, a log line or an error. Objects at or past
``multipart_threshold`` go up in parts (boto3's managed transfer), so a 20 MB document is
not one request that a proxy cuts; ``iter_chunks`` reads one back in pieces.

For an ``endpoint_url`` that is not AWS: ``path_style=True`` addresses
``<endpoint>/<bucket>/<key>`` (MinIO, Ceph and most on-premises servers have no
per-bucket host names), and checksums are sent only where S3 requires them (boto3 1.36+
adds CRC32 headers by default, which several S3-compatible servers refuse).

Needs the ``s3`` extra: ``pip install 'pyrula-stream[s3]'``.
"""

from __future__ import annotations

import io
import urllib.parse
from collections.abc import Iterator
from typing import IO, Any

from pyrula_stream.errors import ConfigurationError, ObjectStoreUnavailable
from pyrula_stream.objects.store import ObjectInfo
from pyrula_stream.redaction import redact, safe_url

STORE_NAME = "s3"
MULTIPART_THRESHOLD = 8 * 1024 * 1024
"""Objects from this size up are uploaded in parts of this size (S3's minimum part is
5 MiB; 8 MiB is boto3's default)."""
CHUNK = 1024 * 1024
MISSING = frozenset({"NoSuchKey", "404", "NotFound"})
REFUSED = frozenset(
    {
        "NoSuchBucket",
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AllAccessDisabled",
        "InvalidBucketName",
        "PermanentRedirect",
        "AuthorizationHeaderMalformed",
    }
)
"""Answers that no retry changes: wrong bucket, region or credentials."""


def _boto3() -> Any:
    try:
        import boto3
    except ImportError:
        raise ConfigurationError(
            "the S3 object store needs boto3: pip install 'pyrula-stream[s3]'"
        ) from None
    return boto3


class S3ObjectStore:
    """Objects under ``prefix`` in ``bucket``; keys are the caller's (content addresses).

    ``endpoint_url``: a non-AWS server (``http://127.0.0.1:9000`` for MinIO); ``region``:
    the bucket's (boto3's own default otherwise); ``profile``: a named profile of
    ``~/.aws``; ``path_style``: path-style addressing (default: on when ``endpoint_url`` is
    given). ``client``: a boto3 S3 client made elsewhere, used as it is.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        path_style: bool | None = None,
        multipart_threshold: int = MULTIPART_THRESHOLD,
        max_concurrency: int = 4,
        timeout_s: float = 60.0,
        client: Any = None,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ConfigurationError(f"S3 bucket name {bucket!r} must be non-empty, without '/'")
        if prefix.startswith("/"):
            raise ConfigurationError(f"S3 key prefix {prefix!r} must not start with '/'")
        if multipart_threshold < 5 * 1024 * 1024:
            raise ConfigurationError(
                f"multipart_threshold={multipart_threshold}: S3 parts are at least 5 MiB"
            )
        self.bucket = bucket
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.endpoint_url = endpoint_url
        self.region = region
        self.multipart_threshold = multipart_threshold
        boto3 = _boto3()
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self._transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_threshold,
            max_concurrency=max_concurrency,
        )
        if client is None:
            other = endpoint_url is not None
            config = Config(
                connect_timeout=min(timeout_s, 10.0),
                read_timeout=timeout_s,
                retries={"max_attempts": 4, "mode": "standard"},
                max_pool_connections=max(10, max_concurrency * 2),
                s3={"addressing_style": _addressing(path_style, other)},
                request_checksum_calculation="when_required" if other else "when_supported",
                response_checksum_validation="when_required" if other else "when_supported",
            )
            self._session = boto3.session.Session(profile_name=profile)
            client = self._session.client(
                "s3", endpoint_url=endpoint_url, region_name=region, config=config
            )
        else:
            self._session = None
        self._client = client

    @property
    def name(self) -> str:
        return STORE_NAME

    def __repr__(self) -> str:
        where = f", endpoint_url={safe_url(self.endpoint_url)!r}" if self.endpoint_url else ""
        return f"S3ObjectStore(bucket={self.bucket!r}, prefix={self.prefix!r}{where})"

    # --- the ObjectStore protocol ------------------------------------------------------

    def put(self, key: str, data: bytes, content_type: str) -> None:
        """One request for a small object, parts for a big one. Always sent, even when the
        key holds these bytes already: the write renews the object's modification time,
        which the sweeper reads as "written again, keep it" (objects/sweep.py)."""
        if len(data) < self.multipart_threshold:
            self._call(
                "put",
                key,
                self._client.put_object,
                Bucket=self.bucket,
                Key=self._key(key),
                Body=data,
                ContentType=content_type,
            )
            return
        self.put_file(key, io.BytesIO(data), content_type)

    def get(self, key: str) -> bytes:
        return b"".join(self.iter_chunks(key))

    def exists(self, key: str) -> bool:
        return self._size(key) is not None

    def _size(self, key: str) -> int | None:
        """The object's length, ``None`` when there is none."""
        try:
            head = self._call(
                "head", key, self._client.head_object, Bucket=self.bucket, Key=self._key(key)
            )
        except KeyError:
            return None
        return int(head["ContentLength"])

    def delete(self, key: str) -> None:
        self._call(
            "delete", key, self._client.delete_object, Bucket=self.bucket, Key=self._key(key)
        )

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + prefix
        )
        try:
            for page in pages:
                for item in page.get("Contents", ()):
                    yield ObjectInfo(
                        key=item["Key"][len(self.prefix) :],
                        size=int(item["Size"]),
                        modified_ms=int(item["LastModified"].timestamp() * 1000),
                    )
        except Exception as exc:
            raise self._error("list", prefix, exc) from None

    # --- streams -----------------------------------------------------------------------

    def put_file(self, key: str, file: IO[bytes], content_type: str) -> None:
        """Upload what ``file`` holds from its position on (in parts when it is at least
        ``multipart_threshold``): a gateway upload spooled to disk is never all in memory."""
        self._call(
            "put",
            key,
            self._client.upload_fileobj,
            file,
            self.bucket,
            self._key(key),
            ExtraArgs={"ContentType": content_type},
            Config=self._transfer,
        )

    def iter_chunks(self, key: str, chunk_size: int = CHUNK) -> Iterator[bytes]:
        """The object in pieces of at most ``chunk_size`` bytes, as the server sends it;
        ``KeyError`` when there is none (raised before the first piece)."""
        answer = self._call(
            "get", key, self._client.get_object, Bucket=self.bucket, Key=self._key(key)
        )
        body = answer["Body"]
        try:
            yield from body.iter_chunks(chunk_size)
        except Exception as exc:
            raise self._error("get", key, exc) from None
        finally:
            body.close()

    # --- errors ------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        if not key or key.startswith("/"):
            raise ValueError(f"object key {key!r} must be non-empty and relative")
        return self.prefix + key

    def _call(self, what: str, key: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            if _code(exc) in MISSING:
                raise KeyError(key) from None
            raise self._error(what, key, exc) from None

    def _error(self, what: str, key: str, exc: Exception) -> Exception:
        """Our error for a failed call, naming bucket and key; no credential in its text."""
        where = f"s3://{self.bucket}/{self.prefix}{key}"
        if self.endpoint_url:
            where += f" at {safe_url(self.endpoint_url)}"
        reason = redact(f"{type(exc).__name__}: {exc}", self._secrets())
        code = _code(exc)
        if type(exc).__name__ in {"NoCredentialsError", "PartialCredentialsError"}:
            return ConfigurationError(
                f"S3 {what} of {where}: no credentials; set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or a role) in the environment"
            )
        if code in REFUSED:
            return ConfigurationError(f"S3 {what} of {where} refused: {reason}")
        return ObjectStoreUnavailable(f"S3 {what} of {where} failed: {reason}")

    def _secrets(self) -> tuple[str, ...]:
        """The secret and token in use (blanked out of error text, in case a server or a
        proxy quoted them back)."""
        found = None if self._session is None else self._session.get_credentials()
        if found is None:
            return ()
        frozen = found.get_frozen_credentials()
        return tuple(s for s in (frozen.secret_key, frozen.token) if s)


def _addressing(path_style: bool | None, other_endpoint: bool) -> str:
    """boto3's addressing style: as asked, else path-style off AWS and AWS's own choice
    on it."""
    if path_style is None:
        return "path" if other_endpoint else "auto"
    return "path" if path_style else "virtual"


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


URL_OPTIONS = frozenset({"endpoint", "region", "path_style", "profile"})
TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})


def store_from_url(url: str) -> S3ObjectStore:
    """``s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=eu-west-1&path_style=1
    &profile=name`` -> the store (every option may be left out). Credentials in the URL
    are refused: they belong in the environment, where no log or listing prints them."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "s3":
        raise ConfigurationError(f"object store URL {_shown(url)!r}: expected s3://bucket/prefix")
    if "@" in parts.netloc:
        raise ConfigurationError(
            "an s3:// object store URL must not hold credentials: set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment instead"
        )
    if not parts.netloc:
        raise ConfigurationError(f"object store URL {_shown(url)!r}: no bucket (s3://BUCKET/...)")
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
    unknown = sorted(set(query) - URL_OPTIONS)
    if unknown:
        raise ConfigurationError(
            f"object store URL s3://{parts.netloc}{parts.path}: unknown option(s) "
            f"{', '.join(unknown)} (known: {', '.join(sorted(URL_OPTIONS))}; credentials "
            "come from the environment)"
        )
    one = {name: values[-1] for name, values in query.items()}
    path_style: bool | None = None
    if "path_style" in one:
        word = one["path_style"].strip().lower()
        if word not in TRUE | FALSE:
            raise ConfigurationError(
                f"path_style={one['path_style']!r}: expected 1/true or 0/false"
            )
        path_style = word in TRUE
    endpoint = one.get("endpoint") or None
    if endpoint is not None and urllib.parse.urlsplit(endpoint).scheme not in ("http", "https"):
        raise ConfigurationError(f"endpoint={safe_url(endpoint)!r}: expected http(s)://host:port")
    return S3ObjectStore(
        parts.netloc,
        parts.path.lstrip("/"),
        endpoint_url=endpoint,
        region=one.get("region") or None,
        profile=one.get("profile") or None,
        path_style=path_style,
    )


def _shown(url: str) -> str:
    """``url`` fit for an error message (no userinfo, no query)."""
    return safe_url(url) or ""
