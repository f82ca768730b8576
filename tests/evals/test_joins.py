"""The joins of one outcomes partition, restored at a takeover: what was decided before
the group's committed offset stays decided (tombstones included, wherever they stand),
what comes after is left for the group to read again."""

from __future__ import annotations

from pyrula_stream.evals.stream.joins import Joins
from pyrula_stream.evals.stream.state import Early, Wait, record
from pyrula_stream.kafka.offsets import ConsumedRecord


def _wait(turn: str, key: str, deadline: int, earliest: int = 0) -> Wait:
    return Wait("delivered", "1", key, {"turn_id": turn}, deadline, deadline + 100, earliest)


def _early(key: str, ts: int, offset: int) -> Early:
    event = {"key": key, "value": None, "ts_ms": ts, "topic": "o", "partition": 0, "offset": offset}
    return Early("delivered", key, event, ts + 1000)


def _rec(offset: int, item: Wait | Early | None, key: str = "") -> ConsumedRecord:
    if item is None:
        return ConsumedRecord(0, offset, key, None, {}, 0)
    out = record("t", item, 1)
    return ConsumedRecord(0, offset, out.key.decode(), out.value, {}, 0)


def test_restore_keeps_what_was_decided_and_leaves_the_rest_to_read_again() -> None:
    decided = _wait("t1", "o1", 5_000)
    waiting = _wait("t2", "o2", 5_000)
    kept = _early("o3", 1_000, 7)
    unread = _wait("t4", "o4", 5_000)
    records = [
        _rec(0, decided),
        _rec(1, waiting),
        _rec(2, kept),
        _rec(3, unread),  # at the committed offset: not read yet
        _rec(4, None, decided.key),  # the tombstone its join wrote, after the offset
    ]
    joins = Joins.restore(records, committed=3)
    assert set(joins.waits) == {waiting.key}
    assert set(joins.events) == {kept.key}
    # read again by the group: the unread wait joins nothing and waits; the kept wait
    # seen a second time changes nothing
    assert joins.arrive(unread) == []
    assert joins.arrive(waiting) == []
    assert set(joins.waits) == {waiting.key, unread.key}


def test_an_event_joins_only_waits_whose_window_it_meets() -> None:
    joins = Joins()
    assert joins.arrive(_wait("early", "o1", 1_000)) == []
    assert joins.arrive(_wait("late", "o1", 3_000)) == []
    joined = joins.arrive(_early("o1", 2_000, 1))
    assert [j.wait.turn["turn_id"] for j in joined] == ["late"]
    waits, events = joins.due(1_100)
    assert [w.turn["turn_id"] for w in waits] == ["early"] and events == []
    # an event stamped before the turn's window opened is not the turn's
    assert joins.arrive(_wait("much later", "o1", 9_000, earliest=2_500)) == []
    joins.forget(_wait("much later", "o1", 9_000, earliest=2_500).key)
    # the event stays for a second turn naming the same key, until it expires
    assert [j.wait.turn["turn_id"] for j in joins.arrive(_wait("again", "o1", 4_000))] == ["again"]
    assert joins.due(3_000) == ([], [_early("o1", 2_000, 1)])
