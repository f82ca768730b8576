"""Hostile turn records end in the DLQ with their reason; the worker never dies on one."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from pyrula_stream import AgentContext, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.kafka.stores.memory import KafkaMemory
from pyrula_stream.llm import FakeLLM
from pyrula_stream.state.memory import record_key
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from pyrula_stream.wire.guard import DecodeLimits

Headers = list[tuple[str, str | bytes | None]]
PARAMS: Headers = [("content-type", b"application/vnd.pyrula.params+json")]
JSON: Headers = [("content-type", b"application/json")]


async def test_deeply_nested_and_huge_records_are_dead_lettered_and_worker_carries_on(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Issue 28 item 1: 100k nested brackets made ``json.loads`` raise RecursionError,
    which passed every ``except`` and killed the worker (and every next owner)."""

    @kafka_agent(name=unique_name("hostile"), llm=FakeLLM(["fine"]), partitions=1)
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    hostile: list[tuple[bytes, Headers]] = [
        (b"[" * 100_000 + b"]" * 100_000, PARAMS),
        (b'{"a":' + b"9" * 5_000 + b"}", PARAMS),  # past Python's int max str digits
        (b'{"q": "\xff\xfe"}', PARAMS),  # invalid UTF-8
        (
            json.dumps({"agent": agent.name, "params": {}, "submitted_ms": "soon"}).encode(),
            JSON,
        ),
        (json.dumps({"agent": agent.name, "params": {}, "metadata": [1]}).encode(), JSON),
    ]
    producer = RecordProducer(kafka_bootstrap_servers)
    async with running_worker(agent, kafka_bootstrap_servers) as worker:
        for value, headers in hostile:
            await producer.send(agent.topics.turns, b"k", value, headers)
        events = await client.run(agent.name, question="still there?", timeout=60)
        assert events[-1].type == "run:complete"
        assert not worker.done

        def dead_letters() -> list[tuple[bytes | None, bytes | None, dict[str, str]]]:
            return read_topic(kafka_bootstrap_servers, agent.topics.dlq)

        await wait_for(lambda: len(dead_letters()) == len(hostile), 30, "every hostile record")
    producer.close()
    letters = dead_letters()
    assert [value for _, value, _ in letters] == [value for value, _ in hostile]
    reasons = [headers["pyrula.dlq.reason"] for _, _, headers in letters]
    assert "nested deeper than" in reasons[0]
    assert "digits" in reasons[1]
    assert "UTF-8" in reasons[2] or "utf-8" in reasons[2]
    assert all(headers["pyrula.dlq.code"] == "invalid_request" for _, _, headers in letters)


async def test_unreadable_replies_are_dead_lettered_and_the_worker_carries_on(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """A reply nested past the parser's stack killed the worker at ``parse_reply``; a
    reply that was merely unreadable was dropped with a log line. Both go to the DLQ."""

    @kafka_agent(name=unique_name("replies"), llm=FakeLLM(["fine"]), partitions=1)
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    deep = b"[" * 100_000 + b"]" * 100_000
    wrong = json.dumps({"parent_turn_id": 1, "child_turn_id": [], "agent": {}}).encode()
    producer = RecordProducer(kafka_bootstrap_servers)
    async with running_worker(agent, kafka_bootstrap_servers) as worker:
        for value in (deep, wrong):
            await producer.send(agent.topics.replies, b"parent", value, JSON)

        def dead_letters() -> list[tuple[bytes | None, bytes | None, dict[str, str]]]:
            return read_topic(kafka_bootstrap_servers, agent.topics.dlq)

        await wait_for(lambda: len(dead_letters()) == 2, 60, "both replies dead-lettered")
        events = await client.run(agent.name, question="still there?", timeout=60)
        assert events[-1].type == "run:complete"
        assert not worker.done
    producer.close()
    (_, first, h1), (_, second, h2) = dead_letters()
    assert (first, second) == (deep, wrong)
    assert "nested deeper than" in h1["pyrula.dlq.reason"]
    assert "field 'parent_turn_id' must be text" in h2["pyrula.dlq.reason"]
    assert h1["pyrula.dlq.source"] == f"{agent.topics.replies}[0]@0"


async def test_a_memory_reader_skips_unreadable_records_and_keeps_following(
    kafka_bootstrap_servers: str, tmp_path: Path
) -> None:
    """Anyone who may write the shared memory topic could stop every worker's reader."""
    memory = KafkaMemory(
        kafka_bootstrap_servers, state_dir=tmp_path, client_id="m", prefix=unique_name("mem")
    )
    await asyncio.to_thread(memory.start)
    producer = RecordProducer(kafka_bootstrap_servers)
    try:
        key = record_key(("ns",), "bad").encode()
        await producer.send(memory.topic, key, b"[" * 100_000 + b"]" * 100_000)
        await producer.send(memory.topic, key, json.dumps({"namespace": 7}).encode())
        await asyncio.to_thread(
            memory.put, ("ns",), "good", {"v": 1}, source="user", written_by_run_id=None
        )
        await wait_for(lambda: memory.get(("ns",), "good") is not None, 30, "the good item")
        assert memory.skipped_records == 2
        assert memory.get(("ns",), "bad") is None
    finally:
        producer.close()
        memory.close()


async def test_decode_limits_are_worker_options(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("limits"), llm=FakeLLM(["fine"]), partitions=1)
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    options = WorkerOptions(decode_limits=DecodeLimits(max_bytes=4096, max_depth=3))
    producer = RecordProducer(kafka_bootstrap_servers)
    async with running_worker(agent, kafka_bootstrap_servers, options):
        await producer.send(agent.topics.turns, b"k", b'{"q": [[[["deep"]]]]}', PARAMS)
        await producer.send(agent.topics.turns, b"k", b'{"q": "' + b"x" * 5000 + b'"}', PARAMS)
        events = await client.run(agent.name, question="shallow", timeout=60)
        assert events[-1].type == "run:complete"
        await wait_for(
            lambda: len(read_topic(kafka_bootstrap_servers, agent.topics.dlq)) == 2, 30, "DLQ"
        )
    producer.close()
    reasons = [
        h["pyrula.dlq.reason"] for _, _, h in read_topic(kafka_bootstrap_servers, agent.topics.dlq)
    ]
    assert "nested deeper than 3 levels" in reasons[0]
    assert "over the decode limit of 4096" in reasons[1]
