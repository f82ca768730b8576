"""The read positions of the replies, signals and answers topics: each is journaled with
what was taken from its topic and restored on its own, so a worker that takes a
partition over reads each topic from where the last owner's commits left it."""

from __future__ import annotations

from pathlib import Path

from pyrula_stream.durable.journal import IdempotencyKeys, PartitionJournal
from pyrula_stream.kafka.table import SqliteView
from pyrula_stream.wire.subagents import cursor_record


def test_each_followed_topic_restores_its_own_position(tmp_path: Path) -> None:
    journal = PartitionJournal(0, IdempotencyKeys(SqliteView(tmp_path / "keys.sqlite")))
    written = [
        cursor_record("j", 0, 5),  # the replies topic, as before the split
        cursor_record("j", 0, 2, "signals"),
        cursor_record("j", 0, 9, "answers"),
        cursor_record("j", 0, 3, "signals"),
    ]
    for record in written:
        journal.apply(record.key.decode(), record.value, 1)
    assert written[0].key == b"cursor/replies", "the key older journals hold"
    assert journal.cursors == {"replies": 5, "signals": 3, "answers": 9}
    journal.apply("cursor/answers", None, 2)  # a tombstone: read that topic from its start
    assert journal.cursors == {"replies": 5, "signals": 3}
