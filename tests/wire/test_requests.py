"""The request side as a producer that is not Python sees it (kcat, Connect, a Go service):
no turn id, no agent, a bare params object, a correlation id echoed on the result."""

from __future__ import annotations

import json

from pyrula_stream import AgentContext, KafkaAgentClient, kafka_agent
from pyrula_stream.kafka.group import record_turn_id
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from pyrula_stream.wire.serde import decode_turn_result


async def test_minimal_requests_run_and_their_results_echo_the_request(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("req"), llm=FakeLLM(), partitions=2)
    async def agent(ctx: AgentContext, order_id: str) -> dict[str, str]:
        return {"order_id": order_id, "answer": "shipped"}

    producer = RecordProducer(kafka_bootstrap_servers)
    async with running_worker(agent, kafka_bootstrap_servers, all_partitions=True):
        # kcat -H content-type=application/json: no turn_id, no agent
        plain = await producer.send(
            agent.topics.turns,
            b"order-7",
            json.dumps({"params": {"order_id": "7"}}).encode(),
            [
                ("content-type", b"application/json"),
                ("pyrula.correlation-id", b"corr-7"),
                ("pyrula.reply.source", b"orders-db"),
            ],
        )
        # the value is the params object itself
        bare = await producer.send(
            agent.topics.turns,
            b"order-8",
            b'{"order_id": "8"}',
            [("content-type", b"application/vnd.pyrula.params+json")],
        )

        def results() -> list[tuple[bytes | None, bytes | None, dict[str, str]]]:
            return read_topic(kafka_bootstrap_servers, agent.topics.results)

        await wait_for(lambda: len(results()) == 2, 60, "two results")
    producer.close()
    by_key = {key: (decode_turn_result(v, h), h) for key, v, h in results() if v is not None}

    seven, headers = by_key[b"order-7"]  # keyed as the request was, not by turn id
    assert seven.status == "completed"
    assert seven.result == {"order_id": "7", "answer": "shipped"}
    assert seven.turn_id == record_turn_id(agent.topics.turns, plain.partition, plain.offset)
    assert seven.correlation_id == "corr-7"
    assert headers["pyrula.correlation-id"] == "corr-7"
    assert headers["source"] == "orders-db"

    eight, _ = by_key[b"order-8"]
    assert eight.result == {"order_id": "8", "answer": "shipped"}
    assert eight.turn_id == record_turn_id(agent.topics.turns, bare.partition, bare.offset)
    # The default turn id is an ordinary turn id: its events stream like any other.
    events = [e async for e in client.stream(agent.name, eight.turn_id)]
    assert events[-1].type == "run:complete"


def test_the_default_turn_id_depends_only_on_where_the_record_sits() -> None:
    assert record_turn_id("t", 0, 5) == record_turn_id("t", 0, 5)
    ids = {record_turn_id("t", 0, 5), record_turn_id("t", 1, 5), record_turn_id("t", 0, 6)}
    assert len(ids) == 3
    assert record_turn_id("t", 0, 5) != record_turn_id("u", 0, 5)
