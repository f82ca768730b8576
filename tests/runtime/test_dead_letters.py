"""A malformed turn record goes to the DLQ with the reason; the worker keeps running."""

from __future__ import annotations

import json

from pyrula_stream import AgentContext, KafkaAgentClient, kafka_agent
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for


async def test_malformed_record_is_dead_lettered_and_next_turn_completes(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("dlq"), llm=FakeLLM(["fine"]), partitions=1)
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    producer = RecordProducer(kafka_bootstrap_servers)
    async with running_worker(agent, kafka_bootstrap_servers):
        await producer.send(agent.topics.turns, b"k1", b"\x00\x01garbage")
        await producer.send(
            agent.topics.turns,
            b"k2",
            json.dumps({"agent": agent.name, "params": ["not", "an", "object"]}).encode(),
            [("content-type", b"application/json")],
        )
        events = await client.run(agent.name, question="still there?", timeout=60)
        assert events[-1].type == "run:complete"

        def dead_letters() -> list[tuple[bytes | None, bytes | None, dict[str, str]]]:
            return read_topic(kafka_bootstrap_servers, agent.topics.dlq)

        await wait_for(lambda: len(dead_letters()) == 2, 30, "two dead letters")
    producer.close()
    first, second = dead_letters()
    assert first[1] == b"\x00\x01garbage"  # the original bytes, untouched
    assert "does not decode as turn_request.avsc" in first[2]["pyrula.dlq.reason"]
    assert first[2]["pyrula.dlq.code"] == "invalid_request"
    assert first[2]["pyrula.dlq.source"].startswith(f"{agent.topics.turns}[0]@")
    assert "field 'params' must be a JSON object" in second[2]["pyrula.dlq.reason"]
    assert second[2]["pyrula.original.content-type"] == "application/json"


async def test_a_dead_letter_keeps_no_credential_header(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("dlqcred"), llm=FakeLLM(["fine"]), partitions=1)
    async def agent(ctx: AgentContext) -> str:
        return "ok"

    producer = RecordProducer(kafka_bootstrap_servers)
    async with running_worker(agent, kafka_bootstrap_servers):
        await producer.send(
            agent.topics.turns,
            b"k1",
            b"\x00garbage",
            [
                ("Authorization", b"Bearer sk-live-0123456789"),
                ("x-api-key", b"key-0123456789"),
                ("session-token", b"tok-0123456789"),
                ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            ],
        )
        await wait_for(
            lambda: len(read_topic(kafka_bootstrap_servers, agent.topics.dlq)) == 1, 30, "dlq"
        )
    producer.close()
    ((_, value, headers),) = read_topic(kafka_bootstrap_servers, agent.topics.dlq)
    assert value == b"\x00garbage"
    assert headers["pyrula.original.Authorization"] == "[redacted]"
    assert headers["pyrula.original.x-api-key"] == "[redacted]"
    assert headers["pyrula.original.session-token"] == "[redacted]"
    assert headers["pyrula.original.traceparent"].startswith("00-0af7651916cd43dd")
