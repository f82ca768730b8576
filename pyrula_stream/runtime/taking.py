"""What a parked or running turn takes from the replies, signals and answers topics,
and the dead letter of what it refuses.

These are the decisions alone, on a turn's journal: which followed topic a record came
from, whether a reply answers a call the parent made, whether a signal fits the pending
caps or came on a topic allowed to carry it. ``parking`` applies them, in order, per
partition; keeping them apart keeps each rule testable on a journal, without a worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.durable.journal import TurnJournal
from pyrula_stream.durable.turn import TurnRuntime
from pyrula_stream.errors import ErrorCode
from pyrula_stream.kafka.offsets import ConsumedRecord
from pyrula_stream.wire.caps import MAX_PENDING_SIGNAL_BYTES, MAX_PENDING_SIGNALS
from pyrula_stream.wire.fitting import fits
from pyrula_stream.wire.records import OutRecord, dead_letter
from pyrula_stream.wire.signals import Signal, is_signal
from pyrula_stream.wire.subagents import CALL_KIND, Reply, reply_journal_record

log = logging.getLogger(__name__)


def calls_made(journal: TurnJournal) -> dict[str, str]:
    """The child turns a turn's journal says it called: child turn id -> agent name."""
    journal.materialize()  # a restored turn keeps its steps raw until first needed
    return {
        str(entry.data.get("child_turn_id")): str(entry.data.get("agent"))
        for entry in journal.steps.values()
        if entry.kind == CALL_KIND and isinstance(entry.data, dict)
    }


def refusal(journal: TurnJournal | None, finished: bool, reply: Reply) -> str | None:
    """Why ``reply`` must not be taken by its parent (``None``: take it)."""
    parent = reply.parent_turn_id
    if journal is None or journal.terminal_ms is not None or finished:
        return f"turn {parent} is not waiting on this partition (unknown here, or ended)"
    called = calls_made(journal).get(reply.child_turn_id)
    if called is None or called != reply.agent:
        return (
            f"turn {parent} made no call to agent {reply.agent!r} with child turn "
            f"{reply.child_turn_id}"
        )
    if reply.child_turn_id in journal.replies:
        return f"child turn {reply.child_turn_id} of turn {parent} was already answered"
    return None


def call_committing(runtime: TurnRuntime | None, reply: Reply) -> asyncio.Future[None] | None:
    """The commit of the call ``reply`` answers when the running parent wrote that call
    and has not recorded its outcome yet (``None``: nothing to wait for, the journal
    alone decides). The future may be done already with the step's confirmation still
    scheduled: waiting on it then lets that run first."""
    if runtime is None:
        return None
    for entry, commit in runtime.committing_steps():
        data = entry.data
        if (
            entry.kind == CALL_KIND
            and isinstance(data, dict)
            and data.get("child_turn_id") == reply.child_turn_id
        ):
            return commit
    return None


def too_large_reply(
    topics: AgentTopics, partition: int, taken: Reply | Signal | None, why: str, room: int
) -> tuple[Reply | None, OutRecord | None]:
    """A failed reply and its journal copy in place of a reply too large to write, so that
    its parent ends that call with an error instead of waiting; none for a signal (it is
    refused) and for a reply whose ids alone are too large."""
    if not isinstance(taken, Reply):
        return None, None
    failed = Reply(
        taken.parent_turn_id,
        taken.child_turn_id,
        taken.agent,
        "failed",
        code=ErrorCode.STREAM_TOO_LARGE,
        message=f"the reply of {taken.agent} was refused: {why}",
        usage=taken.usage,
    )
    copy = reply_journal_record(topics.journal, partition, failed)
    if not fits(copy.key, copy.value, copy.headers, room):
        return None, None
    return failed, copy


def refusal_letter(
    record: ConsumedRecord,
    topics: AgentTopics,
    worker_id: str,
    why: str,
    room: int,
    code: ErrorCode | None = None,
) -> OutRecord:
    """The dead letter of a refused reply or signal: the reason its sender reads."""
    signal = is_signal(record.headers)
    what, refused = (
        ("signal", ErrorCode.SIGNAL_REFUSED) if signal else ("reply", ErrorCode.UNSOLICITED_REPLY)
    )
    code = refused if code is None else code
    source = f"{record.topic or topics.replies}[{record.partition}]@{record.offset}"
    log.warning("refused the %s at %s: %s", what, source, why)
    return dead_letter(
        topics.dlq,
        f"{what} refused: {why}",
        code,
        worker=worker_id,
        key=record.key.encode(),
        value=record.value,
        headers=[(k, v.encode()) for k, v in record.headers.items()],
        max_bytes=room,
        source=source,
    )


def signal_size(signal: Signal) -> int:
    """What one pending signal counts toward ``MAX_PENDING_SIGNAL_BYTES``."""
    return len(json.dumps(signal.data(), default=str))


def pending_over_cap(
    journal: TurnJournal, signal: Signal, taking: Mapping[str, int] | None = None
) -> str | None:
    """Why ``signal`` would hold its turn past ``MAX_PENDING_SIGNALS`` or
    ``MAX_PENDING_SIGNAL_BYTES`` of signals no wait has taken (``None``: it fits), with
    ``taking`` (signals taken whose commit is not confirmed: id -> size). An answer, or a
    signal the parked turn waits for, is taken at once: never refused here, so a flood
    cannot keep a reviewer's answer out."""
    waited = (journal.park or {}).get("signals") or ()
    if signal.answer or (isinstance(waited, list | tuple) and signal.name in waited):
        return None
    taken = journal.taken_signals()
    pending = [s for sid, s in journal.signals.items() if sid not in taken]
    count = len(pending) + len(taking or {})
    if count >= MAX_PENDING_SIGNALS:
        return (
            f"too_many: turn {signal.turn_id} holds {count} signals no wait has "
            f"taken, the cap (MAX_PENDING_SIGNALS)"
        )
    size = sum(len(json.dumps(s, default=str)) for s in pending)
    size += sum((taking or {}).values()) + signal_size(signal)
    if size > MAX_PENDING_SIGNAL_BYTES:
        return (
            f"too_many: turn {signal.turn_id} would hold {size} bytes of signals no wait "
            f"has taken, over the cap of {MAX_PENDING_SIGNAL_BYTES} (MAX_PENDING_SIGNAL_BYTES)"
        )
    return None


def topic_kind(record: ConsumedRecord, topics: AgentTopics) -> str:
    """Which followed topic the record came from: ``replies``, ``signals`` or ``answers``
    (a record without a topic is the replies topic's, as before the split)."""
    if record.topic == topics.answers:
        return "answers"
    if record.topic == topics.signals:
        return "signals"
    return "replies"


def misplaced_signal(signal: Signal, kind: str, topics: AgentTopics) -> str | None:
    """Why a signal is refused for the topic it came on (``None``: its topic may carry
    it). Only reviewers write the answers topic, so an answer is taken from there alone:
    on the signals topic (clients) or the replies topic (the workers of called agents,
    and clients before the split) it is refused, whoever wrote it. A plain signal is
    taken from any of the three (it answers nothing)."""
    if signal.answer and kind != "answers":
        return (
            f"wrong_topic: an answer to {signal.name} is taken only from {topics.answers} "
            f"(reviewers), not from {kind}"
        )
    return None


def pending_names(journal: TurnJournal) -> set[str]:
    """The names of the turn's journaled signals that no wait took yet."""
    taken = journal.taken_signals()
    return {str(s.get("name")) for sid, s in journal.signals.items() if sid not in taken}
