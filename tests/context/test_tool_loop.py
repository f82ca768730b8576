"""The tool contract inside a Kafka turn: bind-time refusals, limits, direct calls,
parallel calls. End to end on the real broker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula_stream import (
    AgentContext,
    AgentLimits,
    KafkaAgentClient,
    MCPServer,
    ToolContext,
    ToolRegistrationError,
    kafka_agent,
    tool,
)
from pyrula_stream.llm import FakeLLM, reply_tool_call, reply_tool_calls
from pyrula_stream.testing import read_topic, running_worker, unique_name
from pyrula_stream.wire.serde import decode_journal_entry


@tool(requires_approval=True)
async def refund(ctx: ToolContext, cents: int) -> str:
    """Refund money."""
    return "refunded"


@tool(approval_timeout=60)
async def timed(ctx: ToolContext) -> str:
    """Waits for an approval with a deadline."""
    return "x"


@tool(read_only=True)
async def echo(ctx: ToolContext, text: str) -> str:
    """Echo the text."""
    return text


def test_binding_refuses_tools_that_need_a_person() -> None:
    for gated in (refund, timed):
        with pytest.raises(ToolRegistrationError, match=gated.name) as err:
            kafka_agent(name="gate", tools=[gated])(_body)
        assert "cannot wait" in str(err.value)
        assert "human_in_the_loop=True" in str(err.value)
    predicate = tool(requires_approval=lambda args: args["cents"] > 100)(_refund_body)
    with pytest.raises(ToolRegistrationError, match="refund_body"):
        kafka_agent(name="gate", tools=[predicate])(_body)
    with pytest.raises(ToolRegistrationError, match="MCP server 'github'"):
        kafka_agent(
            name="gate",
            mcp_servers=[
                MCPServer("github", url="https://mcp.example/mcp", requires_approval=("x",))
            ],
        )(_body)


def test_human_in_the_loop_lifts_the_binding_refusal() -> None:
    """The opt-in binds what the default refuses; the agent says it opted in."""
    server = MCPServer("github", url="https://mcp.example/mcp", requires_approval=("x",))
    agent = kafka_agent(
        name="gate", tools=[refund, timed], mcp_servers=[server], human_in_the_loop=True
    )(_body)
    assert agent.human_in_the_loop
    assert [t.name for t in agent.tools] == ["refund", "timed"]
    with pytest.raises(ToolRegistrationError, match="human_in_the_loop=True"):
        kafka_agent(name="gate", mcp_servers=[server])(_body)


async def _body(ctx: AgentContext) -> str:
    return "never"


async def _refund_body(ctx: ToolContext, cents: int) -> str:
    """Refund."""
    return "x"


async def test_offering_a_gated_tool_at_run_time_fails_the_turn(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("runtime"), llm=FakeLLM(["hi"]), partitions=1)
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "x"}], tools=[refund])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=60)
    assert events[-1].type == "run:error"
    assert events[-1].data["error_type"] == "ToolRegistrationError"
    assert "refund" in events[-1].data["message"]


async def test_interrupt_without_the_opt_in_names_the_kafka_limit(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("wait"), partitions=1, llm=FakeLLM())
    async def agent(ctx: AgentContext) -> str:
        try:
            await ctx.interrupt("approve?")
        except Exception:
            return "talked around the refusal"
        return "never"

    async with running_worker(agent, kafka_bootstrap_servers):
        for _ in range(1):
            events = await client.run(agent.name, timeout=60)
            assert events[-1].data["error_type"] == "KafkaLimitError"
            assert "a Kafka agent cannot wait for a person" in events[-1].data["message"]
            assert "human_in_the_loop=True" in events[-1].data["message"]


async def test_parallel_calls_limits_and_truncation(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    order: list[str] = []

    @tool
    async def slow_then_fast(ctx: ToolContext, name: str, delay: float) -> str:
        """Sleeps, then answers."""
        await asyncio.sleep(delay)
        order.append(name)
        return name * 40  # 40 or 80 bytes: over the 50-byte limit for "bb"

    script = [
        reply_tool_calls(
            ("slow_then_fast", {"name": "a", "delay": 0.4}),
            ("slow_then_fast", {"name": "bb", "delay": 0.0}),
            ("slow_then_fast", {"name": "c"}),  # invalid: delay missing
        ),
        reply_tool_call("echo", text="over the limit"),
    ]

    @kafka_agent(
        name=unique_name("parallel"),
        llm=FakeLLM(script),
        tools=[slow_then_fast, echo],
        limits=AgentLimits(max_tool_calls=3, max_tool_result_bytes=50),
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=60)
    assert order == ["bb", "a"], "ran concurrently: the fast call finished first"
    results = [e.data for e in events if e.type == "tool:result"]
    # journaled as each completes: the invalid call at once, then the fast one, then the slow
    assert [r["call_key"] for r in results] == ["0.2", "0.1", "0.0"]
    assert results[0]["status"] == "error" and "delay" in results[0]["output"]
    shown = results[1]["output"]
    assert shown.startswith("bb" * 25) and "truncated" in shown
    second_call = [e for e in events if e.type == "llm:complete"]
    assert len(second_call) == 2
    assert events[-1].type == "run:error"
    assert events[-1].data["code"] == "budget_exceeded"
    assert "max_tool_calls=3" in events[-1].data["message"]
    entries = [
        decode_journal_entry(value, headers)
        for _, value, headers in read_topic(kafka_bootstrap_servers, agent.topics.journal)
        if value is not None
    ]
    full = [e.data["text"] for e in entries if e.kind == "tool" and e.name == "slow_then_fast"]
    assert "bb" * 40 in full, "the journal keeps the whole result; only the model's copy is cut"


async def test_direct_calls_are_durable_and_ids_are_exclusive(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    keys: list[str] = []

    @tool
    async def charge(ctx: ToolContext, cents: int) -> dict[str, Any]:
        """Charge a card."""
        keys.append(ctx.idempotency_key or "")
        await asyncio.sleep(0.1)
        return {"charged": cents}

    @kafka_agent(name=unique_name("direct"), partitions=1, llm=FakeLLM())
    async def agent(ctx: AgentContext) -> list[Any]:
        first = await charge(ctx, cents=5)
        second = await charge(ctx, cents=6)
        named = await charge(ctx, id="order-9", cents=7)
        clash = None
        try:
            await asyncio.gather(charge(ctx, id="same", cents=1), charge(ctx, id="same", cents=2))
        except Exception as exc:
            clash = type(exc).__name__
        return [first, second, named, clash]

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=60)
    assert events[-1].data["result"] == [
        {"charged": 5},
        {"charged": 6},
        {"charged": 7},
        "ConcurrentCallIdError",
    ]
    turn = events[0].turn_id
    assert keys[:3] == [
        f"{turn}:direct:charge#0:charge",
        f"{turn}:direct:charge#1:charge",
        f"{turn}:direct:charge#id=order-9:charge",
    ]


async def test_durable_operations_inside_a_tool_are_refused(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @tool
    async def inner(ctx: ToolContext) -> str:
        """Called from another tool."""
        return "inner"

    @tool
    async def outer(ctx: ToolContext) -> str:
        """Calls a tool directly: a durable operation inside a tool."""
        return str(await inner(ctx))

    @kafka_agent(
        name=unique_name("nested"),
        llm=FakeLLM([reply_tool_call("outer"), "done"]),
        tools=[outer],
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=60)
    result = next(e.data for e in events if e.type == "tool:result")
    assert result["status"] == "error"
    assert "NestedDurableOperationError" in result["output"]
    assert events[-1].type == "run:complete"


async def test_cached_results_are_shared_by_every_worker(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    runs: list[str] = []

    @tool(cache_ttl=300, read_only=True)
    async def rates(ctx: ToolContext, currency: str) -> dict[str, float]:
        """Exchange rates (expensive)."""
        runs.append(currency)
        return {"EUR": 1.0, "USD": 1.08}

    prefix = unique_name("cache")

    def make() -> Any:
        @kafka_agent(
            name="rates",
            prefix=prefix,
            llm=FakeLLM([reply_tool_call("rates", currency="EUR"), "ok"]),
            tools=[rates],
            partitions=1,
        )
        async def agent(ctx: AgentContext) -> str:
            return await ctx.llm.run([{"role": "user", "content": "rates?"}])

        return agent

    agent = make()
    async with KafkaAgentClient(kafka_bootstrap_servers, prefix=prefix) as scoped:
        async with running_worker(agent, kafka_bootstrap_servers):
            first = await scoped.run("rates", timeout=60)
            second = await scoped.run("rates", timeout=60)
        async with running_worker(make(), kafka_bootstrap_servers):  # a new worker process-state
            third = await scoped.run("rates", timeout=60)
    cached = [
        next(e.data.get("cached", False) for e in events if e.type == "tool:result")
        for events in (first, second, third)
    ]
    assert cached == [False, True, True]
    assert runs == ["EUR"]


async def test_an_oversized_result_fails_fast_and_deltas_are_coalesced(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    calls: list[int] = []

    @tool(retry=3)
    async def dump(ctx: ToolContext) -> str:
        """Returns more than a Kafka record may hold."""
        calls.append(1)
        return "x" * 2_000_000

    long_text = "word " * 400  # 2,000 characters, streamed one character at a time
    script = [reply_tool_call("dump")]

    @kafka_agent(name=unique_name("oversized"), llm=FakeLLM(script), tools=[dump], partitions=1)
    async def oversized(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "dump"}])

    @kafka_agent(name=unique_name("deltas"), llm=FakeLLM([long_text], chunk_chars=1), partitions=1)
    async def chatty(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "talk"}])

    async with running_worker(oversized, kafka_bootstrap_servers):
        events = await client.run(oversized.name, timeout=60)
    assert events[-1].data["code"] == "stream_too_large"
    assert "over the 1000000-byte limit" in events[-1].data["message"]
    assert calls == [1], "a payload over the limit is never retried"

    async with running_worker(chatty, kafka_bootstrap_servers):
        events = await client.run(chatty.name, timeout=60)
    deltas = [e.data["text"] for e in events if e.type == "llm:delta"]
    assert "".join(deltas) == long_text
    assert len(deltas) <= 4, "2,000 one-character chunks become a few llm:delta events"
