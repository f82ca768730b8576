"""Keep credentials out of everything a user can read: errors, logs, ``repr``.

Provider errors can echo what they were sent (a proxy that reflects headers, an auth
error that quotes the key), so every message we build from a provider's words passes
through ``redact`` first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

REDACTED = "[REDACTED]"

# Shapes of well-known provider keys, caught even when we do not know the exact key.
_KEY_SHAPES = re.compile(r"\b(?:sk-ant-|sk-proj-|sk-)[A-Za-z0-9_\-]{8,}")
_BEARER = re.compile(r"(?i)\b(bearer|x-api-key:?)\s+[^\s,;\"']+")


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every known secret and anything shaped like a provider key removed."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    text = _KEY_SHAPES.sub(REDACTED, text)
    return _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)


def safe_url(url: str | None) -> str | None:
    """A base URL fit for ``repr``: user info and query string (where keys hide) dropped."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
