"""One event consumer per client, shared by every ``stream()`` of that client.

A consumer per stream cost about 40 ms of setup each. Here one ``read_committed``
consumer reads the partitions that open streams need and hands each record to the streams
of its key. A stream that needs an older part of a partition than the shared consumer has
reached gets that part from a one-off read of its own (``PartitionFollower.read_range``),
then the shared records it held meanwhile: a caller's ``since_ms`` never moves the shared
consumer back, so it costs the other streams of the partition nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyrula_stream.kafka.io import PartitionFollower, TopicRecord
from pyrula_stream.kafka.partitioner import partition_for
from pyrula_stream.wire.events import Event

POLL_S = 0.1
CATCH_UP_TIMEOUT_S = 60.0
"""The longest a stream's one-off read of older records may take."""


@dataclass(eq=False)
class Subscription:
    """The records of one key of one topic, as the shared consumer reads them."""

    topic: str
    key: bytes
    queue: asyncio.Queue[TopicRecord | BaseException] = field(default_factory=asyncio.Queue)
    held: list[TopicRecord] | None = None
    """While its older records are read apart, the shared records wait here."""
    catch_up: asyncio.Task[None] | None = None
    """That read (left to end on its own: it is bounded by ``CATCH_UP_TIMEOUT_S``)."""


class SharedEventReader:
    """Reads the partitions its subscriptions need with one consumer (see module doc)."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        kafka_config: Mapping[str, Any] | None = None,
        group_id: str | None = None,
    ) -> None:
        self._bootstrap = bootstrap_servers
        self._kafka_config = kafka_config
        self._group_id = group_id
        self._follower = self._new_follower()
        self._lock = asyncio.Lock()  # the consumer is used by one thread at a time
        self._subs: dict[tuple[str, bytes], set[Subscription]] = {}
        self._next_offset: dict[tuple[str, int], int] = {}
        self._partitions: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    async def subscribe(self, topic: str, key: bytes, since_ms: int | None) -> Subscription:
        """Start handing over ``key``'s records from ``since_ms`` (the log start: ``None``)."""
        async with self._lock:
            if topic not in self._partitions:
                self._partitions[topic] = await asyncio.to_thread(
                    self._follower.partition_count, topic
                )
            partition = partition_for(key, self._partitions[topic])
            offset = await asyncio.to_thread(
                self._follower.start_offset, topic, partition, since_ms
            )
            current = self._next_offset.get((topic, partition))
            sub = Subscription(topic, key)
            if current is None:
                await asyncio.to_thread(
                    self._follower.read_from, topic, partition, offset, assigned=False
                )
                self._next_offset[(topic, partition)] = offset
            elif offset < current:  # older than the shared consumer: a read of its own
                sub.held = []
                sub.catch_up = asyncio.create_task(
                    self._catch_up(sub, partition, offset, current), name="pyrula-catch-up"
                )
            self._subs.setdefault((topic, key), set()).add(sub)
        self._keep_reading()
        return sub

    def follow_new(self, topic: str, key: bytes) -> Subscription | None:
        """Subscribe to the records of a key that has none yet (a turn not yet submitted).

        When this reader already reads the key's partition, everything written under the
        key from now on is still ahead of it: the subscription needs no offset lookup, no
        rewind and no turn at the consumer, which ``subscribe`` waits for (up to a whole
        ``POLL_S`` poll while other streams are open). ``None`` when the partition is not
        read yet: then use ``subscribe``.
        """
        count = self._partitions.get(topic)
        if count is None or (topic, partition_for(key, count)) not in self._next_offset:
            return None
        sub = Subscription(topic, key)
        self._subs.setdefault((topic, key), set()).add(sub)
        self._keep_reading()
        return sub

    def _new_follower(self) -> PartitionFollower:
        return PartitionFollower(
            self._bootstrap,
            client_id=f"pyrula-client-{uuid.uuid4().hex[:8]}",
            kafka_config=self._kafka_config,
            group_id=self._group_id,
        )

    async def _catch_up(self, sub: Subscription, partition: int, start: int, end: int) -> None:
        """Hand ``sub`` its key's records in ``[start, end)`` from a one-off reader, then
        the shared records held meanwhile, in offset order."""
        try:
            follower = await asyncio.to_thread(self._new_follower)
            try:
                older = await asyncio.to_thread(
                    follower.read_range,
                    sub.topic,
                    partition,
                    start,
                    end,
                    sub.key,
                    timeout_s=CATCH_UP_TIMEOUT_S,
                )
            finally:
                await asyncio.to_thread(follower.close)
        except Exception as exc:
            sub.queue.put_nowait(exc)
            return
        for record in [*older, *(sub.held or ())]:
            sub.queue.put_nowait(record)
        sub.held = None

    def _keep_reading(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="pyrula-event-reader")

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get((sub.topic, sub.key))
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[(sub.topic, sub.key)]

    async def _run(self) -> None:
        while self._subs:
            try:
                async with self._lock:
                    batch = await asyncio.to_thread(self._follower.poll, POLL_S)
            except Exception as exc:  # every open stream learns why it stopped
                for subs in self._subs.values():
                    for sub in subs:
                        sub.queue.put_nowait(exc)
                return
            for record in batch:
                where = (record.topic, record.partition)
                self._next_offset[where] = max(self._next_offset.get(where, 0), record.offset + 1)
                for sub in self._subs.get((record.topic, record.key or b""), ()):
                    if sub.held is not None:
                        sub.held.append(record)
                    else:
                        sub.queue.put_nowait(record)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        async with self._lock:
            await asyncio.to_thread(self._follower.close)


class TurnStream:
    """One turn's events from ``KafkaAgentClient.open_stream``: iterate it, then
    ``aclose`` it, which unsubscribes even when it was never iterated."""

    def __init__(self, events: AsyncGenerator[Event, None], unsubscribe: Callable[[], None]):
        self._events = events
        self._unsubscribe = unsubscribe

    def __aiter__(self) -> TurnStream:
        return self

    async def __anext__(self) -> Event:
        return await anext(self._events)

    async def aclose(self) -> None:
        try:
            await self._events.aclose()
        finally:
            self._unsubscribe()
