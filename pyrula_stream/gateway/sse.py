"""Server-Sent Events of one turn: ``id:`` the event's seq, ``event:`` its type,
``data:`` its JSON; keepalive comments; the end after the terminal event."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable

from fastapi import Request

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


async def sse_frames(
    events: TurnStream, options: AppOptions, done: Callable[[], None]
) -> AsyncIterator[bytes]:
    """The stream's SSE frames: one per event, a comment every keepalive interval while
    none comes, a ``stream:error`` event if Kafka fails mid-stream; ends after the terminal
    event or ``sse_max_duration_s`` (the client resumes with ``Last-Event-ID``)."""
    limit = options.sse_max_duration_s
    deadline = None if limit is None else time.monotonic() + limit
    pending: asyncio.Future[Event] | None = None
    try:
        yield b": stream open\n\n"
        while True:
            wait = options.sse_keepalive_interval
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    yield b": sse_max_duration_s reached; reconnect with Last-Event-ID\n\n"
                    return
            if pending is None:
                pending = asyncio.ensure_future(anext(events))
            done_now, _ = await asyncio.wait({pending}, timeout=wait)
            if not done_now:
                yield b": keepalive\n\n"
                continue
            finished, pending = pending, None
            try:
                event = finished.result()
            except StopAsyncIteration:
                return
            except Exception as exc:
                refusal = refusal_of(exc, options)
                body = error_body(refusal.message, refusal.code or ErrorCode.INTERNAL)
                yield f"event: {STREAM_ERROR}\ndata: {json.dumps(body)}\n\n".encode()
                return
            yield sse_frame(event)
            if event.is_terminal:
                return
    finally:
        done()
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        with contextlib.suppress(Exception):
            await events.aclose()
