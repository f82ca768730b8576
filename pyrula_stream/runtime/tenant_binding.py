"""Which tenant a request is charged to: the one it names only when the worker can trust it.

A tenant id is outside input. Were every id its own share, a producer could invent a new
one per turn and dodge every per-tenant cap (and win round-robin share), or name a
victim's tenant and spend its quota. So the worker binds the tenant when it reads the
request (``RecordIntake``), before fairness, quotas, events and metrics see it:

- with ``WorkerOptions.tenant_key``, a tenant the agent's source names counts only when
  the request carries its signature for this turn (``access/tenant_signature.py``);
- otherwise (and for a tenant a sub-agent inherits from its parent's lineage), with
  ``unknown_tenants="shared"`` a tenant counts only when it is configured: an override
  in code or in the operator's tenants topic.

Every other tenant runs as ``UNKNOWN_TENANT``: one bucket, held to the default limits (or
the operator's override for ``"unknown"``), so inventing ids gains nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from pyrula_stream.access.tenant_signature import TENANT_SIGNATURE_HEADER, signed_by
from pyrula_stream.agent.tenants import DEFAULT_TENANT, UNKNOWN_TENANT, Tenancy, TenantLimits
from pyrula_stream.wire.serde import TurnRequest

log = logging.getLogger(__name__)


def bind_tenant(
    agent: str,
    tenancy: Tenancy,
    request: TurnRequest,
    headers: Mapping[str, str],
    *,
    key: bytes | None,
    operator: Mapping[str, TenantLimits] | None,
) -> TurnRequest:
    """``request`` with the tenant it is charged to (see the module doc)."""
    if request.tenant is not None or not tenancy.enabled:
        return tenancy.resolve(request, headers)  # already bound (a parked turn) or none
    named = tenancy.tenant_of(request, headers)
    resolved = tenancy.resolve(request, headers)
    tenant = resolved.tenant or DEFAULT_TENANT
    if tenant in (DEFAULT_TENANT, UNKNOWN_TENANT):
        return resolved
    if key is not None and named == tenant:  # the source named it: it must be signed
        signature = headers.get(TENANT_SIGNATURE_HEADER)
        if signed_by(key, agent, request.turn_id, tenant, signature):
            return resolved
        log.debug(  # per turn: a flood of forgeries must not flood the log
            "turn %s of %s names tenant %.80r without a valid %s: it runs as %r",
            request.turn_id,
            agent,
            tenant,
            TENANT_SIGNATURE_HEADER,
            UNKNOWN_TENANT,
        )
        return replace(resolved, tenant=UNKNOWN_TENANT)
    if tenancy.unknown_tenants == "own" or tenancy.known(tenant, operator):
        return resolved
    return replace(resolved, tenant=UNKNOWN_TENANT)


__all__ = ["bind_tenant"]
