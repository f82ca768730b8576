"""``KafkaAgentClient``: submit turns, stream a turn's events, run to completion, cancel.

Every method talks to Kafka only: a turn request goes to ``<prefix>.<agent>.turns`` and the
events are read back from ``<prefix>.<agent>.events`` under ``read_committed``, so a client
sees each event of a turn exactly once, in ``seq`` order.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pyrula_stream import serde
from pyrula_stream.agent import AgentTopics
from pyrula_stream.branch import branch_metadata, check_from_step
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.events import Event, decode_event
from pyrula_stream.kafka.admin import DEFAULT_PREFIX
from pyrula_stream.kafka.consumers import read_key_partition
from pyrula_stream.kafka.io import PartitionReader, RecordProducer
from pyrula_stream.records import ControlRequest, content_type_header
from pyrula_stream.serde import TurnRequest
from pyrula_stream.threads import THREAD_DELETE, ThreadHandle, decode_thread

IDEMPOTENT_TURN_NAMESPACE = uuid.UUID("8f4b1c52-7a0e-4d1e-9a7e-5f2f3c6d9b10")
MAX_REASON = 500


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

    async def __aenter__(self) -> KafkaAgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._producer is not None:
            await asyncio.to_thread(self._producer.close)
            self._producer = None

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

    async def branch(
        self,
        agent: str,
        turn_id: str,
        *,
        from_step: int,
        system: str | None = None,
        model: str | None = None,
        **params: Any,
    ) -> TurnHandle:
        """Start a new turn that replays finished turn ``turn_id`` up to ``from_step`` and
        then runs live with ``params`` (merged over the original's) and, if given, another
        system prompt or model (the agent's model client calling another model). Only
        ``read_only`` tools run live; see the README. The agent must keep history
        (``keep_history=True``)."""
        from pyrula_stream.history import load_recording

        original = await asyncio.to_thread(
            load_recording, self.bootstrap_servers, self._topics(agent).history, turn_id
        )
        check_from_step(original, from_step)
        request = TurnRequest(
            turn_id=turn_id_for(None),
            agent=agent,
            params={**original.request.params, **params},
            metadata={
                **original.request.metadata,
                **branch_metadata(turn_id, from_step, system, model),
            },
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
        idle_timeout_seconds: float | None = None,
    ) -> AsyncIterator[Event]:
        """Events of one turn, in ``seq`` order, ending after its terminal event.

        ``since_ms`` starts reading at that time (a handle's ``submitted_ms``); without it
        the turn's partition is read from its beginning.
        """
        reader = PartitionReader(
            self.bootstrap_servers,
            self._topics(agent).events,
            client_id=f"pyrula-client-{uuid.uuid4().hex[:8]}",
        )
        try:
            await asyncio.to_thread(reader.seek_key, turn_id.encode(), since_ms)
            key = turn_id.encode()
            next_seq = 0
            last_seen = time.monotonic()
            while True:
                batch = await asyncio.to_thread(lambda: list(reader.poll(0.1)))
                for k, value, headers, _, _ in batch:
                    if k != key or value is None:
                        continue
                    event = decode_event(value, headers)
                    if event.seq < next_seq:  # at-least-once mode may repeat an event
                        continue
                    next_seq = event.seq + 1
                    last_seen = time.monotonic()
                    yield event
                    if event.is_terminal:
                        return
                if idle_timeout_seconds is not None and (
                    time.monotonic() - last_seen > idle_timeout_seconds
                ):
                    raise TimeoutError(f"no event of turn {turn_id} for {idle_timeout_seconds}s")
        finally:
            await asyncio.to_thread(reader.close)

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

    async def get_thread(self, agent: str, thread_id: str) -> ThreadHandle:
        """The thread's turns (oldest first) with their messages and outcomes, as committed
        in ``<agent>.threads``; a thread that does not exist has no turns."""
        records = await asyncio.to_thread(
            read_key_partition,
            self.bootstrap_servers,
            self._topics(agent).threads,
            thread_id,
            client_id="pyrula-thread",
        )
        return decode_thread(thread_id, records)

    async def delete_thread(
        self,
        agent: str,
        thread_id: str,
        *,
        timeout: float | None = 300.0,  # noqa: ASYNC109 (seconds until a worker did it)
    ) -> int:
        """Tombstone every record of the thread; returns how many turns it had.

        The delete is a turn request of the thread, so a worker runs it in order with the
        thread's turns: a turn submitted after it starts empty. Needs a running worker.
        """
        events = await self.run(
            agent, thread_id=thread_id, metadata={THREAD_DELETE: True}, timeout=timeout
        )
        last = events[-1] if events else None
        if last is None or last.type != "run:complete":
            raise RuntimeError(f"deleting thread {thread_id!r} failed: {last}")
        return int(last.data["result"]["deleted_turns"])

    async def cancel(self, agent: str, turn_id: str, *, reason: str | None = None) -> None:
        """Ask the owning worker to stop the turn at its next step boundary."""
        await self._control(agent, turn_id, "cancel", reason)

    async def terminate(self, agent: str, turn_id: str, *, reason: str | None = None) -> None:
        """End the turn now: its worker stops it without waiting for a step boundary."""
        await self._control(agent, turn_id, "terminate", reason)

    async def _control(self, agent: str, turn_id: str, action: str, reason: str | None) -> None:
        if reason is not None and len(reason) > MAX_REASON:
            raise ConfigurationError(f"reason is {len(reason)} characters; at most {MAX_REASON}")
        record = ControlRequest(turn_id, action, reason).record(self._topics(agent).control)
        await self._get_producer().send(
            record.topic, record.key, record.value, list(record.headers)
        )
