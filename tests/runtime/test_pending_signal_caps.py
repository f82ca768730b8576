"""The pending-signal caps hold for a turn read but not started yet (issue 46): the hostile
chaos run saw such turns hold 400 flood signals, because a turn waiting for a slot has no
journal until its first signal commits, and signals decided before that were not counted.
"""

from __future__ import annotations

from pathlib import Path

from pyrula_stream.durable.journal import IdempotencyKeys, PartitionJournal
from pyrula_stream.kafka.table import SqliteView
from pyrula_stream.runtime.parking import ParkedTurns
from pyrula_stream.runtime.partition import PartitionState
from pyrula_stream.wire.caps import MAX_PENDING_SIGNALS
from pyrula_stream.wire.signals import Signal


def test_signals_for_a_queued_turn_count_toward_the_cap_before_any_commit(
    tmp_path: Path,
) -> None:
    journal = PartitionJournal(0, IdempotencyKeys(SqliteView(tmp_path / "keys.sqlite")))
    ps = PartitionState(0, journal)
    ps.queued_ids.add("waiting")  # read, every slot taken: no journal yet
    parked = ParkedTurns(
        {0: ps}, admit=lambda p, q: None, cancelled=lambda t: False, running=lambda t: None
    )
    flood = [
        Signal("note", n, 1, "mallory", f"flood-{n}", "waiting")
        for n in range(MAX_PENDING_SIGNALS + 3)
    ]
    # One batch, decided before any of it commits (signal_committed never ran).
    refusals = [parked._signal_refusal(ps, s) for s in flood]
    assert refusals[:MAX_PENDING_SIGNALS] == [None] * MAX_PENDING_SIGNALS
    assert all(r is not None and r.startswith("too_many") for r in refusals[MAX_PENDING_SIGNALS:])
