"""Signed tenants: a turn's tenant that a worker can trust although anyone may write it.

Kafka records do not carry the principal that produced them, so a tenant header is
whatever the producer wrote: naming a victim's tenant would spend its quota. An operator
who gives the workers a tenant key (``WorkerOptions.tenant_key``) makes them trust a
tenant only when the request carries ``pyrula-tenant-signature``: an HMAC-SHA256, under
that key, of the agent, the turn id and the tenant. Whoever holds the key (the gateway,
given the same key, or an operator's own submitter) vouches for the tenant; a signature
is bound to one turn, so one seen on the turns topic cannot be reused for another.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from pyrula_stream.errors import ConfigurationError

TENANT_SIGNATURE_HEADER = "pyrula-tenant-signature"
MIN_TENANT_KEY_BYTES = 32
"""A key shorter than this is refused: the signature is only as strong as the key."""
_LABEL = b"pyrula-stream tenant v1"


def check_tenant_key(key: bytes) -> bytes:
    """The key, or ``ConfigurationError`` when it is too short to sign with."""
    if len(key) < MIN_TENANT_KEY_BYTES:
        raise ConfigurationError(
            f"a tenant key must be at least {MIN_TENANT_KEY_BYTES} bytes, got {len(key)}"
        )
    return key


def load_tenant_key(path: str | Path) -> bytes:
    """The key in a file (surrounding whitespace stripped), checked for length."""
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigurationError(f"cannot read the tenant key file {path}: {exc}") from None
    return check_tenant_key(key)


def tenant_signature(key: bytes, agent: str, turn_id: str, tenant: str) -> str:
    """The signature header's value for ``tenant`` on this turn of ``agent``."""
    message = b"\x00".join((_LABEL, agent.encode(), turn_id.encode(), tenant.encode()))
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def signed_tenant_headers(
    key: bytes, agent: str, turn_id: str, tenant: str, header: str
) -> list[tuple[str, bytes]]:
    """The request headers that name ``tenant`` in ``header`` (the agent's
    ``tenant="header:<name>"``) and sign it for this turn: pass them to
    ``KafkaAgentClient.submit_request(request, headers=...)``."""
    signature = tenant_signature(key, agent, turn_id, tenant)
    return [(header, tenant.encode()), (TENANT_SIGNATURE_HEADER, signature.encode())]


def signed_by(key: bytes, agent: str, turn_id: str, tenant: str, signature: str | None) -> bool:
    """Whether ``signature`` is ``tenant``'s for this turn under ``key`` (constant time)."""
    if not signature:
        return False
    expected = tenant_signature(key, agent, turn_id, tenant)
    return hmac.compare_digest(expected.encode(), signature.strip().lower().encode())


__all__ = [
    "MIN_TENANT_KEY_BYTES",
    "TENANT_SIGNATURE_HEADER",
    "check_tenant_key",
    "load_tenant_key",
    "signed_by",
    "signed_tenant_headers",
    "tenant_signature",
]
