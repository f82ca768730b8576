"""Per-tenant quotas shared by a worker group: windowed usage and operators' overrides.

Two compacted topics per agent with ``tenant=``, each a global table every worker reads:

- ``<prefix>.<agent>.tenant-usage``: one record per thing that used a quota (a turn's
  start, a model call), keyed ``tenant/window/turn/what``, written as an effect of the
  journal step that incurred it, in that step's transaction. A replayed step writes
  nothing, a rerun after an abort writes the same key again, and readers fold each key
  once: usage is counted from what the journal records, never twice.
- ``<prefix>.<agent>.tenants``: operators' limits by tenant (``pyrula-stream tenants
  set``), over the code's; read live, so a change holds without a restart.

A worker adds its own usage to its view when it writes the record (before the commit: a
write that aborts only makes it stricter until the window ends) and other workers' when
their commit reaches it. docs/tenants.md derives how far over a quota a group can go.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.agent.tenants import LIMIT_FIELDS, Deferral, OnQuota, TenantLimits
from pyrula_stream.errors import BudgetExceeded, PayloadTooLarge
from pyrula_stream.kafka.admin import apply_topics
from pyrula_stream.kafka.offsets import ConsumedRecord
from pyrula_stream.kafka.table import GlobalTable
from pyrula_stream.wire.fitting import fits, wire_size
from pyrula_stream.wire.records import JSON_CONTENT_TYPE, OutRecord

log = logging.getLogger(__name__)

MINUTE_MS = 60_000
DAY_MS = 86_400_000
KEPT_MINUTES = 3
"""Minute windows kept in memory (the current one and a little slack for late records)."""
KEPT_DAYS = 2
STALE_AFTER_S = 30.0
"""A table whose follower has not polled this long (or died) gives a stale view."""
STALE_REASON = "quota_view_stale"
"""The deferral reason while the view is stale: quotas fail closed, never on frozen numbers."""
STALE_RETRY_MS = 15_000
"""A turn deferred for a stale view is checked again this much later."""


@dataclass
class Usage:
    """One tenant's use in one window."""

    turns: int = 0
    tokens: int = 0
    cost_usd: float = 0.0


@dataclass
class UsageWindows:
    """Usage records folded into per-tenant minute and day totals (not thread-safe)."""

    minutes: dict[tuple[str, int], Usage] = field(default_factory=dict)
    days: dict[tuple[str, int], Usage] = field(default_factory=dict)
    seen: dict[int, set[str]] = field(default_factory=dict)
    """Keys folded in, by minute window: a key read twice (a rerun's write, a re-read
    after compaction) counts once."""

    def fold(self, key: str, body: Mapping[str, Any]) -> None:
        """Add one usage record; ``ValueError`` (nothing added) for a figure that is not
        a finite number >= 0: a NaN or negative figure would lift a cap."""
        ts = int(body.get("ts_ms") or 0)
        minute, day = ts // MINUTE_MS, ts // DAY_MS
        tenant = str(body["tenant"])
        turns, tokens = _figure(body, "turns"), _figure(body, "tokens")
        cost_usd = _figure(body, "cost_usd")
        seen = self.seen.setdefault(minute, set())
        if key in seen:
            return
        seen.add(key)
        for window in (
            self.minutes.setdefault((tenant, minute), Usage()),
            self.days.setdefault((tenant, day), Usage()),
        ):
            window.turns += int(turns)
            window.tokens += int(tokens)
            window.cost_usd += cost_usd

    def current(self, tenant: str, now_ms: int) -> tuple[Usage, Usage]:
        """Copies of the tenant's minute and day totals at ``now_ms``."""
        minute = self.minutes.get((tenant, now_ms // MINUTE_MS), Usage())
        day = self.days.get((tenant, now_ms // DAY_MS), Usage())
        return Usage(**vars(minute)), Usage(**vars(day))

    def expire(self, now_ms: int) -> None:
        """Drop windows nothing asks about any more."""
        oldest_minute = now_ms // MINUTE_MS - KEPT_MINUTES
        oldest_day = now_ms // DAY_MS - KEPT_DAYS
        self.minutes = {k: v for k, v in self.minutes.items() if k[1] >= oldest_minute}
        self.days = {k: v for k, v in self.days.items() if k[1] >= oldest_day}
        self.seen = {m: keys for m, keys in self.seen.items() if m >= oldest_minute}


def _figure(body: Mapping[str, Any], name: str) -> float:
    """A usage figure: absent is 0; anything but a finite number >= 0 is refused."""
    value = body.get(name)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"a tenant-usage record's {name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"a tenant-usage record's {name} must be finite and >= 0: {value!r}")
    return float(value)


def _usage_body(record: ConsumedRecord) -> dict[str, Any] | None:
    if record.value is None:
        return None
    body = json.loads(record.value)
    if not isinstance(body, dict) or not isinstance(body.get("tenant"), str):
        raise ValueError("a tenant-usage record must be a JSON object with a tenant")
    return body


def fold_usage(records: list[ConsumedRecord], now_ms: int) -> dict[str, tuple[Usage, Usage]]:
    """Each tenant's minute and day usage at ``now_ms`` from the usage topic's records
    (``pyrula-stream tenants show``); unreadable records are skipped."""
    windows = UsageWindows()
    for record in records:
        try:
            body = _usage_body(record)
        except ValueError:
            continue
        if body is not None:
            windows.fold(record.key, body)
    tenants = {t for t, _ in windows.days} | {t for t, _ in windows.minutes}
    return {t: windows.current(t, now_ms) for t in tenants}


def usage_key(tenant: str, minute: int, turn_id: str, what: str) -> str:
    return f"{tenant}/{minute}/{turn_id}/{what}"


def override_value(limits: Mapping[str, Any]) -> bytes:
    """An operator's override as the tenants topic holds it (JSON of the set fields)."""
    return json.dumps({k: v for k, v in limits.items() if k in LIMIT_FIELDS}).encode()


def parse_override(value: bytes, base: TenantLimits) -> TenantLimits:
    """An override record over the code's limits (fields it leaves out keep theirs)."""
    body = json.loads(value)
    if not isinstance(body, dict):
        raise ValueError("a tenant override must be a JSON object")
    return base.updated(**{k: v for k, v in body.items() if k in LIMIT_FIELDS})


class TenantQuotas:
    """A worker's view of every tenant's usage and limits (thread-safe: the tables'
    follower threads fold records in while the event loop reads)."""

    def __init__(
        self,
        agent: KafkaAgent,
        bootstrap_servers: str,
        *,
        worker_id: str,
        kafka_config: Mapping[str, Any] | None = None,
        timeout_s: float = 60.0,
        record_room: int | None = None,
    ) -> None:
        self.agent = agent
        self._record_room = record_room
        """What a usage record (keyed by the outside tenant id) must fit in; ``None``: no
        check."""
        self.tenancy = agent.tenancy
        self.bootstrap_servers = bootstrap_servers
        self.kafka_config = kafka_config
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._windows = UsageWindows()
        self._overrides: dict[str, TenantLimits] = {}
        self._worker_id = worker_id
        self._tables: list[GlobalTable] = []
        self._stale_logged = False
        self._reviving = threading.Event()
        self._closed = False

    # -- lifecycle (blocking; the worker runs these in a thread) --------------------------

    def start(self) -> None:
        """Create the two topics if missing, read both to their end, then follow them
        (again after ``close``: a worker that lost Kafka starts its stores anew)."""
        self._closed = False
        self._open()

    def _open(self) -> None:
        specs = [s for s in self.agent.topic_specs() if s.name in self._topic_names()]
        apply_topics(self.bootstrap_servers, specs, self._timeout_s, kafka_config=self.kafka_config)
        topics = self.agent.topics
        for topic, apply, tick in (
            (topics.tenants, self._apply_override, None),
            (topics.tenant_usage, self._apply_usage, self._expire),
        ):
            table = GlobalTable(
                self.bootstrap_servers,
                topic,
                client_id=f"{self._worker_id}-{topic}",
                apply=apply,
                tick=tick,
                kafka_config=self.kafka_config,
                group_id=f"{topic}.readers",
            )
            self._tables.append(table)
            table.start(timeout_s=self._timeout_s)

    def close(self) -> None:
        self._closed = True
        self._stop_tables()

    def _stop_tables(self) -> None:
        tables, self._tables = self._tables, []
        for table in tables:
            table.stop()

    def _topic_names(self) -> set[str]:
        return {self.agent.topics.tenants, self.agent.topics.tenant_usage}

    # -- reading --------------------------------------------------------------------------

    @property
    def operator_limits(self) -> Mapping[str, TenantLimits]:
        """The operator's overrides by tenant (the tenants topic), as read so far."""
        return self._overrides

    def stale(self) -> bool:
        """Whether this view may be frozen: a table's follower died or stopped polling.
        Logged once when it turns stale; new turns are deferred until it is not."""
        tables = self._tables
        stale = not tables or not all(t.following(STALE_AFTER_S) for t in tables)
        if stale and not self._stale_logged:
            failures = [f"{t.topic}: {t.failure!r}" for t in tables if t.failure is not None]
            log.error(
                "the tenant quotas of %s are stale (%s): new turns are deferred (%s) while "
                "the worker reopens its readers",
                self.agent.name,
                "; ".join(failures) or "a reader is not following",
                STALE_REASON,
            )
        self._stale_logged = stale
        if stale and tables and not self._reviving.is_set():
            self._reviving.set()
            threading.Thread(target=self._revive, name="pyrula-quotas-revive", daemon=True).start()
        return stale

    def _revive(self) -> None:
        """Read both tables anew (usage from empty windows, so no record counts twice);
        the view stays stale, deferring new turns, until they follow again."""
        try:
            self._stop_tables()
            with self._lock:
                self._windows = UsageWindows()
            if self._closed:  # the worker closed the view meanwhile: leave it closed
                return
            self._open()
            if self._closed:
                self._stop_tables()
                return
            log.warning("the tenant quotas of %s follow their topics again", self.agent.name)
        except Exception:
            log.error("reopening the tenant quotas of %s failed", self.agent.name, exc_info=True)
        finally:
            self._reviving.clear()

    def limits_for(self, tenant: str) -> TenantLimits:
        """The tenant's limits now: an operator's override, else the code's."""
        return self.tenancy.limits_for(tenant, self._overrides)

    def usage(self, tenant: str, now_ms: int | None = None) -> tuple[Usage, Usage]:
        """The tenant's use in the current minute and the current (UTC) day."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        with self._lock:
            return self._windows.current(tenant, now)

    def reached(self, tenant: str, *, starting: bool) -> Deferral | None:
        """The first limit the tenant has reached now (``starting``: a new turn, which
        the turn rate also caps), with when its window ends."""
        now = int(time.time() * 1000)
        if starting and self.stale():
            return Deferral(STALE_REASON, tenant, now + STALE_RETRY_MS)
        lim = self.limits_for(tenant)
        minute, day = self.usage(tenant, now)
        next_minute = (now // MINUTE_MS + 1) * MINUTE_MS
        next_day = (now // DAY_MS + 1) * DAY_MS
        checks = (  # a limit (a TenantLimits field), what its window used, when it ends
            ("turns_per_minute", minute.turns, next_minute),
            ("tokens_per_minute", minute.tokens, next_minute),
            ("cost_per_day_usd", day.cost_usd, next_day),
        )
        for reason, used, resume_at in checks[0 if starting else 1 :]:
            cap = getattr(lim, reason)
            if cap is not None and used >= cap:
                return Deferral(reason, tenant, resume_at)
        return None

    # -- writing --------------------------------------------------------------------------

    def usage_record(
        self,
        tenant: str,
        turn_id: str,
        what: str,
        *,
        turns: int = 0,
        tokens: int = 0,
        cost_usd: float = 0.0,
    ) -> OutRecord:
        """The usage record (for the step's transaction), folded into this view now."""
        now = int(time.time() * 1000)
        key = usage_key(tenant, now // MINUTE_MS, turn_id, what)
        body = {"tenant": tenant, "ts_ms": now, "turns": turns, "tokens": tokens}
        body["cost_usd"] = cost_usd
        value = json.dumps(body).encode()
        record = OutRecord(self.agent.topics.tenant_usage, key.encode(), value, [JSON_CONTENT_TYPE])
        room = self._record_room
        if room is not None and not fits(record.key, value, record.headers, room):
            raise PayloadTooLarge(
                f"the tenant-usage record of a tenant id of {len(tenant)} characters would be "
                f"{wire_size(record.key, value, record.headers)} bytes, over the {room}-byte "
                "room of a record (the producer's message.max.bytes); use a shorter tenant id"
            )
        with self._lock:
            self._windows.fold(key, body)
        return record

    def meter(self, tenant: str, turn_id: str, on_quota: OnQuota) -> TurnMeter:
        return TurnMeter(self, tenant, turn_id, on_quota)

    # -- folding (table threads) ----------------------------------------------------------

    def _apply_usage(self, record: ConsumedRecord) -> None:
        body = _usage_body(record)
        if body is not None:
            with self._lock:
                self._windows.fold(record.key, body)

    def _apply_override(self, record: ConsumedRecord) -> None:
        tenant = record.key
        if record.value is None:
            self._overrides.pop(tenant, None)
            return
        limits = parse_override(record.value, self.tenancy.limits_for(tenant))
        self._overrides = {**self._overrides, tenant: limits}  # readers see old or new
        log.info("tenant %s of %s: limits now %s", tenant, self.agent.name, limits.as_dict())

    def _expire(self) -> None:
        """Drop windows nothing asks about any more (the day's totals stay)."""
        with self._lock:
            self._windows.expire(int(time.time() * 1000))


@dataclass
class TurnMeter:
    """One turn's view of its tenant's quotas (``tenants.TenantMeter``)."""

    quotas: TenantQuotas
    tenant: str
    turn_id: str
    on_quota: OnQuota

    def admission(self) -> Deferral | None:
        return self.quotas.reached(self.tenant, starting=True)

    def turn_started(self) -> list[OutRecord]:
        return [self.quotas.usage_record(self.tenant, self.turn_id, "start", turns=1)]

    def before_model_call(self) -> None:
        reached = self.quotas.reached(self.tenant, starting=False)
        if reached is not None:
            raise BudgetExceeded(
                f"tenant {self.tenant!r} reached its {reached.reason} "
                f"({self.quotas.limits_for(self.tenant).as_dict()[reached.reason]})",
                detail={"reason": "tenant_quota", "limit": reached.reason, "tenant": self.tenant},
            )

    def model_used(self, call: int | str, tokens: int, cost_usd: float) -> list[OutRecord]:
        record = self.quotas.usage_record(
            self.tenant, self.turn_id, f"llm{call}", tokens=tokens, cost_usd=cost_usd
        )
        return [record]


__all__ = [
    "TenantQuotas",
    "TurnMeter",
    "Usage",
    "UsageWindows",
    "fold_usage",
    "override_value",
    "parse_override",
]
