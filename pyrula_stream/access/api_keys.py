"""API keys for the HTTP faces (web UI, ``mcp serve --http``, the gateway): who a caller is.

A key file holds one ``name=key`` per line (``#`` comments and blank lines allowed). A
caller proves itself with ``Authorization: Bearer <key>``; its *principal* is the key's
name, never the key, so a key can be replaced under the same name without changing who
owns what. Keys are compared in constant time and never appear in a repr, a log line or
an error message.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Mapping
from pathlib import Path

from pyrula_stream.errors import ConfigurationError

OWNER_METADATA = "owner"
"""The turn request's metadata key that names the principal who submitted the turn."""

SINGLE_KEY_NAME = "api-key"
"""The principal of ``APIKeyAuth("<key>")``: a single string is ``{"api-key": key}``."""

_SESSION_LABEL = b"pyrula-stream browser session v2"

SESSION_MAX_AGE_S = 12 * 3600
"""How long a browser session lasts after its login (the cookie's ``Max-Age`` too): a
cookie copied from a browser stops working within a working day."""
SESSION_CLOCK_SKEW_S = 60

MIN_KEY_LENGTH = 32
"""Shorter keys are refused unless ``allow_short_keys``: a key is the only secret between
a caller and every turn of its principal, and a short one can be guessed."""

PRINCIPAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")
"""A principal's name: it becomes part of thread and idempotency keys (``<principal>:<id>``)
and journal keys (``/``), so it may not hold their separators, spaces or other text."""


def check_principal_name(name: object) -> str:
    """``name`` if it is a safe principal name, else ``ConfigurationError`` saying why."""
    if not isinstance(name, str) or PRINCIPAL_NAME.fullmatch(name) is None:
        raise ConfigurationError(
            f"API key name {name!r} must be 1 to 128 letters, digits and . _ @ + - "
            "(starting with a letter or digit): the name is the principal, and ':' and '/' "
            "separate the keys of its threads and turns"
        )
    return name


class APIKeyAuth:
    """Named static keys. ``APIKeyAuth({"web": k1, "ops": k2})`` or ``APIKeyAuth(key)``."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Mapping[str, str] | str, *, allow_short_keys: bool = False) -> None:
        """``allow_short_keys`` takes keys under ``MIN_KEY_LENGTH`` characters (tests, a
        trusted network); otherwise they are refused."""
        named = {SINGLE_KEY_NAME: keys} if isinstance(keys, str) else dict(keys)
        if not named:
            raise ConfigurationError("APIKeyAuth needs at least one key")
        by_value: dict[str, str] = {}
        for name, key in named.items():
            check_principal_name(name)
            if not isinstance(key, str) or not key or key != key.strip():
                raise ConfigurationError(
                    f"API key '{name}' must be non-empty text without surrounding spaces"
                )
            if len(key) < MIN_KEY_LENGTH and not allow_short_keys:
                raise ConfigurationError(
                    f"API key '{name}' is {len(key)} characters; give at least "
                    f"{MIN_KEY_LENGTH} characters (e.g. `openssl rand -hex 32`), or allow "
                    "short keys explicitly (--allow-short-api-keys, allow_short_keys=True)"
                )
            if key in by_value:  # one key, two principals: who would the caller be?
                raise ConfigurationError(
                    f"API keys '{by_value[key]}' and '{name}' are the same key; give each "
                    "name its own key"
                )
            by_value[key] = name
        self._keys = {name: key.encode() for name, key in named.items()}

    @property
    def names(self) -> tuple[str, ...]:
        """The principals, sorted (never the keys)."""
        return tuple(sorted(self._keys))

    def principal(self, presented: str | bytes) -> str | None:
        """The name of the key ``presented`` is, or ``None``. Every key is compared (in
        constant time), so the time taken says nothing about which key came close."""
        token = presented.encode("utf-8", "replace") if isinstance(presented, str) else presented
        found: str | None = None
        for name, key in self._keys.items():
            if hmac.compare_digest(key, token) and found is None:
                found = name
        return found

    def session_token(self, principal: str, *, issued_s: int | None = None) -> str:
        """What a browser keeps in its cookie for ``principal``: ``<issued>.<mac>``, the
        issue time (epoch seconds) and a MAC of it under the key. Not the key, valid for
        ``SESSION_MAX_AGE_S`` from ``issued_s`` (now), and no longer once the key is
        replaced."""
        issued = int(time.time()) if issued_s is None else issued_s
        return f"{issued}.{self._session_mac(principal, issued)}"

    def _session_mac(self, principal: str, issued: int) -> str:
        message = _SESSION_LABEL + b"|" + str(issued).encode()
        return hmac.new(self._keys[principal], message, hashlib.sha256).hexdigest()

    def session_principal(self, token: str, *, now_s: float | None = None) -> str | None:
        """The principal whose ``session_token`` is ``token`` and still young enough (at
        most ``SESSION_MAX_AGE_S`` old, not issued later than a minute from now), or
        ``None``."""
        stamp, _, mac = token.partition(".")
        if not stamp.isascii() or not stamp.isdigit() or len(stamp) > 12:
            return None
        issued = int(stamp)
        now = time.time() if now_s is None else now_s
        if not (now - SESSION_MAX_AGE_S <= issued <= now + SESSION_CLOCK_SKEW_S):
            return None
        presented = mac.encode("ascii", "replace")
        found: str | None = None
        for name in self._keys:
            ok = hmac.compare_digest(self._session_mac(name, issued).encode(), presented)
            if ok and found is None:
                found = name
        return found

    def __repr__(self) -> str:
        return f"APIKeyAuth(names={list(self.names)!r})"


def parse_api_keys(
    text: str, *, source: str = "the API key file", allow_short_keys: bool = False
) -> APIKeyAuth:
    """``name=key`` lines (``#`` comments, blank lines) → ``APIKeyAuth``. An empty file,
    a line without ``=``, an empty name or key, or a name given twice is refused; the
    error names the line, never its key."""
    keys: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, key = line.partition("=")
        name, key = name.strip(), key.strip()
        if not sep or not name or not key:
            raise ConfigurationError(
                f"{source}, line {number}: expected name=key (a name, '=', then the key)"
            )
        if name in keys:
            raise ConfigurationError(
                f"{source}, line {number}: the name '{name}' is given twice; each name "
                "is one principal with one key"
            )
        try:
            APIKeyAuth({name: key}, allow_short_keys=allow_short_keys)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{source}, line {number}: {exc}") from None
        keys[name] = key
    if not keys:
        raise ConfigurationError(f"{source} holds no keys: add lines of name=key")
    try:
        return APIKeyAuth(keys, allow_short_keys=allow_short_keys)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{source}: {exc}") from None


def load_api_keys(path: str | Path, *, allow_short_keys: bool = False) -> APIKeyAuth:
    """Read a key file (see ``parse_api_keys``)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConfigurationError(f"cannot read the API key file {path}: {reason}") from None
    return parse_api_keys(text, source=f"API key file {path}", allow_short_keys=allow_short_keys)
