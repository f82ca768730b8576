"""Tenants on the real broker: where a turn's tenant comes from, that it is on every event
and in the result record, and fair admission (one tenant's flood does not make another
tenant wait behind it)."""

from __future__ import annotations

import asyncio

import pytest

from pyrula_stream import (
    AgentContext,
    AgentRegistrationError,
    KafkaAgentClient,
    WorkerOptions,
    kafka_agent,
)
from pyrula_stream.agent.tenants import DEFAULT_TENANT, TenantLimits
from pyrula_stream.client.kafka_client import new_request
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from pyrula_stream.wire.serde import decode_turn_result_value


async def test_the_tenant_is_on_every_event_and_in_the_result(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """``tenant="header:x-tenant"``: a turn submitted with the header is that tenant's,
    one without it the default tenant's; both say so in every event and the result."""

    @kafka_agent(
        name=unique_name("tenanted"),
        llm=FakeLLM(["ok"] * 2),
        partitions=1,
        tenant="header:x-tenant",
        unknown_tenants="own",
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "hi"}])

    async with running_worker(agent, kafka_bootstrap_servers):
        acme = await client.submit_request(
            new_request(agent.name, None, None, None, {}), headers=[("x-tenant", b"acme")]
        )
        plain = await client.submit(agent.name)
        acme_events = [e async for e in client.stream(agent.name, acme.turn_id)]
        plain_events = [e async for e in client.stream(agent.name, plain.turn_id)]

    assert acme_events[-1].type == "run:complete"
    assert {e.data.get("tenant") for e in acme_events} == {"acme"}
    assert {e.data.get("tenant") for e in plain_events} == {DEFAULT_TENANT}
    results = {
        r.turn_id: r
        for r in (
            decode_turn_result_value(value)
            for _, value, _ in read_topic(kafka_bootstrap_servers, agent.topics.results)
            if value is not None
        )
    }
    assert results[acme.turn_id].tenant == "acme"
    assert results[plain.turn_id].tenant == DEFAULT_TENANT


async def test_an_agent_without_tenants_publishes_none(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Without ``tenant=`` nothing changes on the wire: no tenant in events or results."""

    @kafka_agent(name=unique_name("untenanted"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "hi"}])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=60)
    assert events[-1].type == "run:complete"
    assert all("tenant" not in e.data for e in events)
    (result,) = [
        decode_turn_result_value(v)
        for _, v, _ in read_topic(kafka_bootstrap_servers, agent.topics.results)
        if v is not None
    ]
    assert result.tenant is None


def test_binding_refuses_a_tenant_source_it_cannot_read() -> None:
    async def body(ctx: AgentContext) -> str:
        return "x"

    with pytest.raises(AgentRegistrationError, match="header:<name>"):
        kafka_agent(name=unique_name("bad"), llm=FakeLLM(), tenant="metadata")(body)
    with pytest.raises(AgentRegistrationError, match="on_quota"):
        kafka_agent(name=unique_name("bad"), llm=FakeLLM(), on_quota="drop")(body)  # type: ignore[arg-type]
    with pytest.raises(AgentRegistrationError, match="positive"):
        TenantLimits(tokens_per_minute=0)


async def test_a_tenants_flood_does_not_hold_back_another_tenant(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Tenant A submits 2,000 turns at once, then tenant B submits 20 to the same
    partition. B's turns finish while most of A's are still queued: on the one results
    partition (commit order), fewer than 1,000 of A's results precede B's last one. A
    worker admitting in read order would put all 2,000 of A's first."""
    finished: dict[str, int] = {"A": 0, "B": 0}

    @kafka_agent(
        name=unique_name("fair"),
        llm=FakeLLM(),
        partitions=1,
        tenant=lambda request: request.metadata.get("tenant"),
        unknown_tenants="own",
    )
    async def agent(ctx: AgentContext, tenant: str) -> str:
        await asyncio.sleep(0.005)  # a turn holds its slot a moment, as a model call would
        finished[tenant] += 1
        return tenant

    async def submit(tenant: str, n: int) -> None:
        await asyncio.gather(
            *(
                client.submit(agent.name, metadata={"tenant": tenant}, tenant=tenant)
                for _ in range(n)
            )
        )

    options = WorkerOptions(max_concurrent_turns=4, max_queued_turns=5000, shutdown_grace=0.5)
    async with running_worker(agent, kafka_bootstrap_servers, options):
        await submit("A", 2000)
        await submit("B", 20)
        await wait_for(lambda: finished["B"] == 20, 120, "tenant B's 20 turns finished")

    tenants = [
        decode_turn_result_value(v).tenant
        for _, v, _ in read_topic(kafka_bootstrap_servers, agent.topics.results)
        if v is not None
    ]
    last_b = max(i for i, t in enumerate(tenants) if t == "B")
    assert tenants.count("B") == 20
    a_before = tenants[:last_b].count("A")
    assert a_before < 1000, f"{a_before} of A's 2,000 turns finished before B's last one"


async def test_metrics_label_the_first_20_tenants_and_count_the_rest_as_other(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """22 tenants, one turn each: 20 series by name, one ``other`` holding two turns."""

    @kafka_agent(
        name=unique_name("tenantmetrics"),
        llm=FakeLLM(["ok"]),
        partitions=1,
        tenant="key",
        unknown_tenants="own",
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "hi"}])

    def tenant_turns(exposition: str) -> dict[str, float]:
        counts: dict[str, float] = {}
        for line in exposition.splitlines():
            if line.startswith("pyrula_tenant_turns_total{"):
                labels, value = line.rsplit(" ", 1)
                tenant = labels.split('tenant="', 1)[1].split('"', 1)[0]
                counts[tenant] = counts.get(tenant, 0) + float(value)
        return counts

    async with running_worker(agent, kafka_bootstrap_servers) as worker:
        for n in range(22):
            events = await client.run(agent.name, thread_id=f"tenant-{n}", timeout=60)
            assert events[-1].type == "run:complete"
        # A turn is counted once its commit is confirmed, which a client reading the
        # committed completion event can see a moment before the worker does.
        await wait_for(
            lambda: sum(tenant_turns(worker.metrics.exposition().decode()).values()) >= 22,
            30,
            "22 turns counted",
        )
        exposition = worker.metrics.exposition().decode()

    counts = tenant_turns(exposition)
    assert len(counts) == 21 and counts["other"] == 2
    assert sum(counts.values()) == 22
    assert "pyrula_tenant_model_tokens_total{" in exposition
