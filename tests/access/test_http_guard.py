"""``HTTPGuard`` on its own, in front of a trivial ASGI app: any request head it is sent
(generated headers, hosts, cookies, bodies) gets an answer, never an exception, and the
Host, Origin and key rules hold for IPv6 and odd spellings as well."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pyrula_stream.access.api_keys import SESSION_MAX_AGE_S, APIKeyAuth
from pyrula_stream.access.attempts import FailedAttempts
from pyrula_stream.access.http_guard import HTTPAccess, HTTPGuard, Message, Scope, principal_of

KEY = "guard-key-0123456789abcdef0123456789abcdef"


async def hello(scope: Scope, receive: Any, send: Any) -> None:
    """The face behind the guard: says who it let in."""
    body = f"hello {principal_of(scope)}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def call(
    guard: HTTPGuard,
    headers: list[tuple[bytes, bytes]],
    *,
    method: str = "GET",
    path: str = "/",
    body: bytes = b"",
    client: str | None = None,
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request through ``guard``: (status, response headers, body)."""
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": headers,
        "scheme": "http",
        "server": ("127.0.0.1", 8088),
    }
    if client is not None:
        scope["client"] = (client, 50000)
    asyncio.run(guard(scope, receive, send))
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def guard(*, keys: bool = True, bind_host: str = "127.0.0.1", hosts: tuple[str, ...] = ()) -> Any:
    access = HTTPAccess(auth=APIKeyAuth({"web": KEY}) if keys else None, allowed_hosts=hosts)
    return HTTPGuard(hello, access, bind_host=bind_host, exposes="test", browser_login=True)


def test_host_names_are_matched_without_port_case_or_brackets() -> None:
    open_guard = guard(keys=False, bind_host="::1", hosts=("UI.example", "[fd00::7]:9000"))
    for host in (b"[::1]:8088", b"LOCALHOST", b"127.0.0.1:1", b"ui.example:443", b"[fd00::7]"):
        assert call(open_guard, [(b"host", host)])[0] == 200, host
    for host in (b"evil.example", b"[::1", b"127.0.0.2", b"ui.example.evil", b"localhost."):
        status, _, body = call(open_guard, [(b"host", host)])
        assert status == 421, host
        assert b"--allowed-hosts" in body
    assert call(open_guard, [])[0] == 400  # no Host at all
    assert call(guard(keys=False, hosts=("*",)), [(b"host", b"anything")])[0] == 200


def test_origin_rules_for_state_changing_requests() -> None:
    g = guard(keys=False)
    host = (b"host", b"127.0.0.1:8088")
    assert call(g, [host], method="POST")[0] == 200  # not a browser
    assert call(g, [host, (b"origin", b"http://127.0.0.1:8088")], method="POST")[0] == 200
    assert call(g, [host, (b"sec-fetch-site", b"same-origin")], method="DELETE")[0] == 200
    for refused in (
        [(b"origin", b"http://127.0.0.1:9999")],
        [(b"origin", b"null")],
        [(b"origin", b"http://[::1")],
        [(b"sec-fetch-site", b"same-site")],
        [(b"sec-fetch-site", b"cross-site"), (b"origin", b"http://127.0.0.1:8088")],
    ):
        assert call(g, [host, *refused], method="PUT")[0] == 403, refused
    assert call(g, [host, (b"origin", b"http://evil.example")], method="GET")[0] == 200


def test_the_principal_comes_from_the_bearer_key_or_the_session_cookie() -> None:
    g = guard()
    host = (b"host", b"localhost:8088")
    assert call(g, [host, (b"authorization", f"bearer {KEY}".encode())])[2] == b"hello web"
    session = APIKeyAuth({"web": KEY}).session_token("web")
    cookie = (b"cookie", f"other=1; pyrula_session_8088={session}".encode())
    assert call(g, [host, cookie])[2] == b"hello web"
    wrong_port = (b"cookie", f"pyrula_session_9000={session}".encode())
    assert call(g, [host, wrong_port])[0] == 401
    status, headers, _ = call(g, [host, (b"authorization", b"Basic d2ViOmtleQ==")])
    assert status == 401 and headers[b"www-authenticate"].startswith(b"Bearer")


header_names = st.sampled_from(
    [b"host", b"origin", b"sec-fetch-site", b"authorization", b"cookie", b"accept", b"x-any"]
)
header_values = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([b"localhost", b"[::1]:80", b"Bearer " + KEY.encode(), b"text/html"]),
)


@settings(max_examples=300, deadline=None)
@given(
    headers=st.lists(st.tuples(header_names, header_values), max_size=8),
    method=st.sampled_from(["GET", "POST", "DELETE", "OPTIONS", "BREW"]),
    path=st.sampled_from(["/", "/login", "/logout", "/api/x"]),
    body=st.binary(max_size=300),
)
def test_any_request_head_gets_an_answer_and_never_an_exception(
    headers: list[tuple[bytes, bytes]], method: str, path: str, body: bytes
) -> None:
    status, _, _ = call(guard(), headers, method=method, path=path, body=body)
    assert status in (200, 303, 400, 401, 403, 405, 421)


def test_failed_attempts_are_slowed_per_client_and_a_good_key_never() -> None:
    """Each wrong key or login after the first from one client waits longer before its
    answer (0.5 s, 1 s, 2 s, ... up to 5 s); other clients and valid keys do not wait."""
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    access = HTTPAccess(auth=APIKeyAuth({"web": KEY}))
    g = HTTPGuard(
        hello,
        access,
        bind_host="127.0.0.1",
        exposes="test",
        browser_login=True,
        attempts=FailedAttempts(sleep=sleep),
    )
    host = (b"host", b"localhost:8088")
    wrong = (b"authorization", b"Bearer not-the-key-0123456789abcdef0123")
    for _ in range(3):
        assert call(g, [host, wrong], client="10.0.0.7")[0] == 401
    assert waits == [0.5, 1.0]
    assert call(g, [host, wrong], client="10.0.0.8")[0] == 401  # another client: its first
    assert waits == [0.5, 1.0]
    good = (b"authorization", f"Bearer {KEY}".encode())
    assert call(g, [host, good], client="10.0.0.7")[2] == b"hello web"
    assert waits == [0.5, 1.0]  # a valid key is answered at once
    login = call(g, [host], method="POST", path="/login", body=b"key=guess", client="10.0.0.7")
    assert login[0] == 401
    for _ in range(4):
        call(g, [host, wrong], client="10.0.0.7")
    assert waits == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert call(g, [host], client="10.0.0.9")[0] == 401  # no key at all: not an attempt
    assert len(waits) == 7


def test_the_login_cookie_carries_its_issue_time_and_a_max_age() -> None:
    g = guard()
    host = (b"host", b"localhost:8088")
    status, headers, _ = call(g, [host], method="POST", path="/login", body=f"key={KEY}".encode())
    assert status == 303
    cookie = headers[b"set-cookie"].decode()
    assert f"Max-Age={SESSION_MAX_AGE_S}" in cookie
    token = cookie.split(";")[0].partition("=")[2]
    issued = int(token.split(".")[0])
    assert abs(issued - time.time()) < 600
    assert call(g, [host, (b"cookie", f"pyrula_session_8088={token}".encode())])[0] == 200
