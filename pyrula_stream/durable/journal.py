"""What a turn has already done: its journaled steps, progress and terminal record.

On replay the agent body runs again from the top and each durable call asks the journal
for the entry at its step index. A recorded entry whose input fingerprint differs from the
call's input fails the turn with ``replay_input_changed``, naming the step and what changed.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyrula_stream.durable.idempotency import IdempotencyKeys
from pyrula_stream.errors import MalformedRecordError, ReplayInputChanged
from pyrula_stream.kafka.offsets import ConsumedRecord
from pyrula_stream.wire.batches import BATCH_RESULT_KIND, BatchRecord, is_batch_key
from pyrula_stream.wire.fingerprint import RunningFingerprint, fingerprint
from pyrula_stream.wire.guard import bad_record_reason
from pyrula_stream.wire.journal_keys import (
    BATCH_PREFIX,
    BATCH_RESULT,
    CURSOR_KEYS,
    DEAD_LETTERED_PREFIX,
    IDEMPOTENCY_PREFIX,
    INTAKE_MARK_KEY,
    PARK,
    PROGRESS,
    REPLY,
    SIGNAL,
    TAKE_SIGNAL_KIND,
    TERMINAL,
    journal_key,
    parse_journal_key,
)
from pyrula_stream.wire.serde import JournalEntry, decode_journal_entry, encode

log = logging.getLogger(__name__)


def model_call_fingerprint(
    messages: list[dict[str, Any]],
    system: str | None,
    tools: list[dict[str, Any]] | str,
    output: dict[str, Any] | None = None,
    *,
    running: RunningFingerprint | None = None,
) -> str:
    """``system.tools.messages.count[.output]``: each part hashed alone so a mismatch can be
    named; the output part (name and schema) only when one goes to the provider natively.
    ``tools``: the offered tools, or their part already hashed (``tools_fingerprint``).
    ``running``: the tool loop's hash of its growing conversation (the same part, each
    message encoded once instead of on every call)."""
    messages_part = fingerprint(messages) if running is None else running.of(messages)
    tools_part = tools if isinstance(tools, str) else fingerprint(tools)
    parts = [_system_fingerprint(system or ""), tools_part, messages_part]
    parts.append(str(len(messages)))
    if output is not None:
        parts.append(fingerprint(output))
    return ".".join(parts)


@functools.lru_cache(maxsize=64)
def _system_fingerprint(system: str) -> str:
    """An agent's system prompt is the same for most of its calls: hashed once."""
    return fingerprint(system)


_TOOLS_HASHED: dict[tuple[int, ...], tuple[tuple[Any, ...], str]] = {}
"""Tool definitions (by identity, kept alive with their hash) -> their fingerprint part."""


def tools_fingerprint(definitions: Sequence[Any], as_dicts: Callable[[], list[Any]]) -> str:
    """The tools part of ``model_call_fingerprint`` for ``definitions``, the objects each
    tool builds once (so the same offered tools are encoded once per worker, not on every
    model call); ``as_dicts`` gives what is hashed."""
    key = tuple(map(id, definitions))
    found = _TOOLS_HASHED.get(key)
    if found is not None and all(a is b for a, b in zip(found[0], definitions, strict=True)):
        return found[1]
    hashed = fingerprint(as_dicts())
    if len(_TOOLS_HASHED) >= 256:  # runtime tool sets that keep changing: start over
        _TOOLS_HASHED.clear()
    _TOOLS_HASHED[key] = (tuple(definitions), hashed)
    return hashed


def describe_model_input_change(recorded: str, live: str) -> str:
    r_parts, l_parts = recorded.split("."), live.split(".")
    if len(r_parts) not in (4, 5) or len(l_parts) not in (4, 5):
        return "the model input changed"
    r_sys, r_tools, r_msgs, r_n, *r_out = r_parts
    l_sys, l_tools, l_msgs, l_n, *l_out = l_parts
    changes = []
    if r_sys != l_sys:
        changes.append("the system prompt changed")
    if r_tools != l_tools:
        changes.append("the offered tools (names, descriptions or schemas) changed")
    if r_n != l_n:
        changes.append(f"the conversation has {l_n} messages, the recording had {r_n}")
    elif r_msgs != l_msgs:
        changes.append("the conversation messages changed")
    if r_out != l_out:
        changes.append("the output schema (output_type) changed")
    return "; ".join(changes) or "the model input changed"


@dataclass(slots=True)
class TurnJournal:
    """Everything the journal holds about one turn.

    Restore keeps step and progress records as raw bytes: most restored turns are never
    resumed (their requests are finished), so decoding waits for ``materialize``. Slots:
    every running and every restored turn has one.
    """

    turn_id: str
    steps: dict[int, JournalEntry] = field(default_factory=dict)
    progress: JournalEntry | None = None
    terminal_ms: int | None = None
    raw_steps: dict[int, bytes] = field(default_factory=dict)
    raw_progress: bytes | None = None
    forked: frozenset[int] = frozenset()
    """Steps a branch took from its original: replayed as recorded, whatever their input
    (the shared empty frozenset for every other turn: an empty set is 216 bytes)."""
    replies: dict[str, dict[str, Any]] = field(default_factory=dict)
    park: dict[str, Any] | None = None
    signals: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Signals and answers taken in for this turn, by signal id (``signals.py``)."""
    batch_results: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Outcomes of the turn's batch calls, by custom id (``wire/batches.py``)."""

    @property
    def attempt(self) -> int:
        return int(self.progress.data.get("attempt", 0)) if self.progress else 0

    @property
    def next_seq(self) -> int:
        return int(self.progress.data.get("next_seq", 0)) if self.progress else 0

    @property
    def dropped_events(self) -> int:
        return int(self.progress.data.get("dropped_events", 0)) if self.progress else 0

    @property
    def stalled_attempts(self) -> int:
        return int(self.progress.data.get("stalled", 0)) if self.progress else 0

    @property
    def empty(self) -> bool:
        return not (
            self.steps
            or self.raw_steps
            or self.progress
            or self.raw_progress
            or self.terminal_ms is not None
            or self.replies
            or self.signals
            or self.batch_results
            or self.park is not None
        )

    def apply(self, key: str, value: bytes | None, ts_ms: int) -> None:
        """Fold one raw journal record (``None`` is a tombstone) into this view."""
        suffix = parse_journal_key(key)[1]
        if suffix == PROGRESS:
            self.raw_progress, self.progress = value, None
        elif suffix == TERMINAL:
            self.terminal_ms = ts_ms if value is not None else None
        elif suffix == PARK:
            self.park = _entry_data(key, value)
        elif suffix.startswith(SIGNAL):
            signal = _entry_data(key, value)
            if signal is None:
                self.signals.pop(suffix[len(SIGNAL) :], None)
            else:
                self.signals[suffix[len(SIGNAL) :]] = signal
        elif suffix.startswith(BATCH_RESULT):
            result = _entry_data(key, value)
            if result is None:
                self.batch_results.pop(suffix[len(BATCH_RESULT) :], None)
            else:
                self.batch_results[suffix[len(BATCH_RESULT) :]] = result
        elif suffix.startswith(REPLY):
            reply = _entry_data(key, value)
            if reply is None:
                self.replies.pop(suffix[len(REPLY) :], None)
            else:
                self.replies[suffix[len(REPLY) :]] = reply
        elif suffix.isdigit():
            index = int(suffix)
            self.steps.pop(index, None)
            if value is None:
                self.raw_steps.pop(index, None)
            else:
                self.raw_steps[index] = value

    def materialize(self) -> TurnJournal:
        """Decode what restore kept raw; a record that cannot be read is skipped (rerun)."""
        for index, raw in sorted(self.raw_steps.items()):
            try:
                self.steps[index] = decode_journal_entry(raw, {})
            except MalformedRecordError as exc:
                log.error(
                    "journal step %s/%d unreadable, it will run again: %s", self.turn_id, index, exc
                )
        self.raw_steps.clear()
        if self.raw_progress is not None:
            try:
                self.progress = decode_journal_entry(self.raw_progress, {})
            except MalformedRecordError as exc:
                log.error("journal progress of %s unreadable: %s", self.turn_id, exc)
            self.raw_progress = None
        return self

    def records(self) -> list[tuple[str, bytes]]:
        """The turn's records as the journal topic holds them, by key suffix (what
        ``apply`` folds back): how a parked turn's journal waits on disk. The terminal
        record and ``forked`` are not kept (a parked turn has neither; a branch's attempt
        takes its forked steps again)."""
        out = [(str(i), raw) for i, raw in self.raw_steps.items()]
        out += [
            (str(i), encode("journal_entry", e))
            for i, e in self.steps.items()
            if i not in self.raw_steps
        ]
        if self.raw_progress is not None:
            out.append((PROGRESS, self.raw_progress))
        elif self.progress is not None:
            out.append((PROGRESS, encode("journal_entry", self.progress)))
        tid = self.turn_id
        if self.park is not None:
            out.append((PARK, encode("journal_entry", JournalEntry(tid, -1, PARK, data=self.park))))
        for child, data in self.replies.items():
            entry = JournalEntry(tid, -1, REPLY_ENTRY_KIND, child, data=data)
            out.append((REPLY + child, encode("journal_entry", entry)))
        out += [signal_row(tid, signal_id, data) for signal_id, data in self.signals.items()]
        for custom_id, data in self.batch_results.items():
            entry = JournalEntry(tid, -1, BATCH_RESULT_KIND, custom_id, data=data)
            out.append((BATCH_RESULT + custom_id, encode("journal_entry", entry)))
        return out

    def taken_signals(self) -> set[str]:
        """The ids of the signals this turn's journaled waits took."""
        self.materialize()
        return {
            str(e.data.get("signal_id"))
            for e in self.steps.values()
            if e.kind == TAKE_SIGNAL_KIND and e.data.get("signal_id")
        }

    def step_indices(self) -> set[int]:
        return set(self.steps) | set(self.raw_steps)

    def recorded(self, step: int, kind: str, name: str, input_hash: str) -> JournalEntry | None:
        """The entry for this call if it was journaled; raises if its input changed."""
        entry = self.steps.get(step)
        if entry is None:
            return None
        if entry.kind != kind or entry.name != name:
            raise ReplayInputChanged(
                f"step {step}: the recording has {entry.kind} '{entry.name}' there, "
                f"the code now makes {kind} '{name}'",
                detail={"step": step, "recorded": [entry.kind, entry.name], "live": [kind, name]},
            )
        if entry.input_hash != input_hash and step not in self.forked:
            what = (
                describe_model_input_change(entry.input_hash, input_hash)
                if kind == "llm"
                else "its arguments changed"
            )
            raise ReplayInputChanged(
                f"step {step} ({kind} '{name}'): {what}",
                detail={"step": step, "kind": kind, "name": name},
            )
        return entry


REPLY_ENTRY_KIND = "reply"
"""The kind of a reply's journal entry (``subagents.REPLY_KIND``; restore reads only its data)."""

SIGNAL_ENTRY_KIND = "signal"
"""The kind of a signal's journal entry (``signals.SIGNAL_KIND``)."""


def signal_row(turn_id: str, signal_id: str, data: dict[str, Any]) -> tuple[str, bytes]:
    """A taken-in signal as the journal holds it: its key suffix and record value."""
    entry = JournalEntry(turn_id, -1, SIGNAL_ENTRY_KIND, str(data.get("name")), data=data)
    return SIGNAL + signal_id, encode("journal_entry", entry)


class ParkedJournals:
    """The journals of a partition's parked turns, on disk until they resume.

    A parked turn may wait an hour or a week, and a worker may hold tens of thousands:
    in memory each journal cost kilobytes (decoded steps, its request twice). Here each
    of a turn's records is a row keyed by turn and key suffix, as the journal topic holds
    it, read back when the turn resumes or a reply for it arrives; a signal taken for a
    parked turn adds its one row (``add_signal``) instead of rewriting the turn's
    journal. The file is opened at the first park and, like the idempotency keys,
    rebuilt from the topic at each assignment.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._db: sqlite3.Connection | None = None

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._path.unlink(missing_ok=True)  # rebuilt from the topic, never reused
            db = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
            db.executescript(
                """
                PRAGMA journal_mode = OFF;
                PRAGMA synchronous = OFF;
                PRAGMA cache_size = -128;
                CREATE TABLE records (
                    turn TEXT NOT NULL, suffix TEXT NOT NULL, value BLOB NOT NULL,
                    PRIMARY KEY (turn, suffix)
                ) WITHOUT ROWID;
                """
            )
            self._db = db
        return self._db

    def __len__(self) -> int:
        if self._db is None:
            return 0
        return int(self._db.execute("SELECT count(DISTINCT turn) FROM records").fetchone()[0])

    def put(self, journal: TurnJournal) -> None:
        db, turn = self._open(), journal.turn_id
        db.execute("BEGIN")
        try:
            db.execute("DELETE FROM records WHERE turn = ?", (turn,))
            db.executemany(
                "INSERT OR REPLACE INTO records (turn, suffix, value) VALUES (?, ?, ?)",
                [(turn, suffix, value) for suffix, value in journal.records()],
            )
        finally:
            db.execute("COMMIT")

    def add_signal(self, turn_id: str, signal_id: str, data: dict[str, Any]) -> bool:
        """Keep one more signal of a parked turn; ``False`` when the turn is not here."""
        if self._db is None or not self._has(turn_id):
            return False
        suffix, value = signal_row(turn_id, signal_id, data)
        self._db.execute(
            "INSERT OR REPLACE INTO records (turn, suffix, value) VALUES (?, ?, ?)",
            (turn_id, suffix, value),
        )
        return True

    def _has(self, turn_id: str) -> bool:
        assert self._db is not None
        found = self._db.execute("SELECT 1 FROM records WHERE turn = ? LIMIT 1", (turn_id,))
        return found.fetchone() is not None

    def get(self, turn_id: str) -> TurnJournal | None:
        if self._db is None:
            return None
        rows = self._db.execute(
            "SELECT suffix, value FROM records WHERE turn = ?", (turn_id,)
        ).fetchall()
        if not rows:
            return None
        journal = TurnJournal(turn_id)
        for suffix, value in rows:
            journal.apply(f"{turn_id}/{suffix}", bytes(value), 0)
        return journal

    def take(self, turn_id: str) -> TurnJournal | None:
        """The turn's journal, no longer kept here (it resumes)."""
        journal = self.get(turn_id)
        if journal is not None and self._db is not None:
            self._db.execute("DELETE FROM records WHERE turn = ?", (turn_id,))
        return journal

    def close(self) -> None:
        """Close and delete the file: the next owner rebuilds it from the topic."""
        if self._db is not None:
            self._db.close()
            self._db = None
            self._path.unlink(missing_ok=True)


@dataclass
class PartitionJournal:
    """The restored journal of one partition: live turns, terminal records, idempotency keys.

    Terminal records stay in the journal only until the committed input watermark passes
    their request (then nothing can read the request again), so restore holds the live
    turns, the few recently finished ones, and the idempotency keys (on disk).
    """

    partition: int
    idempotency: IdempotencyKeys
    turns: dict[str, TurnJournal] = field(default_factory=dict)
    records_read: int = 0
    cursors: dict[str, int] = field(default_factory=dict)
    """Read positions in the replies, signals and answers topics, by kind."""
    skipped_records: int = 0
    intake_mark: tuple[dict[str, Any], int] | None = None
    """The intake mark's data and write time (``None``: none, or a tombstone)."""
    dead_lettered: set[int] = field(default_factory=set)
    """Input offsets whose record was dead-lettered, until the committed offset passes."""
    batches: dict[str, BatchRecord] = field(default_factory=dict)
    """The partition's batches whose results are not journaled yet, by tag."""
    parked: ParkedJournals = field(init=False)
    """Parked turns' journals (not in ``turns``), in a file beside the idempotency keys."""

    def __post_init__(self) -> None:
        keys = self.idempotency.path
        self.parked = ParkedJournals(keys.with_name(f"{keys.stem}.parked{keys.suffix}"))

    def restore(self, records: Iterable[ConsumedRecord]) -> None:
        """Fold a partition's records, read to its end, in offset order."""
        with self.idempotency.batch():
            for record in records:
                try:
                    self.apply(record.key, record.value, record.ts_ms)
                except Exception as exc:  # anyone with write access may have written it
                    self.skipped_records += 1
                    log.error(
                        "journal record %r (partition %d @%d) unreadable, skipped: %s",
                        record.key,
                        record.partition,
                        record.offset,
                        bad_record_reason(exc),
                    )

    def expire(self, now_ms: int, ttl_ms: int) -> list[str]:
        """Forget terminal records and keys older than the TTL; return the keys to tombstone
        (every expired key at once: the worker expires keys in batches, off its loop)."""
        keys = self.expire_terminals(now_ms, ttl_ms)
        expired = self.idempotency.still_expired(self.idempotency.expire(now_ms - ttl_ms))
        keys += [IDEMPOTENCY_PREFIX + k for k in expired]
        return keys

    def expire_terminals(self, now_ms: int, ttl_ms: int) -> list[str]:
        """Forget restored terminal records older than the TTL (in memory, few); return
        their keys to tombstone."""
        keys: list[str] = []
        for turn_id, turn in list(self.turns.items()):
            if turn.terminal_ms is not None and now_ms - turn.terminal_ms > ttl_ms:
                keys.append(journal_key(turn_id, -1, TERMINAL))
                del self.turns[turn_id]
        return keys

    def finished_turns(self) -> list[str]:
        """Restored turns that have a terminal record."""
        return [t for t, turn in self.turns.items() if turn.terminal_ms is not None]

    def forget_finished(self) -> list[str]:
        """Drop restored terminal records; return their keys to tombstone."""
        done = self.finished_turns()
        for turn_id in done:
            del self.turns[turn_id]
        return [journal_key(turn_id, -1, TERMINAL) for turn_id in done]

    def apply(self, key: str, value: bytes | None, ts_ms: int) -> None:
        """Fold one raw record of this partition's journal (in offset order)."""
        self.records_read += 1
        if key == INTAKE_MARK_KEY:
            data = _entry_data(key, value)
            self.intake_mark = None if data is None else (data, ts_ms)
            return
        if key in CURSOR_KEYS:
            data = _entry_data(key, value)
            offset = data.get("offset") if data else None
            if isinstance(offset, int) and offset >= 0:
                self.cursors[CURSOR_KEYS[key]] = offset
            else:
                self.cursors.pop(CURSOR_KEYS[key], None)
            return
        if key.startswith(IDEMPOTENCY_PREFIX):
            self.idempotency.apply(key[len(IDEMPOTENCY_PREFIX) :], value, ts_ms)
            return
        if is_batch_key(key):
            data = _entry_data(key, value)
            tag = key[len(BATCH_PREFIX) :]
            if data is None:
                self.batches.pop(tag, None)
            else:
                self.batches[tag] = BatchRecord.from_data(data)
            return
        if key.startswith(DEAD_LETTERED_PREFIX):
            offset = int(key[len(DEAD_LETTERED_PREFIX) :])
            if value is None:
                self.dead_lettered.discard(offset)
            else:
                self.dead_lettered.add(offset)
            return
        turn_id = parse_journal_key(key)[0]
        turn = self.turns.get(turn_id)
        if turn is None:
            if value is None:
                return
            turn = self.turns[turn_id] = TurnJournal(turn_id)
        turn.apply(key, value, ts_ms)
        if turn.empty:
            del self.turns[turn_id]


def _entry_data(key: str, value: bytes | None) -> dict[str, Any] | None:
    """The ``data`` of a small journal record decoded at restore (park, reply, cursor)."""
    if value is None:
        return None
    try:
        return decode_journal_entry(value, {}).data
    except MalformedRecordError as exc:
        log.error("journal record %s unreadable, ignored: %s", key, exc)
        return None
