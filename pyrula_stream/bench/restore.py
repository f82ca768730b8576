"""Restore: how fast a fresh worker rebuilds a partition whose journal holds N live entries.

The journal is filled directly with a producer, in the journal's wire format (Avro
``JournalEntry`` values keyed ``turn_id/step``, the content-type header), as unfinished
turns of ten ``ctx.step`` entries each: nothing is tombstoned, so every record is live.
Two figures per size: ``restore_journal`` alone (read to the last stable
offset under ``read_committed``, decode, fold into turns), timed with its consumer
already connected, median of ``repeats``; and a whole takeover, from starting a fresh
worker to its owning the partition (topic check, ``init_transactions``, group join,
restore).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyrula_stream.bench.harness import (
    agent_topics,
    create_topics,
    drop_topics,
    in_process_worker,
    unique,
)
from pyrula_stream.bench.load import Record, Submitter
from pyrula_stream.bench.stats import median
from pyrula_stream.bench.workload import STEP_TEXT, steps_agent
from pyrula_stream.kafka.consumers import reader_consumer
from pyrula_stream.kafka.table import PartitionedTable
from pyrula_stream.runtime.restore import restore_journal
from pyrula_stream.wire import serde
from pyrula_stream.wire.fingerprint import fingerprint
from pyrula_stream.wire.records import content_type_header
from pyrula_stream.wire.serde import JournalEntry

STEPS_PER_TURN = 10


def journal_entries(n: int) -> list[Record]:
    """``n`` live step entries of unfinished turns, encoded as the worker writes them."""
    now = int(time.time() * 1000)
    out: list[Record] = []
    for j in range(n):
        turn_id, step = f"restore{j // STEPS_PER_TURN:08d}", j % STEPS_PER_TURN
        entry = JournalEntry(
            turn_id,
            step,
            "step",
            f"step{step}",
            fingerprint([[step], {}]),
            {"value": {"i": step, "text": STEP_TEXT}},
            1,
            now,
        )
        value = serde.encode("journal_entry", entry)
        out.append((entry.key.encode(), value, [content_type_header("journal_entry")]))
    return out


def _time_restore(bootstrap: str, journal_topic: str) -> tuple[float, int]:
    reader = reader_consumer(bootstrap, client_id=unique("bench-restore"))
    try:
        with tempfile.TemporaryDirectory(prefix="bench-restore-") as state_dir:
            started = time.perf_counter()
            journal = restore_journal(
                reader, PartitionedTable(journal_topic), 0, Path(state_dir) / "keys.sqlite"
            )
            seconds = time.perf_counter() - started
            journal.idempotency.close()
            return seconds, journal.records_read
    finally:
        reader.close()


async def restore_one(
    bootstrap: str, size: int, *, repeats: int, keep_topics: bool = False
) -> dict[str, Any]:
    agent = steps_agent(unique("rst"))
    try:
        await asyncio.to_thread(create_topics, bootstrap, agent.topic_specs())
        entries = journal_entries(size)
        submitter = Submitter(bootstrap)
        try:
            await asyncio.to_thread(submitter.send_all, agent.topics.journal, entries)
        finally:
            submitter.close()
        del entries
        timings = []
        for _ in range(repeats):
            seconds, records = await asyncio.to_thread(
                _time_restore, bootstrap, agent.topics.journal
            )
            if records != size:
                raise RuntimeError(f"restore read {records} journal records, wrote {size}")
            timings.append(seconds)
        started = time.monotonic()
        async with in_process_worker(agent, bootstrap, create=False) as fresh:
            takeover_s = time.monotonic() - started
            taken_over = fresh.restored_records
        restore_s = median(timings)
        return {
            "live_entries": size,
            "restore_s": round(restore_s, 3),
            "records_per_s": round(size / restore_s),
            "runs_s": [round(t, 3) for t in timings],
            "takeover_s": round(takeover_s, 3),
            "takeover_restored_records": taken_over,
        }
    finally:
        if not keep_topics:
            await asyncio.to_thread(drop_topics, bootstrap, agent_topics(agent))


async def run_restore(
    bootstrap: str, *, sizes: Sequence[int], repeats: int = 3, keep_topics: bool = False
) -> list[dict[str, Any]]:
    """One fresh journal per size; see the module docstring for what is timed."""
    return [
        await restore_one(bootstrap, size, repeats=repeats, keep_topics=keep_topics)
        for size in sizes
    ]
