"""What each feature leaves in a finishing turn's terminal transaction: its ``TurnCloser``.

The kernel (``durable/turn.py``) writes a turn's own closing records and names no
feature; the worker registers these closers on every turn it runs, in the order their
records go: sub-agent replies, signals, the park record, the recorded history, the
thread. ``Closing`` says where each part lands in the transaction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.durable.turn import Closing, TurnCloser
from pyrula_stream.errors import ErrorCode
from pyrula_stream.state.history import history_record
from pyrula_stream.state.threads import closing_writes, offloaded_writes, thread_records
from pyrula_stream.wire.events import RunError
from pyrula_stream.wire.journal_keys import batch_result_key, park_key, reply_key, signal_key
from pyrula_stream.wire.payload_refs import StoredValue
from pyrula_stream.wire.records import ControlRequest
from pyrula_stream.wire.subagents import reply_record


def close_replies(closing: Closing) -> None:
    """Sub-agents: the replies the turn took in are tombstoned; a child answers its
    parent; cancelling a turn cancels the children that have not replied (each ends
    with ``cancelled`` and its late reply is skipped)."""
    turn, terminal = closing.turn, closing.terminal
    closing.keys += [reply_key(turn.turn_id, child) for child in sorted(turn.journal.replies)]
    if turn.request.lineage is not None:
        closing.others.append(
            reply_record(turn.request, terminal, turn.spend.as_dict(), turn.offload)
        )
    if isinstance(terminal, RunError) and terminal.code == ErrorCode.CANCELLED:
        now = int(time.time() * 1000)
        reason = f"parent {turn.turn_id}: {terminal.message}"
        closing.others += [
            ControlRequest(child, "cancel", reason, now).record(topic)
            for child, topic in sorted(turn.children.items())
            if child not in turn.journal.replies
        ]


def close_signals(closing: Closing) -> None:
    """Signals: the signals the turn took in are tombstoned."""
    turn = closing.turn
    closing.keys += [signal_key(turn.turn_id, sid) for sid in sorted(turn.journal.signals)]


def close_batch(closing: Closing) -> None:
    """The batch lane: the outcomes of the turn's batch calls are tombstoned."""
    turn = closing.turn
    closing.keys += [batch_result_key(turn.turn_id, c) for c in sorted(turn.journal.batch_results)]


def close_park(closing: Closing) -> None:
    """Parking: the record of what the turn waited for, if it ever parked, is tombstoned."""
    turn = closing.turn
    if turn.journal.park is not None or turn.parked is not None:
        closing.keys.append(park_key(turn.turn_id))


@dataclass(frozen=True, slots=True)
class HistoryCloser:
    """Recorded turns (``keep_history=True``): the turn's request, steps and outcome."""

    topic: str
    """``<agent>.history``."""

    def __call__(self, closing: Closing, /) -> None:
        turn, terminal = closing.turn, closing.terminal
        closing.state.append(
            history_record(
                self.topic,
                turn.request,
                turn.every_step(),
                {"type": terminal.type, **closing.entry.data, **terminal.data()},
                version=turn.version,
                ts_ms=closing.now_ms,
                max_bytes=turn.max_record_bytes,
                thread=turn.thread,
                offload=turn.offload,
            )
        )


@dataclass(frozen=True, slots=True)
class ThreadCloser:
    """Threads: a completed turn adds its messages to its thread (``turn.thread_writes``
    is what it wrote, applied to the partition's threads once committed)."""

    topic: str
    """``<agent>.threads``."""
    max_turns: int
    """``max_thread_turns``: the newest turns a thread keeps (0: all)."""

    def __call__(self, closing: Closing, /) -> None:
        turn = closing.turn
        turn.thread_writes = []  # set only once its records are built (a failed turn: none)
        # A branch sees its original's thread but never adds to it.
        if turn.thread is None or closing.code is not None or turn.branch is not None:
            return
        writes = closing_writes(
            turn.thread,
            turn.request,
            turn.thread_messages,
            {"status": "completed", "result": closing.terminal.data().get("result")},
            ts_ms=closing.now_ms,
            max_turns=self.max_turns,
            base=turn.thread_base,
        )
        stored: list[StoredValue] = []
        if turn.offload is not None:  # a large tool result among the messages: by reference
            writes, stored = offloaded_writes(writes, turn.offload)
        records = thread_records(
            self.topic, turn.partition, writes, max_bytes=turn.max_record_bytes
        )
        if stored:
            records[0].objects = tuple(stored)
        closing.state += records
        turn.thread_writes = writes


OFFLINE_CLOSERS: tuple[TurnCloser, ...] = (close_replies, close_signals, close_batch, close_park)
"""An offline replay's: it has neither a history nor a threads topic."""


def turn_closers(agent: KafkaAgent) -> tuple[TurnCloser, ...]:
    """The closers of ``agent``'s turns on a worker, in the order their records go."""
    topics = agent.topics
    history: tuple[TurnCloser, ...] = (HistoryCloser(topics.history),) if agent.keep_history else ()
    return (*OFFLINE_CLOSERS, *history, ThreadCloser(topics.threads, agent.max_thread_turns))
