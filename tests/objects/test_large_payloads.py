"""Payloads by reference with the local-directory store: a turn whose request, tool result
and result are each far past a Kafka record completes, and the client reads every value
back whole; the records carry small references."""

from __future__ import annotations

import json
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
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.objects import LocalObjectStore
from pyrula_stream.testing import read_topic, running_worker, unique_name
from pyrula_stream.wire.payload_refs import REF_MARK

DOCUMENT = 20_000_000
LOG = 5_000_000
RESULT = 2_000_000


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "objects")


async def test_a_turn_far_past_a_record_completes_and_reads_back_whole(
    kafka_bootstrap_servers: str, store: LocalObjectStore
) -> None:
    @tool
    async def read_log(ctx: ToolContext, name: str) -> str:
        """Read a log file."""
        return "L" * LOG

    @kafka_agent(
        name=unique_name("large"),
        llm=FakeLLM([reply_tool_call("read_log", name="app.log"), "read it"]),
        tools=[read_log],
        partitions=1,
        limits=AgentLimits(max_tool_result_bytes=None),
    )
    async def agent(ctx: AgentContext, document: str) -> dict[str, Any]:
        answer = await ctx.llm.run([{"role": "user", "content": "read app.log"}])
        return {"document": len(document), "answer": answer, "summary": "S" * RESULT}

    options = WorkerOptions(object_store=store)
    async with (
        running_worker(agent, kafka_bootstrap_servers, options),
        KafkaAgentClient(kafka_bootstrap_servers, object_store=store) as client,
    ):
        events = await client.run(agent.name, document="D" * DOCUMENT, timeout=120)
    assert events[-1].type == "run:complete", events[-1].data
    result = events[-1].data["result"]
    assert result == {"document": DOCUMENT, "answer": "read it", "summary": "S" * RESULT}
    assert events[0].data["params"]["document"] == "D" * DOCUMENT
    [tool_result] = [e for e in events if e.type == "tool:result"]
    assert tool_result.data["output"] == "L" * LOG

    # Every record is small, and the ones that held the big values carry references.
    for topic in (
        agent.topics.events,
        agent.topics.results,
        agent.topics.journal,
        agent.topics.turns,
    ):
        for _, value, _ in read_topic(kafka_bootstrap_servers, topic):
            assert len(value or b"") < 300_000, topic
    [(_, stored_result, _)] = read_topic(kafka_bootstrap_servers, agent.topics.results)
    assert REF_MARK in (stored_result or b"")
    sizes = sorted(info.size for info in store.list())
    assert sizes[-1] == DOCUMENT + 2  # the document, as its JSON string
    assert LOG + 2 in sizes
    assert any(size > RESULT for size in sizes)
    assert (
        json.loads(store.get(next(i.key for i in store.list() if i.size == LOG + 2))) == "L" * LOG
    )
