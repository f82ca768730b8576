"""The checks of ``make chaos ARGS=--tenants`` on hand-made records: usage past a quota
within the documented bound passes, one unit beyond it counts in ``quota_overshoot``, and
deferrals and tenant-quota stops are counted once each (a re-read event is not)."""

from __future__ import annotations

import json
from typing import Any

from pyrula_stream.chaos import verify
from pyrula_stream.chaos.tenants import LIMITS, SLOTS, check_tenants, tokens_bound, turns_bound
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import Event

WORKERS = 3
MINUTE = 29_000_000
TS = MINUTE * 60_000 + 1_000


def usage(tenant: str, turn: str, what: str, *, turns: int = 0, tokens: int = 0) -> verify.Record:
    body = {"tenant": tenant, "ts_ms": TS, "turns": turns, "tokens": tokens, "cost_usd": 0.0}
    key = f"{tenant}/{MINUTE}/{turn}/{what}"
    return verify.Record(0, 0, key, json.dumps(body).encode(), {}, TS)


def event(turn: str, seq: int, type_: str, data: dict[str, Any]) -> verify.Record:
    encoded = serde.encode("event", Event(type_, turn, "chaos", seq, 0, 1, data))
    headers = {serde.CONTENT_TYPE_HEADER: serde.content_type("event")}
    return verify.Record(0, seq, turn, encoded, headers, 0)


def starts(tenant: str, n: int) -> list[verify.Record]:
    return [usage(tenant, f"{tenant}-{i}", "start", turns=1) for i in range(n)]


def test_usage_within_the_bound_passes_and_one_past_it_is_an_overshoot() -> None:
    turns_cap = LIMITS["t0"].turns_per_minute
    tokens_cap = LIMITS["t1"].tokens_per_minute
    assert turns_cap is not None and tokens_cap is not None
    biggest = 100
    turns_limit = turns_cap + turns_bound(WORKERS, SLOTS)
    tokens_limit = tokens_cap + tokens_bound(WORKERS, SLOTS, biggest)
    calls = [usage("t1", f"c{i}", "llm1", tokens=biggest) for i in range(tokens_limit // biggest)]
    within = [*starts("t0", turns_limit), *calls]

    f = verify.Findings()
    check_tenants([], [], within, WORKERS, 50, f)
    assert f.counts["quota_overshoot"] == 0
    assert f.counts["quota_most_past_cap"]["turns_per_minute"] == turns_limit - turns_cap
    assert f.counts["quota_bounds"]["biggest_call_tokens"] == biggest

    past = [*within, usage("t0", "one-more", "start", turns=1)]
    past.append(usage("t1", "one-more", "llm1", tokens=biggest))
    f = verify.Findings()
    check_tenants([], [], past, WORKERS, 50, f)
    assert f.counts["quota_overshoot"] == 2
    assert any("turns_per_minute" in e for e in f.examples["quota_overshoot"])
    assert any("tokens_per_minute" in e for e in f.examples["quota_overshoot"])


def test_a_record_read_twice_counts_once_and_fewer_worker_slots_tighten_the_bound() -> None:
    turns_cap = LIMITS["t0"].turns_per_minute
    assert turns_cap is not None
    exact = starts("t0", turns_cap + turns_bound(WORKERS, 1))
    f = verify.Findings()
    check_tenants([], [], [*exact, *exact], WORKERS, 50, f)  # a rerun writes the same key
    assert f.counts["quota_overshoot"] == 0
    # Workers with one slot each: the tenant's cap of SLOTS never binds, the bound is smaller.
    f = verify.Findings()
    check_tenants([], [], [*exact, usage("t0", "x", "start", turns=1)], WORKERS, 1, f)
    assert f.counts["quota_overshoot"] == 1


def test_deferrals_and_quota_stops_are_counted_once_per_event() -> None:
    deferred = {"reason": "turns_per_minute", "tenant": "t0", "resume_at": TS + 60_000}
    stop = {"code": "budget_exceeded", "message": "m", "detail": {"reason": "tenant_quota"}}
    events = [
        event("a", 0, "run:deferred", deferred),
        event("a", 0, "run:deferred", deferred),  # read twice: one event
        event("a", 1, "run:deferred", {**deferred, "reason": "tokens_per_minute"}),
        event("a", 2, "run:error", stop),
        event("b", 0, "run:error", {"code": "agent_error", "message": "m"}),
        event("other", 0, "run:deferred", deferred),  # not a turn of this run
    ]
    f = verify.Findings()
    check_tenants(["a", "b"], events, [], WORKERS, 50, f)
    assert f.counts["deferrals"] == 2
    assert f.counts["deferrals_by_reason"] == {"turns_per_minute": 1, "tokens_per_minute": 1}
    assert f.counts["deferred_turns"] == 1
    assert f.counts["tenant_quota_stops"] == 1
