"""A scripted local HTTP server: the common part of the provider wire servers (on
``_http.LoopbackServer``, as the routed batch servers).

Each test queues the replies it wants (``enqueue``) and reads back what the SDK sent
(``requests``). The server runs on a free loopback port in a daemon thread and closes
every connection after one reply, so no state leaks between requests through keep-alive.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from pyrula_stream.testing_servers._http import LoopbackServer, write_reply


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it; header names are lower-cased."""

    method: str
    path: str
    headers: dict[str, str] = field(repr=False)
    """As sent: the client's API key among them, so not in ``repr``."""
    raw_body: bytes

    @property
    def body(self) -> Any:
        """The JSON body, or ``None`` when there was none."""
        return json.loads(self.raw_body) if self.raw_body else None


@dataclass(frozen=True)
class Reply:
    """One scripted response.

    ``chunks`` set makes a streamed reply: each chunk is written and flushed on its own,
    and the body ends when the connection closes. ``abort`` promises a longer body than
    is sent (``Content-Length``) and hangs up, which clients see as a broken transfer,
    not a clean end. ``delay_s`` waits before each chunk.
    """

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    chunks: tuple[bytes, ...] | None = None
    abort: bool = False
    delay_s: float = 0.0


def json_reply(status: int, payload: Any, headers: dict[str, str] | None = None) -> Reply:
    """A plain JSON response."""
    return Reply(
        status=status,
        headers={"content-type": "application/json", **(headers or {})},
        body=json.dumps(payload).encode(),
    )


def sse_reply(
    frames: list[bytes], *, abort: bool = False, headers: dict[str, str] | None = None
) -> Reply:
    """A ``text/event-stream`` response made of pre-encoded SSE frames."""
    return Reply(
        status=200,
        headers={
            "content-type": "text/event-stream",
            "cache-control": "no-cache",
            **(headers or {}),
        },
        chunks=tuple(frames),
        abort=abort,
    )


def sse_frame(data: Any, event: str | None = None) -> bytes:
    """One SSE event: an optional ``event:`` line and a JSON (or literal string) ``data:``."""
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


NO_SCRIPT_STATUS = 418

Scripted = Reply | Callable[[RecordedRequest], Reply]
"""A queued reply, or a function making it from the request it answers (the prompt
caches' usage depends on the request)."""


class WireServer(LoopbackServer):
    """A loopback HTTP server that answers from a queue of ``Reply`` objects.

    With an empty queue it answers 418 with a body saying so, which the adapters surface
    as a non-retriable ``LLMError``, so a test that forgot a reply fails loudly.
    """

    poll_interval_s = 0.02

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self._replies: deque[Scripted] = deque()
        self._lock = threading.Lock()
        super().__init__()

    def enqueue(self, *replies: Scripted) -> None:
        """Queue replies, answered in order, one per request."""
        with self._lock:
            self._replies.extend(replies)

    @property
    def pending(self) -> int:
        """Replies queued but not yet used."""
        with self._lock:
            return len(self._replies)

    @property
    def last_request(self) -> RecordedRequest:
        return self.requests[-1]

    def _next(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(request)
            if not self._replies:
                return self.no_script_reply()
            scripted = self._replies.popleft()
            return scripted if isinstance(scripted, Reply) else scripted(request)

    def no_script_reply(self) -> Reply:
        return json_reply(NO_SCRIPT_STATUS, {"error": {"message": "wire server: no reply left"}})

    def answer(self, request: BaseHTTPRequestHandler, raw: bytes) -> None:
        headers = {k.lower(): v for k, v in request.headers.items()}
        reply = self._next(RecordedRequest(request.command, request.path, headers, raw))
        promised = None
        if reply.abort and reply.chunks is not None:
            promised = sum(len(c) for c in reply.chunks) + 1024
        write_reply(
            request,
            reply.status,
            reply.headers,
            reply.body,
            reply.chunks,
            promised=promised,
            delay_s=reply.delay_s,
        )
