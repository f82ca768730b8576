"""What ends or bounds a turn, checked from the topics: nothing is written after the
terminal record, the wall-time budget survives replays, event caps are visible, and a
worker refuses an agent that has no model."""

from __future__ import annotations

import asyncio
import time

import pytest

from pyrula_stream import (
    AgentContext,
    AgentLimits,
    ConfigurationError,
    KafkaAgentClient,
    KafkaWorker,
    Poison,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.llm import FakeLLM, reply_tool_call, reply_tool_calls
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from pyrula_stream.wire.events import decode_event
from pyrula_stream.wire.journal_keys import parse_journal_key
from pyrula_stream.wire.serde import decode_journal_entry

QUICK_STOP = WorkerOptions(shutdown_grace=0.2)


async def test_no_record_of_a_turn_follows_its_terminal_record(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """One call of a parallel batch poisons the turn while its siblings still run: the
    siblings are cancelled and awaited, so neither an event nor a journal record of the
    turn lands after its terminal one (read raw under read_committed)."""
    release = asyncio.Event()
    cancelled: list[int] = []
    finished: list[int] = []

    @tool
    async def slow(ctx: ToolContext, n: int) -> str:
        """Waits for the test."""
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.append(n)
            raise
        finished.append(n)
        return f"slow {n}"

    @tool
    async def bad(ctx: ToolContext) -> str:
        """Poisons the turn."""
        raise Poison("this order cannot be processed")

    @kafka_agent(
        name=unique_name("batch"),
        llm=FakeLLM([reply_tool_calls(("slow", {"n": 1}), ("bad", {}), ("slow", {"n": 2}))]),
        tools=[slow, bad],
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=60)
        release.set()  # a sibling still running now would finish and publish
        await asyncio.sleep(0.5)
    # leaving running_worker stopped the worker gracefully: everything buffered is flushed
    assert events[-1].data["code"] == "poison_quarantine"
    turn = events[-1].turn_id

    raw_events = [
        decode_event(value, headers)
        for key, value, headers in read_topic(kafka_bootstrap_servers, agent.topics.events)
        if value is not None and key == turn.encode()
    ]
    terminal_at = next(i for i, e in enumerate(raw_events) if e.is_terminal)
    assert terminal_at == len(raw_events) - 1, [e.type for e in raw_events[terminal_at:]]
    assert [e.seq for e in raw_events] == list(range(len(raw_events)))

    journal = [
        (key.decode(), value, headers)
        for key, value, headers in read_topic(kafka_bootstrap_servers, agent.topics.journal)
        if key is not None and parse_journal_key(key.decode())[0] == turn
    ]
    suffixes = [parse_journal_key(key)[1] for key, _, _ in journal]
    last_terminal = max(i for i, s in enumerate(suffixes) if s == "terminal")
    assert last_terminal == len(journal) - 1, suffixes[last_terminal:]
    live_steps = {
        s for (key, value, _), s in zip(journal, suffixes, strict=True) if s.isdigit() and value
    }
    tombstoned = {s for (_, value, _), s in zip(journal, suffixes, strict=True) if value is None}
    assert live_steps <= tombstoned, "every step key of the finished turn is tombstoned"
    assert sorted(cancelled) == [1, 2] and finished == []


async def test_wall_time_counts_from_the_first_attempt_and_guards_tools(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    ran: list[str] = []

    @tool
    async def ship(ctx: ToolContext) -> str:
        """Ship the order."""
        ran.append(ctx.turn_id)
        return "shipped"

    @kafka_agent(
        name=unique_name("wall"),
        llm=FakeLLM(),
        limits=AgentLimits(max_turn_wall_seconds=2.0),
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> str:
        await ctx.step("first", lambda: "done")
        if ctx.attempt == 1:
            await asyncio.Event().wait()  # the first worker stops here
        return str(await ship(ctx))

    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        handle = await client.submit(agent.name)
        await wait_for(lambda: _has_step(kafka_bootstrap_servers, agent.topics.journal), 30, "step")
        started = time.monotonic()
    await asyncio.sleep(max(0.0, 2.2 - (time.monotonic() - started)))
    async with running_worker(agent, kafka_bootstrap_servers):
        events = [e async for e in client.stream(agent.name, handle.turn_id)]
    last = events[-1]
    assert last.type == "run:error" and last.attempt == 2
    assert last.data["code"] == "budget_exceeded"
    assert last.data["detail"]["limit"] == "max_turn_wall_seconds"
    assert ran == [], "the budget is checked before the tool runs"


def _has_step(bootstrap: str, journal_topic: str) -> bool:
    for key, value, headers in read_topic(bootstrap, journal_topic):
        if value is not None and key is not None and key.decode().endswith("/1"):
            return decode_journal_entry(value, headers).name == "first"
    return False


async def test_event_caps_are_visible_and_never_drop_the_terminal_event(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @tool
    async def report(ctx: ToolContext) -> str:
        """A long report."""
        return "é" * 100

    @kafka_agent(
        name=unique_name("caps"),
        # The second call's barrier commits the first call's entry: a step and its
        # tombstone that meet in the turn's last commit are not written at all.
        llm=FakeLLM(
            [reply_tool_call("report"), reply_tool_call("report"), "z" * 300], chunk_chars=100
        ),
        tools=[report],
        limits=AgentLimits(max_event_payload_bytes=41),
        partitions=1,
    )
    async def chatty(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    @kafka_agent(
        name=unique_name("count"),
        llm=FakeLLM(),
        limits=AgentLimits(max_event_count_per_turn=5),
        partitions=1,
    )
    async def noisy(ctx: AgentContext) -> str:
        for i in range(10):
            await ctx.emit_status(f"line {i}")
        return "done"

    async with running_worker(chatty, kafka_bootstrap_servers):
        events = await client.run(chatty.name, timeout=60)
    result = next(e.data for e in events if e.type == "tool:result")
    assert result["output"] == "é" * 20 + "\n[truncated: showed 40 of 200 bytes]"
    deltas = [e.data["text"] for e in events if e.type == "llm:delta"]
    assert deltas and all(d.startswith("z" * 41 + "\n[truncated") for d in deltas)
    assert events[-1].data["result"] == "z" * 300, "the result itself is never cut"
    journaled = [
        decode_journal_entry(value, headers).data
        for _, value, headers in read_topic(kafka_bootstrap_servers, chatty.topics.journal)
        if value is not None
    ]
    assert any(d.get("text") == "é" * 100 for d in journaled), "the journal keeps it whole"

    async with running_worker(noisy, kafka_bootstrap_servers):
        events = await client.run(noisy.name, timeout=60)
    assert len(events) == 5
    assert [e.type for e in events] == ["run:start", "status", "status", "status", "run:complete"]
    notice = events[-2].data
    assert notice["dropped_events"] == 8
    assert "max_event_count_per_turn=5" in notice["text"]


async def test_a_worker_refuses_an_agent_without_a_model(kafka_bootstrap_servers: str) -> None:
    @kafka_agent(name=unique_name("nomodel"), partitions=1)
    async def agent(ctx: AgentContext) -> str:
        return "never"

    with pytest.raises(ConfigurationError, match="has no model: pass llm="):
        KafkaWorker(agent, bootstrap_servers=kafka_bootstrap_servers)
