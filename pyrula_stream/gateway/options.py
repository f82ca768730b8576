"""``AppOptions``: what ``create_app`` serves, where its Kafka is, and its limits.

Kept apart from the FastAPI app so the HTTP client and the CLI can read the defaults
without importing FastAPI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyrula_stream.access.api_keys import APIKeyAuth
from pyrula_stream.access.rate_limit import RatePolicy
from pyrula_stream.access.tenant_signature import check_tenant_key
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.kafka.admin import DEFAULT_PREFIX

DEFAULT_HTTP_PREFIX = "/agents"
GATEWAY_TENANT_HEADER = "pyrula-gateway-tenant"
"""The request header the gateway sets to the caller's tenant (an agent behind the gateway
reads it with ``tenant="header:pyrula-gateway-tenant"``)."""
MAX_BODY_BYTES = 1024 * 1024
MAX_UPLOAD_BYTES = 64 * 1024 * 1024
"""Each key's default limit on one upload, and on a turn's JSON body with a store."""


GATEWAY_RATE = RatePolicy(per_second=50.0, burst=100)
"""Each caller's default rate."""


@dataclass(frozen=True)
class AppOptions:
    """Options of ``create_app`` (the seeds' names where they have one).

    ``prefix`` is the HTTP path the routes live under; ``topic_prefix`` the Kafka topic
    prefix (``<topic_prefix>.<agent>.turns``). ``auth`` with keys makes every route under
    ``prefix`` ask for ``Authorization: Bearer <key>``; ``host`` is the address the app is
    served on (beyond loopback it needs ``auth`` or ``allow_unauthenticated``).
    ``kafka_timeout`` bounds every Kafka call of a request, so a broker that is down is a
    ``503`` within that time, never a hang. ``max_queue_depth`` answers a submit ``429``
    while more of the agent's turns wait for a worker (its workers' lag).
    ``static_dir`` serves that folder at ``/`` (a web page such as ``examples/web_chat``);
    with keys, a browser signs in with a key at ``/login`` and then carries a session
    cookie, since ``EventSource`` cannot send an ``Authorization`` header.
    With keys, each turn's tenant is the caller's: ``tenants`` maps a principal to its
    tenant (a principal it does not name is its own tenant), written in the header
    ``GATEWAY_TENANT_HEADER``, and signed with ``tenant_key`` when given (the workers' key:
    they then trust the tenant, see docs/tenants.md). ``max_connections`` caps open
    connections when served by ``pyrula-stream gateway`` (default 1024; past it, ``503``).
    ``rate_limit`` holds each caller (key, or address without keys) to its rate on the
    routes under ``prefix`` (``429`` past it; ``None``: no limit).
    ``object_store`` (a store or its setting; ``None``: ``PYRULA_OBJECT_STORE``) is where
    values stored by reference are: the SSE stream reads them back (docs/large-payloads.md).
    It also takes large inputs: ``POST <prefix>/<agent>/uploads`` streams one into it and
    answers its reference, and a turn's JSON body may then reach ``max_upload_bytes`` (its
    large parameters are stored by reference before the request is produced).
    ``upload_limits`` gives a key (by principal) another limit than ``max_upload_bytes``;
    past it, ``413`` (docs/object-stores.md).
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    prefix: str = DEFAULT_HTTP_PREFIX
    topic_prefix: str = DEFAULT_PREFIX
    kafka_config: Mapping[str, Any] | None = None
    auth: APIKeyAuth | None = None
    host: str | None = None
    allowed_hosts: tuple[str, ...] = ()
    allow_unauthenticated: bool = False
    sse_keepalive_interval: float = 15.0
    sse_max_streams: int | None = 256
    sse_max_streams_per_owner: int | None = 16
    sse_max_duration_s: float | None = 3600.0
    max_body_bytes: int = MAX_BODY_BYTES
    max_queue_depth: int | None = None
    static_dir: str | None = None
    include_health: bool = True
    include_ready: bool = True
    health_path: str = "/healthz"
    ready_path: str = "/readyz"
    kafka_timeout: float = 10.0
    retry_after_s: int = 5
    tenants: Mapping[str, str] | None = None
    max_connections: int | None = None
    rate_limit: RatePolicy | None = GATEWAY_RATE
    tenant_key: bytes | None = field(default=None, repr=False)
    object_store: Any = field(default=None, repr=False)  # may hold a store's credentials
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    upload_limits: Mapping[str, int] | None = None

    def upload_limit(self, principal: str | None) -> int:
        """The most one upload (or, with a store, one turn's body) of ``principal`` holds."""
        limits = self.upload_limits or {}
        return limits.get(principal, self.max_upload_bytes) if principal else self.max_upload_bytes

    def __post_init__(self) -> None:
        if not self.prefix.startswith("/") or (self.prefix != "/" and self.prefix.endswith("/")):
            raise ConfigurationError(
                f"prefix must start with '/' and not end with one, got {self.prefix!r}"
            )
        if self.sse_keepalive_interval <= 0 or self.kafka_timeout <= 0:
            raise ConfigurationError("sse_keepalive_interval and kafka_timeout must be > 0")
        for name in ("sse_max_streams", "sse_max_streams_per_owner"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigurationError(f"{name} must be >= 1 or None, got {value}")
        if self.tenant_key is not None:
            check_tenant_key(self.tenant_key)
        for principal, tenant in (self.tenants or {}).items():
            if not isinstance(tenant, str) or not tenant.strip():
                raise ConfigurationError(f"tenants[{principal!r}] must be non-empty text")
        if self.max_body_bytes < 1:
            raise ConfigurationError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        for name, limit in {
            "max_upload_bytes": self.max_upload_bytes,
            **{f"upload_limits[{k!r}]": v for k, v in (self.upload_limits or {}).items()},
        }.items():
            if not isinstance(limit, int) or limit < 1:
                raise ConfigurationError(f"{name} must be a number of bytes >= 1, got {limit!r}")
