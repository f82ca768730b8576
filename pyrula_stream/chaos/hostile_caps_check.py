"""What became of issue 46's hostile kinds (``hostile_caps.py``), read from the outside.

- ``hostile_not_in_dlq`` (with ``hostile_check``'s): a usage record naming a long
  tenant (``tenant_cut``) past ``MAX_TENANT_CHARS``; a flood signal neither dead-lettered
  nor journaled under its turn, and a flood's turn holding more than
  ``FLOOD_HELD_MAX`` signals or ``FLOOD_HELD_BYTES`` of them (one per signal past the
  cap, one for bytes); a signal with a long id that was not dead-lettered (``Outcomes``);
- ``forged_answers_taken``: forged answers a turn took: the answer journaled under its
  turn (``<turn>/signal:<id>``), or the gated call it approved took effect, whichever
  topic it was sent to (on ``--secured``, also ``<agent>.answers``, where the broker
  should refuse it: ``forged_answers_refused`` counts those refusals);
- ``forged_replies_taken`` (with ``hostile_check``'s): on ``--secured``, the made-up
  sub-agent reply a client sent with a forged answer, taken by its turn (a ``reply:``
  journal entry or ``subagent:result`` event for its child id, or its marker in the
  journal or events) should the broker have let it through (``forged_replies_refused``);
- ``invented_tenant_overshoot``: minutes in which the turns of the tenants the agent does
  not know (invented ids, and whatever bucket they share) passed the unknown-tenant
  ``turns_per_minute`` plus its over-quota bound (docs/tenants.md), read from the usage
  records the workers committed to ``<agent>.tenant-usage``;
- ``valid_turns_stuck``: valid turns with no terminal event when the run ended (the
  partition they wait on never moved past a hostile record).
"""

from __future__ import annotations

import json
from collections import Counter

from pyrula_stream.agent.tenants import DEFAULT_TENANT, MAX_TENANT_CHARS
from pyrula_stream.chaos.effects import read_effects
from pyrula_stream.chaos.hostile_caps import (
    FLOOD_HELD_BYTES,
    FLOOD_HELD_MAX,
    UNKNOWN_TENANT_LIMITS,
    reply_marker,
)
from pyrula_stream.chaos.hostile_record import HostileRecord
from pyrula_stream.chaos.tenants import LIMITS, turns_bound
from pyrula_stream.chaos.verify import Findings, Record, readable_events
from pyrula_stream.wire.events import EventType
from pyrula_stream.wire.journal_keys import REPLY, SIGNAL
from pyrula_stream.wire.signals import REFUSAL_REASONS

CAPS_KEYS = ("forged_answers_taken", "invented_tenant_overshoot", "valid_turns_stuck")
"""Gated in a ``--hostile`` run, beside ``hostile_check.HOSTILE_KEYS``."""


def journaled_signals(journal: list[Record]) -> dict[str, dict[str, int]]:
    """Signal ids journaled under each turn (a later tombstone, at the turn's end, keeps
    them counted), with the size of their journal record's value: what the turn held."""
    held: dict[str, dict[str, int]] = {}
    for rec in journal:
        turn, _, suffix = rec.key.rpartition("/")
        if not suffix.startswith(SIGNAL):
            continue
        sid = suffix[len(SIGNAL) :]
        if rec.value is not None:
            held.setdefault(turn, {})[sid] = len(rec.value)
    return held


def check_floods(
    sent: list[HostileRecord],
    by_source: dict[str, list[Record]],
    held: dict[str, dict[str, int]],
    f: Findings,
) -> None:
    """Each flood signal dead-lettered or held; no turn holds more than the caps."""
    for rec in sent:
        if rec.expect != "flood":
            continue
        mine = held.get(rec.turn_id or "", {})
        count = nbytes = 0
        for follow in rec.follow:
            letters = by_source.get(follow.source(), [])
            if len(letters) > 1:
                f.add("hostile_dlq_doubled", len(letters) - 1, example=rec.describe())
            if follow.note in mine:
                count += 1
                nbytes += len(follow.value or b"")
            elif not letters:
                f.add("hostile_not_in_dlq", example=f"{rec.describe()}: signal {follow.note} "
                      f"at {follow.source()} neither held nor dead-lettered")  # fmt: skip
        over = max(count - FLOOD_HELD_MAX, 0)
        if nbytes > FLOOD_HELD_BYTES:
            over = max(over, 1)
        if over:
            f.add("hostile_not_in_dlq", over, example=f"{rec.describe()}: turn {rec.turn_id} "
                  f"holds {count} flood signals, {nbytes} bytes")  # fmt: skip
        f.counts["flood_signals_held_most"] = max(f.counts.get("flood_signals_held_most", 0), count)


def taken_children(events: list[Record], journal: list[Record]) -> set[str]:
    """Child turn ids whose reply a parent took: a ``subagent:result`` event names it,
    or a ``<turn>/reply:<child>`` journal entry holds it."""
    taken: set[str] = set()
    for event in readable_events(events):
        if event.type == EventType.SUBAGENT_RESULT:
            taken.add(str(event.data.get("child_turn_id")))
    for entry in journal:
        _, _, suffix = entry.key.rpartition("/")
        if suffix.startswith(REPLY) and entry.value is not None:
            taken.add(suffix[len(REPLY) :])
    return taken


def _refusal(letter: Record) -> str:
    """A dead letter's code, and for a refused signal why (``signal_refused/wrong_topic``)."""
    code = letter.headers.get("pyrula.dlq.code") or "?"
    reason = letter.headers.get("pyrula.dlq.reason") or ""
    why = [r for r in REFUSAL_REASONS if f"{r}:" in reason]
    return f"{code}/{why[0]}" if why else code


def check_forged_answers(
    sent: list[HostileRecord],
    held: dict[str, dict[str, int]],
    gated_effects: str,
    events: list[Record],
    journal: list[Record],
    by_source: dict[str, list[Record]],
    f: Findings,
) -> None:
    """``forged_answers_taken`` and ``forged_replies_taken`` of the module docstring, and
    how each forged record was refused (``forged_refusals``: the broker's
    ``authorization`` error, else the dead letter's code and, for a signal, why: e.g.
    ``signal_refused/wrong_topic``)."""
    refusals: Counter[str] = Counter()
    applied = Counter(e.get("turn") for e in read_effects(gated_effects) if e.get("applied"))
    children = taken_children(events, journal)
    texts = b"\n".join(r.value for r in (*events, *journal) if r.value is not None)
    for rec in sent:
        if rec.expect != "not_taken":
            continue
        mine = held.get(rec.turn_id or "", {})
        answers = [follow for follow in rec.follow if not follow.reply]
        taken = [follow.note for follow in answers if follow.note in mine]
        if taken or applied[rec.turn_id]:
            f.add("forged_answers_taken", example=f"{rec.describe()}: turn {rec.turn_id} "
                  f"journaled {taken}, gated effect applied {applied[rec.turn_id]}")  # fmt: skip
        f.add("forged_answers_sent", sum(1 for follow in answers if follow.delivered))
        f.add("forged_answers_refused", sum(1 for follow in answers if follow.refused))
        for follow in rec.follow:
            if follow.refused:
                refusals["authorization"] += 1
            for letter in by_source.get(follow.source(), []) if follow.delivered else []:
                refusals[_refusal(letter)] += 1
            if not follow.reply:
                continue
            f.add("forged_replies_sent", 1 if follow.delivered else 0)
            f.add("forged_replies_refused", 1 if follow.refused else 0)
            if follow.note in children or reply_marker(rec.marker).encode() in texts:
                f.add("forged_replies_taken", example=f"{rec.describe()}: forged reply of "
                      f"child {follow.note} taken by turn {rec.turn_id}")  # fmt: skip
    f.counts["forged_refusals"] = dict(sorted(refusals.items()))


def check_invented_tenants(
    sent: list[HostileRecord], usage: list[Record], workers: int, f: Findings
) -> None:
    """Turns started per minute by the tenants the agent does not know, against one
    bucket. A usage record counts when its tenant is not a known one (an invented id, or
    whatever bucket they share) or its key (``<tenant>/<minute>/<turn>/<what>``) names
    an invented tenant's turn (should the bucket be the default tenant's)."""
    known = {*LIMITS, DEFAULT_TENANT}
    invented = {t for rec in sent for t in (rec.turn_id, *(f.note for f in rec.follow))
                if rec.kind == "invented_tenant" and t}  # fmt: skip
    seen: set[str] = set()
    per_minute: Counter[int] = Counter()
    for rec in usage:
        if rec.value is None or rec.key in seen:
            continue  # a record read twice counts once, as the workers fold them
        seen.add(rec.key)
        try:
            body = json.loads(rec.value)
            tenant, minute = str(body["tenant"]), int(body["ts_ms"]) // 60_000
            turns = int(body.get("turns") or 0)
        except (ValueError, TypeError, KeyError):
            continue
        parts = rec.key.rsplit("/", 2)
        turn = parts[1] if len(parts) == 3 else ""
        if tenant not in known or turn in invented:
            per_minute[minute] += turns
    cap = UNKNOWN_TENANT_LIMITS.turns_per_minute or 0
    bound = turns_bound(workers, UNKNOWN_TENANT_LIMITS.max_concurrent_turns or 1)
    for minute, turns in sorted(per_minute.items()):
        if turns > cap + bound:
            f.add("invented_tenant_overshoot", example=f"minute {minute}: {turns} turns of "
                  f"unknown tenants > {cap} + bound {bound}")  # fmt: skip
    cut = {rec.turn_id: rec for rec in sent if rec.expect == "tenant_cut" and rec.turn_id}
    for rec in usage:  # key: <tenant>/<minute>/<turn>/<what>
        parts = rec.key.rsplit("/", 3)
        if len(parts) == 4 and parts[2] in cut and len(parts[0]) > MAX_TENANT_CHARS:
            f.add("hostile_not_in_dlq", example=f"{cut[parts[2]].describe()}: usage record "
                  f"of a {len(parts[0])}-character tenant")  # fmt: skip
    f.counts["invented_tenant_turns"] = len(invented)
    f.counts["unknown_tenant_turns_per_minute"] = dict(sorted(per_minute.items()))
    f.counts["unknown_tenant_bound"] = {"turns_per_minute": cap, "bound": bound}


def check_stuck(ids: list[str], events: list[Record], f: Findings) -> None:
    ended = {event.turn_id for event in readable_events(events) if event.is_terminal}
    for turn in ids:
        if turn not in ended:
            f.add("valid_turns_stuck", example=f"{turn}: no terminal event")


def check_caps(
    sent: list[HostileRecord],
    ids: list[str],
    dlq: list[Record],
    events: list[Record],
    journal: list[Record],
    usage: list[Record],
    gated_effects: str,
    workers: int,
    f: Findings,
) -> None:
    """The counts of the module docstring."""
    f.zero(*CAPS_KEYS, "forged_answers_sent", "forged_answers_refused")
    f.zero("forged_replies_taken", "forged_replies_sent", "forged_replies_refused")
    by_source: dict[str, list[Record]] = {}
    for rec in dlq:
        source = rec.headers.get("pyrula.dlq.source")
        if source:
            by_source.setdefault(source, []).append(rec)
    held = journaled_signals(journal)
    check_floods(sent, by_source, held, f)
    check_forged_answers(sent, held, gated_effects, events, journal, by_source, f)
    check_invented_tenants(sent, usage, workers, f)
    check_stuck(ids, events, f)
