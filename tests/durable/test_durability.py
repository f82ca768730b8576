"""Durable turns on the real broker: replay after a worker stops mid-turn, changed input,
cancel and terminate, idempotent resubmits, the at-least-once mode."""

from __future__ import annotations

import asyncio
from typing import Any

from pyrula_stream import (
    AgentContext,
    Event,
    KafkaAgentClient,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.llm import FakeLLM, ModelResponse, ToolDefinition, reply_text, reply_tool_call
from pyrula_stream.llm.fake import count_model_calls
from pyrula_stream.testing import running_worker, unique_name, wait_for
from pyrula_stream.wire.serde import TurnRequest

QUICK_STOP = WorkerOptions(shutdown_grace=0.2)


class Recorder:
    """Counts what really ran: model calls by index, tool effects by idempotency key."""

    def __init__(self) -> None:
        self.model_calls: list[int] = []
        self.effects: list[str] = []
        self.gate = asyncio.Event()

    def model(self, messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
        index = count_model_calls(messages)
        self.model_calls.append(index)
        if index == 0:
            return reply_tool_call("effect", item="x")
        return reply_text("done")


async def collect(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    return [e async for e in client.stream(agent, turn_id)]


async def test_a_new_worker_replays_without_redoing_journaled_steps(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    rec = Recorder()

    @tool(writes=True)
    async def effect(ctx: ToolContext, item: str) -> str:
        """A side effect that waits for the test's go-ahead."""
        rec.effects.append(ctx.idempotency_key or "")
        await rec.gate.wait()
        return f"did {item}"

    @kafka_agent(name=unique_name("replay"), llm=FakeLLM(rec.model), tools=[effect], partitions=1)
    async def agent(ctx: AgentContext, q: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": q}])

    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        handle = await client.submit(agent.name, q="go")
        await wait_for(lambda: len(rec.effects) == 1, 30, "the tool started")
    # The first worker stopped while the tool ran: model call 0 is journaled, the tool is not.
    assert rec.model_calls == [0]
    rec.gate.set()
    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        events = await asyncio.wait_for(collect(client, agent.name, handle.turn_id), 60)

    assert rec.model_calls == [0, 1], "model call 0 came from the journal, not the model"
    assert rec.effects == [f"{handle.turn_id}:0.0:effect"] * 2  # same key on the rerun
    assert [e.seq for e in events] == list(range(len(events)))
    assert [e.type for e in events].count("run:complete") == 1
    assert [e.type for e in events].count("llm:complete") == 2
    assert events[-1].attempt == 2
    assert events[-1].data["result"] == "done"


async def test_changed_model_input_on_replay_fails_with_replay_input_changed(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    rec = Recorder()
    name = unique_name("changed")

    @tool(writes=True)
    async def effect(ctx: ToolContext, item: str) -> str:
        """Waits forever in the first worker."""
        rec.effects.append(item)
        await rec.gate.wait()
        return "ok"

    def make(system: str) -> Any:
        @kafka_agent(name=name, llm=FakeLLM(rec.model), tools=[effect], partitions=1)
        async def agent(ctx: AgentContext, q: str) -> str:
            return await ctx.llm.run([{"role": "user", "content": q}], system=system)

        return agent

    async with running_worker(make("v1"), kafka_bootstrap_servers, QUICK_STOP):
        handle = await client.submit(name, q="go")
        await wait_for(lambda: len(rec.effects) == 1, 30, "the tool started")
    rec.gate.set()
    async with running_worker(make("v2"), kafka_bootstrap_servers, QUICK_STOP):
        events = await asyncio.wait_for(collect(client, name, handle.turn_id), 60)
    error = events[-1]
    assert error.type == "run:error"
    assert error.data["code"] == "replay_input_changed"
    assert "step 1 (llm 'llm'): the system prompt changed" in error.data["message"]


async def test_cancel_stops_at_the_next_step_and_terminate_at_once(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    started = asyncio.Event()

    @tool
    async def slow(ctx: ToolContext) -> str:
        """Takes a while."""
        started.set()
        await asyncio.sleep(1.0)
        return "slept"

    @tool
    async def stuck(ctx: ToolContext) -> str:
        """Never returns on its own."""
        started.set()
        await asyncio.sleep(3600)
        return "never"

    def looping(name: str) -> Any:
        @kafka_agent(
            name=unique_name("cancel"),
            llm=FakeLLM([reply_tool_call(name)]),
            tools=[slow, stuck],
            partitions=1,
        )
        async def agent(ctx: AgentContext) -> str:
            return await ctx.llm.run([{"role": "user", "content": "loop"}])

        return agent

    cancel_agent, terminate_agent = looping("slow"), looping("stuck")
    async with running_worker(cancel_agent, kafka_bootstrap_servers, QUICK_STOP):
        handle = await client.submit(cancel_agent.name)
        await asyncio.wait_for(started.wait(), 30)
        await client.cancel(cancel_agent.name, handle.turn_id, reason="user left")
        await client.cancel(cancel_agent.name, handle.turn_id, reason="user left")  # repeat: safe
        events = await asyncio.wait_for(collect(client, cancel_agent.name, handle.turn_id), 60)
    assert events[-1].type == "run:error"
    assert events[-1].data["code"] == "cancelled"
    assert "user left" in events[-1].data["message"]
    assert "tool:result" in [e.type for e in events]  # the running step finished first

    started.clear()
    async with running_worker(terminate_agent, kafka_bootstrap_servers, QUICK_STOP):
        handle = await client.submit(terminate_agent.name)
        await asyncio.wait_for(started.wait(), 30)
        stopped = await client.terminate(terminate_agent.name, handle.turn_id, reason="ops")
        events = await asyncio.wait_for(collect(client, terminate_agent.name, handle.turn_id), 30)
    # What it stopped: the turn waited on its tool after its first model call.
    assert (stopped.state, stopped.code) == ("failed", "cancelled")
    assert (stopped.attempt, stopped.last_step) == (1, "llm")
    assert events[-1].type == "run:error"
    assert events[-1].data["code"] == "cancelled"
    assert "tool:result" not in [e.type for e in events]


async def test_resubmitted_idempotency_key_does_not_run_again(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    runs: list[str] = []

    @kafka_agent(name=unique_name("idem"), llm=FakeLLM(["ok"]), partitions=2)
    async def agent(ctx: AgentContext, order: str) -> str:
        runs.append(order)
        return f"charged {order}"

    async with running_worker(agent, kafka_bootstrap_servers):
        first = await client.run(agent.name, idempotency_key="order-7", order="7", timeout=60)
        again = await client.submit(agent.name, idempotency_key="order-7", order="7")
        assert again.turn_id == first[0].turn_id
        marker = await client.run(agent.name, order="8", timeout=60)  # the worker moved on
        # A producer that picks its own turn id but reuses the key is pointed at the original.
        foreign = TurnRequest("foreign-1", agent.name, {"order": "7"}, idempotency_key="order-7")
        handle = await client.submit_request(foreign)
        duplicate = await collect(client, agent.name, handle.turn_id)
    assert marker[-1].type == "run:complete"
    assert runs == ["7", "8"]
    replayed = await collect(client, agent.name, again.turn_id)
    assert [e.type for e in replayed].count("run:complete") == 1
    assert [e.type for e in duplicate] == ["run:error"]
    assert duplicate[0].data["code"] == "duplicate_run"
    assert duplicate[0].data["original_turn_id"] == first[0].turn_id


async def test_concurrency_is_bounded_and_slow_keys_do_not_block_others(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    running: list[int] = [0]
    peak: list[int] = [0]
    finished: list[str] = []

    @kafka_agent(name=unique_name("bounded"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext, n: str, seconds: float) -> str:
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await ctx.sleep(seconds)
        running[0] -= 1
        finished.append(n)
        return n

    options = WorkerOptions(max_concurrent_turns=3)
    async with running_worker(agent, kafka_bootstrap_servers, options):
        slow = await client.submit(agent.name, thread_id="slow", n="slow", seconds=3.0)
        fast = [
            await client.submit(agent.name, thread_id=f"k{i}", n=str(i), seconds=0.2)
            for i in range(8)
        ]
        for h in [*fast, slow]:
            await collect(client, agent.name, h.turn_id)
    assert peak[0] == 3
    assert finished[-1] == "slow", "eight fast turns of other keys finished behind the slow one"


async def test_at_least_once_mode_completes_turns(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("alo"), llm=FakeLLM(["answer"]), partitions=2)
    async def agent(ctx: AgentContext, q: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": q}])

    options = WorkerOptions(processing_guarantee="at_least_once")
    async with running_worker(agent, kafka_bootstrap_servers, options):
        results = await asyncio.gather(
            *(client.run(agent.name, q=str(i), timeout=60) for i in range(5))
        )
    for events in results:
        assert events[-1].type == "run:complete"
        assert [e.seq for e in events] == list(range(len(events)))
