"""Payloads by reference with the local-directory store: a turn whose request, tool result
and result are each far past a Kafka record completes, and the client reads every value
back whole; the records carry small references."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from pyrula_stream import (
    AgentContext,
    AgentLimits,
    KafkaAgentClient,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.llm import FakeLLM, reply_text, reply_tool_call
from pyrula_stream.llm.base import ModelResponse, ToolDefinition
from pyrula_stream.llm.fake import count_model_calls
from pyrula_stream.objects import LocalObjectStore, ObjectStore, PayloadStores
from pyrula_stream.runtime.replay import replay_turn
from pyrula_stream.state.history import load_recording
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from pyrula_stream.wire.payload_refs import REF_MARK

DOCUMENT = 20_000_000
LOG = 5_000_000
RESULT = 2_000_000


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "objects")


async def test_a_turn_far_past_a_record_completes_and_reads_back_whole(
    kafka_bootstrap_servers: str, object_store: ObjectStore
) -> None:
    """A 20 MB request, a 5 MB tool result, a 2 MB result, on each store: read back whole
    by the client (stream and result), replayed offline from its history, and branched
    after the tool (whose recorded result the branch reads from the store instead of
    running it)."""
    store = object_store
    log_reads: list[int] = []

    @tool(read_only=True)
    async def read_log(ctx: ToolContext, name: str) -> str:
        """Read a log file."""
        log_reads.append(1)
        return "L" * LOG

    def respond(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
        if count_model_calls(messages):
            return reply_text("read it")
        return reply_tool_call("read_log", name="app.log")

    @kafka_agent(
        name=unique_name("large"),
        llm=FakeLLM(respond),
        tools=[read_log],
        partitions=1,
        keep_history=True,
        limits=AgentLimits(max_tool_result_bytes=None),
    )
    async def agent(ctx: AgentContext, document: str) -> dict[str, Any]:
        answer = await ctx.llm.run([{"role": "user", "content": "read app.log"}])
        return {"document": len(document), "answer": answer, "summary": "S" * RESULT}

    options = WorkerOptions(object_store=store)
    expected = {"document": DOCUMENT, "answer": "read it", "summary": "S" * RESULT}
    async with (
        running_worker(agent, kafka_bootstrap_servers, options),
        KafkaAgentClient(kafka_bootstrap_servers, object_store=store) as client,
    ):
        events = await client.run(agent.name, document="D" * DOCUMENT, timeout=120)
        assert events[-1].type == "run:complete", events[-1].data
        turn_id = events[-1].turn_id
        branch = await client.branch(agent.name, turn_id, from_step=3)
        branched = [e async for e in client.stream(agent.name, branch.turn_id)]
    assert events[-1].data["result"] == expected
    assert events[0].data["params"]["document"] == "D" * DOCUMENT
    [tool_result] = [e for e in events if e.type == "tool:result"]
    assert tool_result.data["output"] == "L" * LOG
    assert branched[-1].type == "run:complete", branched[-1].data
    assert branched[-1].data["result"] == expected
    assert log_reads == [1]  # the branch took the recorded 5 MB result

    recording = await asyncio.to_thread(
        load_recording,
        kafka_bootstrap_servers,
        agent.topics.history,
        turn_id,
        payloads=PayloadStores([store]),
    )
    report = await replay_turn(agent, recording)
    assert report.clean, report.message

    # Every record is small, and the ones that held the big values carry references.
    for topic in (
        agent.topics.events,
        agent.topics.results,
        agent.topics.journal,
        agent.topics.turns,
        agent.topics.history,
    ):
        for _, value, _ in read_topic(kafka_bootstrap_servers, topic):
            assert len(value or b"") < 300_000, topic
    for _, stored_result, _ in read_topic(kafka_bootstrap_servers, agent.topics.results):
        assert REF_MARK in (stored_result or b"")
    sizes = sorted(info.size for info in store.list())
    assert sizes[-1] == DOCUMENT + 2  # the document, as its JSON string
    assert LOG + 2 in sizes
    assert any(size > RESULT for size in sizes)
    key = next(i.key for i in store.list() if i.size == LOG + 2)
    assert json.loads(store.get(key)) == "L" * LOG


async def test_a_worker_that_takes_over_reads_the_recorded_value_back(
    kafka_bootstrap_servers: str, store: LocalObjectStore
) -> None:
    """The first worker journals a 5 MB tool result by reference and stops mid-turn; the
    next one replays it from the store (the tool does not run again, and the model call
    after it sees the same conversation, else the replay would fail its fingerprint)."""
    big_runs: list[int] = []
    gate_runs: list[int] = []

    @tool
    async def read_log(ctx: ToolContext) -> str:
        """Read a log file."""
        big_runs.append(1)
        return "L" * LOG

    @tool
    async def wait_gate(ctx: ToolContext) -> str:
        """Hangs on the first worker."""
        gate_runs.append(1)
        if len(gate_runs) == 1:
            await asyncio.sleep(3600)
        return "through"

    script = [reply_tool_call("read_log"), reply_tool_call("wait_gate"), "done"]

    @kafka_agent(
        name=unique_name("takeover"),
        llm=FakeLLM(script),
        tools=[read_log, wait_gate],
        partitions=1,
        limits=AgentLimits(max_tool_result_bytes=None),
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    options = WorkerOptions(object_store=store, shutdown_grace=0.2)
    async with KafkaAgentClient(kafka_bootstrap_servers, object_store=store) as client:
        async with running_worker(agent, kafka_bootstrap_servers, options):
            handle = await client.submit(agent.name)
            await wait_for(lambda: len(gate_runs) == 1, 30, "the gate tool started")
        async with running_worker(agent, kafka_bootstrap_servers, options) as worker:
            events = [e async for e in client.stream(agent.name, handle.turn_id)]
            resolved = worker.metrics.registry.get_sample_value(
                "pyrula_payload_refs_resolved_total", {"agent": agent.name}
            )
    assert events[-1].type == "run:complete", events[-1].data
    assert events[-1].data["result"] == "done"
    assert big_runs == [1] and len(gate_runs) == 2
    assert (resolved or 0) >= 1


async def test_a_value_past_the_agents_max_payload_bytes_fails_the_turn_naming_it(
    kafka_bootstrap_servers: str, store: LocalObjectStore
) -> None:
    @tool
    async def read_log(ctx: ToolContext) -> str:
        """Read a log file."""
        return "L" * 600_000

    @kafka_agent(
        name=unique_name("limit"),
        llm=FakeLLM([reply_tool_call("read_log"), "read it"]),
        tools=[read_log],
        partitions=1,
        limits=AgentLimits(max_tool_result_bytes=None, max_payload_bytes=500_000),
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "read"}])

    async with (
        running_worker(agent, kafka_bootstrap_servers, WorkerOptions(object_store=store)),
        KafkaAgentClient(kafka_bootstrap_servers, object_store=store) as client,
    ):
        events = await client.run(agent.name, timeout=60)
    assert events[-1].type == "run:error"
    assert events[-1].data["code"] == "stream_too_large"
    assert "max_payload_bytes=500000" in events[-1].data["message"]
    assert list(store.list()) == []


async def test_a_sub_agents_large_request_and_result_travel_by_reference(
    kafka_bootstrap_servers: str, store: LocalObjectStore
) -> None:
    """Both past a record: the parent's call and the child's reply carry references."""

    @kafka_agent(name=unique_name("child"), llm=FakeLLM(["ok"]), partitions=1)
    async def child(ctx: AgentContext, doc: str) -> str:
        return "C" * len(doc)

    @kafka_agent(name=unique_name("parent"), llm=FakeLLM(["ok"]), partitions=1)
    async def parent(ctx: AgentContext) -> int:
        return len(await ctx.call_agent(child, doc="Q" * 1_200_000))

    options = WorkerOptions(object_store=store)
    async with (
        running_worker(child, kafka_bootstrap_servers, options),
        running_worker(parent, kafka_bootstrap_servers, options),
        KafkaAgentClient(kafka_bootstrap_servers, object_store=store) as client,
    ):
        events = await client.run(parent.name, timeout=60)
    assert events[-1].type == "run:complete", events[-1].data
    assert events[-1].data["result"] == 1_200_000
    [answer] = [e for e in events if e.type == "subagent:result"]
    assert answer.data["result"] == "C" * 1_200_000


async def test_a_worker_without_the_store_fails_the_turn_naming_store_and_key(
    kafka_bootstrap_servers: str, store: LocalObjectStore
) -> None:
    @kafka_agent(name=unique_name("nostore"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext, document: str) -> int:
        return len(document)

    async with (
        running_worker(agent, kafka_bootstrap_servers),
        KafkaAgentClient(kafka_bootstrap_servers, object_store=store) as client,
    ):
        events = await client.run(agent.name, document="D" * 400_000, timeout=60)
    [stored] = list(store.list())
    assert events[-1].type == "run:error"
    assert events[-1].data["code"] == "payload_unresolved"
    assert "'local'" in events[-1].data["message"]
    assert "PYRULA_OBJECT_STORE" in events[-1].data["message"]
    assert stored.key in events[-1].data["message"]


async def test_a_large_memory_value_is_stored_by_reference_and_read_back(
    kafka_bootstrap_servers: str, store: LocalObjectStore
) -> None:
    """Past the memory topic's 256 KiB cap (which fails the put without a store)."""
    ns = ("tests", uuid.uuid4().hex)

    @kafka_agent(name=unique_name("bigmem"), llm=FakeLLM(["x"]), partitions=1)
    async def agent(ctx: AgentContext, write: bool) -> Any:
        if write:
            await ctx.memory.put(ns, "doc", {"blob": "M" * 400_000})
        item = await ctx.memory.get(ns, "doc")
        return None if item is None else len(item.value["blob"])

    async with (
        running_worker(agent, kafka_bootstrap_servers, WorkerOptions(object_store=store)),
        KafkaAgentClient(kafka_bootstrap_servers, object_store=store) as client,
    ):
        wrote = await client.run(agent.name, write=True, timeout=60)
        assert wrote[-1].data.get("result") == 400_000, wrote[-1].data
        read: Any = None
        for _ in range(30):  # eventual: the worker's view catches up with the topic
            read = (await client.run(agent.name, write=False, timeout=60))[-1].data
            if read.get("result") is not None:
                break
            await asyncio.sleep(0.5)
    assert read["result"] == 400_000, read
    [memory] = [r for r in read_topic(kafka_bootstrap_servers, f"{agent.prefix}.memory")
                if r[0] and ns[-1].encode() in r[0]]  # fmt: skip
    assert REF_MARK in (memory[1] or b"") and len(memory[1] or b"") < 10_000


async def test_a_thread_keeps_a_large_tool_result_by_reference(
    kafka_bootstrap_servers: str, store: LocalObjectStore
) -> None:
    """The next turn of the thread sends the model the whole earlier tool result, and
    ``get_thread`` shows it whole; the thread record is past a record without a store."""

    @tool(read_only=True)
    async def read_log(ctx: ToolContext) -> str:
        """Read a log file."""
        return "L" * 1_200_000

    def respond(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
        seen = sum(len(str(m.get("content", ""))) for m in messages)
        if messages[-1].get("content") == "again":
            return reply_text(f"saw {seen >= 1_200_000}")
        return reply_text("read it") if count_model_calls(messages) else reply_tool_call("read_log")

    @kafka_agent(
        name=unique_name("bigthread"),
        llm=FakeLLM(respond),
        tools=[read_log],
        partitions=1,
        limits=AgentLimits(max_tool_result_bytes=None),
    )
    async def agent(ctx: AgentContext, text: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": text}])

    async with (
        running_worker(agent, kafka_bootstrap_servers, WorkerOptions(object_store=store)),
        KafkaAgentClient(kafka_bootstrap_servers, object_store=store) as client,
    ):
        first = await client.run(agent.name, thread_id="t1", text="read", timeout=60)
        second = await client.run(agent.name, thread_id="t1", text="again", timeout=60)
        thread = await client.get_thread(agent.name, "t1")
    assert first[-1].type == "run:complete", first[-1].data
    assert second[-1].data["result"] == "saw True", second[-1].data
    contents = [str(m.get("content")) for t in thread.turns for m in t.messages]
    assert any("L" * 1_200_000 in c for c in contents)
    for _, value, _ in read_topic(kafka_bootstrap_servers, agent.topics.threads):
        assert len(value or b"") < 300_000
