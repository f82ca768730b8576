"""A sub-agent's turn belongs to its parent's tenant: the child's request carries it
(``pyrula-tenant`` in its lineage), unless the child agent's own source names a tenant;
an agent without tenants in the middle of the tree passes it on untouched."""

from __future__ import annotations

import asyncio
from typing import Any

from pyrula_stream import (
    AgentContext,
    Event,
    KafkaAgent,
    KafkaAgentClient,
    WorkerOptions,
    kafka_agent,
)
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import read_topic, running_worker, unique_name
from pyrula_stream.wire.serde import decode_turn_result_value

QUICK = WorkerOptions(shutdown_grace=0.2)


def leaf_agents() -> tuple[KafkaAgent, KafkaAgent]:
    @kafka_agent(
        name=unique_name("tkeyed"),
        llm=FakeLLM(["ok"]),
        partitions=2,
        tenant="key",
        unknown_tenants="own",
    )
    async def keyed(ctx: AgentContext, n: int) -> int:
        return n

    @kafka_agent(
        name=unique_name("town"),
        llm=FakeLLM(["ok"]),
        partitions=2,
        tenant=lambda request: request.params.get("customer"),
        unknown_tenants="own",
    )
    async def own(ctx: AgentContext, customer: str | None = None) -> str | None:
        return customer

    return keyed, own


def plain_agent(keyed: KafkaAgent) -> KafkaAgent:
    @kafka_agent(name=unique_name("tplain"), llm=FakeLLM(["ok"]), partitions=2)
    async def plain(ctx: AgentContext) -> int:
        return int(await ctx.call_agent(keyed, n=7))

    return plain


def parent_agent(keyed: KafkaAgent, own: KafkaAgent, plain: KafkaAgent) -> KafkaAgent:
    @kafka_agent(
        name=unique_name("tparent"),
        llm=FakeLLM(["ok"]),
        partitions=2,
        tenant=lambda request: request.metadata.get("tenant"),
        unknown_tenants="own",
    )
    async def parent(ctx: AgentContext) -> dict[str, Any]:
        return {
            "keyed": await ctx.call_agent(keyed, n=1),
            "own": await ctx.call_agent(own, customer="globex"),
            "inherited": await ctx.call_agent(own),
            "through_plain": await ctx.call_agent(plain),
        }

    return parent


async def events_of(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    async def collect() -> list[Event]:
        return [e async for e in client.stream(agent, turn_id)]

    return await asyncio.wait_for(collect(), 60)


def result_tenants(bootstrap: str, agent: KafkaAgent) -> dict[str, str | None]:
    out = {}
    for _, value, _ in read_topic(bootstrap, agent.topics.results):
        if value is not None:
            result = decode_turn_result_value(value)
            out[result.turn_id] = result.tenant
    return out


async def test_a_child_turn_runs_as_its_parents_tenant_unless_it_names_its_own(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    keyed, own = leaf_agents()
    plain = plain_agent(keyed)
    parent = parent_agent(keyed, own, plain)
    async with (
        running_worker(keyed, kafka_bootstrap_servers, QUICK, all_partitions=True),
        running_worker(own, kafka_bootstrap_servers, QUICK, all_partitions=True),
        running_worker(plain, kafka_bootstrap_servers, QUICK, all_partitions=True),
        running_worker(parent, kafka_bootstrap_servers, QUICK, all_partitions=True),
    ):
        events = await client.run(parent.name, metadata={"tenant": "acme"}, timeout=90)
        assert events[-1].type == "run:complete", events[-1].data
        children = {
            e.data["child_turn_id"]: e.data["agent"] for e in events if e.type == "subagent:start"
        }
        assert len(children) == 4
        child_events = {
            turn: await events_of(client, agent, turn) for turn, agent in children.items()
        }
        plain_turn = next(t for t, a in children.items() if a == plain.name)
        grandchild = next(
            e.data["child_turn_id"] for e in child_events[plain_turn] if e.type == "subagent:start"
        )
        grand_events = await events_of(client, keyed.name, grandchild)

    assert {e.data["tenant"] for e in events} == {"acme"}
    tenants_seen: dict[str, set[str | None]] = {
        turn: {e.data.get("tenant") for e in evs} for turn, evs in child_events.items()
    }
    keyed_turn = next(t for t, a in children.items() if a == keyed.name)
    own_turns = [t for t, a in children.items() if a == own.name]  # call order: globex, none
    # "key" names no tenant for a sub-agent (its key is its own turn id): the parent's.
    assert tenants_seen[keyed_turn] == {"acme"}
    # A source that names a tenant wins; one that names none takes the parent's.
    assert [tenants_seen[t] for t in own_turns] == [{"globex"}, {"acme"}]
    # An agent without tenants publishes none, yet its own child is still acme's.
    assert tenants_seen[plain_turn] == {None}
    assert {e.data.get("tenant") for e in grand_events} == {"acme"}
    assert result_tenants(kafka_bootstrap_servers, own) == {
        own_turns[0]: "globex",
        own_turns[1]: "acme",
    }
    assert result_tenants(kafka_bootstrap_servers, keyed) == {
        keyed_turn: "acme",
        grandchild: "acme",
    }
    assert result_tenants(kafka_bootstrap_servers, plain) == {plain_turn: None}
