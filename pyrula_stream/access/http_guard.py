"""The door of every HTTP face (web UI, ``mcp serve --http``, gateway): an ASGI middleware
that checks, before the face sees a request, that

1. the ``Host`` header names this server (loopback names, the bound address, and
   ``allowed_hosts``), so a DNS-rebinding page cannot reach a face on loopback: ``421``;
2. a state-changing request (POST, PUT, PATCH, DELETE) sent by a browser comes from the
   page's own origin (``Sec-Fetch-Site``, else ``Origin`` against ``Host``; a request
   with neither is not from a browser and is left to the key check), as Go's
   ``http.CrossOriginProtection`` decides: ``403``;
3. with API keys, the caller has one: ``Authorization: Bearer <key>``, or for a browser
   face the HttpOnly ``SameSite=Strict`` cookie its login form sets: ``401`` with
   ``WWW-Authenticate: Bearer``. The principal (the key's name) goes into the ASGI scope.

``check_bind`` refuses to serve beyond loopback without keys unless the operator opted out.
"""

from __future__ import annotations

import html
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pyrula_stream.access.api_keys import SESSION_MAX_AGE_S, APIKeyAuth
from pyrula_stream.access.attempts import FailedAttempts
from pyrula_stream.errors import ConfigurationError, ErrorCode

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_ADDRESSES = ("", "0.0.0.0", "::")
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
PRINCIPAL_SCOPE_KEY = "pyrula.principal"
LOGIN_PATH, LOGOUT_PATH = "/login", "/logout"
MAX_LOGIN_BODY = 16 * 1024


@dataclass(frozen=True)
class HTTPAccess:
    """Who may talk to an HTTP face: its API keys (``None``: no key asked), the ``Host``
    names it answers besides loopback and its bound address (``"*"``: any), and whether
    it may serve beyond loopback without keys."""

    auth: APIKeyAuth | None = None
    allowed_hosts: tuple[str, ...] = ()
    allow_unauthenticated: bool = False


NO_KEYS = HTTPAccess()
"""The default: no key asked, loopback names only, and no serving beyond loopback."""


def principal_of(scope: Scope) -> str | None:
    """The key name the guard let this request in with (``None`` without keys)."""
    value = scope.get(PRINCIPAL_SCOPE_KEY)
    return value if isinstance(value, str) else None


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (all of 127.0.0.0/8, ``::1``)."""
    bare = host.strip().strip("[]").lower()
    if bare == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def check_bind(host: str, access: HTTPAccess, *, exposes: str) -> None:
    """Refuse to serve on a non-loopback ``host`` without keys, unless opted out.
    ``exposes`` says what a stranger could do, for the error."""
    if is_loopback(host) or access.auth is not None or access.allow_unauthenticated:
        return
    raise ConfigurationError(
        f"refusing to serve on {host} without API keys: anyone who reaches it could "
        f"{exposes}. Give --api-keys FILE (name=key lines; in Python, HTTPAccess(auth="
        "APIKeyAuth(...))), or pass --allow-unauthenticated (allow_unauthenticated=True) "
        "if something in front of it already checks who calls"
    )


def _bare_host(value: str) -> str:
    """``Host``/``--allowed-hosts`` text → a lower-case name without port or brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:  # name:port (a bare IPv6 address has more than one colon)
        return value.partition(":")[0]
    return value


def host_names(bind_host: str, allowed_hosts: tuple[str, ...]) -> frozenset[str]:
    """The ``Host`` names a face answers: loopback, its bound address unless it is a
    wildcard, and ``allowed_hosts`` (``"*"`` in the set means any)."""
    names = set(LOOPBACK_NAMES)
    if _bare_host(bind_host) not in WILDCARD_ADDRESSES:
        names.add(_bare_host(bind_host))
    names.update(_bare_host(h) for h in allowed_hosts if h.strip())
    return frozenset(names)


def _headers(scope: Scope) -> dict[str, str]:
    """Request headers, lower-case names, latin-1 text (the first of repeated ones)."""
    out: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", []):
        out.setdefault(raw_name.decode("latin-1").lower(), raw_value.decode("latin-1"))
    return out


def _client(scope: Scope) -> str:
    """The caller's address, as the server saw it ("" when it did not say)."""
    client = scope.get("client")
    return str(client[0]) if client else ""


def _bearer(headers: dict[str, str]) -> str | None:
    scheme, _, token = headers.get("authorization", "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _cookie(headers: dict[str, str], name: str) -> str | None:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except CookieError:
        return None
    morsel = jar.get(name)
    return morsel.value if morsel is not None else None


def cross_origin_refusal(method: str, headers: dict[str, str]) -> str | None:
    """Why a state-changing browser request is cross-origin, or ``None`` if it is not."""
    if method not in UNSAFE_METHODS:
        return None
    site = headers.get("sec-fetch-site")
    if site is not None:
        if site in ("same-origin", "none"):
            return None
        return f"cross-origin {method} refused (Sec-Fetch-Site: {site})"
    origin = headers.get("origin")
    if origin is None:  # not sent by a browser: only the key check applies
        return None
    try:
        parts = urlsplit(origin)
        same = parts.scheme in ("http", "https") and parts.netloc.lower() == (
            headers.get("host", "").lower()
        )
    except ValueError:
        same = False
    return None if same else f"cross-origin {method} refused (Origin: {origin[:100]})"


class HTTPGuard:
    """ASGI middleware: Host, Origin and key checks in front of ``app`` (see module doc).

    ``browser_login`` (the web UI) adds ``GET/POST /login`` and ``POST /logout`` and
    accepts the session cookie as well as the Bearer header.
    """

    def __init__(
        self,
        app: ASGIApp,
        access: HTTPAccess,
        *,
        bind_host: str,
        exposes: str,
        browser_login: bool = False,
        attempts: FailedAttempts | None = None,
    ) -> None:
        check_bind(bind_host, access, exposes=exposes)
        self.app = app
        self.access = access
        self.browser_login = browser_login
        self.attempts = FailedAttempts() if attempts is None else attempts
        """Wrong keys per client: each refusal after the first waits longer."""
        self.hosts = host_names(bind_host, access.allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan
            return
        headers = _headers(scope)
        method = str(scope.get("method", "GET")).upper()
        status, refusal = self._refuse_host(headers)
        if refusal is None:
            status, refusal = 403, cross_origin_refusal(method, headers)
        if refusal is not None:
            log.info("refused a request to %s: %s", scope.get("path"), refusal)
            payload = {"error": refusal, "code": ErrorCode.AUTH_FORBIDDEN.value}
            await _reply(scope, send, status, payload)
            return
        auth = self.access.auth
        if auth is None:
            await self.app(scope, receive, _framed(send))
            return
        path = str(scope.get("path", ""))
        if self.browser_login and path in (LOGIN_PATH, LOGOUT_PATH):
            await self._login(scope, receive, send, auth, method, path)
            return
        presented = _bearer(headers)
        principal = auth.principal(presented) if presented is not None else None
        session = _cookie(headers, self._cookie_name(scope)) if self.browser_login else None
        if principal is None and session is not None:
            principal = auth.session_principal(session)
        if principal is None:
            missing = not presented and not session
            if not missing:
                await self.attempts.slow_down(_client(scope))
            await self._unauthorized(scope, send, headers, missing=missing)
            return
        scope[PRINCIPAL_SCOPE_KEY] = principal
        await self.app(scope, receive, _framed(send))

    def _refuse_host(self, headers: dict[str, str]) -> tuple[int, str | None]:
        """(status, why) when the Host header does not name this server, else (0, None).
        421 Misdirected Request, as the MCP SDK answers a rebinding attempt."""
        host = headers.get("host")
        if not host:
            return 400, "the Host header is missing"
        name = _bare_host(host)
        if "*" in self.hosts or name in self.hosts:
            return 0, None
        return 421, (
            f"host '{name[:100]}' is not served here (a DNS-rebinding page looks like this); "
            f"to serve that name, start with --allowed-hosts {name[:100]}"
        )

    def _cookie_name(self, scope: Scope) -> str:
        server = scope.get("server")
        return f"pyrula_session_{server[1]}" if server else "pyrula_session"

    async def _unauthorized(
        self, scope: Scope, send: Send, headers: dict[str, str], *, missing: bool
    ) -> None:
        reason = "an API key is needed" if missing else "that API key is not valid"
        challenge = 'Bearer realm="pyrula-stream"' + ("" if missing else ', error="invalid_token"')
        extra = [(b"www-authenticate", challenge.encode())]
        wants_page = "text/html" in headers.get("accept", "") and scope["type"] == "http"
        if self.browser_login and wants_page and scope.get("method") == "GET":
            await _send(scope, send, 401, _login_page(""), "text/html; charset=utf-8", extra)
            return
        code = ErrorCode.AUTH_MISSING if missing else ErrorCode.AUTH_INVALID
        hint = "send Authorization: Bearer <key> (a key from the --api-keys file)"
        payload = {"error": f"{reason}: {hint}", "code": code.value}
        await _reply(scope, send, 401, payload, extra)

    async def _login(
        self, scope: Scope, receive: Receive, send: Send, auth: APIKeyAuth, method: str, path: str
    ) -> None:
        cookie = self._cookie_name(scope)
        secure = "; Secure" if scope.get("scheme") in ("https", "wss") else ""
        attributes = f"Path=/; HttpOnly; SameSite=Strict{secure}"
        if path == LOGOUT_PATH:
            if method != "POST":
                payload = {"error": "sign out with POST /logout", "code": "invalid_request"}
                await _reply(scope, send, 405, payload)
                return
            clear = f"{cookie}=; Max-Age=0; {attributes}".encode()
            await _redirect(scope, send, LOGIN_PATH, [(b"set-cookie", clear)])
            return
        if method != "POST":
            await _send(scope, send, 200, _login_page(""), "text/html; charset=utf-8")
            return
        body = await _read_body(receive, MAX_LOGIN_BODY)
        fields = parse_qs(body.decode("utf-8", "replace")) if body is not None else {}
        principal = auth.principal(fields.get("key", [""])[0].strip())
        if principal is None:
            log.info("a login with a wrong or missing API key was refused")
            await self.attempts.slow_down(_client(scope))
            page = _login_page("That key is not valid.")
            await _send(scope, send, 401, page, "text/html; charset=utf-8")
            return
        token = auth.session_token(principal)
        session = f"{cookie}={token}; Max-Age={SESSION_MAX_AGE_S}; {attributes}".encode()
        await _redirect(scope, send, "/", [(b"set-cookie", session)])


_FRAME_HEADERS = [
    (b"x-frame-options", b"DENY"),  # actions are buttons: no page may frame them
    (b"content-security-policy", b"frame-ancestors 'none'"),
]


def _framed(send: Send) -> Send:
    """``send`` that adds the no-framing headers to a response that has none of its own."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            present = {name.lower() for name, _ in message.get("headers", [])}
            extra = [h for h in _FRAME_HEADERS if h[0] not in present]
            message["headers"] = [*message.get("headers", []), *extra]
        await send(message)

    return wrapped


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, or ``None`` past ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send(
    scope: Scope,
    send: Send,
    status: int,
    body: bytes,
    content_type: str,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    if scope["type"] == "websocket":  # refuse the handshake (RFC 6455 close 1008: policy)
        await send({"type": "websocket.close", "code": 1008})
        return
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *_FRAME_HEADERS,
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _reply(
    scope: Scope,
    send: Send,
    status: int,
    payload: dict[str, str],
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    await _send(scope, send, status, json.dumps(payload).encode(), "application/json", extra)


async def _redirect(
    scope: Scope, send: Send, location: str, extra: list[tuple[bytes, bytes]]
) -> None:
    headers = [(b"location", location.encode()), *extra]
    await _send(scope, send, 303, b"", "text/plain", headers)


def _login_page(message: str) -> bytes:
    """A self-contained form (no script, no other file: nothing else is served yet)."""
    note = f'<p class="bad" role="alert">{html.escape(message)}</p>' if message else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>pyrula-stream: sign in</title>
<style>body{{font:15px system-ui,sans-serif;max-width:26rem;margin:12vh auto;padding:0 1rem}}
input{{width:100%;padding:.5rem;margin:.5rem 0;box-sizing:border-box}}.bad{{color:#b00020}}</style>
</head><body><h1>pyrula-stream</h1>
<p>This server asks for an API key (a key from its <code>--api-keys</code> file).</p>{note}
<form method="post" action="{LOGIN_PATH}"><label>API key
<input name="key" type="password" autocomplete="current-password" required autofocus></label>
<button type="submit">Sign in</button></form></body></html>
""".encode()
