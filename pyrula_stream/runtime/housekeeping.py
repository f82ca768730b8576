"""Housekeeping of the owned partitions' journals: tombstones for what nothing reads again.

A finished turn's terminal record and a dead-letter marker serve the dedupe of a re-read
request only until the committed input offset passes that request; an idempotency key
serves until ``idempotency_ttl_s``. Past that each is tombstoned, so compaction drops it:
at assignment (what earlier owners left) and after each commit (what this owner
finished). The tombstones of a commit ride the next commit something else starts, so
cleanup never costs a commit of its own.

Idempotency keys are many (a worker's throughput times the TTL), so their disk work stays
off the event loop: the session's keys task (``run``) writes the keys turns took, in
batches, on a worker thread, and every ``idempotency_expiry_interval_s`` expires the old
ones there, at most ``idempotency_expiry_batch`` per commit, each batch's tombstones
committed before the next batch is read (on an idle worker, in a commit of its own). So
neither a key a turn takes nor an expiry of a day's keys stalls the loop, and no
transaction carries more than one batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection

from pyrula_stream.durable.idempotency import FLUSH_BATCH, IdempotencyKeys
from pyrula_stream.kafka.table import PartitionedTable
from pyrula_stream.kafka.transactions import Offsets
from pyrula_stream.runtime.committer import GroupCommitter
from pyrula_stream.runtime.options import WorkerOptions
from pyrula_stream.runtime.partition import PartitionState
from pyrula_stream.wire.journal_keys import IDEMPOTENCY_PREFIX, TERMINAL, journal_key
from pyrula_stream.wire.records import OutRecord, content_type_header

log = logging.getLogger(__name__)

KEYS_FLUSH_INTERVAL_S = 0.05
"""How often the keys task writes the keys turns took since (at most)."""


def keys_owner(partition: int) -> str:
    """The committer's owner of a partition's expiry tombstones."""
    return f"pyrula.keys-expiry.{partition}"


def _flush_all(keys: list[IdempotencyKeys]) -> None:
    """Write every remembered key, ``FLUSH_BATCH`` per disk transaction (a worker thread)."""
    for view in keys:
        while view.flush(FLUSH_BATCH):
            pass


def _flush_and_expire(
    waiting: list[IdempotencyKeys], keys: IdempotencyKeys, before_ms: int, limit: int
) -> list[str]:
    """One expiry batch, after writing what waits (so a long expiry holds no keys back)."""
    _flush_all(waiting)
    return keys.expire(before_ms, limit)


class JournalHousekeeping:
    """Tombstones the journal keys of the worker's partitions that nothing reads again.

    ``parts`` is the worker's map of owned partitions (shared, not copied).
    """

    def __init__(
        self,
        journal_topic: str,
        parts: dict[int, PartitionState],
        options: WorkerOptions,
        *,
        committer: Callable[[], GroupCommitter],
    ) -> None:
        self._table = PartitionedTable(journal_topic)
        self._parts = parts
        self._options = options
        self._committer = committer
        self._next_expiry = 0.0
        self.expiry_batches = 0
        """Batches of expired keys tombstoned (the bench and the tests read it)."""
        self.expired_keys = 0

    def tombstone(self, partition: int, key: str) -> OutRecord:
        return self._table.tombstone(key, partition, [content_type_header("journal_entry")])

    def assigned(self, partition: int, state: PartitionState) -> None:
        """A partition was restored: tombstone the terminal records past the TTL or the
        committed input offset (its keys past the TTL: the keys task, soon)."""
        ttl_ms = int(self._options.idempotency_ttl_s * 1000)
        expired = state.journal.expire_terminals(int(time.time() * 1000), ttl_ms)
        if state.restored_committed is not None:
            expired += state.committed(state.restored_committed)
        if expired:
            self._committer().add_records([self.tombstone(partition, key) for key in expired])
        self._next_expiry = 0.0

    def on_committed(self, offsets: Offsets, ended: Collection[tuple[str, int, int]] = ()) -> None:
        """Input offsets committed: forget the finished turns they passed, tombstone their
        terminal records (a later commit carries them). ``ended``: the turns (id,
        partition, input offset) whose terminal records were in the commit; one whose
        input the commit passed too is never read again, so its terminal record goes
        at once."""
        records: list[OutRecord] = []
        for (_, p), offset in offsets.items():
            ps = self._parts.get(p)
            if ps is not None:
                records += [self.tombstone(p, key) for key in ps.committed(offset)]
        for turn_id, p, offset in ended:
            ps = self._parts.get(p)
            if ps is not None and offset < ps.committed_to:
                records.append(self.tombstone(p, journal_key(turn_id, -1, TERMINAL)))
        if records:
            self._committer().add_records(records, wake=False)  # cleanup rides the next commit

    async def run(self) -> None:
        """The session's keys task: write the keys turns took and expire old ones, the
        disk work on a worker thread, one job at a time (see the module docstring)."""
        while True:
            await asyncio.sleep(KEYS_FLUSH_INTERVAL_S)
            try:
                await self._keys_round()
            except Exception:  # a disk error must not end the task: the topic holds all
                log.exception("idempotency keys housekeeping failed; retrying")

    async def _keys_round(self) -> None:
        """Write what waits; expire when due."""
        waiting = self._waiting()
        if waiting:
            await asyncio.to_thread(_flush_all, waiting)
        if time.monotonic() >= self._next_expiry:
            self._next_expiry = time.monotonic() + self._options.idempotency_expiry_interval_s
            await self._expire()

    def _waiting(self) -> list[IdempotencyKeys]:
        """The owned partitions' keys with remembered keys not yet on disk."""
        return [
            ps.journal.idempotency for ps in self._parts.values() if ps.journal.idempotency.pending
        ]

    async def _expire(self) -> None:
        """Tombstone what is past the TTL in every owned partition, keys in batches."""
        now_ms = int(time.time() * 1000)
        ttl_ms = int(self._options.idempotency_ttl_s * 1000)
        limit = max(1, self._options.idempotency_expiry_batch)
        for p in sorted(self._parts):
            ps = self._parts.get(p)
            if ps is None:
                continue
            terminals = ps.journal.expire_terminals(now_ms, ttl_ms)
            if terminals:
                self._committer().add_records([self.tombstone(p, k) for k in terminals], wake=False)
            keys = ps.journal.idempotency
            while True:
                gone = await asyncio.to_thread(
                    _flush_and_expire, self._waiting(), keys, now_ms - ttl_ms, limit
                )
                if self._parts.get(p) is not ps:
                    break  # revoked meanwhile: the next owner expires them
                expired = keys.still_expired(gone)  # not taken again while we waited
                if expired:
                    await self._commit_tombstones(p, expired)
                if len(gone) < limit:
                    break

    async def _commit_tombstones(self, p: int, keys: list[str]) -> None:
        """One batch of expired keys' tombstones, committed before the next is read (with
        every owned partition's offset: a worker that lost the group is fenced)."""
        records = [self.tombstone(p, IDEMPOTENCY_PREFIX + k) for k in keys]
        done = self._committer().durable_records(keys_owner(p), records)
        await asyncio.wait([done])
        if done.cancelled() or done.exception() is not None:
            return  # the partition left (purged), or the session ends with the error
        self.expiry_batches += 1
        self.expired_keys += len(keys)
