"""``KafkaAgentClient``: submit turns, stream a turn's events, run to completion, cancel,
ask a turn's status.

Every method talks to Kafka only: a turn request goes to ``<prefix>.<agent>.turns`` and the
events are read back from ``<prefix>.<agent>.events`` under ``read_committed`` (one
consumer per client, shared by its streams), so a client sees each event of a turn
exactly once, in ``seq`` order. A status comes from the turn's journal records.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, Literal

from pyrula_stream import serde
from pyrula_stream.agent import AgentTopics
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.event_reader import SharedEventReader
from pyrula_stream.events import Event, decode_event
from pyrula_stream.journal import PROGRESS, TERMINAL
from pyrula_stream.kafka.admin import DEFAULT_PREFIX
from pyrula_stream.kafka.consumers import read_topic
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.records import ControlRequest, content_type_header
from pyrula_stream.serde import TurnRequest, decode_journal_entry, parse_journal_key

IDEMPOTENT_TURN_NAMESPACE = uuid.UUID("8f4b1c52-7a0e-4d1e-9a7e-5f2f3c6d9b10")
MAX_REASON = 500
REMEMBERED_SUBMITS = 10_000
"""Turns this client submitted, remembered so ``status`` can say ``queued``."""

TurnState = Literal["queued", "running", "completed", "failed", "unknown"]


@dataclass(frozen=True)
class TurnStatus:
    """Where a turn stands, from its journal records.

    ``queued``: submitted by this client, no worker started it yet. ``running``: its
    ``attempt`` and ``last_step`` (e.g. ``llm``, ``tool:lookup_order``). ``completed`` /
    ``failed`` (with ``code``): ended; ``events`` is how many it published. ``unknown``:
    nothing is recorded for the turn.
    """

    turn_id: str
    state: TurnState
    attempt: int = 0
    last_step: str | None = None
    code: str | None = None
    events: int = 0


@dataclass(frozen=True)
class TurnHandle:
    """What ``submit`` returns: the turn's id and where its request landed."""

    turn_id: str
    agent: str
    partition: int
    offset: int
    submitted_ms: int


def turn_id_for(idempotency_key: str | None) -> str:
    """A resubmitted idempotency key yields the same turn id, so it lands on the same
    partition and the worker's journal recognises it."""
    if idempotency_key is None:
        return uuid.uuid4().hex
    return uuid.uuid5(IDEMPOTENT_TURN_NAMESPACE, idempotency_key).hex


class KafkaAgentClient:
    """Async client for agents served by ``pyrula-stream worker``. Use as ``async with``."""

    def __init__(self, bootstrap_servers: str, *, prefix: str = DEFAULT_PREFIX) -> None:
        if not bootstrap_servers:
            raise ConfigurationError("bootstrap_servers is empty")
        self.bootstrap_servers = bootstrap_servers
        self.prefix = prefix
        self._producer: RecordProducer | None = None
        self._reader: SharedEventReader | None = None
        self._submitted: OrderedDict[tuple[str, str], None] = OrderedDict()

    async def __aenter__(self) -> KafkaAgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._producer is not None:
            await asyncio.to_thread(self._producer.close)
            self._producer = None
        if self._reader is not None:
            await self._reader.close()
            self._reader = None

    def _topics(self, agent: str) -> AgentTopics:
        return AgentTopics.for_agent(agent, self.prefix)

    def _get_producer(self) -> RecordProducer:
        if self._producer is None:
            self._producer = RecordProducer(self.bootstrap_servers)
        return self._producer

    async def submit(
        self,
        agent: str,
        *,
        idempotency_key: str | None = None,
        metadata: dict[str, Any] | None = None,
        thread_id: str | None = None,
        **params: Any,
    ) -> TurnHandle:
        """Produce a turn request; returns once the broker acknowledged it."""
        request = TurnRequest(
            turn_id=turn_id_for(idempotency_key),
            agent=agent,
            params=params,
            metadata=metadata or {},
            thread_id=thread_id,
            idempotency_key=idempotency_key,
            submitted_ms=int(time.time() * 1000),
        )
        return await self.submit_request(request)

    async def submit_request(self, request: TurnRequest) -> TurnHandle:
        delivered = await self._get_producer().send(
            self._topics(request.agent).turns,
            request.key.encode(),
            serde.encode("turn_request", request),
            [content_type_header("turn_request")],
        )
        self._submitted[(request.agent, request.turn_id)] = None
        while len(self._submitted) > REMEMBERED_SUBMITS:
            self._submitted.popitem(last=False)
        return TurnHandle(
            request.turn_id,
            request.agent,
            delivered.partition,
            delivered.offset,
            request.submitted_ms,
        )

    async def stream(
        self,
        agent: str,
        turn_id: str,
        *,
        since_ms: int | None = None,
        after_seq: int | None = None,
        idle_timeout_seconds: float | None = None,
    ) -> AsyncIterator[Event]:
        """Events of one turn, in ``seq`` order, ending after its terminal event.

        ``since_ms`` starts reading at that time (a handle's ``submitted_ms``); without it
        the turn's partition is read from its beginning. ``after_seq=N`` resumes a stream
        that already saw events up to ``seq`` N.
        """
        if self._reader is None:
            self._reader = SharedEventReader(self.bootstrap_servers)
        reader = self._reader
        sub = await reader.subscribe(self._topics(agent).events, turn_id.encode(), since_ms)
        next_seq = 0 if after_seq is None else after_seq + 1
        try:
            while True:
                try:
                    async with asyncio.timeout(idle_timeout_seconds):
                        item = await sub.queue.get()
                except TimeoutError:
                    raise TimeoutError(
                        f"no event of turn {turn_id} for {idle_timeout_seconds}s"
                    ) from None
                if isinstance(item, BaseException):
                    raise item
                if item.value is None:
                    continue
                event = decode_event(item.value, item.headers)
                if event.seq < next_seq:  # a repeat (at-least-once, a shared re-read)
                    continue
                next_seq = event.seq + 1
                yield event
                if event.is_terminal:
                    return
        finally:
            reader.unsubscribe(sub)

    async def run(
        self,
        agent: str,
        *,
        idempotency_key: str | None = None,
        metadata: dict[str, Any] | None = None,
        thread_id: str | None = None,
        timeout: float | None = 300.0,  # noqa: ASYNC109 (seconds for the whole turn)
        **params: Any,
    ) -> list[Event]:
        """Submit a turn and collect its events until the terminal one."""
        handle = await self.submit(
            agent, idempotency_key=idempotency_key, metadata=metadata, thread_id=thread_id, **params
        )
        events: list[Event] = []

        async def collect() -> None:
            async for event in self.stream(
                agent, handle.turn_id, since_ms=handle.submitted_ms - 60_000
            ):
                events.append(event)

        await asyncio.wait_for(collect(), timeout)
        return events

    async def cancel(self, agent: str, turn_id: str, *, reason: str | None = None) -> None:
        """Ask the owning worker to stop the turn at its next step boundary."""
        await self._control(agent, turn_id, "cancel", reason)

    async def terminate(
        self,
        agent: str,
        turn_id: str,
        *,
        reason: str | None = None,
        timeout: float = 60.0,  # noqa: ASYNC109 (seconds to wait for the turn to end)
    ) -> TurnStatus:
        """End the turn now (its worker does not wait for a step boundary); return what
        was stopped: the turn's attempt and last step, and how it ended.

        A turn that had already ended is returned as it ended (nothing was stopped); a
        turn nothing is known of yet is returned ``unknown`` (workers remember the
        request and stop the turn when it arrives).
        """
        before = await self.status(agent, turn_id)
        if before.state in ("completed", "failed"):
            return before
        await self._control(agent, turn_id, "terminate", reason)
        if before.state == "unknown":
            return before
        async with asyncio.timeout(timeout):
            async for _ in self.stream(agent, turn_id):
                pass
        after = await self.status(agent, turn_id)
        return replace(after, attempt=before.attempt, last_step=before.last_step)

    async def status(self, agent: str, turn_id: str) -> TurnStatus:
        """Where the turn stands (see ``TurnStatus``), read from the journal topic."""
        records = await asyncio.to_thread(
            read_topic,
            self.bootstrap_servers,
            self._topics(agent).journal,
            client_id=f"pyrula-status-{uuid.uuid4().hex[:8]}",
        )
        latest: dict[str, bytes | None] = {}
        for record in records:
            owner, suffix = parse_journal_key(record.key)
            if owner == turn_id:
                latest[suffix] = record.value
        live = {k: decode_journal_entry(v, {}) for k, v in latest.items() if v is not None}
        terminal = live.get(TERMINAL)
        if terminal is not None:
            failed = terminal.data.get("status") == "failed"
            return TurnStatus(
                turn_id,
                "failed" if failed else "completed",
                attempt=terminal.attempt,
                code=terminal.data.get("code"),
                events=int(terminal.data.get("events") or 0),
            )
        steps = sorted(((int(k), e) for k, e in live.items() if k.isdigit()), key=lambda s: s[0])
        progress = live.get(PROGRESS)
        if steps or progress is not None:
            last = steps[-1][1] if steps else None
            attempts = [e.attempt for _, e in steps] + ([progress.attempt] if progress else [])
            return TurnStatus(
                turn_id,
                "running",
                attempt=max(attempts),
                last_step=None if last is None else _step_name(last.kind, last.name),
                events=int(progress.data.get("next_seq") or 0) if progress else 0,
            )
        queued = (agent, turn_id) in self._submitted
        return TurnStatus(turn_id, "queued" if queued else "unknown")

    async def _control(self, agent: str, turn_id: str, action: str, reason: str | None) -> None:
        if reason is not None and len(reason) > MAX_REASON:
            raise ConfigurationError(f"reason is {len(reason)} characters; at most {MAX_REASON}")
        record = ControlRequest(turn_id, action, reason).record(self._topics(agent).control)
        await self._get_producer().send(
            record.topic, record.key, record.value, list(record.headers)
        )


def _step_name(kind: str, name: str) -> str:
    return kind if not name or name == kind else f"{kind}:{name}"
