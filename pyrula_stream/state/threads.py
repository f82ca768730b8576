"""Threads: the earlier turns of a conversation, kept in ``<agent>.threads``.

The topic is compacted and co-partitioned with the turns topic: a thread's records live
in the partition of its turns (the turns are keyed by thread id), so the worker that owns
turns partition p restores partition p of the threads when p is assigned. Each finished
turn adds one record keyed ``<thread_id>/<n>`` holding only the messages that turn added
(deltas: thread bytes grow linearly with turns), plus the thread's head record
``<thread_id>/head`` (the next turn number). The records ride the transaction of the
turn's terminal event, so a thread never holds half a turn and never misses a completed
one; a turn that ends in ``run:error`` adds nothing.

A delete is a turn request too (``THREAD_DELETE`` in its metadata): it runs in order with
the thread's other turns on the partition's owner and tombstones every record, so a turn
queued after it starts empty.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pyrula_stream.errors import MalformedRecordError, PayloadTooLarge
from pyrula_stream.kafka.offsets import ConsumedRecord
from pyrula_stream.wire import guard
from pyrula_stream.wire.payload_refs import Offload, StoredValue
from pyrula_stream.wire.records import JSON_CONTENT_TYPE, OutRecord
from pyrula_stream.wire.serde import TurnRequest

log = logging.getLogger(__name__)

__all__ = [
    "THREAD_DELETE",
    "PartitionThreads",
    "ThreadHandle",
    "ThreadTurn",
    "decode_thread",
    "is_thread_delete",
    "thread_records",
]

HEAD = "head"
THREAD_DELETE = "pyrula.thread.delete"
"""Metadata flag of a turn request that deletes its thread instead of running the body."""


def is_thread_delete(request: TurnRequest) -> bool:
    return bool(request.thread_id) and bool(request.metadata.get(THREAD_DELETE))


def turn_key(thread_id: str, n: int) -> str:
    return f"{thread_id}/{n}"


def head_key(thread_id: str) -> str:
    return f"{thread_id}/{HEAD}"


def split_key(key: str) -> tuple[str, str]:
    """``(thread_id, "head" or turn number)``; thread ids may themselves contain ``/``."""
    thread_id, sep, tail = key.rpartition("/")
    if not sep or not thread_id:
        raise MalformedRecordError(f"thread record key {key!r} is not '<thread_id>/<n>'")
    return thread_id, tail


@dataclass(frozen=True, slots=True)
class ThreadTurn:
    """One finished turn of a thread: the messages it added and how it ended."""

    n: int
    turn_id: str
    messages: list[dict[str, Any]]
    outcome: dict[str, Any]
    ts_ms: int
    base: list[dict[str, Any]] | None = None
    """A compaction: the messages that replace every earlier turn (a summary)."""

    def to_json(self) -> dict[str, Any]:
        out = {
            "n": self.n,
            "turn_id": self.turn_id,
            "messages": self.messages,
            "outcome": self.outcome,
            "ts_ms": self.ts_ms,
        }
        if self.base is not None:
            out["base"] = self.base
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ThreadTurn:
        """A thread turn from its JSON object; a missing or mistyped field is malformed."""
        what = "thread turn"
        if not isinstance(raw, Mapping):
            raise MalformedRecordError(f"{what} must be a JSON object")
        n, turn_id, messages = raw.get("n"), raw.get("turn_id"), raw.get("messages")
        if isinstance(n, bool) or not isinstance(n, int):
            raise MalformedRecordError(f"{what}: field 'n' must be an integer")
        if not isinstance(turn_id, str):
            raise MalformedRecordError(f"{what}: field 'turn_id' must be text")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise MalformedRecordError(f"{what}: field 'messages' must be a list of objects")
        base = raw.get("base")
        if base is not None and not (
            isinstance(base, list) and all(isinstance(m, dict) for m in base)
        ):
            raise MalformedRecordError(f"{what}: field 'base' must be a list of objects")
        return cls(
            n,
            turn_id,
            list(messages),
            guard.dict_field(dict(raw), "outcome", what),
            guard.int_field(dict(raw), "ts_ms", what),
            base,
        )


@dataclass(frozen=True, slots=True)
class ThreadHandle:
    """``ctx.thread``: the thread id and its earlier turns, oldest first."""

    thread_id: str
    turns: tuple[ThreadTurn, ...] = ()
    next_turn: int = 1
    """The number the running turn gets when it completes."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """What ``ctx.llm`` puts before the body's messages: every earlier turn's messages
        in order, from the newest compaction (its summary, then its turn) on."""
        start = max((i for i, t in enumerate(self.turns) if t.base is not None), default=0)
        base = self.turns[start].base if self.turns else None
        return [*(base or []), *(m for t in self.turns[start:] for m in t.messages)]


@dataclass
class PartitionThreads:
    """The threads of one partition, restored from ``<agent>.threads``; updated only after
    a turn's terminal transaction committed.

    A turn record is kept as the bytes it came in and decoded when its thread next runs a
    turn (then kept decoded): a takeover reads every thread of the partition, most of
    which will not run again soon, and the bytes are smaller than the decoded messages.
    One that turns out unreadable then is dropped with a warning and counted in
    ``skipped_records``, as an unreadable record is at restore.
    """

    turns: dict[str, dict[int, ThreadTurn | bytes]] = field(default_factory=dict)
    heads: dict[str, int] = field(default_factory=dict)

    skipped_records: int = 0
    decoded_records: int = 0
    """Turn records decoded so far: how many threads' turns were read, not just held."""

    def restore(self, records: Iterable[ConsumedRecord]) -> int:
        """Fold a partition's records in; returns how many were read. A record that
        cannot be read is skipped with a warning and counted in ``skipped_records``."""
        count = 0
        for record in records:
            count += 1
            try:
                self.apply(record.key or "", record.value)
            except MalformedRecordError as exc:
                self.skipped_records += 1
                log.warning(
                    "skipping unreadable thread record %r (partition %d @%d): %s",
                    record.key,
                    record.partition,
                    record.offset,
                    exc,
                )
        return count

    def apply(self, key: str, value: bytes | None) -> None:
        """Fold one record (``None``: a tombstone); ``MalformedRecordError`` if unreadable."""
        with guard.guarded(f"thread record {key!r:.100}"):
            self._apply(key, value)

    def _apply(self, key: str, value: bytes | None) -> None:
        thread_id, tail = split_key(key)
        if tail == HEAD:
            if value is None:
                self.heads.pop(thread_id, None)
                self.turns.pop(thread_id, None)
            else:
                head = guard.loads_object(value, "thread head")
                self.heads[thread_id] = guard.int_field(head, "next", "thread head", 1)
            return
        if not tail.isdigit():
            raise MalformedRecordError(f"thread record key {key!r:.100} has no turn number")
        n = int(tail)
        if value is None:
            self.turns.get(thread_id, {}).pop(n, None)
        else:
            self.turns.setdefault(thread_id, {})[n] = bytes(value)  # decoded on first use

    def handle(self, thread_id: str) -> ThreadHandle:
        """The thread as its next turn sees it; its records not yet read are decoded now."""
        turns = self.turns.get(thread_id, {})
        ordered: list[ThreadTurn] = []
        for n in sorted(turns):
            turn = turns[n]
            if isinstance(turn, bytes):
                decoded = self._decode(thread_id, n, turn)
                if decoded is None:
                    del turns[n]
                    continue
                turns[n] = turn = decoded
            ordered.append(turn)
        return ThreadHandle(thread_id, tuple(ordered), self.heads.get(thread_id, 1))

    def _decode(self, thread_id: str, n: int, value: bytes) -> ThreadTurn | None:
        key = turn_key(thread_id, n)
        try:
            with guard.guarded(f"thread record {key!r:.100}"):
                turn = ThreadTurn.from_json(guard.loads_object(value, "thread turn"))
        except MalformedRecordError as exc:
            self.skipped_records += 1
            log.warning("skipping unreadable thread record %r: %s", key, exc)
            return None
        self.decoded_records += 1
        return turn

    @property
    def live_threads(self) -> int:
        return len(self.heads)


def closing_writes(
    handle: ThreadHandle,
    request: TurnRequest,
    messages: list[dict[str, Any]],
    outcome: dict[str, Any],
    *,
    ts_ms: int,
    max_turns: int,
    base: list[dict[str, Any]] | None = None,
) -> list[tuple[str, bytes | None]]:
    """The thread writes of a completed turn (or of a delete), as ``(key, value)``."""
    tid = handle.thread_id
    if is_thread_delete(request):
        deletes: list[tuple[str, bytes | None]] = [(turn_key(tid, t.n), None) for t in handle.turns]
        return [*deletes, (head_key(tid), None)]
    turn = ThreadTurn(handle.next_turn, request.turn_id, messages, outcome, ts_ms, base)
    writes: list[tuple[str, bytes | None]] = [
        (turn_key(tid, turn.n), json.dumps(turn.to_json()).encode()),
        (head_key(tid), json.dumps({"thread_id": tid, "next": turn.n + 1}).encode()),
    ]
    if base is not None:  # the summary replaces every earlier turn
        writes += [(turn_key(tid, t.n), None) for t in handle.turns]
    elif max_turns > 0:  # keep the newest max_turns turns, this one included
        writes += [(turn_key(tid, t.n), None) for t in handle.turns if t.n <= turn.n - max_turns]
    return writes


def offloaded_writes(
    writes: list[tuple[str, bytes | None]], offload: Offload
) -> tuple[list[tuple[str, bytes | None]], list[StoredValue]]:
    """``writes`` with each value past the offload threshold holding its big parts (a
    large tool result among a turn's messages) by reference, and the values to store."""
    out: list[tuple[str, bytes | None]] = []
    stored: list[StoredValue] = []
    for key, value in writes:
        if value is not None and len(value) > offload.threshold:
            smaller, values = offload.apply(json.loads(value), f"thread record {key!r}", value)
            value, stored = json.dumps(smaller).encode(), stored + values
        out.append((key, value))
    return out, stored


async def resolved_thread(
    handle: ThreadHandle, resolve: Callable[[Any], Awaitable[Any]]
) -> ThreadHandle:
    """``handle`` with the values its turns hold by reference read back (``resolve``: a
    resolver's ``resolve_async``); the same handle when there are none."""
    turns = []
    changed = False
    for turn in handle.turns:
        raw = turn.to_json()
        whole = await resolve(raw)
        changed = changed or whole is not raw
        turns.append(ThreadTurn.from_json(whole) if whole is not raw else turn)
    return replace(handle, turns=tuple(turns)) if changed else handle


def thread_records(
    topic: str, partition: int, writes: list[tuple[str, bytes | None]], *, max_bytes: int
) -> list[OutRecord]:
    """The writes as records of the thread's partition (never placed by key hash).

    ``PayloadTooLarge`` past ``max_bytes``: the turn then ends in ``run:error`` and its
    thread is left as it was, rather than a terminal transaction the broker refuses.
    """
    out = [OutRecord(topic, k.encode(), v, [JSON_CONTENT_TYPE], partition) for k, v in writes]
    for rec in out:
        if rec.size > max_bytes:
            raise PayloadTooLarge(
                f"turn record {rec.key.decode()!r} for {topic} would be {rec.size} bytes, over "
                f"the {max_bytes}-byte limit (max_record_bytes); keep tool results and the "
                "answer smaller, or compact the history (AgentLimits.compaction_fraction)"
            )
    return out


def decode_thread(thread_id: str, records: Iterable[tuple[str, bytes | None]]) -> ThreadHandle:
    """A thread as ``client.get_thread`` shows it, from its partition's records in order."""
    state = PartitionThreads()
    for key, value in records:
        try:
            owner, _ = split_key(key)
        except MalformedRecordError:
            continue
        if owner == thread_id:
            state.apply(key, value)
    return state.handle(thread_id)
