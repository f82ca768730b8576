"""A tenant id is outside input: the worker charges a turn to the tenant it names only when
it can trust it (issue 46). Invented ids share the one ``"unknown"`` bucket; with a tenant
key, only a tenant signed for that very turn counts; a usage record with a NaN or
negative figure is refused; a quota view whose reader stopped defers new turns."""

from __future__ import annotations

import logging
import math

import pytest

from pyrula_stream import AgentContext, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.access.tenant_signature import (
    TENANT_SIGNATURE_HEADER,
    signed_tenant_headers,
    tenant_signature,
)
from pyrula_stream.agent.tenants import UNKNOWN_TENANT, TenantLimits
from pyrula_stream.client.kafka_client import new_request
from pyrula_stream.llm import FakeLLM
from pyrula_stream.runtime.quotas import STALE_REASON, TenantQuotas, UsageWindows
from pyrula_stream.testing import running_worker, unique_name, wait_for
from pyrula_stream.wire.events import Event
from tests.agent.test_tenants_quotas import fresh_minute

KEY = b"k" * 40
QUICK_STOP = WorkerOptions(shutdown_grace=0.5)


def tenants_of(events: list[Event]) -> set[str | None]:
    return {e.data.get("tenant") for e in events}


async def submit_as(
    client: KafkaAgentClient, agent: str, tenant: str, signature: str | None = None
) -> list[Event]:
    """A turn whose ``x-tenant`` header names ``tenant`` (signed when given), run to its end."""
    headers = [("x-tenant", tenant.encode())]
    if signature is not None:
        headers.append((TENANT_SIGNATURE_HEADER, signature.encode()))
    handle = await client.submit_request(new_request(agent, None, None, None, {}), headers=headers)
    return [e async for e in client.stream(agent, handle.turn_id, idle_timeout_seconds=60)]


async def test_invented_tenants_share_one_bucket_and_gain_nothing(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Five turns under five invented tenant ids share ``"unknown"`` and its two turns a
    minute (at most four of them fit even if a minute ends among them); a configured
    tenant keeps its own share."""

    @kafka_agent(
        name=unique_name("invented"),
        llm=FakeLLM(["ok"]),
        partitions=1,
        tenant="header:x-tenant",
        tenant_limits=TenantLimits(turns_per_minute=2),
        tenant_overrides={"acme": TenantLimits(turns_per_minute=2)},
        on_quota="fail",
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "hi"}])

    await fresh_minute(15)
    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        invented = [await submit_as(client, agent.name, f"made-up-{i}") for i in range(5)]
        acme = await submit_as(client, agent.name, "acme")

    assert set().union(*(tenants_of(run) for run in invented)) == {UNKNOWN_TENANT}
    refused = [run[-1].data for run in invented if run[-1].type == "run:error"]
    assert refused, "invented ids did not escape the shared bucket's turn rate"
    assert {(d["code"], d["detail"]["tenant"]) for d in refused} == {
        ("budget_exceeded", UNKNOWN_TENANT)
    }
    assert acme[-1].type == "run:complete"
    assert tenants_of(acme) == {"acme"}


async def test_with_a_tenant_key_only_a_tenant_signed_for_the_turn_counts(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Even with ``unknown_tenants="own"``: a signed tenant is trusted; an unsigned one, or
    one carrying a signature made for another turn (copied off the turns topic), runs as
    ``"unknown"``."""

    @kafka_agent(
        name=unique_name("signed"),
        llm=FakeLLM(["ok"]),
        partitions=1,
        tenant="header:x-tenant",
        unknown_tenants="own",
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "hi"}])

    options = WorkerOptions(shutdown_grace=0.5, tenant_key=KEY)
    async with running_worker(agent, kafka_bootstrap_servers, options):
        signed_request = new_request(agent.name, None, None, None, {})
        signature = tenant_signature(KEY, agent.name, signed_request.turn_id, "acme")
        headers = signed_tenant_headers(KEY, agent.name, signed_request.turn_id, "acme", "x-tenant")
        signed = await client.submit_request(signed_request, headers=headers)
        stream = client.stream(agent.name, signed.turn_id, idle_timeout_seconds=60)
        signed_events = [e async for e in stream]
        replayed = await submit_as(client, agent.name, "acme", signature)
        unsigned = await submit_as(client, agent.name, "globex")
        wrong_key = tenant_signature(b"x" * 40, agent.name, "t", "globex")
        forged = await submit_as(client, agent.name, "globex", wrong_key)

    assert tenants_of(signed_events) == {"acme"}
    for run in (replayed, unsigned, forged):
        assert run[-1].type == "run:complete"
        assert tenants_of(run) == {UNKNOWN_TENANT}


def test_usage_records_with_nan_or_negative_figures_are_refused() -> None:
    """A NaN cost or negative tokens would lift a cap: the record is refused whole."""
    windows = UsageWindows()
    windows.fold("acme/1/t/llm1", {"tenant": "acme", "ts_ms": 60_000, "tokens": 100})
    bad = [
        {"tokens": -1_000_000},
        {"turns": -5},
        {"cost_usd": math.nan},
        {"cost_usd": -math.inf},
        {"tokens": "many"},
    ]
    for i, figures in enumerate(bad):
        with pytest.raises(ValueError):
            windows.fold(f"acme/1/t/bad{i}", {"tenant": "acme", "ts_ms": 60_000, **figures})
    minute, day = windows.current("acme", 60_000)
    assert (minute.turns, minute.tokens, minute.cost_usd) == (0, 100, 0.0)
    assert (day.turns, day.tokens, day.cost_usd) == (0, 100, 0.0)


async def test_a_stale_quota_view_defers_new_turns_until_it_follows_again(
    kafka_bootstrap_servers: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A usage reader that stops leaves frozen numbers: admission fails closed with
    ``quota_view_stale`` (and says so in the log) until the readers follow again."""

    @kafka_agent(
        name=unique_name("stale"),
        llm=FakeLLM(["ok"]),
        tenant="header:x-tenant",
        tenant_limits=TenantLimits(turns_per_minute=100),
    )
    async def agent(ctx: AgentContext) -> str:
        return "ok"

    caplog.set_level(logging.WARNING, logger="pyrula_stream.runtime.quotas")
    quotas = TenantQuotas(agent, kafka_bootstrap_servers, worker_id=unique_name("w"))
    quotas.start()
    try:
        assert quotas.reached("acme", starting=True) is None
        quotas._tables[-1].stop()  # the usage reader ends, as a reader that died would
        deferral = quotas.reached("acme", starting=True)
        assert deferral is not None and deferral.reason == STALE_REASON
        assert any("are stale" in r.getMessage() for r in caplog.records)
        await wait_for(lambda: not quotas.stale(), 60, "the quota readers follow again")
        assert quotas.reached("acme", starting=True) is None
    finally:
        quotas.close()
