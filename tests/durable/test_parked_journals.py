"""A parked turn's journal waits on disk and comes back as it was, as pure logic: its
steps, progress, park record and replies, raw or decoded, and the request its park record
rebuilds (what the result record echoes included)."""

from __future__ import annotations

from pathlib import Path

from pyrula_stream.durable.journal import IdempotencyKeys, ParkedJournals, PartitionJournal
from pyrula_stream.kafka.table import SqliteView
from pyrula_stream.wire import serde
from pyrula_stream.wire.lineage import Lineage
from pyrula_stream.wire.serde import JournalEntry, TurnRequest
from pyrula_stream.wire.subagents import Park


def step(turn_id: str, index: int, data: dict[str, object]) -> JournalEntry:
    return JournalEntry(turn_id, index, "step", f"s{index}", "h", data, 2, 7)


def test_a_parked_journal_comes_back_from_disk_with_everything_a_resume_reads(
    tmp_path: Path,
) -> None:
    journal = PartitionJournal(0, IdempotencyKeys(SqliteView(tmp_path / "keys.sqlite")))
    request = TurnRequest("t1", "agent", {"q": "where?"}, {"m": 1}, submitted_ms=3)
    # One step arrives raw (as restore keeps it), one decoded (as a live attempt leaves it).
    journal.apply("t1/0", serde.encode("journal_entry", step("t1", 0, {"a": 1})), 1)
    turn = journal.turns["t1"]
    turn.steps[1] = step("t1", 1, {"b": [1, 2]})
    turn.progress = JournalEntry("t1", -1, "progress", data={"attempt": 2, "next_seq": 5})
    turn.park = Park(request, ("child-a", "child-b"), 99).data()
    turn.replies["child-a"] = {"status": "completed", "result": "x"}

    journal.parked.put(turn)
    del journal.turns["t1"]
    assert len(journal.parked) == 1
    assert (tmp_path / "keys.parked.sqlite").exists()  # beside the idempotency keys

    back = journal.parked.take("t1")
    assert back is not None and len(journal.parked) == 0
    assert journal.parked.take("t1") is None
    back.materialize()
    assert back.steps == {0: step("t1", 0, {"a": 1}), 1: step("t1", 1, {"b": [1, 2]})}
    assert back.progress is not None and back.progress.data == {"attempt": 2, "next_seq": 5}
    assert back.attempt == 2 and back.next_seq == 5
    assert back.replies == {"child-a": {"status": "completed", "result": "x"}}
    assert back.park is not None
    park = Park.from_data(back.park)
    assert (park.request, park.children, park.wake_at_ms) == (request, ("child-a", "child-b"), 99)
    journal.parked.close()
    assert not (tmp_path / "keys.parked.sqlite").exists()


def test_a_park_record_rebuilds_the_whole_request_a_resumed_turn_answers_with() -> None:
    request = TurnRequest(
        "t2",
        "agent",
        {"q": 1},
        thread_id="th",
        idempotency_key="k",
        submitted_ms=4,
        lineage=Lineage("root", "parent", "boss", "pyrula", 1, "agent:x#0", 1),
        correlation_id="corr",
        reply_headers=(("x-route", "blue"),),
        record_key="order-7",
    )
    assert Park.from_data(Park(request, wake_at_ms=5).data()).request == request


def test_nothing_is_written_until_a_turn_parks(tmp_path: Path) -> None:
    parked = ParkedJournals(tmp_path / "p.sqlite")
    assert len(parked) == 0 and parked.get("t") is None
    parked.close()
    assert not (tmp_path / "p.sqlite").exists()
