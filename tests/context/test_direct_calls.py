"""Tools called from agent code take the same durable path as the model's calls: the
Kafka approval limit, the tool's own error type, and the same ``tool:result`` payload."""

from __future__ import annotations

from typing import Any

from pyrula_stream import (
    AgentContext,
    AgentLimits,
    Fatal,
    KafkaAgentClient,
    Poison,
    ToolContext,
    kafka_agent,
    tool,
)
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.testing import read_topic, running_worker, unique_name


async def test_a_gated_tool_called_directly_is_refused_and_never_runs(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    ran: list[int] = []

    @tool(requires_approval=True)
    async def refund(ctx: ToolContext, cents: int) -> str:
        """Refund money."""
        ran.append(cents)
        return "refunded"

    @tool(requires_approval=lambda args: args["cents"] > 10_000)
    async def refund_over(ctx: ToolContext, cents: int) -> str:
        """Refund money; large ones would need a person."""
        ran.append(cents)
        return "refunded"

    @kafka_agent(name=unique_name("gated"), llm=FakeLLM(), partitions=1)
    async def agent(ctx: AgentContext, which: str, catch: bool) -> str:
        gated = refund if which == "always" else refund_over
        try:
            return str(await gated(ctx, cents=25_000))
        except Exception:
            if not catch:
                raise
            return "talked around the refusal"

    async with running_worker(agent, kafka_bootstrap_servers):
        for which, catch in (("always", False), ("predicate", False), ("always", True)):
            events = await client.run(agent.name, which=which, catch=catch, timeout=60)
            last = events[-1]
            assert last.type == "run:error", (which, catch, last.data)
            assert last.data["error_type"] == "ToolRegistrationError"
            assert "refund" in last.data["message"]
            assert "cannot wait for a person" in last.data["message"]
            assert not [e for e in events if e.type == "tool:start"]
    assert ran == [], "the tool body never runs"


async def test_direct_call_failures_keep_the_tools_error(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @tool
    async def charge(ctx: ToolContext, outcome: str) -> str:
        """Charge a card."""
        if outcome == "fatal":
            raise Fatal("card declined")
        raise Poison("the order record is corrupt")

    @kafka_agent(name=unique_name("direrr"), llm=FakeLLM(), partitions=1)
    async def agent(ctx: AgentContext, outcome: str) -> str:
        return str(await charge(ctx, outcome=outcome))

    async with running_worker(agent, kafka_bootstrap_servers):
        fatal = await client.run(agent.name, outcome="fatal", timeout=60)
        poison = await client.run(agent.name, outcome="poison", timeout=60)
    assert fatal[-1].data["code"] == "fatal"
    assert fatal[-1].data["message"] == "card declined"
    assert fatal[-1].data["error_type"] == "Fatal"
    assert poison[-1].data["code"] == "poison_quarantine"
    assert "the order record is corrupt" in poison[-1].data["message"]
    quarantined = [
        headers
        for _, _, headers in read_topic(kafka_bootstrap_servers, agent.topics.dlq)
        if headers.get("pyrula.dlq.code") == "poison_quarantine"
    ]
    assert len(quarantined) == 1


async def test_direct_and_model_calls_publish_the_same_tool_result(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @tool
    async def lookup(ctx: ToolContext, order_id: str) -> str:
        """Look an order up."""
        return f"order {order_id}: " + "x" * 200

    @kafka_agent(
        name=unique_name("same"),
        llm=FakeLLM([reply_tool_call("lookup", order_id="1"), "done"]),
        tools=[lookup],
        limits=AgentLimits(max_tool_result_bytes=50),
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> Any:
        direct = await lookup(ctx, order_id="2")
        answer = await ctx.llm.run([{"role": "user", "content": "go"}])
        return [direct[:7], answer]

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=60)
    assert events[-1].data["result"] == ["order 2", "done"]
    direct, model = [e.data for e in events if e.type == "tool:result"]
    assert set(direct) == set(model)
    assert direct["tool_use_id"] is None and model["tool_use_id"]
    assert "truncated" in direct["output"] and "truncated" in model["output"]
    starts = [e.data for e in events if e.type == "tool:start"]
    assert [set(s) for s in starts] == [set(starts[1])] * 2
