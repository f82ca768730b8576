"""Tenants: who a turn belongs to, and what each tenant may use.

Teams run one agent for many customers. ``@kafka_agent(tenant=...)`` says where a turn's
tenant comes from (the record key, a header, or a function of the request); the worker
resolves it once, when the request is read, and the turn carries it from then on (its
events, its result record, its status, its metrics). ``TenantLimits`` caps what one
tenant's turns may use; the default applies to every tenant without an override of its
own. Declarations only: the worker's admission (``runtime/fairness.py``) enforces them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Protocol

from pyrula_stream.errors import AgentRegistrationError
from pyrula_stream.wire import caps
from pyrula_stream.wire.records import OutRecord
from pyrula_stream.wire.serde import TurnRequest

DEFAULT_TENANT = "default"
"""The tenant of a turn whose source gives none (no key, no such header, ``None``)."""

UNKNOWN_TENANT = "unknown"
"""The one bucket every tenant nobody configured shares (``Tenancy.unknown_tenants``):
a producer that invents a new tenant id per turn gets this bucket's share and limits,
never one of its own."""

MAX_TENANT_CHARS = caps.MAX_TENANT_CHARS
"""A tenant id is a label and a key: one the source names is cut to this, never refused."""

HEADER_SOURCE = "header:"

TenantSource = str | Callable[[TurnRequest], str | None]
"""``"key"``, ``"header:<name>"``, or a function of the request."""

OnQuota = Literal["defer", "fail"]
UnknownTenants = Literal["shared", "own"]
"""``"shared"``: a tenant the worker does not know runs as ``UNKNOWN_TENANT``;
``"own"``: every tenant id gets its own share (trusted producers only)."""


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """What one tenant may use; ``None`` leaves a dimension uncapped.

    ``max_concurrent_turns`` caps the tenant's turns of this agent holding a task on one
    worker (parked turns hold none), so a group of W workers runs at most W times it;
    ``turns_per_minute``, ``tokens_per_minute`` and ``cost_per_day_usd`` are windowed
    usage shared by the worker group (see docs/tenants.md for the over-quota bound).
    """

    max_concurrent_turns: int | None = None
    tokens_per_minute: int | None = None
    cost_per_day_usd: float | None = None
    turns_per_minute: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and (isinstance(value, bool) or value <= 0):
                raise AgentRegistrationError(
                    f"TenantLimits.{f.name} must be a positive number or None, got {value!r}"
                )

    def updated(self, **values: Any) -> TenantLimits:
        """A copy with ``values`` set (an operator's override of some fields only)."""
        return replace(self, **values)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


LIMIT_FIELDS = tuple(f.name for f in fields(TenantLimits))
"""The names ``pyrula-stream tenants set AGENT TENANT key=value`` accepts."""


def parse_limit(name: str, text: str) -> int | float | None:
    """A limit's value from text (``none`` clears it); refuses unknown names."""
    if name not in LIMIT_FIELDS:
        raise AgentRegistrationError(
            f"unknown tenant limit {name!r}; the limits are {', '.join(LIMIT_FIELDS)}"
        )
    if text.strip().lower() in ("none", "null", ""):
        return None
    try:
        return float(text) if name == "cost_per_day_usd" else int(text)
    except ValueError:
        raise AgentRegistrationError(f"tenant limit {name}={text!r} is not a number") from None


@dataclass(frozen=True)
class Tenancy:
    """An agent's tenant source, default limits and per-tenant overrides (in code)."""

    source: TenantSource | None = None
    limits: TenantLimits = field(default_factory=TenantLimits)
    overrides: Mapping[str, TenantLimits] = field(default_factory=dict)
    on_quota: OnQuota = "defer"
    unknown_tenants: UnknownTenants = "shared"

    @property
    def enabled(self) -> bool:
        """Whether turns have tenants at all (without a source every turn is the default
        tenant and nothing about it is published)."""
        return self.source is not None

    def limits_for(
        self, tenant: str, operator: Mapping[str, TenantLimits] | None = None
    ) -> TenantLimits:
        """The tenant's limits: an operator's override (tenants topic) wins over code's."""
        if operator is not None and tenant in operator:
            return operator[tenant]
        return self.overrides.get(tenant, self.limits)

    def known(self, tenant: str, operator: Mapping[str, TenantLimits] | None = None) -> bool:
        """Whether ``tenant`` was configured (an override in code or the operator's
        tenants topic); ``DEFAULT_TENANT`` and ``UNKNOWN_TENANT`` are buckets of their own."""
        return (
            tenant in (DEFAULT_TENANT, UNKNOWN_TENANT)
            or tenant in self.overrides
            or (operator is not None and tenant in operator)
        )

    def tenant_of(self, request: TurnRequest, headers: Mapping[str, str]) -> str:
        """The request's tenant by the agent's source; ``DEFAULT_TENANT`` when it names
        none (a sub-agent's turn then takes its parent's, ``resolve``)."""
        return self._named(request, headers) or DEFAULT_TENANT

    def _named(self, request: TurnRequest, headers: Mapping[str, str]) -> str | None:
        """The tenant the source names, if any. A function that raises is a bug of the
        user's: its turn goes to the default tenant rather than being lost. The key of a
        sub-agent's request is its own turn id, which names no tenant."""
        source = self.source
        found: str | None
        if source is None:
            return None
        if callable(source):
            try:
                found = source(request)
            except Exception:
                found = None
        elif source == "key":
            found = None if request.lineage is not None else request.record_key or request.key
        else:
            found = headers.get(source[len(HEADER_SOURCE) :])
        if not found:
            return None
        return str(found)[:MAX_TENANT_CHARS]

    def resolve(self, request: TurnRequest, headers: Mapping[str, str]) -> TurnRequest:
        """The request with its tenant set (a request that has one keeps it: a parked
        turn resumes as the tenant it was read as). A sub-agent's turn is its parent's
        tenant's (``Lineage.tenant``) unless this agent's source names one of its own.
        Admission counts a turn without a tenant as ``DEFAULT_TENANT``'s."""
        if request.tenant is not None or self.source is None:
            return request  # without a source nothing about tenants goes on the wire
        inherited = request.lineage.tenant if request.lineage is not None else None
        tenant = self._named(request, headers) or inherited or DEFAULT_TENANT
        return replace(request, tenant=tenant)


@dataclass(frozen=True, slots=True)
class Deferral:
    """Why a turn may not start now, and when its tenant's window has room again."""

    reason: str
    """The limit that is reached: ``turns_per_minute``, ``tokens_per_minute``, ..."""
    tenant: str
    resume_at_ms: int


class TenantMeter(Protocol):
    """What a turn asks of its tenant's quotas; the worker implements it
    (``runtime/quotas.py``), the step kernel and the tool loop call it."""

    tenant: str
    on_quota: OnQuota

    def admission(self) -> Deferral | None:
        """``None`` when the turn may start now."""
        ...

    def turn_started(self) -> list[OutRecord]:
        """The usage record of the turn's start, to commit with its start step."""
        ...

    def before_model_call(self) -> None:
        """Raise ``BudgetExceeded`` (``reason: "tenant_quota"``) when the tenant's token
        or cost cap is reached."""
        ...

    def model_used(self, call: int | str, tokens: int, cost_usd: float) -> list[OutRecord]:
        """The usage record of model call ``call`` (its index, or a name such as
        compaction's), to commit with its journal step."""
        ...


def check_tenancy(agent_name: str, tenancy: Tenancy) -> None:
    """Refuse a source or quota mode that would mean nothing at run time."""
    source = tenancy.source
    readable = (
        source is None
        or callable(source)
        or source == "key"
        or (
            isinstance(source, str)
            and source.startswith(HEADER_SOURCE)
            and len(source) > len(HEADER_SOURCE)
        )
    )
    if not readable:
        raise AgentRegistrationError(
            f"agent '{agent_name}': tenant must be 'key', 'header:<name>' or a function "
            f"of the request, got {source!r}"
        )
    if tenancy.unknown_tenants not in ("shared", "own"):
        raise AgentRegistrationError(
            f"agent '{agent_name}': unknown_tenants must be 'shared' or 'own', "
            f"got {tenancy.unknown_tenants!r}"
        )
    if tenancy.on_quota not in ("defer", "fail"):
        raise AgentRegistrationError(
            f"agent '{agent_name}': on_quota must be 'defer' or 'fail', got {tenancy.on_quota!r}"
        )
    for tenant, limits in tenancy.overrides.items():
        if not isinstance(limits, TenantLimits):
            raise AgentRegistrationError(
                f"agent '{agent_name}': tenant_limits[{tenant!r}] must be TenantLimits"
            )


__all__ = [
    "DEFAULT_TENANT",
    "LIMIT_FIELDS",
    "UNKNOWN_TENANT",
    "Deferral",
    "OnQuota",
    "Tenancy",
    "TenantLimits",
    "TenantMeter",
    "TenantSource",
    "UnknownTenants",
    "check_tenancy",
    "parse_limit",
]
