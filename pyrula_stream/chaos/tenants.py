"""``--tenants``: three tenants with small quotas share the chaos agent while workers die.

Each turn belongs to one of ``TENANTS`` (round-robin by submission, in the request's
``metadata["tenant"]``). Their limits are small enough that turns are deferred, at their
start, for ``turns_per_minute`` and ``tokens_per_minute``, and that running turns stop with
``budget_exceeded`` (``reason: "tenant_quota"``). Afterwards the usage the group committed
to ``<agent>.tenant-usage`` is folded window by window, as the workers fold it, and held
against each quota plus the over-quota bound of docs/tenants.md:

- ``tokens_per_minute``: ``cap + (2W - 1) * C * M``;
- ``turns_per_minute``: ``cap + 2 * (W - 1) * C``;

(``W`` workers, ``C`` the tenant's turn slots on one worker, ``M`` the most tokens one
recorded model call used). ``quota_overshoot`` counts the windows whose usage passed that;
the run proves something only if some turn was deferred (``deferrals``).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from pyrula_stream.agent.tenants import DEFAULT_TENANT, TenantLimits
from pyrula_stream.chaos.verify import Findings, Record
from pyrula_stream.runtime.quotas import UsageWindows
from pyrula_stream.wire.events import EventType, decode_event
from pyrula_stream.wire.serde import TurnRequest

TENANTS_ENV = "PYRULA_CHAOS_TENANTS"
"""Set to 1: the chaos agent has tenants and the quotas below (``chaos/agent.py``)."""
TENANT_KEYS = ("quota_overshoot",)
TENANTS = ("t0", "t1", "t2")
SLOTS = 2
"""Each tenant's ``max_concurrent_turns`` (per worker): ``C`` of the bounds."""
LIMITS = {
    "t0": TenantLimits(max_concurrent_turns=SLOTS, turns_per_minute=12),
    "t1": TenantLimits(max_concurrent_turns=SLOTS, tokens_per_minute=1_200),
    "t2": TenantLimits(max_concurrent_turns=SLOTS, turns_per_minute=15, tokens_per_minute=1_800),
}
"""One tenant capped by turns, one by tokens, one by both."""
DEFAULT_TURNS = 90
DEFAULT_TIMEOUT_S = 420.0
"""Deferred turns wait for later minutes: ``--timeout`` for a tenants run."""
KILL_WINDOW_EXTRA_S = 90.0
"""The kills go on this long past the submissions, while deferred turns resume."""


def tenant_for(i: int) -> str:
    """The tenant of the ``i``-th submitted turn."""
    return TENANTS[i % len(TENANTS)]


def chaos_tenant(request: TurnRequest) -> str | None:
    """The chaos agent's tenant source: the submitter's ``metadata["tenant"]``."""
    tenant = request.metadata.get("tenant")
    return tenant if isinstance(tenant, str) else None


def tenancy_options(unknown: TenantLimits | None = None) -> dict[str, Any]:
    """``@kafka_agent`` keywords of the chaos agent in a tenants run (``unknown``: the
    limits of a tenant not in ``LIMITS``, as a ``--hostile`` run sets them)."""
    # With ``unknown``, the valid turns without a tenant (the default one) stay unlimited.
    known = {**LIMITS, DEFAULT_TENANT: TenantLimits()} if unknown else LIMITS
    return {
        "tenant": chaos_tenant,
        "tenant_limits": unknown or TenantLimits(max_concurrent_turns=SLOTS),
        "tenant_overrides": known,
        "on_quota": "defer",
    }


def turns_bound(workers: int, slots: int) -> int:
    """How many turns past ``turns_per_minute`` a group may start (docs/tenants.md)."""
    return 2 * (workers - 1) * slots


def tokens_bound(workers: int, slots: int, biggest_call: int) -> int:
    """How many tokens past ``tokens_per_minute`` a group may use (docs/tenants.md)."""
    return (2 * workers - 1) * slots * biggest_call


def check_tenants(
    ids: list[str],
    events: list[Record],
    usage: list[Record],
    workers: int,
    worker_slots: int,
    f: Findings,
) -> None:
    """``quota_overshoot`` and what the quotas did (module docstring)."""
    f.zero(*TENANT_KEYS)
    wanted = set(ids)
    windows = UsageWindows()
    biggest = 0
    for rec in usage:
        if rec.value is None:
            continue
        body = json.loads(rec.value)
        windows.fold(rec.key, body)
        biggest = max(biggest, int(body.get("tokens") or 0))
    slots = min(SLOTS, worker_slots)
    over_cap: dict[str, int] = {}
    for (tenant, minute), used in sorted(windows.minutes.items()):
        limits = LIMITS.get(tenant, TenantLimits())
        for name, cap, value, bound in (
            ("turns_per_minute", limits.turns_per_minute, used.turns, turns_bound(workers, slots)),
            (
                "tokens_per_minute",
                limits.tokens_per_minute,
                used.tokens,
                tokens_bound(workers, slots, biggest),
            ),
        ):
            if cap is None:
                continue
            over_cap[name] = max(over_cap.get(name, 0), value - cap)
            if value > cap + bound:
                f.add(
                    "quota_overshoot",
                    1,
                    example=f"{tenant} minute {minute}: {name} {value} > {cap} + bound {bound}",
                )
    deferred: Counter[str] = Counter()
    deferred_turns: set[str] = set()
    stops = 0
    seen: set[tuple[str, int]] = set()
    for rec in events:
        if rec.value is None:
            continue
        event = decode_event(rec.value, rec.headers)
        if event.turn_id not in wanted or (event.turn_id, event.seq) in seen:
            continue
        seen.add((event.turn_id, event.seq))
        if event.type == EventType.RUN_DEFERRED:
            deferred[str(event.data.get("reason"))] += 1
            deferred_turns.add(event.turn_id)
        elif event.type == EventType.RUN_ERROR:
            detail = event.data.get("detail") or {}
            if isinstance(detail, dict) and detail.get("reason") == "tenant_quota":
                stops += 1
    f.counts["deferrals"] = sum(deferred.values())
    f.counts["deferrals_by_reason"] = dict(deferred)
    f.counts["deferred_turns"] = len(deferred_turns)
    f.counts["tenant_quota_stops"] = stops
    f.counts["quota_windows"] = len(windows.minutes)
    f.counts["quota_most_past_cap"] = over_cap
    f.counts["quota_bounds"] = {
        "turns_per_minute": turns_bound(workers, slots),
        "tokens_per_minute": tokens_bound(workers, slots, biggest),
        "biggest_call_tokens": biggest,
    }
