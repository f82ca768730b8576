"""``KafkaAgentClient``: submit turns, stream a turn's events, run to completion, read
and delete threads; cancel, terminate and status come from ``control``, signals and
answers from ``signals``.

Every method talks to Kafka only: a turn request goes to ``<prefix>.<agent>.turns`` and the
events are read back from ``<prefix>.<agent>.events`` under ``read_committed`` (one
consumer per client, shared by its streams), so a client sees each event of a turn
exactly once, in ``seq`` order. A status reads only the partition of the turn's key.

Nothing waits forever on Kafka: a call that cannot reach a broker within ``timeout``
raises ``BrokerUnavailableError``, and an agent without topics ``UnknownTopicError``
saying how to create them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from pyrula_stream.agent.batch import Deadline, lane_metadata
from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.client.control import ControlClient
from pyrula_stream.client.event_reader import SharedEventReader, Subscription, TurnStream
from pyrula_stream.client.outgoing_caps import check_request
from pyrula_stream.client.signals import SignalsClient
from pyrula_stream.durable.branch import branch_metadata, check_from_step
from pyrula_stream.errors import (
    ConfigurationError,
    ErrorCode,
    ThreadDeleteFailed,
    TurnFailed,
    UnknownTopicError,
    UserError,
)
from pyrula_stream.kafka.admin import DEFAULT_PREFIX
from pyrula_stream.kafka.config import (
    KafkaSettings,
    check_serialization,
    registry_config,
    resolve,
)
from pyrula_stream.kafka.consumers import read_key_partition, reader_group_id
from pyrula_stream.kafka.io import PartitionReader, RecordProducer
from pyrula_stream.kafka.local.bootstrap import find_bootstrap
from pyrula_stream.objects.resolver import PayloadStores, has_refs
from pyrula_stream.objects.store import ObjectStore
from pyrula_stream.objects.sweep import object_prefix
from pyrula_stream.objects.urls import store_from_environment
from pyrula_stream.observability.tracing import carrier_headers, send_span
from pyrula_stream.state.threads import (
    THREAD_DELETE,
    ThreadHandle,
    decode_thread,
    resolved_thread,
)
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import Event, EventType, decode_event
from pyrula_stream.wire.payload_refs import DEFAULT_THRESHOLD, Offload
from pyrula_stream.wire.serde import TurnRequest

IDEMPOTENT_TURN_NAMESPACE = uuid.UUID("8f4b1c52-7a0e-4d1e-9a7e-5f2f3c6d9b10")
REMEMBERED_SUBMITS = 10_000
"""Turns this client submitted, remembered with their key so ``status`` finds them."""


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


class KafkaAgentClient(SignalsClient, ControlClient):
    """Async client for agents served by ``pyrula-stream worker``. Use as ``async with``.

    ``bootstrap_servers`` defaults as the CLI's does (``kafka.local.bootstrap``):
    ``$KAFKA_BOOTSTRAP_SERVERS``, the settings' ``bootstrap.servers``, then the broker
    ``pyrula-stream broker start`` ran.
    ``timeout`` (seconds) bounds each request to Kafka: a submit's acknowledgement, a
    stream's first look at its topic. ``kafka_config`` (librdkafka settings such as
    ``security.protocol`` and ``sasl.*``) reaches the client's producer and readers;
    without it the file in ``PYRULA_KAFKA_CONFIG`` is used.
    ``serialization="schema_registry"`` submits turn requests in the Confluent wire format
    through the registry at ``schema.registry.url`` in those settings; events in either
    framing are read whenever a registry is set.
    ``object_store`` (a store, or its setting ``file:///dir`` / ``s3://bucket/prefix``;
    without it ``PYRULA_OBJECT_STORE``): parameters whose JSON is past
    ``offload_threshold_bytes`` are put there and the request carries references; the
    references in events are read back from it (docs/large-payloads.md). A reference
    this client cannot read raises ``PayloadUnresolved`` naming its store and key.
    """

    def __init__(
        self,
        bootstrap_servers: str | None = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout: float = 30.0,
        kafka_config: Mapping[str, Any] | None = None,
        serialization: Literal["avro", "schema_registry"] = "avro",
        object_store: ObjectStore | str | None = None,
        offload_threshold_bytes: int = DEFAULT_THRESHOLD,
    ) -> None:
        if bootstrap_servers is not None and not bootstrap_servers:
            raise ConfigurationError("bootstrap_servers is empty")
        if timeout <= 0:
            raise ConfigurationError(f"timeout must be > 0 seconds, got {timeout}")
        self.kafka_config: KafkaSettings = resolve(kafka_config)
        self.bootstrap_servers = bootstrap_servers or find_bootstrap(self.kafka_config)
        self.prefix = prefix
        self.timeout = timeout
        check_serialization(serialization, self.kafka_config)
        self.serialization = serialization
        self._registry: serde.ValueCodec | None = None
        self._producer: RecordProducer | None = None
        self._reader: SharedEventReader | None = None
        self._submitted: OrderedDict[tuple[str, str], str] = OrderedDict()
        store = store_from_environment(object_store)
        self.payloads = PayloadStores([store] if store is not None else [])
        """The one resolver of references this client reads (empty: no store)."""
        self._offload = Offload(store.name, offload_threshold_bytes) if store is not None else None

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
        if self._reader is not None:
            await self._reader.close()
            self._reader = None

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
            self._producer = RecordProducer(
                self.bootstrap_servers, timeout_s=self.timeout, kafka_config=self.kafka_config
            )
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
        deferrable: bool | None = None,
        deadline: Deadline | None = None,
        **params: Any,
    ) -> TurnHandle:
        """Produce a turn request; returns once the broker acknowledged it.

        ``deferrable`` and ``deadline`` (a ``datetime``, epoch seconds or ISO 8601) say
        whether the turn's model calls may wait in an agent's batch lane, and until when
        (see docs/batch-lane.md)."""
        if deferrable is not None or deadline is not None:
            try:
                metadata = {**(metadata or {}), **lane_metadata(deferrable, deadline)}
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
        return await self.submit_request(
            new_request(agent, idempotency_key, metadata, thread_id, params)
        )

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
        ``read_only`` tools run live; see docs/deploying.md. The agent must keep history
        (``keep_history=True``)."""
        from pyrula_stream.state.history import load_recording

        original = await asyncio.to_thread(
            load_recording,
            self.bootstrap_servers,
            self._topics(agent).history,
            turn_id,
            kafka_config=self.kafka_config,
            group_id=reader_group_id(self.prefix, agent),
            payloads=self.payloads,
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

    async def submit_request(
        self, request: TurnRequest, *, headers: Sequence[tuple[str, bytes]] = ()
    ) -> TurnHandle:
        """Produce a prepared request, with the current trace context in its headers
        (and ``headers``, such as the gateway's owner header). An id past its cap
        (``wire/caps.py``) raises ``OverCapError`` and nothing is sent."""
        topic = self._topics(request.agent).turns
        codec = self._writer_codec()
        request = await self._offloaded(request)
        value, ctype = await asyncio.to_thread(codec.encode, "turn_request", request, topic)
        with send_span(topic, request.turn_id) as trace:
            sent: list[tuple[str, str | bytes | None]] = [
                (serde.CONTENT_TYPE_HEADER, ctype.encode()),
                *carrier_headers(trace),
                *headers,
            ]
            check_request(request, sent)
            try:
                delivered = await self._get_producer().send(
                    topic, request.key.encode(), value, sent
                )
            except UnknownTopicError as exc:
                raise self._no_topic(request.agent, exc) from None
        self._submitted[(request.agent, request.turn_id)] = request.key
        while len(self._submitted) > REMEMBERED_SUBMITS:
            self._submitted.popitem(last=False)
        return TurnHandle(
            request.turn_id,
            request.agent,
            delivered.partition,
            delivered.offset,
            request.submitted_ms,
        )

    async def _offloaded(self, request: TurnRequest) -> TurnRequest:
        """``request`` with parameters past the threshold stored by reference (put before
        the request is produced: a worker never reads a reference to nothing)."""
        if self._offload is None:
            return request
        what = f"the parameters of turn {request.turn_id}"
        offload = replace(self._offload, prefix=object_prefix(self.prefix, request.agent))
        params, stored = await asyncio.to_thread(offload.apply, request.params, what)
        if not stored:
            return request
        await asyncio.to_thread(self.payloads.put, stored)
        return replace(request, params=params)

    async def resolve(self, value: Any) -> Any:
        """``value`` (an event's data, a result) with its payload references read back."""
        return await self.payloads.resolve_async(value)

    async def stream(
        self,
        agent: str,
        turn_id: str,
        *,
        since_ms: int | None = None,
        after_seq: int | None = None,
        idle_timeout_seconds: float | None = None,
        include_children: bool = False,
    ) -> AsyncIterator[Event]:
        """Events of one turn, in ``seq`` order, ending after its terminal event.

        ``since_ms`` starts reading at that time (a handle's ``submitted_ms``); without it
        the turn's partition is read from its beginning. ``after_seq=N`` resumes a stream
        that already saw events up to ``seq`` N. ``include_children`` adds the
        events of its sub-agent turns and theirs (each turn's events in ``seq`` order,
        turns interleaved as they arrive; ``Event.turn_id`` and ``agent`` tell them
        apart), ending once the turn and every child it started have ended.
        """
        if include_children:
            async for event in self._stream_tree(agent, turn_id, since_ms, idle_timeout_seconds):
                yield event
            return
        events = await self.open_stream(
            agent,
            turn_id,
            since_ms=since_ms,
            after_seq=after_seq,
            idle_timeout_seconds=idle_timeout_seconds,
        )
        async with contextlib.aclosing(events):  # unsubscribes even if this stream is dropped
            async for event in events:
                yield event

    async def open_stream(
        self,
        agent: str,
        turn_id: str,
        *,
        since_ms: int | None = None,
        after_seq: int | None = None,
        idle_timeout_seconds: float | None = None,
        new_turn: bool = False,
    ) -> TurnStream:
        """``stream`` subscribed now: a missing topic or an unreachable broker raises
        here, before any event is awaited (the gateway answers those with an HTTP error
        rather than inside an event stream). ``aclose`` it when done. ``new_turn``: the
        turn is not submitted yet, so only what is written from now on is read (no
        offset lookup, no read of older records)."""
        reader = self._event_reader(agent)
        topic = self._topics(agent).events
        try:
            sub = await reader.subscribe(topic, turn_id.encode(), since_ms, new=new_turn)
        except UnknownTopicError as exc:
            raise self._no_topic(agent, exc) from None
        events = self._events(sub, turn_id, after_seq, idle_timeout_seconds)
        return TurnStream(events, lambda: reader.unsubscribe(sub))

    def _event_reader(self, agent: str) -> SharedEventReader:
        if self._reader is None:
            self._reader = SharedEventReader(
                self.bootstrap_servers,
                kafka_config=self.kafka_config,
                group_id=reader_group_id(self.prefix, agent),
            )
        return self._reader

    async def _events(
        self,
        sub: Subscription,
        turn_id: str,
        after_seq: int | None = None,
        idle_timeout_seconds: float | None = None,
    ) -> AsyncGenerator[Event, None]:
        """A subscription's events in ``seq`` order until the terminal one; unsubscribes."""
        assert self._reader is not None, "a subscription comes from the client's reader"
        reader = self._reader
        next_seq = 0 if after_seq is None else after_seq + 1
        codec = self._reader_codec()
        try:
            while True:
                try:
                    async with asyncio.timeout(idle_timeout_seconds):
                        item = await reader.get(sub)
                except TimeoutError:
                    raise TimeoutError(
                        f"no event of turn {turn_id} for {idle_timeout_seconds}s"
                    ) from None
                if item.value is None:
                    continue
                if codec is None:
                    event = decode_event(item.value, item.headers)
                else:  # may ask the registry for a schema: off the loop
                    event = await asyncio.to_thread(decode_event, item.value, item.headers, codec)
                if event.seq < next_seq:  # a repeat (at-least-once, a shared re-read)
                    continue
                next_seq = event.seq + 1
                if has_refs(event.data):
                    event = replace(event, data=await self.payloads.resolve_async(event.data))
                yield event
                if event.is_terminal:
                    return
        finally:
            reader.unsubscribe(sub)

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
        """Submit a turn and collect its events until the terminal one.

        A turn with a new id is subscribed to before it is submitted: it has no past
        events, so there is no lookup or read of older records, and no wait behind the
        reader's poll (``SharedEventReader.follow_new``, else ``subscribe(new=True)``).
        """
        request = new_request(agent, idempotency_key, metadata, thread_id, params)
        reader, sub = self._reader, None
        if idempotency_key is None:  # a new turn id: no past events
            reader = self._event_reader(agent)
            topic, key = self._topics(agent).events, request.turn_id.encode()
            sub = reader.follow_new(topic, key)
            if sub is None:
                try:
                    sub = await reader.subscribe(topic, key, None, new=True)
                except UnknownTopicError as exc:
                    raise self._no_topic(agent, exc) from None
        try:
            handle = await self.submit_request(request)
        except BaseException:
            if reader is not None and sub is not None:
                reader.unsubscribe(sub)
            raise
        events: list[Event] = []

        async def collect() -> None:
            if sub is None:
                since_ms = handle.submitted_ms - 60_000
                async for event in self.stream(agent, handle.turn_id, since_ms=since_ms):
                    events.append(event)
                return
            stream = self._events(sub, handle.turn_id)
            async with contextlib.aclosing(stream):
                async for event in stream:
                    events.append(event)

        await asyncio.wait_for(collect(), timeout)
        return events

    async def ask(self, agent: str, **params: Any) -> Any:
        """``run`` a turn and return its result; a turn that ended with ``run:error``
        raises ``TurnFailed`` (its code and message). Keywords are ``run``'s."""
        events = await self.run(agent, **params)
        last = events[-1]
        if last.type != EventType.RUN_COMPLETE:
            raise TurnFailed(agent=agent, turn_id=last.turn_id, data=last.data)
        return last.data.get("result")

    async def get_thread(self, agent: str, thread_id: str) -> ThreadHandle:
        """The thread's turns (oldest first) with their messages and outcomes, as committed
        in ``<agent>.threads``; a thread that does not exist has no turns, an agent without
        that topic (a typo?) raises ``UnknownTopicError``."""
        threads = self._topics(agent).threads
        await asyncio.to_thread(self._require_topic, agent, threads)
        records = await asyncio.to_thread(
            read_key_partition,
            self.bootstrap_servers,
            threads,
            thread_id,
            client_id="pyrula-thread",
            kafka_config=self.kafka_config,
        )
        handle = decode_thread(thread_id, [(r.key, r.value) for r in records])
        return await resolved_thread(handle, self.payloads.resolve_async)

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
        ``UnknownTopicError`` when the agent has no threads topic; ``ThreadDeleteFailed``
        when the delete ended with ``run:error`` or no worker finished it in ``timeout``.
        """
        if not isinstance(thread_id, str) or not thread_id:
            raise UserError(f"thread_id must be a non-empty string, not {thread_id!r}")
        await asyncio.to_thread(self._require_topic, agent, self._topics(agent).threads)
        what = f"deleting thread {thread_id!r} of agent '{agent}'"
        try:
            events = await self.run(
                agent, thread_id=thread_id, metadata={THREAD_DELETE: True}, timeout=timeout
            )
        except TimeoutError:
            within = "" if timeout is None else f" within {timeout:g}s"
            raise ThreadDeleteFailed(
                f"{what} timed out: no worker finished it{within} (is a worker "
                f"for '{agent}' running?); the delete stays queued in "
                f"{self._topics(agent).turns} and runs when a worker takes it",
                code=ErrorCode.WAIT_TIMEOUT,
                agent=agent,
                thread_id=thread_id,
            ) from None
        last = events[-1]
        if last.type != EventType.RUN_COMPLETE:
            code = str(last.data.get("code", ErrorCode.INTERNAL))
            known = code in ErrorCode.__members__.values()
            raise ThreadDeleteFailed(
                f"{what} failed: its turn {last.turn_id} ended with {code}: "
                f"{last.data.get('message')}; the thread is unchanged, fix that and delete "
                "it again",
                code=ErrorCode(code) if known else ErrorCode.INTERNAL,
                agent=agent,
                thread_id=thread_id,
            )
        return int(last.data["result"]["deleted_turns"])

    def _require_topic(self, agent: str, topic: str) -> None:
        """``UnknownTopicError`` saying how to create ``topic`` when it does not exist."""
        reader = PartitionReader(
            self.bootstrap_servers,
            topic,
            client_id="pyrula-client",
            timeout_s=self.timeout,
            kafka_config=self.kafka_config,
            group_id=reader_group_id(self.prefix, agent),
        )
        try:
            reader.partitions()
        except UnknownTopicError as exc:
            raise self._no_topic(agent, exc) from None
        finally:
            reader.close()


def new_request(
    agent: str,
    idempotency_key: str | None,
    metadata: dict[str, Any] | None,
    thread_id: str | None,
    params: dict[str, Any],
) -> TurnRequest:
    """A turn request as ``submit`` writes it, stamped now."""
    return TurnRequest(
        turn_id=turn_id_for(idempotency_key),
        agent=agent,
        params=params,
        metadata=metadata or {},
        thread_id=thread_id,
        idempotency_key=idempotency_key,
        submitted_ms=int(time.time() * 1000),
    )
