"""What became of each hostile record of a ``--hostile`` run, read from the outside.

``hostile_not_in_dlq``: records whose documented outcome (``hostile.EXPECT``) is not seen:
a ``dlq`` record with no dead letter naming its place and a reason, a ``forged_child``
whose reply was not dead-lettered by the parent it names (on ``--secured``: by its own
worker, ``record_undeliverable``, as the broker refuses the reply), a ``control_unreadable`` record
no worker logged as skipped, a ``control_unknown_turn`` whose turn shows up in the events.
``forged_replies_taken``: forged replies (and forged children's replies, and replies with
a long child id) a parent took: a ``subagent:result`` event or a ``reply:`` journal entry
for their child id, or their marker in the parent agent's events or journal.
``control_brackets`` records are ``skipped`` as ``control_unreadable`` ones are; a long
signal id must be dead-lettered where the signal (not its turn) sits. The other kinds of
issue 46 are checked by ``hostile_caps_check`` (``HOSTILE_KEYS`` gates its keys too).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from pyrula_stream.chaos.hostile_caps_check import CAPS_KEYS, journaled_signals, taken_children
from pyrula_stream.chaos.hostile_record import KIND_HEADER, REPLY_KINDS, HostileRecord
from pyrula_stream.chaos.verify import Findings, Record, readable_events
from pyrula_stream.wire.subagents import CHILD_TURN_HEADER

HOSTILE_KEYS = (
    "worker_crashes",
    "hostile_not_in_dlq",
    "forged_replies_taken",
    "hostile_dlq_doubled",
    *CAPS_KEYS,
)
"""Gated in a ``--hostile`` run."""
SKIPPED_LINE = "ignoring unreadable control record"
LETTERED = ("dlq", "reply_dlq", "undeliverable_dlq")
"""Outcomes that are a dead letter."""
_ORIGINAL = "pyrula.original."


def control_log_markers(logs: Iterable[Path]) -> set[str]:
    """The markers of the control records the workers logged as skipped."""
    found: set[str] = set()
    pattern = re.compile(r"chaos-hostile-[0-9a-z]+-\d+")
    for path in logs:
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            if SKIPPED_LINE in line:
                found.update(pattern.findall(line))
    return found


def control_skips(metrics: str, agent: str) -> int:
    """``pyrula_skipped_records_total{agent, source="control"}`` in a worker's /metrics."""
    total = 0.0
    for line in metrics.splitlines():
        if (
            line.startswith("pyrula_skipped_records_total{")
            and f'agent="{agent}"' in line
            and 'source="control"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def check_control_counts(sent: list[HostileRecord], skips: dict[str, int], f: Findings) -> None:
    """Every worker reads every control record from the start (again after each restart),
    so each one's skip counter is at least the number of unreadable control records."""
    unreadable = sum(1 for rec in sent if rec.expect == "skipped" and rec.delivered)
    f.counts["control_skips_counted"] = skips
    f.zero("control_skips_uncounted", "control_skips_unread")
    for worker, n in sorted(skips.items()):
        if n < 0:  # e.g. a worker of several agents (a mesh) serves no /metrics
            f.add("control_skips_unread", example=f"{worker}: its /metrics did not answer")
        elif n < unreadable:
            f.add("control_skips_uncounted", example=f"{worker}: {n} < {unreadable}")


class Outcomes:
    """The dead letters of a run, indexed the ways hostile records are looked up."""

    def __init__(
        self,
        dlq: list[Record],
        markers: set[str],
        held: dict[str, dict[str, int]] | None = None,
    ) -> None:
        self.held = held or {}
        """Signal ids journaled under each turn (``hostile_caps_check.journaled_signals``)."""
        self.by_source: dict[str, list[Record]] = {}
        self.by_child: dict[str, list[Record]] = {}
        self.undeliverable_by_child: dict[str, list[Record]] = {}
        """Replies their own worker dead-lettered as ``record_undeliverable``."""
        for rec in dlq:
            source = rec.headers.get("pyrula.dlq.source")
            if source:
                self.by_source.setdefault(source, []).append(rec)
            child = rec.headers.get(_ORIGINAL + CHILD_TURN_HEADER)
            code = rec.headers.get("pyrula.dlq.code")
            if child and code == "unsolicited_reply":
                self.by_child.setdefault(child, []).append(rec)
            elif child and code == "record_undeliverable":
                self.undeliverable_by_child.setdefault(child, []).append(rec)
        self.markers = markers

    def letters(self, rec: HostileRecord) -> list[Record]:
        if rec.expect == "reply_dlq":
            return self.by_child.get(rec.turn_id or "", [])
        if rec.expect == "undeliverable_dlq":
            return self.undeliverable_by_child.get(rec.turn_id or "", [])
        if rec.expect == "dlq" and rec.follow:  # a long signal id sent to a turn of its own
            return [r for follow in rec.follow for r in self.by_source.get(follow.source(), [])]
        return self.by_source.get(rec.source, [])

    def seen(self, rec: HostileRecord) -> bool:
        """The record's documented outcome is visible (``ignored`` is checked later; for
        ``flood`` and ``not_taken``, each signal is decided; ``hostile_caps_check`` counts
        what the decisions were)."""
        if rec.delivered is None:
            return False
        if rec.expect == "dlq" and rec.follow:
            return all(
                any(r.headers.get("pyrula.dlq.reason") for r in self.by_source.get(f.source(), []))
                for f in rec.follow
            )
        if rec.expect in LETTERED:
            return any(r.headers.get("pyrula.dlq.reason") for r in self.letters(rec))
        if rec.expect == "skipped":
            return rec.marker in self.markers
        if rec.expect in ("flood", "not_taken"):  # each signal decided: held or refused
            mine = self.held.get(rec.turn_id or "", {})
            return all(
                f.note in mine or f.source() in self.by_source
                for f in rec.follow
                if f.delivered is not None
            )
        return True


def pending(sent: list[HostileRecord], outcomes: Outcomes) -> list[HostileRecord]:
    """Records whose outcome is not visible yet (what the harness waits for)."""
    return [rec for rec in sent if not outcomes.seen(rec)]


def check_hostile(
    sent: list[HostileRecord],
    dlq: list[Record],
    events: list[Record],
    journal: list[Record],
    logs: Iterable[Path],
    f: Findings,
) -> None:
    f.zero("hostile_not_in_dlq", "forged_replies_taken", "hostile_headers_lost")
    f.zero("hostile_dlq_doubled")
    outcomes = Outcomes(dlq, control_log_markers(logs), journaled_signals(journal))
    event_turns: set[str] = set()
    ended: set[str] = set()
    for event in readable_events(events):
        event_turns.add(event.turn_id)
        if event.is_terminal:
            ended.add(event.turn_id)
    children_taken = taken_children(events, journal)
    texts = b"\n".join(r.value for r in (*events, *journal) if r.value is not None)
    kinds: Counter[str] = Counter()
    for rec in sent:
        kinds[rec.kind] += 1
        if not outcomes.seen(rec) or (rec.expect == "ignored" and rec.turn_id in event_turns):
            why = f"{rec.describe()}: {rec.expect} not seen"
            if rec.expect in ("reply_dlq", "undeliverable_dlq"):
                why += f" (turn {rec.turn_id} {'ended' if rec.turn_id in ended else 'never ended'})"
            f.add("hostile_not_in_dlq", example=why)
        letters = outcomes.letters(rec)
        if len(letters) > 1:
            f.add("hostile_dlq_doubled", len(letters) - 1, example=rec.describe())
        if rec.expect == "dlq" and letters:
            tag = letters[0].headers.get(_ORIGINAL + KIND_HEADER)
            if tag != rec.kind:
                f.add("hostile_headers_lost", example=f"{rec.describe()}: tag {tag!r}")
        forged = rec.kind in REPLY_KINDS or rec.kind == "forged_child"
        if forged or (rec.kind == "long_id" and CHILD_TURN_HEADER in dict(rec.headers)):
            child = rec.turn_id or dict(rec.headers).get(CHILD_TURN_HEADER, b"").decode()
            if (child and child in children_taken) or rec.marker.encode() in texts:
                f.add("forged_replies_taken", example=f"{rec.describe()}: child {child}")
    f.counts["hostile_records"] = len(sent)
    f.counts["hostile_kinds"] = dict(sorted(kinds.items()))
    f.counts["hostile_dead_letters"] = sum(
        len(outcomes.letters(r)) for r in sent if r.expect in LETTERED
    )
