"""The outside view: read the topics (read_committed), the call log and the effects file,
and count every way a turn could have been lost, doubled or redone.

Journal times are the Kafka timestamps of the journal records (CreateTime: set when the
record was produced, a little before its transaction committed). A model request that
arrived after that time while the entry is in the committed journal counts as
``repeated_llm_after_journal``; as the produce time precedes the commit, this can only
over-count, never hide a repeat.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyrula_stream.chaos.effects import read_effects
from pyrula_stream.chaos.model_server import answer_for
from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.kafka.offsets import ConsumedRecord
from pyrula_stream.state.threads import decode_thread
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import Event, EventType, decode_event
from pyrula_stream.wire.serde import JournalEntry

Record = ConsumedRecord


def read_jsonl(path: str) -> list[dict[str, Any]]:
    out = []
    try:
        with open(path, "rb") as f:
            for raw in f:
                try:
                    out.append(json.loads(raw))
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    return out


@dataclass
class Findings:
    """Counts (the JSON line) and examples (the human summary)."""

    counts: dict[str, Any] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def add(self, name: str, n: int = 1, example: str | None = None) -> None:
        self.counts[name] = self.counts.get(name, 0) + n
        if example is not None and len(self.examples[name]) < 5:
            self.examples[name].append(example)

    def zero(self, *names: str) -> None:
        for name in names:
            self.counts.setdefault(name, 0)


def readable_events(records: Iterable[Record]) -> Iterator[Event]:
    """The events among ``records`` that decode (a hostile run writes some that do not)."""
    for rec in records:
        if rec.value is None:
            continue
        try:
            yield decode_event(rec.value, rec.headers)
        except MalformedRecordError:
            continue


def check_threads(
    threads: dict[str, list[str]], events: list[Record], records: list[Record], f: Findings
) -> None:
    """Every completed turn of a thread is in its thread once, in submission order."""
    f.zero("thread_turns_missing", "thread_turns_doubled", "thread_turns_out_of_order")
    completed = set()
    for rec in events:
        if rec.value is not None:
            event = decode_event(rec.value, rec.headers)
            if event.type == EventType.RUN_COMPLETE:
                completed.add(event.turn_id)
    by_thread: dict[str, list[tuple[str, bytes | None]]] = defaultdict(list)
    for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
        by_thread[rec.key.rpartition("/")[0]].append((rec.key, rec.value))
    for thread_id, submitted in sorted(threads.items()):
        recorded = [t.turn_id for t in decode_thread(thread_id, by_thread[thread_id]).turns]
        doubled = len(recorded) - len(set(recorded))
        if doubled:
            f.add("thread_turns_doubled", doubled, example=f"{thread_id}: {recorded}")
        for turn in submitted:
            if turn in completed and turn not in recorded:
                f.add("thread_turns_missing", example=f"{thread_id}: {turn}")
        once = list(dict.fromkeys(recorded))  # a doubled turn is counted above, not here
        if once != [t for t in submitted if t in set(recorded)]:
            f.add("thread_turns_out_of_order", example=f"{thread_id}: {recorded}")


def check_events(turn_ids: Iterable[str], records: list[Record], f: Findings) -> None:
    """One terminal per turn, seqs contiguous from 0 without repeats, in order, right answers."""
    f.zero(
        "lost",
        "duplicate_terminal",
        "duplicate_events",
        "seq_gaps",
        "events_after_terminal",
        "out_of_order_events",
        "failed_turns",
        "wrong_results",
        "unexpected_turn_events",
    )
    wanted = set(turn_ids)
    by_turn: dict[str, list[tuple[Record, Event]]] = defaultdict(list)
    for rec in records:
        if rec.value is None:
            continue
        event = decode_event(rec.value, rec.headers)
        if event.turn_id not in wanted:
            f.add("unexpected_turn_events", example=f"{event.turn_id} {event.type}")
            continue
        by_turn[event.turn_id].append((rec, event))
    errors: Counter[str] = Counter()
    attempts: Counter[int] = Counter()
    for turn in sorted(wanted):
        evs = sorted(by_turn.get(turn, []), key=lambda re: (re[0].partition, re[0].offset))
        terminals = [e for _, e in evs if e.is_terminal]
        if not terminals:
            last = evs[-1][1].type if evs else "no events"
            f.add("lost", example=f"{turn}: {len(evs)} events, last {last}")
        elif len(terminals) > 1:
            f.add(
                "duplicate_terminal",
                example=f"{turn}: {[(e.seq, e.type, e.attempt) for e in terminals]}",
            )
        seqs = Counter(e.seq for _, e in evs)
        repeats = sum(n - 1 for n in seqs.values())
        if repeats:
            f.add(
                "duplicate_events",
                repeats,
                example=f"{turn}: seqs repeated {sorted(s for s, n in seqs.items() if n > 1)}",
            )
        if seqs and sorted(seqs) != list(range(max(seqs) + 1)):
            missing = sorted(set(range(max(seqs) + 1)) - set(seqs))
            f.add("seq_gaps", example=f"{turn}: missing seqs {missing[:10]}")
        order = [e.seq for _, e in evs]
        if any(b < a for a, b in itertools.pairwise(order)):
            f.add("out_of_order_events", example=f"{turn}: {order}")
        if terminals:
            first = terminals[0]
            after = [e.seq for _, e in evs if e.seq > first.seq]
            if after:
                f.add("events_after_terminal", len(after), example=f"{turn}: seqs {after}")
            attempts[first.attempt] += 1
            if first.type == EventType.RUN_ERROR:
                code = str(first.data.get("code"))
                errors[code] += 1
                f.add("failed_turns", example=f"{turn}: {code}: {first.data.get('message')}")
            elif (first.data.get("result") or {}).get("answer") != answer_for(turn):
                f.add("wrong_results", example=f"{turn}: {first.data.get('result')}")
    f.counts["events"] = sum(len(v) for v in by_turn.values())
    f.counts["failed_by_code"] = dict(errors)
    f.counts["terminal_attempts"] = {str(k): v for k, v in sorted(attempts.items())}


@dataclass
class JournalView:
    """What the journal committed, including entries later tombstoned."""

    llm: dict[tuple[str, int], int] = field(default_factory=dict)  # (turn, call) -> ts_ms
    tools: dict[str, int] = field(default_factory=dict)  # idempotency key -> ts_ms


def check_journal(turn_ids: Iterable[str], records: list[Record], f: Findings) -> JournalView:
    """Step indices contiguous from 0, each step journaled once, steps tombstoned at the end."""
    f.zero(
        "journal_gaps",
        "duplicate_journal_steps",
        "steps_left_after_finish",
        "missing_terminal_record",
    )
    wanted = set(turn_ids)
    view = JournalView()
    steps: dict[str, Counter[int]] = defaultdict(Counter)
    live: dict[str, bytes | None] = {}
    # A terminal record is tombstoned once the committed input offset passes its turn's
    # request, so "written" is any committed value, not the live one.
    terminal_written: set[str] = set()
    for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
        live[rec.key] = rec.value
        turn, _, suffix = rec.key.rpartition("/")
        if suffix == "terminal" and rec.value is not None:
            terminal_written.add(turn)
        if rec.value is None or not suffix.isdigit():
            continue
        entry: JournalEntry = serde.decode_journal_entry(rec.value, rec.headers)
        steps[turn][int(suffix)] += 1
        if entry.kind == "llm":
            k = (turn, int(entry.data.get("call", -1)))
            view.llm[k] = min(view.llm.get(k, rec.ts_ms), rec.ts_ms)
        elif entry.kind == "tool":
            key = f"{turn}:{entry.data.get('call_key')}:{entry.name}"
            view.tools[key] = min(view.tools.get(key, rec.ts_ms), rec.ts_ms)
    for turn in sorted(wanted):
        counts = steps.get(turn, Counter())
        if counts and sorted(counts) != list(range(max(counts) + 1)):
            f.add("journal_gaps", example=f"{turn}: steps {sorted(counts)}")
        doubled = {s: n for s, n in counts.items() if n > 1}
        if doubled:
            f.add(
                "duplicate_journal_steps",
                sum(n - 1 for n in doubled.values()),
                example=f"{turn}: step -> entries {doubled}",
            )
        left = [s for s in counts if live.get(f"{turn}/{s}") is not None]
        if left and turn in terminal_written:
            f.add("steps_left_after_finish", example=f"{turn}: steps {sorted(left)}")
        if turn not in terminal_written:
            f.add("missing_terminal_record", example=turn)
    f.counts["journal_records"] = len(records)
    return view


def check_model_calls(
    turn_ids: Iterable[str], calls: list[dict[str, Any]], view: JournalView, f: Findings
) -> None:
    """The server's call log against the journal: repeats before and after the commit."""
    f.zero("repeated_llm_after_journal", "repeated_llm_before_commit", "unjournaled_llm_calls")
    wanted = set(turn_ids)
    by_call: dict[tuple[str, int], list[float]] = defaultdict(list)
    for c in calls:
        if c.get("turn") in wanted:
            by_call[(str(c["turn"]), int(c["call"]))].append(float(c["ts"]))
    for (turn, call), stamps in sorted(by_call.items()):
        journaled = view.llm.get((turn, call))
        if journaled is None:
            # Never committed: the turn ended in the commit that would have carried it (a
            # step and its tombstone in one commit send neither), so every ask came first.
            f.add("unjournaled_llm_calls", len(stamps), example=f"{turn} call {call}")
            if len(stamps) > 1:
                f.add("repeated_llm_before_commit", len(stamps) - 1, example=f"{turn} call {call}")
            continue
        after = [t for t in stamps if t * 1000 > journaled]
        before = len(stamps) - len(after)
        if after:
            f.add(
                "repeated_llm_after_journal",
                len(after),
                example=f"{turn} call {call}: journaled at {journaled} ms, asked again "
                f"{[round(t * 1000 - journaled) for t in after]} ms later",
            )
        if before > 1:
            f.add("repeated_llm_before_commit", before - 1, example=f"{turn} call {call}")
    f.counts["model_calls"] = sum(len(v) for v in by_call.values())
    expected = {(t, c) for t in wanted for c in (0, 1)}
    f.counts["model_calls_missing"] = len(expected - set(by_call))


def check_effects(
    turn_ids: Iterable[str], effects_path: str, view: JournalView, f: Findings
) -> None:
    """At most one applied effect per idempotency key; tool reruns before/after the commit."""
    f.zero(
        "duplicate_effects",
        "missing_effects",
        "unstable_idempotency_keys",
        "repeated_tool_after_journal",
        "repeated_tool_before_commit",
    )
    wanted = set(turn_ids)
    lines: dict[str, list[dict[str, Any]]] = defaultdict(list)
    keys_by_turn: dict[str, set[str]] = defaultdict(set)
    for e in read_effects(effects_path):
        if e.get("turn") in wanted:
            lines[str(e["key"])].append(e)
    for key, es in sorted(lines.items()):
        applied = [e for e in es if e.get("applied")]
        if applied:
            keys_by_turn[str(es[0]["turn"])].add(key)
        if len(applied) > 1:
            f.add("duplicate_effects", example=f"{key}: applied {len(applied)} times")
        journaled = view.tools.get(key)
        if journaled is None:
            continue
        after = [e for e in es if float(e["ts"]) * 1000 > journaled]
        if after:
            f.add("repeated_tool_after_journal", len(after), example=f"{key}")
        if len(es) - len(after) > 1:
            f.add("repeated_tool_before_commit", len(es) - len(after) - 1, example=key)
    for turn in sorted(wanted):
        keys = keys_by_turn.get(turn, set())
        if not keys:
            f.add("missing_effects", example=turn)
        elif len(keys) > 1:
            f.add("unstable_idempotency_keys", example=f"{turn}: {sorted(keys)}")
    f.counts["effects"] = sum(1 for es in lines.values() for e in es if e.get("applied"))


_NOISE = re.compile(r"^\S+ \S+ |[0-9a-f]{16,}|\b\d+(\.\d+)?\b")


def worker_log_digest(paths: Iterable[Path]) -> list[tuple[int, str]]:
    """Distinct WARNING/ERROR/Traceback lines of the workers' logs, ids and numbers masked."""
    seen: Counter[str] = Counter()
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            if any(w in line for w in ("WARNING", "ERROR", "CRITICAL", "Traceback", "Error:")):
                seen[_NOISE.sub("#", line.strip())[:200]] += 1
    return [(n, text) for text, n in seen.most_common()]


SUBAGENT_KEYS = ("child_turns_doubled", "replies_lost", "replies_doubled")


def check_subagents(
    parent_ids: Iterable[str],
    parent_events: list[Record],
    child_requests: list[Record],
    child_events: list[Record],
    replies: list[Record],
    f: Findings,
) -> None:
    """Each call ran one child turn; each child's reply reached its parent exactly once.

    ``child_turns_doubled``: calls (parent turn, call key) that produced more than one
    child turn id, plus child turns with more than one terminal event.
    ``replies_lost``: child turns that never ended, and ended children of a completed
    parent that has no ``subagent:result`` for them.
    ``replies_doubled``: children with more than one ``subagent:result`` in their
    parent's events, or more than one reply record.
    """
    f.zero(*SUBAGENT_KEYS)
    wanted = set(parent_ids)
    calls: dict[tuple[str, str], set[str]] = defaultdict(set)
    parent_of: dict[str, str] = {}
    for rec in child_requests:
        parent = rec.headers.get("pyrula-parent-turn-id")
        if parent not in wanted or rec.value is None:
            continue
        child = serde.decode_turn_request(rec.value, rec.headers).turn_id
        calls[(parent, rec.headers.get("pyrula-call-key", ""))].add(child)
        parent_of[child] = parent
    for (parent, key), children in sorted(calls.items()):
        if len(children) > 1:
            f.add("child_turns_doubled", len(children) - 1, example=f"{parent} {key}: {children}")
    terminals: Counter[str] = Counter()
    for rec in child_events:
        if rec.value is not None:
            event = decode_event(rec.value, rec.headers)
            if event.is_terminal and event.turn_id in parent_of:
                terminals[event.turn_id] += 1
    for child, n in sorted(terminals.items()):
        if n > 1:
            f.add("child_turns_doubled", n - 1, example=f"child {child}: {n} terminal events")
    taken: Counter[str] = Counter()
    completed: set[str] = set()
    for rec in parent_events:
        if rec.value is None:
            continue
        event = decode_event(rec.value, rec.headers)
        if event.turn_id not in wanted:
            continue
        if event.type == EventType.SUBAGENT_RESULT:
            taken[str(event.data.get("child_turn_id"))] += 1
        elif event.type == EventType.RUN_COMPLETE:
            completed.add(event.turn_id)
    for child, parent in sorted(parent_of.items()):
        if child not in terminals:
            f.add("replies_lost", example=f"child {child} of {parent} never ended")
        elif parent in completed and taken[child] == 0:
            f.add("replies_lost", example=f"child {child} ended; parent {parent} never took it")
        if taken[child] > 1:
            f.add("replies_doubled", taken[child] - 1, example=f"{child}: taken {taken[child]}x")
    written = Counter(r.headers.get("pyrula-child-turn-id", "") for r in replies)
    for child, n in sorted(written.items()):
        if n > 1:
            f.add("replies_doubled", n - 1, example=f"{child}: {n} reply records")
    f.counts["child_turns"] = len(parent_of)
    f.counts["replies"] = sum(written.values())
