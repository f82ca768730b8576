"""``GET /{agent}/turns/{turn_id}/events``: a documented FastAPI route served by a plain
ASGI app.

An open stream keeps whatever its request built for as long as the turn lasts. FastAPI's
request handling (dependency solving and its exit stacks) and Starlette's
``StreamingResponse`` (a task group with a task that waits for the disconnect) kept about
30 KB per open stream; this app checks the request as the other routes do, then writes
the frames straight to the server and watches for the disconnect itself.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Coroutine
from typing import Any

from confluent_kafka import KafkaException
from fastapi import Request
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from pyrula_stream.access.http_guard import principal_of
from pyrula_stream.client.event_reader import TurnStream
from pyrula_stream.errors import PyrulaError
from pyrula_stream.gateway.errors import refusal_of, refusal_response
from pyrula_stream.gateway.served import Gateway
from pyrula_stream.gateway.sse import last_event_id, write_frames

log = logging.getLogger(__name__)

CLOCK_SKEW_MS = 60_000
"""A stream reads events from a minute before its turn was submitted (clocks differ)."""
SSE_HEADERS = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
)
_ANSWERED = (PyrulaError, KafkaException, TimeoutError)
"""What a stream that cannot open answers with its own status; anything else is a
logged 500."""


class PlainASGIRoute(APIRoute):
    """A FastAPI route whose ``endpoint`` only documents it (OpenAPI: its parameters)
    and whose requests ``app`` serves, with none of FastAPI's per-request wrapping."""

    def __init__(
        self,
        path: str,
        endpoint: Callable[..., Coroutine[Any, Any, Any]],
        *,
        app: Callable[[Scope, Receive, Send], Coroutine[Any, Any, None]],
        **kwargs: Any,
    ) -> None:
        super().__init__(path, endpoint, **kwargs)
        self.app = app


class EventStreams:
    """Serves one turn's events as Server-Sent Events (``gateway.sse``), after the same
    checks as every route: the agent is served, the caller may see the turn, and the
    caller has a stream slot left."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gateway = self.gateway
        try:
            stream, owner = await self._open(Request(scope))
        except Exception as exc:
            if not isinstance(exc, _ANSWERED):
                log.exception("opening the stream of %s failed", scope.get("path"))
            await refusal_response(refusal_of(exc, gateway.options))(scope, receive, send)
            return
        # A new message each time: middleware may add headers to the one it is given.
        start = {"type": "http.response.start", "status": 200, "headers": list(SSE_HEADERS)}
        await send(start)
        await write_frames(
            stream, gateway.options, send, receive, lambda: gateway.slots.give_back(owner)
        )

    async def _open(self, request: Request) -> tuple[TurnStream, str]:
        """The turn's subscribed stream (before the answer starts: Kafka errors are still
        HTTP errors) and the owner whose slot it holds."""
        gateway = self.gateway
        agent, turn_id = request.path_params["agent"], request.path_params["turn_id"]
        served = gateway.agent(agent)
        after = last_event_id(request)
        thread_id = request.query_params.get("thread_id")
        owner = await gateway.check_owner(served, turn_id, thread_id, principal_of(request.scope))
        since = request.query_params.get("since_ms")
        since_ms = int(since) if since is not None and since.isdigit() else None
        if since_ms is None and (seen := gateway.owners.submitted_ms(agent, turn_id)):
            since_ms = seen - CLOCK_SKEW_MS
        gateway.slots.take(owner)
        try:
            stream = gateway.pending.take(agent, turn_id) if after is None else None
            if stream is None:
                stream = await gateway.client(served).open_stream(
                    agent, turn_id, since_ms=since_ms, after_seq=after
                )
        except BaseException:
            gateway.slots.give_back(owner)
            raise
        return stream, owner


EVENTS_PATH = re.compile(r"/(?P<agent>[^/]+)/turns/(?P<turn_id>[^/]+)/events")
"""The events route's path below the API's prefix."""


class EventStreamsFirst:
    """ASGI middleware: a turn's events request (``GET {prefix}/{agent}/turns/{turn_id}
    /events``) goes straight to ``streams``, mounted at ``prefix``; anything else to
    ``app``. The request then skips the layers in between (FastAPI's exception and exit
    stack middlewares, routers, the mount), which would stay on its stack for as long as
    the stream is open; it meets the same guard and app it would have reached."""

    def __init__(self, app: ASGIApp, *, streams: ASGIApp, prefix: str = "") -> None:
        self.app = app
        self.streams = streams
        self.prefix = prefix.rstrip("/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            root = scope.get("root_path", "")
            path: str = scope["path"]
            below = path[len(root) :] if root and path.startswith(root) else path
            if below.startswith(self.prefix) and (
                found := EVENTS_PATH.fullmatch(below, len(self.prefix))
            ):
                # In place, as Starlette's router does: no copy lives as long as the stream.
                if self.prefix:
                    scope.setdefault("app_root_path", root)
                    scope["root_path"] = root + self.prefix
                scope["path_params"] = found.groupdict()  # the server decoded the path
                await self.streams(scope, receive, send)
                return
        await self.app(scope, receive, send)
