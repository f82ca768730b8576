"""``KafkaAgentClient``: submit turns, stream a turn's events, run to completion, cancel.

Every method talks to Kafka only: a turn request goes to ``<prefix>.<agent>.turns`` and the
events are read back from ``<prefix>.<agent>.events`` under ``read_committed``, so a client
sees each event of a turn exactly once, in ``seq`` order.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pyrula_stream import serde
from pyrula_stream.agent import AgentTopics
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.kafka.admin import DEFAULT_PREFIX
from pyrula_stream.kafka.config import (
    KafkaSettings,
    check_serialization,
    registry_config,
    resolve,
)
from pyrula_stream.kafka.consumers import reader_group_id
from pyrula_stream.kafka.io import PartitionReader, RecordProducer
from pyrula_stream.serde import Event, TurnRequest

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
    """Async client for agents served by ``pyrula-stream worker``. Use as ``async with``.

    ``kafka_config`` (librdkafka settings such as ``security.protocol`` and ``sasl.*``)
    reaches the client's producer and readers; without it the file in
    ``PYRULA_KAFKA_CONFIG`` is used. ``serialization="schema_registry"`` submits turn
    requests in the Confluent wire format through the registry at ``schema.registry.url``
    in those settings; events in either framing are read whenever a registry is set.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        kafka_config: Mapping[str, Any] | None = None,
        serialization: Literal["avro", "schema_registry"] = "avro",
    ) -> None:
        if not bootstrap_servers:
            raise ConfigurationError("bootstrap_servers is empty")
        self.bootstrap_servers = bootstrap_servers
        self.prefix = prefix
        self.kafka_config: KafkaSettings = resolve(kafka_config)
        check_serialization(serialization, self.kafka_config)
        self.serialization = serialization
        self._registry: serde.ValueCodec | None = None
        self._producer: RecordProducer | None = None

    async def __aenter__(self) -> KafkaAgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._registry is not None:
            self._registry.close()
            self._registry = None
        if self._producer is not None:
            await asyncio.to_thread(self._producer.close)
            self._producer = None

    def _topics(self, agent: str) -> AgentTopics:
        return AgentTopics.for_agent(agent, self.prefix)

    def _reader_codec(self) -> serde.ValueCodec | None:
        """The registry codec when ``schema.registry.url`` is set (either framing is read)."""
        if self._registry is None and registry_config(self.kafka_config) is not None:
            from pyrula_stream.kafka.schema_registry import reader_codec

            self._registry = reader_codec(self.kafka_config)
        return self._registry

    def _writer_codec(self) -> serde.ValueCodec:
        if self.serialization == "schema_registry":
            return self._reader_codec() or serde.SCHEMALESS
        return serde.SCHEMALESS

    def _get_producer(self) -> RecordProducer:
        if self._producer is None:
            self._producer = RecordProducer(self.bootstrap_servers, kafka_config=self.kafka_config)
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
        topic = self._topics(request.agent).turns
        codec = self._writer_codec()
        value, ctype = await asyncio.to_thread(codec.encode, "turn_request", request, topic)
        delivered = await self._get_producer().send(
            topic, request.key.encode(), value, [(serde.CONTENT_TYPE_HEADER, ctype.encode())]
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
            kafka_config=self.kafka_config,
            group_id=reader_group_id(self.prefix, agent),
        )
        try:
            await asyncio.to_thread(reader.seek_key, turn_id.encode(), since_ms)
            key = turn_id.encode()
            next_seq = 0
            last_seen = time.monotonic()
            codec = self._reader_codec()

            def next_events() -> list[Event]:  # decoding may ask the registry: off the loop
                return [
                    serde.decode_event(value, headers, codec)
                    for k, value, headers, _, _ in reader.poll(0.1)
                    if k == key and value is not None
                ]

            while True:
                for event in await asyncio.to_thread(next_events):
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

    async def cancel(self, agent: str, turn_id: str, *, reason: str | None = None) -> None:
        """Ask the owning worker to stop the turn at its next step boundary."""
        await self._control(agent, turn_id, "cancel", reason)

    async def terminate(self, agent: str, turn_id: str, *, reason: str | None = None) -> None:
        """End the turn now: its worker stops it without waiting for a step boundary."""
        await self._control(agent, turn_id, "terminate", reason)

    async def _control(self, agent: str, turn_id: str, action: str, reason: str | None) -> None:
        if reason is not None and len(reason) > MAX_REASON:
            raise ConfigurationError(f"reason is {len(reason)} characters; at most {MAX_REASON}")
        body = {
            "turn_id": turn_id,
            "action": action,
            "reason": reason,
            "ts_ms": int(time.time() * 1000),
        }
        await self._get_producer().send(
            self._topics(agent).control,
            turn_id.encode(),
            json.dumps(body).encode(),
            [(serde.CONTENT_TYPE_HEADER, b"application/json")],
        )
