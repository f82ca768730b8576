"""What became of issue 46's hostile kinds (``hostile_caps.py``), read from the outside.

- ``hostile_not_in_dlq`` (with ``hostile_check``'s): a usage record naming a long
  tenant (``tenant_cut``) past ``MAX_TENANT_CHARS``; a flood signal neither dead-lettered
  nor journaled under its turn, and a flood's turn holding more than
  ``FLOOD_HELD_MAX`` signals or ``FLOOD_HELD_BYTES`` of them (one per signal past the
  cap, one for bytes); a signal with a long id that was not dead-lettered (``Outcomes``);
- ``forged_answers_taken``: forged answers a turn took: the answer journaled under its
  turn (``<turn>/signal:<id>``), or the gated call it approved took effect;
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
)
from pyrula_stream.chaos.hostile_record import HostileRecord
from pyrula_stream.chaos.tenants import LIMITS, turns_bound
from pyrula_stream.chaos.verify import Findings, Record
from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.wire.events import decode_event
from pyrula_stream.wire.journal_keys import SIGNAL

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


def check_forged_answers(
    sent: list[HostileRecord],
    held: dict[str, dict[str, int]],
    gated_effects: str,
    f: Findings,
) -> None:
    applied = Counter(e.get("turn") for e in read_effects(gated_effects) if e.get("applied"))
    for rec in sent:
        if rec.expect != "not_taken":
            continue
        mine = held.get(rec.turn_id or "", {})
        taken = [follow.note for follow in rec.follow if follow.note in mine]
        if taken or applied[rec.turn_id]:
            f.add("forged_answers_taken", example=f"{rec.describe()}: turn {rec.turn_id} "
                  f"journaled {taken}, gated effect applied {applied[rec.turn_id]}")  # fmt: skip
        f.add("forged_answers_sent", sum(1 for follow in rec.follow if follow.delivered))


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
    ended: set[str] = set()
    for rec in events:
        if rec.value is None:
            continue
        try:
            event = decode_event(rec.value, rec.headers)
        except MalformedRecordError:
            continue
        if event.is_terminal:
            ended.add(event.turn_id)
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
    f.zero(*CAPS_KEYS, "forged_answers_sent")
    by_source: dict[str, list[Record]] = {}
    for rec in dlq:
        source = rec.headers.get("pyrula.dlq.source")
        if source:
            by_source.setdefault(source, []).append(rec)
    held = journaled_signals(journal)
    check_floods(sent, by_source, held, f)
    check_forged_answers(sent, held, gated_effects, f)
    check_invented_tenants(sent, usage, workers, f)
    check_stuck(ids, events, f)
