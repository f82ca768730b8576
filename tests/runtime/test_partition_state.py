"""What a partition remembers of finished turns, as pure logic: a finished turn is kept
until the committed input offset passes its request, restored ones until the committed
offset reaches the input's end at restore, idempotency keys (on disk) for their TTL."""

from __future__ import annotations

from pathlib import Path

from pyrula_stream.durable.journal import IdempotencyKeys, PartitionJournal
from pyrula_stream.kafka.offsets import ConsumedRecord
from pyrula_stream.kafka.table import SqliteView
from pyrula_stream.runtime.partition import PartitionState
from pyrula_stream.wire import serde
from pyrula_stream.wire.serde import JournalEntry, TurnRequest


def state(tmp_path: Path, *, restored_end: int = 0) -> PartitionState:
    keys = IdempotencyKeys(SqliteView(tmp_path / "p0.sqlite"))
    return PartitionState(0, PartitionJournal(0, keys), restored_end=restored_end)


def terminal(turn_id: str) -> bytes:
    entry = JournalEntry(turn_id, -1, "terminal", "run:complete", data={}, attempt=1, ts_ms=5)
    return serde.encode("journal_entry", entry)


def test_a_finished_turn_is_kept_until_a_commit_passes_its_offset(tmp_path: Path) -> None:
    ps = state(tmp_path)
    request = TurnRequest("t1", "a", {})
    ps.turn_finished(request, offset=7, ts_ms=1)
    assert ps.committed(7) == []  # offset 7 itself is still to be read again
    assert ps.is_finished(request)
    assert ps.committed(8) == ["t1/terminal"]
    assert not ps.is_finished(request)
    assert ps.remembered_turns == 0


def test_a_keyed_turn_stays_finished_through_its_key_after_the_commit(tmp_path: Path) -> None:
    ps = state(tmp_path)
    request = TurnRequest("t1", "a", {}, idempotency_key="order-7")
    ps.running_keys["order-7"] = "t1"
    ps.turn_finished(request, offset=0, ts_ms=1_000)
    assert ps.committed(1) == ["t1/terminal"]
    assert ps.is_finished(request)  # a resubmit of the key: same turn id, a no-op
    other = TurnRequest("t2", "a", {}, idempotency_key="order-7")
    assert ps.original_turn(other) == "t1"
    assert ps.journal.expire(now_ms=5_000, ttl_ms=1_000) == ["idem/order-7"]
    assert not ps.is_finished(request)


def test_restored_terminals_are_kept_until_the_commit_reaches_the_restored_end(
    tmp_path: Path,
) -> None:
    ps = state(tmp_path, restored_end=10)
    ps.journal.apply("t1/terminal", terminal("t1"), 5)
    ps.journal.apply("t2/0", b"raw step", 5)
    request = TurnRequest("t1", "a", {})
    assert ps.is_finished(request)
    assert ps.committed(9) == []
    assert ps.committed(10) == ["t1/terminal"]
    assert not ps.is_finished(request)
    assert list(ps.journal.turns) == ["t2"]  # an unfinished turn stays to be resumed


def test_a_dead_lettered_offset_is_remembered_until_a_commit_passes_it(tmp_path: Path) -> None:
    """The marker a dead letter commits with: restored, it says the record at that offset
    was dead-lettered already; a committed offset past it returns the key to tombstone."""
    ps = state(tmp_path)
    marker = JournalEntry("", -1, "dead_lettered", data={"reason": "bad"}, ts_ms=5)
    ps.journal.restore(
        [
            ConsumedRecord(0, 1, "dead-lettered/4", serde.encode("journal_entry", marker), {}, 5),
            ConsumedRecord(0, 2, "dead-lettered/9", serde.encode("journal_entry", marker), {}, 5),
            ConsumedRecord(0, 3, "dead-lettered/9", None, {}, 6),
        ]
    )
    assert ps.journal.dead_lettered == {4}
    assert ps.committed(4) == []
    assert ps.committed(5) == ["dead-lettered/4"]
    assert ps.journal.dead_lettered == set()
