"""A turn flows through a real broker: request, worker, journal, events, client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from pyrula_stream import AgentContext, KafkaAgentClient, ToolContext, kafka_agent, tool
from pyrula_stream.llm import FakeLLM, reply_text, reply_tool_call, reply_tool_calls
from pyrula_stream.llm.base import (
    LLMClient,
    ModelResponse,
    StreamItem,
    ToolDefinition,
    ToolUseBlock,
)
from pyrula_stream.testing import read_topic, running_worker, unique_name


@tool(read_only=True)
async def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    """Look up an order."""
    return {"order_id": order_id, "status": "shipped"}


@tool
async def broken(ctx: ToolContext) -> str:
    """Always fails."""
    raise RuntimeError("backend down")


def make_agent(script: list[Any], tools: list[Any]) -> Any:
    @kafka_agent(name=unique_name("e2e"), llm=FakeLLM(script), tools=tools, partitions=2)
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    return agent


async def test_turn_publishes_ordered_events_and_result(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    agent = make_agent(
        [reply_tool_call("lookup_order", order_id="9"), "It shipped."], [lookup_order]
    )
    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, question="where is 9?", timeout=60)
    types = [e.type for e in events]
    assert types[0] == "run:start"
    assert types[-1] == "run:complete"
    assert [e.seq for e in events] == list(range(len(events)))
    assert types.count("llm:complete") == 2
    assert types.index("tool:start") < types.index("tool:result")
    result = next(e for e in events if e.type == "tool:result")
    assert result.data["status"] == "ok"
    assert result.data["output"] == '{"order_id":"9","status":"shipped"}'
    assert events[-1].data["result"] == "It shipped."
    assert events[-1].data["usage"]["llm_calls"] == 2
    assert all(e.attempt == 1 and e.agent == agent.name for e in events)
    # What compaction keeps of a finished turn without an idempotency key: nothing. Its
    # terminal record is tombstoned once the committed input offset passed its request.
    latest: dict[bytes | None, bytes | None] = {}
    for key, value, _ in read_topic(kafka_bootstrap_servers, agent.topics.journal):
        latest[key] = value
    live = sorted(k.decode() for k, v in latest.items() if v is not None and k is not None)
    assert live == []


async def test_runs_on_partitions_the_client_already_reads_get_every_event(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Once the client's reader follows a partition, ``run()`` subscribes to a new turn
    before submitting it (no offset lookup, no rewind); each turn still gets all of its
    own events, once and in order, one after another and many at once."""
    agent = make_agent(
        [reply_tool_call("lookup_order", order_id="9"), "It shipped."], [lookup_order]
    )
    async with running_worker(agent, kafka_bootstrap_servers, all_partitions=True):
        runs = [await client.run(agent.name, question=f"q{i}", timeout=60) for i in range(6)]
        runs += await asyncio.gather(
            *(client.run(agent.name, question=f"c{i}", timeout=60) for i in range(6))
        )
    assert len({events[0].turn_id for events in runs}) == 12
    for events in runs:
        assert [e.seq for e in events] == list(range(len(events)))
        assert events[0].type == "run:start"
        assert events[-1].type == "run:complete"
        assert events[-1].data["result"] == "It shipped."
        assert {e.turn_id for e in events} == {events[0].turn_id}


async def test_unknown_and_failing_tools_keep_the_turn_going(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    agent = make_agent(
        [reply_tool_calls(("nope", {}), ("broken", {}), ("lookup_order", {"id": 1})), "done"],
        [lookup_order, broken],
    )
    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, question="q", timeout=60)
    # Published as each completes; sorted back into the order the model asked.
    results = sorted(
        (e.data for e in events if e.type == "tool:result"), key=lambda r: r["call_key"]
    )
    assert [r["tool"] for r in results] == ["nope", "broken", "lookup_order"]
    assert all(r["status"] == "error" for r in results)
    assert results[0]["output"] == "unknown tool 'nope'; available: broken, lookup_order"
    assert "backend down" in results[1]["output"]
    assert "order_id" in results[2]["output"]
    started = [e.data["tool"] for e in events if e.type == "tool:start"]
    assert started == ["broken"]  # no tool:start for unknown or invalid calls
    assert events[-1].type == "run:complete"


async def test_turns_of_one_thread_run_in_submission_order(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    order: list[str] = []

    @kafka_agent(name=unique_name("thread"), llm=FakeLLM([reply_text("ok")]), partitions=2)
    async def agent(ctx: AgentContext, n: str) -> str:
        order.append(n)
        return n

    async with running_worker(agent, kafka_bootstrap_servers):
        handles = [await client.submit(agent.name, thread_id="t1", n=str(i)) for i in range(5)]
        for h in handles:
            async for _ in client.stream(agent.name, h.turn_id, since_ms=h.submitted_ms - 5000):
                pass
    assert order == [str(i) for i in range(5)]


async def test_a_turn_past_the_agent_timeout_ends_with_turn_timeout_and_others_go_on(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """The agent's timeout cancels only the turn that outlived it, and the worker goes on."""

    @kafka_agent(name=unique_name("slow"), llm=FakeLLM(["unused"]), partitions=1, timeout=0.5)
    async def slow(ctx: AgentContext, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    async with running_worker(slow, kafka_bootstrap_servers):
        late, quick = await asyncio.gather(
            client.run(slow.name, seconds=30, timeout=60),
            client.run(slow.name, seconds=0.01, timeout=60),
        )
    assert late[-1].type == "run:error"
    assert late[-1].data["code"] == "turn_timeout"
    assert "agent timeout of 0.5s" in late[-1].data["message"]
    assert quick[-1].type == "run:complete"
    assert quick[-1].data["result"] == "slept 0.01"


class DatedClient(LLMClient):
    """A custom client whose tool call input holds a value JSON does not have."""

    provider = "custom"
    model = "dated"

    async def stream(
        self,
        messages: list[dict[str, Any]],
        tools: list[ToolDefinition] | None = None,
        system: str | None = None,
    ) -> AsyncIterator[StreamItem]:
        if len(messages) == 1:
            block = ToolUseBlock(id="c1", name="stamp", input={"when": datetime(2026, 1, 2, 3)})
            yield ModelResponse(content=[block], stop_reason="tool_use")
        else:
            yield reply_text("stamped")


@tool(read_only=True)
async def stamp(ctx: ToolContext, when: str) -> str:
    """Echo a time given as text."""
    return when


async def test_a_live_turn_goes_on_with_the_values_its_journal_records(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """The datetime a custom client put in a tool call is, for the live turn too, the text
    the journal records (what a replay reads back), so the tool taking ``str`` accepts it
    live as it would on replay."""

    @kafka_agent(name=unique_name("dated"), llm=DatedClient(), tools=[stamp], partitions=1)
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, question="stamp it", timeout=60)
    result = next(e for e in events if e.type == "tool:result")
    assert result.data["status"] == "ok", result.data
    assert result.data["output"] == "2026-01-02T03:00:00"
    assert events[-1].type == "run:complete"
