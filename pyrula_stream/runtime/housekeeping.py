"""Housekeeping of the owned partitions' journals: tombstones for what nothing reads again.

A finished turn's terminal record and a dead-letter marker serve the dedupe of a re-read
request only until the committed input offset passes that request; an idempotency key
serves until ``idempotency_ttl_s``. Past that each is tombstoned, so compaction drops it:
at assignment (what earlier owners left) and after each commit (what this owner
finished). The tombstones of a commit ride the next commit something else starts, so
cleanup never costs a commit of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pyrula_stream.kafka.table import PartitionedTable
from pyrula_stream.kafka.transactions import Offsets
from pyrula_stream.runtime.committer import GroupCommitter
from pyrula_stream.runtime.options import WorkerOptions
from pyrula_stream.runtime.partition import PartitionState
from pyrula_stream.wire.records import OutRecord, content_type_header

EXPIRY_INTERVAL_S = 60.0
"""How often idempotency keys past their TTL are looked for (and tombstoned)."""


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

    def tombstone(self, partition: int, key: str) -> OutRecord:
        return self._table.tombstone(key, partition, [content_type_header("journal_entry")])

    def assigned(self, partition: int, state: PartitionState) -> None:
        """A partition was restored: tombstone its keys past the idempotency TTL and the
        terminal records its committed input offset has passed."""
        ttl_ms = int(self._options.idempotency_ttl_s * 1000)
        expired = state.journal.expire(int(time.time() * 1000), ttl_ms)
        if state.restored_committed is not None:
            expired += state.committed(state.restored_committed)
        if expired:
            self._committer().add_records([self.tombstone(partition, key) for key in expired])

    def on_committed(self, offsets: Offsets) -> None:
        """Input offsets committed: forget the finished turns they passed, tombstone their
        terminal records (a later commit carries them), and expire idempotency keys."""
        records: list[OutRecord] = []
        for (_, p), offset in offsets.items():
            ps = self._parts.get(p)
            if ps is not None:
                records += [self.tombstone(p, key) for key in ps.committed(offset)]
        if time.monotonic() >= self._next_expiry:
            self._next_expiry = time.monotonic() + EXPIRY_INTERVAL_S
            now_ms = int(time.time() * 1000)
            ttl_ms = int(self._options.idempotency_ttl_s * 1000)
            for p, ps in self._parts.items():
                records += [self.tombstone(p, k) for k in ps.journal.expire(now_ms, ttl_ms)]
        if records:
            self._committer().add_records(records, wake=False)  # cleanup rides the next commit
