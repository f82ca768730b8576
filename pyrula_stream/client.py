"""``KafkaAgentClient``: submit turns, stream a turn's events, run to completion, cancel.

Every method talks to Kafka only: a turn request goes to ``<prefix>.<agent>.turns`` and the
events are read back from ``<prefix>.<agent>.events`` under ``read_committed``, so a client
sees each event of a turn exactly once, in ``seq`` order.

Nothing waits forever on Kafka: a call that cannot reach a broker within ``timeout``
raises ``BrokerUnavailableError``, and an agent without topics ``UnknownTopicError``
saying how to create them.
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
from pyrula_stream.errors import ConfigurationError, UnknownTopicError
from pyrula_stream.events import Event, EventType, decode_event
from pyrula_stream.kafka.admin import DEFAULT_PREFIX
from pyrula_stream.kafka.io import PartitionReader, RecordProducer
from pyrula_stream.observability.tracing import carrier_headers, send_span
from pyrula_stream.records import ControlRequest, content_type_header
from pyrula_stream.serde import TurnRequest

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


def missing_agent_topic(agent: str, prefix: str, topic: str) -> UnknownTopicError:
    """The error for an agent whose topics were never created, saying how to create them."""
    flag = "" if prefix == DEFAULT_PREFIX else f" --prefix {prefix}"
    return UnknownTopicError(
        f"no topic {topic}: start a worker for '{agent}' or run "
        f"`pyrula-stream topics apply {agent}{flag}`",
        topic=topic,
    )


class KafkaAgentClient:
    """Async client for agents served by ``pyrula-stream worker``. Use as ``async with``.

    ``timeout`` (seconds) bounds each request to Kafka: a submit's acknowledgement, a
    stream's first look at its topic.
    """

    def __init__(
        self, bootstrap_servers: str, *, prefix: str = DEFAULT_PREFIX, timeout: float = 30.0
    ) -> None:
        if not bootstrap_servers:
            raise ConfigurationError("bootstrap_servers is empty")
        if timeout <= 0:
            raise ConfigurationError(f"timeout must be > 0 seconds, got {timeout}")
        self.bootstrap_servers = bootstrap_servers
        self.prefix = prefix
        self.timeout = timeout
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
            self._producer = RecordProducer(self.bootstrap_servers, timeout_s=self.timeout)
        return self._producer

    def _no_topic(self, agent: str, exc: UnknownTopicError) -> UnknownTopicError:
        return missing_agent_topic(agent, self.prefix, exc.topic)

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
        """Produce a prepared request, with the current trace context in its headers."""
        topic = self._topics(request.agent).turns
        with send_span(topic, request.turn_id) as trace:
            try:
                delivered = await self._get_producer().send(
                    topic,
                    request.key.encode(),
                    serde.encode("turn_request", request),
                    [content_type_header("turn_request"), *carrier_headers(trace)],
                )
            except UnknownTopicError as exc:
                raise self._no_topic(request.agent, exc) from None
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
        include_children: bool = False,
    ) -> AsyncIterator[Event]:
        """Events of one turn, in ``seq`` order, ending after its terminal event.

        ``since_ms`` starts reading at that time (a handle's ``submitted_ms``); without it
        the turn's partition is read from its beginning. ``include_children`` adds the
        events of its sub-agent turns and theirs (each turn's events in ``seq`` order,
        turns interleaved as they arrive; ``Event.turn_id`` and ``agent`` tell them
        apart), ending once the turn and every child it started have ended.
        """
        if include_children:
            async for event in self._stream_tree(agent, turn_id, since_ms, idle_timeout_seconds):
                yield event
            return
        reader = PartitionReader(
            self.bootstrap_servers,
            self._topics(agent).events,
            client_id=f"pyrula-client-{uuid.uuid4().hex[:8]}",
            timeout_s=self.timeout,
        )
        try:
            try:
                await asyncio.to_thread(reader.seek_key, turn_id.encode(), since_ms)
            except UnknownTopicError as exc:
                raise self._no_topic(agent, exc) from None
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

    async def _stream_tree(
        self, agent: str, turn_id: str, since_ms: int | None, idle: float | None
    ) -> AsyncIterator[Event]:
        """One reader per turn of the tree, merged through a queue as events arrive."""
        queue: asyncio.Queue[Event | BaseException] = asyncio.Queue()
        readers: list[asyncio.Task[None]] = []

        async def pump(agent_name: str, tid: str, since: int | None) -> None:
            try:
                async for event in self.stream(
                    agent_name, tid, since_ms=since, idle_timeout_seconds=idle
                ):
                    await queue.put(event)
            except Exception as exc:
                await queue.put(exc)

        def follow(agent_name: str, tid: str, since: int | None) -> None:
            readers.append(asyncio.create_task(pump(agent_name, tid, since)))
            unfinished.add(tid)

        unfinished: set[str] = set()
        follow(agent, turn_id, since_ms)
        try:
            while unfinished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.type == EventType.SUBAGENT_START:
                    child = str(item.data["child_turn_id"])
                    if child not in unfinished:
                        follow(str(item.data["agent"]), child, item.ts_ms - 60_000)
                elif item.is_terminal:
                    unfinished.discard(item.turn_id)
        finally:
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

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

    async def terminate(self, agent: str, turn_id: str, *, reason: str | None = None) -> None:
        """End the turn now: its worker stops it without waiting for a step boundary."""
        await self._control(agent, turn_id, "terminate", reason)

    async def _control(self, agent: str, turn_id: str, action: str, reason: str | None) -> None:
        if reason is not None and len(reason) > MAX_REASON:
            raise ConfigurationError(f"reason is {len(reason)} characters; at most {MAX_REASON}")
        record = ControlRequest(turn_id, action, reason).record(self._topics(agent).control)
        try:
            await self._get_producer().send(
                record.topic, record.key, record.value, list(record.headers)
            )
        except UnknownTopicError as exc:
            raise self._no_topic(agent, exc) from None
