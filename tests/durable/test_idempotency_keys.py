"""A partition's idempotency keys, as pure logic: a key a turn takes is found at once but
written to disk only by a flush (which the worker runs off its event loop), and expiry
forgets the oldest keys in bounded batches, never one a turn took again meanwhile."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from pyrula_stream.durable.journal import IdempotencyKeys
from pyrula_stream.kafka.table import SqliteView


def on_disk(path: Path) -> dict[str, int]:
    """What another reader of the file sees: key -> record timestamp."""
    with sqlite3.connect(path) as conn:
        return {str(k): int(ts) for k, ts in conn.execute("SELECT key, ts_ms FROM entries")}


def test_a_remembered_key_is_found_at_once_and_written_only_by_a_flush(tmp_path: Path) -> None:
    keys = IdempotencyKeys(SqliteView(tmp_path / "p0.sqlite"))
    keys.remember("order-7", "t1", 1_000)
    found = keys.get("order-7")
    assert found is not None and (found.turn_id, found.ts_ms) == ("t1", 1_000)
    assert on_disk(keys.path) == {}, "remember wrote to disk (on the event loop)"
    assert keys.pending == 1
    for i in range(5):
        keys.remember(f"k{i}", f"t{i}", 2_000 + i)
    assert keys.flush(4) == 2  # four written in one transaction, two still waiting
    assert keys.flush(4) == 0
    assert keys.pending == 0
    assert on_disk(keys.path) == {"order-7": 1_000} | {f"k{i}": 2_000 + i for i in range(5)}
    found = keys.get("k3")
    assert found is not None and found.turn_id == "t3"


def test_expiry_forgets_the_oldest_keys_in_batches_no_larger_than_the_bound(
    tmp_path: Path,
) -> None:
    keys = IdempotencyKeys(SqliteView(tmp_path / "p0.sqlite"))
    for i in range(10):
        keys.remember(f"old-{i}", f"t{i}", 100 + i)
    keys.remember("young", "ty", 5_000)
    batches = []
    while batch := keys.expire(1_000, limit=4):  # waiting keys are flushed first
        batches.append(batch)
    assert batches == [
        ["old-0", "old-1", "old-2", "old-3"],
        ["old-4", "old-5", "old-6", "old-7"],
        ["old-8", "old-9"],
    ]
    assert on_disk(keys.path) == {"young": 5_000}
    assert keys.get("old-3") is None
    assert keys.get("young") is not None


def test_a_key_taken_again_while_it_expires_is_not_tombstoned(tmp_path: Path) -> None:
    """Expiry runs on a thread: a turn may take the key again before the loop tombstones
    it. The new record must not be tombstoned, and the key must stay found."""
    keys = IdempotencyKeys(SqliteView(tmp_path / "p0.sqlite"))
    keys.remember("order-7", "t1", 100)
    keys.remember("order-8", "t2", 100)
    gone = keys.expire(1_000, limit=10)
    assert gone == ["order-7", "order-8"]
    keys.remember("order-7", "t9", 2_000)  # taken again before the tombstones are made
    assert keys.still_expired(gone) == ["order-8"]
    found = keys.get("order-7")
    assert found is not None and found.turn_id == "t9"
    keys.flush(10)
    assert on_disk(keys.path) == {"order-7": 2_000}


def test_a_closed_table_ignores_a_late_flush_and_expiry(tmp_path: Path) -> None:
    """A partition revoked while its flush waits on the worker thread: nothing fails."""
    keys = IdempotencyKeys(SqliteView(tmp_path / "p0.sqlite"))
    keys.remember("order-7", "t1", 100)
    keys.close()
    assert keys.flush(10) == 0
    assert keys.expire(1_000, limit=10) == []
    assert keys.get("order-7") is None
    assert not keys.path.exists()
