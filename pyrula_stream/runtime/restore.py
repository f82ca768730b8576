"""A partition's state rebuilt from its changelogs when the worker is assigned it.

The journal and the threads table are read to their last stable offset before any turn of
the partition runs; unfinished turns stay in memory and idempotency keys go to a local
SQLite file, so a worker's memory is bounded by its live turns, not by its history.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyrula_stream.durable.idempotency import IdempotencyKeys
from pyrula_stream.durable.journal import PartitionJournal
from pyrula_stream.kafka.offsets import committed_offset, watermarks
from pyrula_stream.kafka.table import PartitionedTable, SqliteView
from pyrula_stream.runtime.partition import PartitionState
from pyrula_stream.state.threads import PartitionThreads


def restore_journal(
    reader: Any, journal_table: PartitionedTable, partition: int, keys_file: Path
) -> PartitionJournal:
    """One journal partition read to its last stable offset: unfinished turns in memory,
    idempotency keys in the SQLite file ``keys_file``."""
    journal = PartitionJournal(partition, IdempotencyKeys(SqliteView(keys_file)))
    journal.restore(journal_table.restore(reader, partition))
    return journal


def restore_partition(
    partition: int,
    *,
    reader: Any,
    group_client: Any,
    turns_topic: str,
    journal_table: PartitionedTable,
    threads_table: PartitionedTable,
    keys_file: Path,
) -> tuple[PartitionState, int]:
    """The partition's state and the number of changelog records read to build it.

    The input partition's end is read after the journal: every turn the journal shows
    finished was read before that, so its request lies below the end.
    """
    journal = restore_journal(reader, journal_table, partition, keys_file)
    threads = PartitionThreads()
    records = journal.records_read + threads.restore(threads_table.restore(reader, partition))
    _, end = watermarks(reader, turns_topic, partition)
    committed = committed_offset(group_client, turns_topic, partition)
    state = PartitionState(
        partition, journal, restored_end=end, restored_committed=committed, threads=threads
    )
    return state, records
