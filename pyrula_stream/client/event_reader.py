"""One event consumer per client, shared by every ``stream()`` of that client.

A consumer per stream cost about 40 ms of setup each. Here one ``read_committed``
consumer reads the partitions that open streams need and hands each record to the streams
of its key. A stream that needs an older part of a partition moves the partition back;
the other streams of that partition see records again and drop them by ``seq``, as they
already do for the at-least-once mode.
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


@dataclass(eq=False)
class Subscription:
    """The records of one key of one topic, as the shared consumer reads them."""

    topic: str
    key: bytes
    queue: asyncio.Queue[TopicRecord | BaseException] = field(default_factory=asyncio.Queue)


class SharedEventReader:
    """Reads the partitions its subscriptions need with one consumer (see module doc)."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        kafka_config: Mapping[str, Any] | None = None,
        group_id: str | None = None,
    ) -> None:
        self._follower = PartitionFollower(
            bootstrap_servers,
            client_id=f"pyrula-client-{uuid.uuid4().hex[:8]}",
            kafka_config=kafka_config,
            group_id=group_id,
        )
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
            if current is None or offset < current:
                await asyncio.to_thread(
                    self._follower.read_from, topic, partition, offset, assigned=current is not None
                )
                self._next_offset[(topic, partition)] = offset
            sub = Subscription(topic, key)
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
