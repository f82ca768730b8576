"""A memory-writing agent whose worker can be stopped inside the transaction of its put,
for the test that SIGKILLs a worker between a ``ctx.memory.put`` and its commit.

Blocking the agent body cannot hold that commit: a put's step commits in the background
(group commit) while the body goes on. So, when ``$UNCOMMITTED_PUT_DIR`` is set, this
module holds the worker's transactional write itself: once the records of a transaction
that journals a ``ctx.memory.put`` have been handed to the producer (the transaction is
open, its records on their way to the log), the write creates
``$UNCOMMITTED_PUT_DIR/in-transaction`` and never returns, so the commit is never called
and the test kills the process there. The producer, the transaction, the broker and the
abort by the next producer with the same transactional id are all the real ones.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyrula_stream import AgentContext, kafka_agent
from pyrula_stream.kafka.transactions import BatchWriter
from pyrula_stream.llm import FakeLLM, reply_text
from pyrula_stream.wire import serde
from pyrula_stream.wire.records import OutRecord


def journals_a_put(record: OutRecord) -> bool:
    if not record.topic.endswith(".journal") or record.value is None:
        return False
    entry = serde.decode_journal_entry(record.value, serde.headers_dict(record.headers))
    return entry.kind == "memory" and entry.name == "put"


def hold_put_transactions(marker: Path) -> None:
    """Make every transaction that journals a put stop between its records and its commit."""
    produce_all = BatchWriter._produce_all

    def produce_then_hold(self: BatchWriter, records: Sequence[OutRecord]) -> None:
        produce_all(self, records)
        if self.exactly_once and any(journals_a_put(r) for r in records):
            marker.touch()
            threading.Event().wait()  # until SIGKILL: this transaction is never committed

    BatchWriter._produce_all = produce_then_hold  # type: ignore[method-assign]


if os.environ.get("UNCOMMITTED_PUT_DIR"):
    hold_put_transactions(Path(os.environ["UNCOMMITTED_PUT_DIR"]) / "in-transaction")


def _nothing() -> int:
    return 0


@kafka_agent(
    name=os.environ.get("UNCOMMITTED_PUT_AGENT_NAME", "uncommitted-put"),
    llm=FakeLLM([reply_text("unused")]),
    partitions=1,
)
async def uncommitted_put(ctx: AgentContext, ns: str) -> Any:
    """Writes one item (stamped with the worker process that wrote it) and reads it back."""
    await ctx.memory.put(("tests", ns), "k", {"v": 1, "pid": os.getpid()})
    # A step waits for what the turn journaled before it: the put's entry commits in a
    # transaction of its own (at the turn's end it would meet its tombstone, and a step
    # whose entry and tombstone share a commit is not written at all).
    await ctx.step("after-put", _nothing)
    item = await ctx.memory.get(("tests", ns), "k")
    return None if item is None else item.value
