"""Server-Sent Events of one turn: ``id:`` the event's seq, ``event:`` its type,
``data:`` its JSON; keepalive comments; the end after the terminal event."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from asyncio import FIRST_COMPLETED
from collections.abc import Callable

from fastapi import Request
from starlette.types import Receive, Send

from pyrula_stream.client.event_reader import TurnStream
from pyrula_stream.errors import ErrorCode
from pyrula_stream.gateway.errors import GatewayRefusal, error_body, refusal_of
from pyrula_stream.gateway.options import AppOptions
from pyrula_stream.wire.events import Event

STREAM_ERROR = "stream:error"
"""The SSE event that ends a stream Kafka failed under (not ``error``: ``EventSource``
fires its own ``error`` event on every lost connection)."""


def sse_frame(event: Event) -> bytes:
    """One committed event as an SSE message: ``id:`` its seq, ``event:`` its type."""
    data = json.dumps(
        {
            "type": event.type,
            "turn_id": event.turn_id,
            "agent": event.agent,
            "seq": event.seq,
            "ts_ms": event.ts_ms,
            "attempt": event.attempt,
            "data": event.data,
        },
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return f"id: {event.seq}\nevent: {event.type}\ndata: {data}\n\n".encode()


def last_event_id(request: Request) -> int | None:
    raw = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise GatewayRefusal(
            400,
            f"Last-Event-ID must be an event's seq (an integer), got {raw[:40]!r}",
            code=ErrorCode.INVALID_REQUEST,
        ) from None
    return value


async def write_frames(
    events: TurnStream, options: AppOptions, send: Send, receive: Receive, done: Callable[[], None]
) -> None:
    """Send the stream's SSE frames (the response is started): one per event, a comment
    every keepalive interval while none comes, a ``stream:error`` event if Kafka fails
    mid-stream; ends after the terminal event, after ``sse_max_duration_s`` (the client
    resumes with ``Last-Event-ID``) or when the client goes away. ``done`` runs last."""
    limit = options.sse_max_duration_s
    deadline = None if limit is None else time.monotonic() + limit
    gone = asyncio.ensure_future(_disconnect(receive))
    pending: asyncio.Future[Event] | None = None

    async def frame(body: bytes, more: bool = True) -> None:
        await send({"type": "http.response.body", "body": body, "more_body": more})

    try:
        await frame(b": stream open\n\n")
        while True:
            wait = options.sse_keepalive_interval
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    await frame(b": sse_max_duration_s reached; reconnect with Last-Event-ID\n\n")
                    break
            if pending is None:
                pending = asyncio.ensure_future(anext(events))
            await asyncio.wait((pending, gone), timeout=wait, return_when=FIRST_COMPLETED)
            if gone.done():
                return  # nobody to end the response for
            if not pending.done():
                await frame(b": keepalive\n\n")
                continue
            finished, pending = pending, None
            try:
                event = finished.result()
            except StopAsyncIteration:
                break
            except Exception as exc:
                refusal = refusal_of(exc, options)
                body = error_body(refusal.message, refusal.code or ErrorCode.INTERNAL)
                await frame(f"event: {STREAM_ERROR}\ndata: {json.dumps(body)}\n\n".encode())
                break
            await frame(sse_frame(event))
            if event.is_terminal:
                break
        await frame(b"", more=False)
    finally:
        done()
        for task in (pending, gone):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        with contextlib.suppress(Exception):
            await events.aclose()


async def _disconnect(receive: Receive) -> None:
    """Returns when the client has gone (a stream's request has no body left to read)."""
    while (await receive())["type"] != "http.disconnect":
        pass
