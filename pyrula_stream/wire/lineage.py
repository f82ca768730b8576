"""Where a sub-agent's turn came from: the headers a ``call_agent`` request carries.

A child turn request names its root turn, its parent (agent, prefix, turn, and the
partition of the parent's turns topic, which is where the reply goes), its depth, the
tightest depth limit above it, the budget its parent has left, and the W3C trace context
(``traceparent``, ``tracestate``) when the parent had one, and the tenant the parent ran
as (``pyrula-tenant``: a sub-agent's turn is its parent's tenant's, ``tenants.py``).
Readers in any language follow a tree from these headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.wire import caps

PREFIX = "pyrula-"
_FIELDS = {
    "root_turn_id": "pyrula-root-turn-id",
    "parent_turn_id": "pyrula-parent-turn-id",
    "parent_agent": "pyrula-parent-agent",
    "parent_prefix": "pyrula-parent-prefix",
    "parent_partition": "pyrula-parent-partition",
    "call_key": "pyrula-call-key",
    "depth": "pyrula-depth",
    "max_depth": "pyrula-max-depth",
    "tokens_left": "pyrula-budget-tokens-left",
    "cost_left_usd": "pyrula-budget-cost-left-usd",
    "traceparent": "traceparent",
    "tracestate": "tracestate",
    "tenant": "pyrula-tenant",
}
_REQUIRED = frozenset(
    (
        "root_turn_id",
        "parent_turn_id",
        "parent_agent",
        "parent_prefix",
        "parent_partition",
        "call_key",
        "depth",
    )
)
"""Without any of these a reply has nowhere to go (``str(None)`` is no agent's name)."""


@dataclass(frozen=True, slots=True)
class Lineage:
    """A child turn's place in its call tree (root turns have none)."""

    root_turn_id: str
    parent_turn_id: str
    parent_agent: str
    parent_prefix: str
    parent_partition: int
    call_key: str
    depth: int
    max_depth: int | None = None
    tokens_left: int | None = None
    cost_left_usd: float | None = None
    traceparent: str | None = None
    tracestate: str | None = None
    tenant: str | None = None
    """The tenant of the call tree (the parent's), which a child inherits."""

    @property
    def replies_topic(self) -> str:
        """Where the child's outcome goes: the parent agent's replies topic."""
        return f"{self.parent_prefix}.{self.parent_agent}.replies"

    def headers(self) -> list[tuple[str, bytes]]:
        out = []
        for name, header in _FIELDS.items():
            value = getattr(self, name)
            if value is not None:
                out.append((header, str(value).encode()))
        return out

    def as_dict(self) -> dict[str, str]:
        return {h: v.decode() for h, v in self.headers()}

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> Lineage | None:
        """The lineage in ``headers``; ``None`` for a root turn. A partial or unreadable
        lineage is a malformed request (its reply would have nowhere to go)."""
        if _FIELDS["parent_turn_id"] not in headers:
            return None
        missing = [h for name, h in _FIELDS.items() if name in _REQUIRED and not headers.get(h)]
        if missing:
            raise MalformedRecordError(
                f"sub-agent request lacks lineage headers {missing}: call_agent sets them; "
                "a producer sends every pyrula-* lineage header or none"
            )
        raw = {name: headers.get(h) for name, h in _FIELDS.items()}
        for name in ("root_turn_id", "parent_turn_id"):
            what = f"lineage {_FIELDS[name]}"
            caps.check_text(str(raw[name]), caps.MAX_TURN_ID_CHARS, what, "MAX_TURN_ID_CHARS")
        caps.check_text(
            raw["tenant"] or "", caps.MAX_TENANT_CHARS, "lineage pyrula-tenant", "MAX_TENANT_CHARS"
        )
        try:
            return cls(
                root_turn_id=str(raw["root_turn_id"]),
                parent_turn_id=str(raw["parent_turn_id"]),
                parent_agent=str(raw["parent_agent"]),
                parent_prefix=str(raw["parent_prefix"]),
                parent_partition=int(str(raw["parent_partition"])),
                call_key=str(raw["call_key"]),
                depth=int(str(raw["depth"])),
                max_depth=_opt_int(raw["max_depth"]),
                tokens_left=_opt_int(raw["tokens_left"]),
                cost_left_usd=float(raw["cost_left_usd"]) if raw["cost_left_usd"] else None,
                traceparent=raw["traceparent"] or None,
                tracestate=raw["tracestate"] or None,
                tenant=raw["tenant"] or None,
            )
        except (TypeError, ValueError) as exc:
            raise MalformedRecordError(
                f"sub-agent request has unreadable lineage headers ({exc}): call_agent sets "
                "them; a producer sends every pyrula-* lineage header or none"
            ) from None


def _opt_int(value: str | None) -> int | None:
    return int(value) if value else None
