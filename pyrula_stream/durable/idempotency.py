"""The idempotency keys a worker holds for its partitions: on disk, written off the loop.

A key is taken by a turn's terminal record (``idem/<key>`` in the journal) and kept for
``idempotency_ttl_s``. A worker takes keys at its throughput, so each partition's keys
live in a ``SqliteView`` rebuilt from the journal on assignment, and the event loop only
reads them: writes wait in memory for a flush on another thread, and expiry, in bounded
batches, runs there too (``runtime/housekeeping.py`` drives both).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.kafka.table import SqliteView
from pyrula_stream.wire.journal_keys import IDEMPOTENCY_PREFIX
from pyrula_stream.wire.serde import decode_journal_entry

__all__ = ["FLUSH_BATCH", "IdempotencyKeys", "IdempotencyRecord"]

log = logging.getLogger(__name__)

FLUSH_BATCH = 1000
"""Most idempotency keys one disk transaction writes (how long the event loop may wait
for the connection while a flush holds it: about a millisecond)."""


@dataclass
class IdempotencyRecord:
    """Which turn took an idempotency key, and when (the record's timestamp)."""

    turn_id: str
    ts_ms: int


class IdempotencyKeys:
    """The idempotency keys of one journal partition within their TTL, kept on disk.

    A worker takes keys at its throughput and holds each for the TTL (a day by default),
    so they live in a ``SqliteView`` rebuilt from the journal's ``idem/<key>`` records on
    assignment, not in memory. The view changes only after a write committed.

    A key a turn took (``remember``, on the event loop) waits in memory until ``flush``
    writes it, in batches, from another thread; ``expire`` runs there too. So the loop
    never waits on a disk write: ``get`` reads the waiting keys first, then the view,
    and a lock lets one thread at a time use the view's connection.
    """

    def __init__(self, view: SqliteView) -> None:
        self._view = view
        self._db_lock = threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending: dict[str, tuple[str, int]] = {}
        """Keys remembered and not yet written: key -> (turn id, timestamp)."""
        self._closed = False

    def __len__(self) -> int:
        """Keys held (one taken again before its flush counts twice)."""
        with self._db_lock:
            return (0 if self._closed else len(self._view)) + len(self._pending)

    @property
    def path(self) -> Path:
        return self._view.path

    @property
    def pending(self) -> int:
        """Keys remembered and not yet written to disk."""
        return len(self._pending)

    def get(self, key: str) -> IdempotencyRecord | None:
        waiting = self._pending.get(key)  # a flush writes a key before it leaves here
        if waiting is not None:
            return IdempotencyRecord(*waiting)
        with self._db_lock:
            found = None if self._closed else self._view.get(key)
        return None if found is None else IdempotencyRecord(found[0].decode(), found[1])

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Apply many records as one disk write (restore)."""
        with self._db_lock, self._view.batch():
            yield

    def remember(self, key: str, turn_id: str, ts_ms: int) -> None:
        """A terminal record taking ``key`` committed (no disk write here: ``flush``)."""
        with self._pending_lock:
            self._pending[key] = (turn_id, ts_ms)

    def flush(self, limit: int) -> int:
        """Write at most ``limit`` remembered keys to disk in one transaction (off the
        event loop); return how many still wait."""
        with self._pending_lock:
            rows = list(itertools.islice(self._pending.items(), limit))
        if rows:
            with self._db_lock:
                if self._closed:
                    return 0
                self._view.apply_many((k, t.encode(), ts) for k, (t, ts) in rows)
        with self._pending_lock:
            for key, taken in rows:
                if self._pending.get(key) is taken:  # not taken again meanwhile
                    del self._pending[key]
            return len(self._pending)

    def expire(self, before_ms: int, limit: int | None = None) -> list[str]:
        """Forget at most ``limit`` keys taken before ``before_ms``, the oldest first
        (``None``: all), and return them (off the event loop). Before their records are
        tombstoned, ``still_expired`` drops those a turn took again meanwhile: a flush
        writes such a key anew, and its new record must not be tombstoned."""
        while self.flush(limit or FLUSH_BATCH):  # a remembered key may be old already
            pass
        with self._db_lock:
            if self._closed:
                return []
            keys = self._view.older_than(before_ms, limit)
            self._view.delete_many(keys)
        return keys

    def still_expired(self, keys: list[str]) -> list[str]:
        """``keys`` (returned by ``expire``) but those a turn took again since."""
        with self._pending_lock:
            return [k for k in keys if k not in self._pending]

    def apply(self, key: str, value: bytes | None, ts_ms: int) -> None:
        """Fold one restored ``idem/<key>`` record (``None``: a tombstone). Restore calls
        it within ``batch``, before the partition is handed to the event loop."""
        if value is None:
            self._view.apply(key, None, ts_ms)
            return
        try:
            turn_id = decode_journal_entry(value, {}).turn_id
        except MalformedRecordError as exc:
            log.error("idempotency record %s%s unreadable: %s", IDEMPOTENCY_PREFIX, key, exc)
            return
        self._view.apply(key, turn_id.encode(), ts_ms)

    def close(self) -> None:
        """Close and delete the file (waits for a flush or expiry in flight)."""
        with self._db_lock:
            self._closed = True
            self._view.close()
        with self._pending_lock:
            self._pending.clear()
