"""One way to keep secrets out of everything a person can read: reprs, logs, errors.

Kafka client settings hide their secret keys and the passwords and query values of their
URLs; text built from a model provider's words loses known keys and anything shaped like
a provider key (a proxy that reflects headers, an auth error that quotes the key). Every
floor uses it, so it is a leaf. One spelling: ``[redacted]``.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[redacted]"

REGISTRY_PREFIX = "schema.registry."
"""Settings for the Schema Registry client ride in the same file: ``schema.registry.url``,
``schema.registry.basic.auth.user.info``, ``schema.registry.ssl.ca.location``, ..."""


SECRET_KEYS = frozenset(
    {
        "sasl.password",
        "sasl.jaas.config",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.config",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl_key",
        "ssl.keystore.password",
        "ssl.truststore.password",
        "basic.auth.user.info",
        "bearer.auth.token",
        "bearer.auth.client.secret",
    }
)


def is_secret(key: str) -> bool:
    return key.removeprefix(REGISTRY_PREFIX) in SECRET_KEYS or key.endswith(
        (".password", ".secret", ".user.info")
    )


def redact_url(url: str) -> str:
    """``url`` (or a comma-separated list of them) without the password of its userinfo
    nor the values of its query: ``https://key:secret@host/?token=t`` ->
    ``https://key:[redacted]@host/?token=[redacted]`` (the registry client takes
    credentials from the URL, and many services take a key in the query string)."""
    return ",".join(_redact_one_url(part) for part in url.split(","))


def _redact_one_url(url: str) -> str:
    try:
        parts = urllib.parse.urlsplit(url.strip())
    except ValueError:
        return url
    if not parts.scheme or not parts.netloc:
        return url  # not a URL: a plain setting such as a user name
    if parts.password is not None:
        host = parts.netloc.rpartition("@")[2]
        user = parts.netloc.rpartition("@")[0].partition(":")[0]
        parts = parts._replace(netloc=f"{user}:{REDACTED}@{host}")
    if parts.query:
        names = [field.partition("=")[0] for field in parts.query.split("&")]
        parts = parts._replace(query="&".join(f"{name}={REDACTED}" for name in names))
    return urllib.parse.urlunsplit(parts)


def _url_passwords(value: str) -> list[str]:
    found = []
    for part in value.split(","):
        try:
            password = urllib.parse.urlsplit(part.strip()).password
        except ValueError:
            continue
        if password:
            found += [password, urllib.parse.unquote(password)]  # as written, as sent
    return found


def redacted(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``conf`` with every secret value replaced (for logs and reprs)."""
    return {
        k: REDACTED if is_secret(k) else redact_url(v) if isinstance(v, str) else v
        for k, v in conf.items()
    }


def scrub(text: str, conf: Mapping[str, Any]) -> str:
    """``text`` with every secret value of ``conf`` blanked out (for error messages)."""
    for key, value in conf.items():
        if not isinstance(value, str) or not value:
            continue
        secrets = [value] if is_secret(key) else _url_passwords(value)
        for secret in secrets:
            text = text.replace(secret, REDACTED)
    return text


_CREDENTIAL_HEADER = re.compile(
    r"^(?:proxy-)?authorization$|^(?:set-)?cookie$|token|secret|password|passwd|api[-_]?key",
    re.IGNORECASE,
)
_OWN_HEADER = re.compile(r"^pyrula[-.]", re.IGNORECASE)


def is_credential_header(name: str) -> bool:
    """A record header whose value may be a credential a producer put there
    (``Authorization``, ``Cookie``, ``*token*``, ``*secret*``, ``*password*``,
    ``*api-key*``): kept out of dead letters and the UI. Our own ``pyrula-``/``pyrula.``
    headers never hold one (``pyrula-budget-tokens-left`` is a count) and are kept."""
    return _CREDENTIAL_HEADER.search(name) is not None and _OWN_HEADER.match(name) is None


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
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))
