"""One event consumer per client, shared by every ``stream()`` of that client.

A consumer per stream cost about 40 ms of setup each. Here one ``read_committed``
consumer reads the partitions that open streams need and hands each record to the live
streams of its key. Only the polling thread touches that consumer (librdkafka's Python
client serves one call at a time, so an assign from another thread waits behind the
polls); a subscribe never waits for it:

- A stream of a partition already read is live at once: it gets every record the shared
  consumer reads from now on, with no offset lookup.
- The first stream of a partition asks a side consumer where the partition ends and is
  live from there; the shared consumer starts reading it at its next poll. When the last
  stream of a partition ends, the partition is released (unassigned, no longer fetched)
  after ``release_after_s``.
- Records older than the shared position (``since_ms``, a stream that fell behind) come
  from a side consumer, a few at a time, read for all the streams of the partition that
  are behind at once; the shared consumer never moves back.
- Each stream queues at most ``QUEUE_RECORDS`` records. A stream whose reader does not
  keep up (a slow SSE client) is not buffered: it falls behind, and once it has taken its
  queue, the records it missed are read again from Kafka, where they stay. This is how
  Kafka's own consumers bound memory (the log is the buffer; a slow reader keeps an
  offset, not a copy).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from pyrula_stream.kafka.io import PartitionFollower, TopicRecord
from pyrula_stream.kafka.partitioner import partition_for
from pyrula_stream.wire.events import Event

POLL_S = 0.1
CATCH_UP_TIMEOUT_S = 60.0
"""The longest one side read of older records may take."""
QUEUE_RECORDS = 64
"""Records one stream holds before it falls behind and reads the rest from Kafka."""
CHUNK_RECORDS = 1_000
"""Records of behind streams one side read hands over at most."""
SIDE_READERS = 2
"""Side consumers (lookups and reads of older records) open at most at once."""
RELEASE_AFTER_S = 10.0
"""How long a partition no stream needs is still read (a next turn often comes soon)."""

TopicPartitionKey = tuple[str, int]


class Subscription:
    """The records of one key of one topic: ``await get()`` them in offset order."""

    __slots__ = (
        "_wake",
        "behind",
        "error",
        "key",
        "partition",
        "records",
        "since_ms",
        "start",
        "topic",
    )

    def __init__(self, topic: str, key: bytes, partition: int) -> None:
        self.topic = topic
        self.key = key
        self.partition = partition
        self.records: list[TopicRecord] = []
        """At most about ``QUEUE_RECORDS``, so taking the first is cheap; a list, not a
        deque: an empty deque is 760 bytes, and a gateway holds one per open stream."""
        self.error: BaseException | None = None
        self.start: int | None = None
        """While behind: the first offset not handed over yet (``None``: live, or the
        first record at or after ``since_ms``)."""
        self.since_ms: int | None = None
        self._wake: asyncio.Future[None] | None = None
        self.behind = False

    @property
    def where(self) -> TopicPartitionKey:
        return (self.topic, self.partition)

    def push(self, record: TopicRecord) -> None:
        self.records.append(record)
        self._notify()

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def wait(self) -> None:
        """Until a record or an error is there."""
        while not self.records and self.error is None:
            self._wake = asyncio.get_running_loop().create_future()
            try:
                await self._wake
            finally:
                self._wake = None


class SharedEventReader:
    """Reads the partitions its subscriptions need with one consumer (see module doc)."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        kafka_config: Mapping[str, Any] | None = None,
        group_id: str | None = None,
        release_after_s: float = RELEASE_AFTER_S,
    ) -> None:
        self._bootstrap = bootstrap_servers
        self._kafka_config = kafka_config
        self._group_id = group_id
        self._release_after_s = release_after_s
        self._follower = self._new_follower()
        self._subs: dict[tuple[str, bytes], set[Subscription]] = {}
        self._count: dict[TopicPartitionKey, int] = {}
        """Open subscriptions per partition (a partition with none is released)."""
        self._next_offset: dict[TopicPartitionKey, int] = {}
        """Partitions read (or to be read at the next poll) and the next offset."""
        self._to_assign: dict[TopicPartitionKey, int] = {}
        self._to_release: set[TopicPartitionKey] = set()
        self._starting: dict[TopicPartitionKey, asyncio.Future[int]] = {}
        self._partitions: dict[str, asyncio.Future[int]] = {}
        self._behind: dict[TopicPartitionKey, set[Subscription]] = {}
        self._catching_up: dict[TopicPartitionKey, asyncio.Task[None]] = {}
        self._side: list[PartitionFollower] = []
        self._side_slots = asyncio.Semaphore(SIDE_READERS)
        self._task: asyncio.Task[None] | None = None
        self._polling: asyncio.Future[list[TopicRecord]] | None = None
        self._closed = False
        self.fetched: set[TopicPartitionKey] = set()
        """The partitions the shared consumer is assigned, as it last said."""

    # -- subscribing ---------------------------------------------------------------

    async def subscribe(
        self, topic: str, key: bytes, since_ms: int | None, *, new: bool = False
    ) -> Subscription:
        """Hand over ``key``'s records from ``since_ms`` (the log start: ``None``), or
        with ``new`` (a key with no records yet) those written from now on."""
        partition = partition_for(key, await self._partition_count(topic))
        where = (topic, partition)
        sub = Subscription(topic, key, partition)
        if where not in self._next_offset:
            await self._start_reading(where)
        self._add(sub)
        if not new:
            self._fall_behind(sub, None, since_ms)
        return sub

    def follow_new(self, topic: str, key: bytes) -> Subscription | None:
        """Subscribe to the records of a key that has none yet (a turn not yet submitted)
        without waiting for anything: ``None`` when the key's partition is not read yet
        (then ``await subscribe(..., new=True)``)."""
        found = self._partitions.get(topic)
        if found is None or not found.done() or found.exception() is not None:
            return None
        where = (topic, partition_for(key, found.result()))
        if where not in self._next_offset:
            return None
        sub = Subscription(topic, key, where[1])
        self._add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get((sub.topic, sub.key))
        if subs is None or sub not in subs:
            return
        subs.discard(sub)
        if not subs:
            del self._subs[(sub.topic, sub.key)]
        behind = self._behind.get(sub.where)
        if behind is not None:
            behind.discard(sub)
        left = self._count[sub.where] = self._count.get(sub.where, 1) - 1
        if left <= 0:
            del self._count[sub.where]
            asyncio.get_running_loop().call_later(
                self._release_after_s, self._release_if_unused, sub.where
            )

    async def get(self, sub: Subscription) -> TopicRecord:
        """The subscription's next record (raises what stopped the reader)."""
        while True:
            if sub.records:
                record = sub.records.pop(0)
                if sub.behind and len(sub.records) <= QUEUE_RECORDS // 2:
                    self._catch_up(sub.where)
                return record
            if sub.error is not None:
                raise sub.error
            if sub.behind:
                self._catch_up(sub.where)
            await sub.wait()

    def assigned(self) -> set[TopicPartitionKey]:
        """The partitions the shared consumer reads (or starts reading at its next poll)."""
        return set(self._next_offset)

    def _add(self, sub: Subscription) -> None:
        self._subs.setdefault((sub.topic, sub.key), set()).add(sub)
        self._count[sub.where] = self._count.get(sub.where, 0) + 1
        self._to_release.discard(sub.where)
        self._keep_reading()

    def _fall_behind(self, sub: Subscription, start: int | None, since_ms: int | None) -> None:
        """From now on ``sub`` gets its records from side reads, from ``start``."""
        sub.behind = True
        sub.start, sub.since_ms = start, since_ms
        self._behind.setdefault(sub.where, set()).add(sub)
        self._catch_up(sub.where)

    # -- the shared consumer -------------------------------------------------------

    async def _partition_count(self, topic: str) -> int:
        found = self._partitions.get(topic)
        if found is None or (found.done() and found.exception() is not None):
            found = self._partitions[topic] = asyncio.ensure_future(
                self._side_call(lambda side: side.partition_count(topic))
            )
        return await asyncio.shield(found)

    async def _start_reading(self, where: TopicPartitionKey) -> None:
        """Read ``where`` from its current end: one lookup, shared by its first streams."""
        found = self._starting.get(where)
        if found is None:
            found = self._starting[where] = asyncio.ensure_future(
                self._side_call(lambda side: side.end_offset(*where))
            )
        try:
            end = await asyncio.shield(found)
        finally:
            if found.done():
                self._starting.pop(where, None)
        if where not in self._next_offset:
            self._next_offset[where] = end
            self._to_assign[where] = end
            self._to_release.discard(where)

    def _release_if_unused(self, where: TopicPartitionKey) -> None:
        if self._count.get(where) or where not in self._next_offset:
            return
        del self._next_offset[where]
        if self._to_assign.pop(where, None) is None:
            self._to_release.add(where)
        self._keep_reading()

    def _keep_reading(self) -> None:
        if not self._closed and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._run(), name="pyrula-event-reader")

    def _poll(
        self, added: list[tuple[str, int, int]], released: list[TopicPartitionKey]
    ) -> list[TopicRecord]:
        """In the polling thread: the assignment changes asked for, then one poll."""
        fetched = self._follower.reassign(added, released)
        if fetched is not None:
            self.fetched = fetched
        return self._follower.poll(POLL_S)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._subs or self._to_release or self._to_assign:
            added = [(t, p, o) for (t, p), o in self._to_assign.items()]
            released = list(self._to_release)
            self._to_assign.clear()
            self._to_release.clear()
            try:
                self._polling = loop.run_in_executor(None, self._poll, added, released)
                batch = await self._polling
            except Exception as exc:  # every open stream learns why it stopped
                for subs in self._subs.values():
                    for sub in subs:
                        sub.fail(exc)
                return
            finally:
                self._polling = None
            self._dispatch(batch)

    def _dispatch(self, batch: list[TopicRecord]) -> None:
        for record in batch:
            where = (record.topic, record.partition)
            position = self._next_offset.get(where)
            if position is None or record.offset < position:
                continue  # released, or read already
            self._next_offset[where] = record.offset + 1
            for sub in self._subs.get((record.topic, record.key or b""), ()):
                if sub.behind:
                    continue  # its side read gets it
                if len(sub.records) >= QUEUE_RECORDS:
                    self._fall_behind(sub, record.offset, None)
                    continue
                sub.push(record)

    # -- side reads ----------------------------------------------------------------

    async def _side_call(self, call: Callable[[PartitionFollower], Any]) -> Any:
        """``call`` with a side consumer, in a thread (the shared one is never used)."""
        async with self._side_slots:
            side = self._side.pop() if self._side else None
            try:
                if side is None:
                    side = await asyncio.to_thread(self._new_follower)
                result = await asyncio.to_thread(call, side)
            except BaseException:
                if side is not None:
                    await asyncio.to_thread(side.close)
                raise
            if self._closed:
                await asyncio.to_thread(side.close)
            else:
                self._side.append(side)
            return result

    def _catch_up(self, where: TopicPartitionKey) -> None:
        running = self._catching_up.get(where)
        if running is None or running.done():
            self._catching_up[where] = asyncio.create_task(
                self._read_behind(where), name="pyrula-catch-up"
            )

    async def _read_behind(self, where: TopicPartitionKey) -> None:
        """Side reads for the streams of ``where`` that are behind and have room, until
        each is live again (at the shared position) or full."""
        topic, partition = where
        while True:
            ready = [s for s in self._behind.get(where, ()) if len(s.records) < QUEUE_RECORDS // 2]
            end = self._next_offset.get(where)
            if not ready or end is None:
                return
            known = [s.start for s in ready if s.start is not None]
            unknown = [s.since_ms for s in ready if s.start is None]
            start = min(known) if known else None
            look_up = bool(unknown)  # the first offset at or after the earliest since_ms
            since = None if not unknown or None in unknown else min(u or 0 for u in unknown)
            keys = frozenset(s.key for s in ready)
            try:
                read = functools.partial(
                    PartitionFollower.read_chunk,
                    topic=topic,
                    partition=partition,
                    start=start,
                    end=end,
                    keys=keys,
                    since_ms=since,
                    look_up=look_up,
                    limit=CHUNK_RECORDS,
                    timeout_s=CATCH_UP_TIMEOUT_S,
                )
                records, reached = await self._side_call(read)
            except Exception as exc:
                for sub in ready:
                    sub.fail(exc)
                    self._behind.get(where, set()).discard(sub)
                return
            self._hand_over(where, ready, records, reached)

    def _hand_over(
        self,
        where: TopicPartitionKey,
        ready: list[Subscription],
        records: list[TopicRecord],
        reached: int,
    ) -> None:
        """Give each ready stream its records of the side read; one that reached the
        shared position is live again, one that filled up waits to be read."""
        full: set[Subscription] = set()
        for record in records:
            for sub in ready:
                if sub in full or record.key != sub.key or not sub.behind:
                    continue
                if sub.start is None:
                    if sub.since_ms is not None and record.ts_ms < sub.since_ms:
                        continue
                elif record.offset < sub.start:
                    continue
                if len(sub.records) >= QUEUE_RECORDS:
                    full.add(sub)
                    sub.start = record.offset
                    continue
                sub.push(record)
                sub.start = record.offset + 1
        behind = self._behind.get(where, set())
        for sub in ready:
            if sub in full or not sub.behind:
                continue
            sub.start = reached if sub.start is None else max(sub.start, reached)
            if sub.start >= self._next_offset.get(where, reached):
                sub.behind = False  # nothing between it and the shared position: live
                sub.start = sub.since_ms = None
                behind.discard(sub)

    def _new_follower(self) -> PartitionFollower:
        return PartitionFollower(
            self._bootstrap,
            client_id=f"pyrula-client-{uuid.uuid4().hex[:8]}",
            kafka_config=self._kafka_config,
            group_id=self._group_id,
        )

    async def close(self) -> None:
        self._closed = True
        for task in [self._task, *self._catching_up.values()]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._polling is not None:  # the thread still polls: let it finish
            with contextlib.suppress(BaseException):
                await self._polling
        await asyncio.to_thread(self._follower.close)
        async with self._side_slots:
            for side in self._side:
                await asyncio.to_thread(side.close)
            self._side.clear()


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

    def drop(self) -> None:
        """Close a stream that was never iterated (its generator holds nothing yet)."""
        self._unsubscribe()
