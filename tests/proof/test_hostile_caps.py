"""Ids and counts from outside past their caps (``wire/caps.py``) end in a dead letter
whose reason names the cap; the worker keeps running (issue 46).
"""

from __future__ import annotations

import json

from pyrula_stream import AgentContext, KafkaAgentClient, kafka_agent
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from pyrula_stream.wire.caps import MAX_PENDING_SIGNALS
from pyrula_stream.wire.signals import Signal, signal_record

JSON = [("content-type", b"application/json")]


async def test_a_70000_character_signal_id_is_refused_and_restores_still_work(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Before the cap the signal was journaled, and its 16-bit-framed key in the
    parked-turn store raised ``struct.error`` at every later assignment."""

    @kafka_agent(name=unique_name("capsig"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext) -> str:
        signal = await ctx.wait_for_signal("go")
        return f"went with {signal.payload}"

    journal, dlq = agent.topics.journal, agent.topics.dlq
    long_id = "s" * 70_000
    producer = RecordProducer(kafka_bootstrap_servers)
    try:
        async with running_worker(agent, kafka_bootstrap_servers) as worker:
            handle = await client.submit(agent.name)
            park = f"{handle.turn_id}/park".encode()

            def parked() -> bool:
                records = read_topic(kafka_bootstrap_servers, journal)
                return any(k == park and v for k, v, _ in records)

            await wait_for(parked, 60, "the turn parked on its wait")
            hostile = Signal("other", {"x": 1}, 1, "mallory", long_id, handle.turn_id)
            out = signal_record(agent.topics.replies, handle.turn_id, hostile)
            await producer.send(out.topic, out.key, out.value, list(out.headers))

            def decided() -> bool:
                journaled = any(
                    k is not None and long_id.encode() in k
                    for k, _, _ in read_topic(kafka_bootstrap_servers, journal)
                )
                return journaled or bool(read_topic(kafka_bootstrap_servers, dlq))

            await wait_for(decided, 60, "the long signal decided")
            assert not worker.done
        # A new owner restores the partition with the turn still parked.
        async with running_worker(agent, kafka_bootstrap_servers) as worker:
            assert not worker.done
            sent = await client.signal(agent.name, handle.turn_id, "go", "now", wait=60)
            assert sent.accepted
            events = [e async for e in client.stream(agent.name, handle.turn_id)]
            assert events[-1].type == "run:complete"
            assert events[-1].data["result"] == "went with now"
            assert not worker.done
    finally:
        producer.close()
    (_, value, headers), *_ = read_topic(kafka_bootstrap_servers, dlq)
    assert value is not None and long_id.encode() in value
    assert headers["pyrula.dlq.code"] == "signal_refused"
    assert "over the cap of 200 (MAX_SIGNAL_ID_CHARS)" in headers["pyrula.dlq.reason"]


async def test_turn_records_past_a_cap_are_dead_lettered_with_the_cap_named(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("capturn"), llm=FakeLLM(["fine"]), partitions=1)
    async def agent(ctx: AgentContext, q: str = "") -> str:
        return await ctx.llm.run([{"role": "user", "content": q or "hi"}])

    def request(**fields: str) -> bytes:
        return json.dumps({"agent": agent.name, "params": {}, **fields}).encode()

    lineage = [
        ("pyrula-root-turn-id", b"root"),
        ("pyrula-parent-turn-id", b"parent"),
        ("pyrula-parent-agent", b"caller"),
        ("pyrula-parent-prefix", b"pyrula"),
        ("pyrula-parent-partition", b"0"),
        ("pyrula-call-key", b"0.0"),
        ("pyrula-depth", b"1"),
        ("pyrula-tenant", b"t" * 5_000),
    ]
    hostile: list[tuple[bytes, list[tuple[str, bytes]], str]] = [
        (request(thread_id="x" * 600), JSON, "MAX_THREAD_ID_CHARS"),
        (request(idempotency_key="k" * 600), JSON, "MAX_IDEMPOTENCY_KEY_CHARS"),
        (request(turn_id="t" * 600), JSON, "MAX_TURN_ID_CHARS"),
        (request(), JSON + [(f"h{i}", b"v") for i in range(65)], "(MAX_HEADERS)"),
        (request(turn_id="child"), JSON + lineage, "MAX_TENANT_CHARS"),
    ]
    producer = RecordProducer(kafka_bootstrap_servers)
    try:
        async with running_worker(agent, kafka_bootstrap_servers) as worker:
            for value, headers, _ in hostile:
                await producer.send(agent.topics.turns, b"child", value, list(headers))

            def letters() -> list[tuple[bytes | None, bytes | None, dict[str, str]]]:
                return read_topic(kafka_bootstrap_servers, agent.topics.dlq)

            await wait_for(lambda: len(letters()) >= len(hostile), 60, "every dead letter")
            events = await client.run(agent.name, q="still there?", timeout=60)
            assert events[-1].type == "run:complete"
            assert not worker.done
    finally:
        producer.close()
    reasons = [h["pyrula.dlq.reason"] for _, _, h in letters()]
    assert len(reasons) == len(hostile)
    for reason, (_, _, cap) in zip(reasons, hostile, strict=True):
        assert cap in reason and "over the cap of" in reason, reason


async def test_a_signal_flood_past_the_pending_cap_is_refused_and_the_wait_still_ends(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("flood"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext) -> str:
        signal = await ctx.wait_for_signal("go")
        return f"went with {signal.payload}"

    journal, dlq = agent.topics.journal, agent.topics.dlq
    flood = MAX_PENDING_SIGNALS + 5
    producer = RecordProducer(kafka_bootstrap_servers)
    try:
        async with running_worker(agent, kafka_bootstrap_servers) as worker:
            handle = await client.submit(agent.name)
            park = f"{handle.turn_id}/park".encode()

            def parked() -> bool:
                records = read_topic(kafka_bootstrap_servers, journal)
                return any(k == park and v for k, v, _ in records)

            await wait_for(parked, 60, "the turn parked on its wait")
            for n in range(flood):
                note = Signal("note", n, 1, "mallory", f"flood-{n}", handle.turn_id)
                out = signal_record(agent.topics.replies, handle.turn_id, note)
                await producer.send(out.topic, out.key, out.value, list(out.headers))
            refused = flood - MAX_PENDING_SIGNALS

            def all_refused() -> bool:
                return len(read_topic(kafka_bootstrap_servers, dlq)) >= refused

            await wait_for(all_refused, 120, "the signals past the cap refused")
            sent = await client.signal(agent.name, handle.turn_id, "go", "now", wait=60)
            assert sent.accepted  # the signal the turn waits for still gets through
            events = [e async for e in client.stream(agent.name, handle.turn_id)]
            assert events[-1].data["result"] == "went with now"
            assert not worker.done
    finally:
        producer.close()
    letters = read_topic(kafka_bootstrap_servers, dlq)
    assert len(letters) == flood - MAX_PENDING_SIGNALS
    for _, _, headers in letters:
        assert headers["pyrula.dlq.code"] == "signal_refused"
        assert "too_many" in headers["pyrula.dlq.reason"]
        assert "MAX_PENDING_SIGNALS" in headers["pyrula.dlq.reason"]
