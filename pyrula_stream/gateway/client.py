"""``AgentClient``: the gateway over HTTP, for Python programs that do not speak Kafka.

Only httpx is needed (no FastAPI, no Kafka client). ``stream`` reads the turn's SSE
stream and, when the connection drops or the gateway ends it early (its
``sse_max_duration_s``), reconnects with ``Last-Event-ID`` on its own: to the same
base URL, which may be another gateway process behind a load balancer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from pyrula_stream.client.turn_status import TurnStatus
from pyrula_stream.errors import ErrorCode, PyrulaError
from pyrula_stream.wire.events import Event

STREAM_READ_TIMEOUT_S = 45.0
"""Three of the gateway's 15 s keepalives: a connection silent that long is dead."""


class GatewayError(PyrulaError):
    """The gateway answered with an error: ``status``, and the body's ``code``."""

    def __init__(self, status: int, message: str, *, code: str, body: Any = None) -> None:
        known = code in ErrorCode.__members__.values()
        super().__init__(message, code=ErrorCode(code) if known else ErrorCode.INTERNAL)
        self.status = status
        self.error_code = code
        self.body = body


@dataclass(frozen=True)
class SubmittedTurn:
    """What ``submit`` returns: the turn's id and where to follow it."""

    turn_id: str
    agent: str
    events_url: str
    status_url: str


def _error(response: httpx.Response) -> GatewayError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        message = str(body.get("error", response.reason_phrase))
        code = str(body.get("code", ErrorCode.INTERNAL))
    else:
        message, code = f"{response.status_code} {response.reason_phrase}", "internal"
    return GatewayError(response.status_code, message, code=code, body=body)


class AgentClient:
    """Async client of ``pyrula-stream gateway``. Use as ``async with``.

    ``headers`` go with every request (``{"Authorization": "Bearer <key>"}``);
    ``reconnects`` is how many reconnections in a row ``stream`` tries before it gives
    up (an event received resets the count).
    """

    def __init__(
        self,
        base_url: str,
        *,
        prefix: str = "/agents",
        timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        reconnects: int = 5,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.prefix = prefix.rstrip("/")
        self.timeout = timeout
        self.reconnects = reconnects
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=dict(headers or {}),
            timeout=timeout,
            transport=transport,
        )

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def _turn_path(self, agent: str, turn_id: str) -> str:
        return f"{self.prefix}/{quote(agent, safe='')}/turns/{quote(turn_id, safe='')}"

    async def _json(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        response = await self._http.request(method, path, json=body, headers=headers)
        if response.status_code >= 400:
            raise _error(response)
        return response.json()

    async def submit(
        self,
        agent: str,
        *,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        thread_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> SubmittedTurn:
        """``POST {prefix}/{agent}/turns``: the turn is on Kafka when this returns."""
        body: dict[str, Any] = dict(params)
        if metadata is not None:
            body["metadata"] = metadata
        if thread_id is not None:
            body["thread_id"] = thread_id
        sent = dict(headers or {})
        if idempotency_key is not None:
            sent["Idempotency-Key"] = idempotency_key
        path = f"{self.prefix}/{quote(agent, safe='')}/turns"
        answer = await self._json("POST", path, body=body, headers=sent)
        return SubmittedTurn(answer["turn_id"], agent, answer["events_url"], answer["status_url"])

    async def stream(
        self,
        agent: str,
        turn_id: str,
        last_event_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        idle_timeout_seconds: float | None = None,
    ) -> AsyncIterator[Event]:
        """The turn's events in ``seq`` order, ending after the terminal one.

        ``last_event_id`` resumes after that seq. A dropped connection is reconnected
        with ``Last-Event-ID``; ``idle_timeout_seconds`` bounds the wait for the next
        event (keepalive comments do not count) with ``TimeoutError``.
        """
        path = f"{self._turn_path(agent, turn_id)}/events"
        async for event in self.stream_from_path(
            path,
            last_event_id=last_event_id,
            headers=headers,
            idle_timeout_seconds=idle_timeout_seconds,
        ):
            yield event

    async def stream_from_path(
        self,
        stream_path: str,
        *,
        last_event_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        idle_timeout_seconds: float | None = None,
    ) -> AsyncIterator[Event]:
        """``stream`` from an ``events_url`` as ``submit`` returned it."""
        last = last_event_id
        failures = 0
        while True:
            sent = dict(headers or {})
            sent["Accept"] = "text/event-stream"
            if last is not None:
                sent["Last-Event-ID"] = last
            try:
                async for event in self._read_stream(stream_path, sent, idle_timeout_seconds):
                    failures = 0
                    last = str(event.seq)
                    yield event
                    if event.is_terminal:
                        return
            except GatewayError as exc:
                if exc.status != 503 or failures >= self.reconnects:
                    raise
            except httpx.TransportError:
                if failures >= self.reconnects:
                    raise
            # dropped, or ended before the terminal event: resume where it stopped
            failures += 1
            if failures > self.reconnects:
                raise GatewayError(
                    502,
                    f"the stream {stream_path} ended {failures} times before its terminal event",
                    code=ErrorCode.STORE_UNAVAILABLE,
                )
            await asyncio.sleep(min(5.0, 0.1 * 2**failures))

    async def _read_stream(
        self, path: str, headers: dict[str, str], idle: float | None
    ) -> AsyncIterator[Event]:
        """One connection's events (raises ``GatewayError`` for an error answer or a
        ``stream:error`` event)."""
        timeout = httpx.Timeout(self.timeout, read=max(self.timeout, STREAM_READ_TIMEOUT_S))
        async with self._http.stream("GET", path, headers=headers, timeout=timeout) as response:
            if response.status_code >= 400:
                await response.aread()
                raise _error(response)
            lines = response.aiter_lines()
            kind, data = "message", []
            since = time.monotonic()
            while True:
                wait = None if idle is None else max(0.0, idle - (time.monotonic() - since))
                try:
                    line = await asyncio.wait_for(anext(lines), wait)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise TimeoutError(f"no event on {path} for {idle}s") from None
                if line.startswith(":"):
                    continue
                if line:
                    field, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    if field == "event":
                        kind = value
                    elif field == "data":
                        data.append(value)
                    continue
                if not data:
                    continue
                payload = json.loads("\n".join(data))
                if kind == "stream:error":
                    raise GatewayError(
                        503 if payload.get("code") == ErrorCode.STORE_UNAVAILABLE else 500,
                        str(payload.get("error")),
                        code=str(payload.get("code")),
                        body=payload,
                    )
                since = time.monotonic()
                kind, data = "message", []
                yield Event(**payload)

    async def run(
        self,
        agent: str,
        *,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        thread_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> list[Event]:
        """Submit a turn and collect its events until the terminal one."""
        turn = await self.submit(
            agent,
            metadata=metadata,
            idempotency_key=idempotency_key,
            thread_id=thread_id,
            headers=headers,
            **params,
        )
        return [e async for e in self.stream_from_path(turn.events_url, headers=headers)]

    async def status(
        self, agent: str, turn_id: str, *, headers: Mapping[str, str] | None = None
    ) -> TurnStatus:
        """Where the turn stands, as ``pyrula-stream status`` prints it."""
        answer = await self._json("GET", self._turn_path(agent, turn_id), headers=headers)
        return TurnStatus(**answer)

    async def cancel(
        self,
        agent: str,
        turn_id: str,
        *,
        reason: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Ask the turn to stop at its next step boundary."""
        path = f"{self._turn_path(agent, turn_id)}/cancel"
        await self._json("POST", path, body={"reason": reason}, headers=headers)

    async def terminate(
        self,
        agent: str,
        turn_id: str,
        *,
        reason: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> TurnStatus:
        """End the turn now; returns what was stopped (as ``KafkaAgentClient.terminate``)."""
        path = f"{self._turn_path(agent, turn_id)}/terminate"
        answer = await self._json("POST", path, body={"reason": reason}, headers=headers)
        return TurnStatus(**answer)
