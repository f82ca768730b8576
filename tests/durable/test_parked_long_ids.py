"""A journal key past 65,535 bytes must not break the parked-turn store.

Issue 46: the store packed each journal key suffix with a 16-bit length, so a signal
journaled with a 70,000-character id raised ``struct.error`` each time the partition was
assigned (re-arming its parked turn), and the group kept rebalancing. Intake now refuses
such ids (``MAX_SIGNAL_ID_CHARS``), but a journal written before the cap still holds them.
"""

from __future__ import annotations

from pathlib import Path

from pyrula_stream.durable.journal import IdempotencyKeys, PartitionJournal
from pyrula_stream.kafka.table import SqliteView
from pyrula_stream.wire.serde import TurnRequest
from pyrula_stream.wire.signals import Signal, signal_journal_record
from pyrula_stream.wire.subagents import Park


def test_a_parked_turn_with_a_70000_character_signal_id_is_stored_and_read_back(
    tmp_path: Path,
) -> None:
    journal = PartitionJournal(0, IdempotencyKeys(SqliteView(tmp_path / "keys.sqlite")))
    request = TurnRequest("t1", "agent", {"q": "wait"})
    long_id = "s" * 70_000
    signal = Signal("approve", {"ok": True}, 1, "alice", long_id, "t1", False, 5)
    for record in (
        Park(request, (), None, ("approve",)).record("j", 0, 1),
        signal_journal_record("j", 0, signal),
    ):
        assert record.key is not None and record.value is not None
        journal.apply(record.key.decode(), record.value, 1)
    turn = journal.turns["t1"]
    assert set(turn.signals) == {long_id}

    journal.parked.put(turn)  # what re-arming a parked turn at assignment does
    back = journal.parked.take("t1")
    assert back is not None
    assert back.signals == {long_id: signal.data()}
    assert back.park == turn.park
    journal.parked.close()


def test_a_signal_for_a_parked_turn_is_one_more_row(tmp_path: Path) -> None:
    """Parked signals are rows: a flood of signals adds rows, never rewrites the turn's
    journal (each signal once rewrote the whole parked blob)."""
    journal = PartitionJournal(0, IdempotencyKeys(SqliteView(tmp_path / "keys.sqlite")))
    request = TurnRequest("t1", "agent", {"q": "wait"})
    record = Park(request, (), None, ("go",)).record("j", 0, 1)
    assert record.key is not None and record.value is not None
    journal.apply(record.key.decode(), record.value, 1)
    journal.parked.put(journal.turns.pop("t1"))
    signals = [Signal("note", n, 1, "alice", f"s{n}", "t1", False, n) for n in range(3)]
    for signal in signals:
        assert journal.parked.add_signal("t1", signal.signal_id, signal.data())
    assert not journal.parked.add_signal("t2", "s", signals[0].data())  # not parked here
    assert len(journal.parked) == 1
    back = journal.parked.take("t1")
    assert back is not None and back.park is not None
    assert back.signals == {s.signal_id: s.data() for s in signals}
    assert len(journal.parked) == 0
    journal.parked.close()
