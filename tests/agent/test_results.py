"""Typed results: output_type validation with retries, the results topic, output topics."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel

from pyrula_stream import AgentContext, KafkaAgentClient, kafka_agent
from pyrula_stream.errors import AgentRegistrationError
from pyrula_stream.kafka.admin import TopicSpec, apply_topics
from pyrula_stream.llm import FakeLLM
from pyrula_stream.llm.base import StreamItem, ToolDefinition
from pyrula_stream.testing import read_topic, running_worker, unique_name
from pyrula_stream.wire.serde import TurnResult, decode_turn_result


class Answer(BaseModel):
    order_id: str
    priority: int


class RecordingLLM(FakeLLM):
    """FakeLLM that remembers the system prompt of every call."""

    def __init__(self, script: list[Any]) -> None:
        super().__init__(script)
        self.systems: list[str | None] = []

    async def stream(
        self,
        messages: list[dict[str, Any]],
        tools: list[ToolDefinition] | None = None,
        system: str | None = None,
    ) -> AsyncIterator[StreamItem]:
        self.systems.append(system)
        async for item in super().stream(messages, tools, system):
            yield item


def results_of(bootstrap: str, topic: str) -> list[tuple[bytes | None, TurnResult, dict[str, str]]]:
    return [
        (key, decode_turn_result(value, headers), headers)
        for key, value, headers in read_topic(bootstrap, topic)
        if value is not None
    ]


async def test_a_bad_answer_is_sent_back_once_and_the_valid_one_is_the_result(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    llm = RecordingLLM(['{"order_id": "9"}', '```json\n{"order_id": "9", "priority": 2}\n```'])

    @kafka_agent(name=unique_name("typed"), llm=llm, output_type=Answer)
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}], system="Triage.")

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, thread_id="order-9", question="q", timeout=60)
    assert events[-1].type == "run:complete"
    assert events[-1].data["result"] == {"order_id": "9", "priority": 2}
    assert [e.type for e in events].count("llm:complete") == 2
    # The schema went to the model with the system prompt, on both calls.
    assert all(s and s.startswith("Triage.") and '"priority"' in s for s in llm.systems)

    [(key, result, headers)] = results_of(kafka_bootstrap_servers, agent.topics.results)
    assert key == b"order-9"  # keyed as the request was (its thread id)
    assert headers["content-type"] == "application/vnd.pyrula.turn_result.v1+avro"
    assert result.turn_id == events[0].turn_id
    assert result.status == "completed"
    assert result.result == {"order_id": "9", "priority": 2}
    assert result.usage["llm_calls"] == 2
    assert result.thread_id == "order-9"
    assert result.started_ms > 0 and result.finished_ms >= result.started_ms
    assert result.duration_ms == result.finished_ms - result.started_ms


async def test_retries_exhausted_fail_with_output_validation(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    llm = FakeLLM(["not json", '{"order_id": 9}', '{"order_id": "9", "priority": 1}'])

    @kafka_agent(name=unique_name("typedfail"), llm=llm, output_type=Answer, output_retries=1)
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "q"}])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=60)
    error = events[-1]
    assert error.type == "run:error"
    assert error.data["code"] == "output_validation"
    assert "after 2 attempt(s)" in error.data["message"]
    assert [e.type for e in events].count("llm:complete") == 2  # the third reply never asked

    [(key, result, _)] = results_of(kafka_bootstrap_servers, agent.topics.results)
    assert key == error.turn_id.encode()
    assert result.status == "failed"
    assert result.result is None
    assert result.error_code == "output_validation"
    assert result.error_message == error.data["message"]


async def test_a_returned_value_that_does_not_validate_is_not_sent_to_the_model(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("typedval"), llm=FakeLLM(), output_type=Answer)
    async def agent(ctx: AgentContext) -> dict[str, Any]:
        return {"order_id": "1", "priority": "high"}

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=60)
    assert events[-1].data["code"] == "output_validation"
    assert "priority" in events[-1].data["message"]
    assert "llm:complete" not in [e.type for e in events]


async def test_results_and_events_route_to_output_topics_in_json(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    answered, enriched = unique_name("orders.answered."), unique_name("orders.enriched.")
    apply_topics(kafka_bootstrap_servers, [TopicSpec(answered, 2), TopicSpec(enriched, 2)])

    @kafka_agent(
        name=unique_name("routed"),
        llm=FakeLLM(),
        output_topics={"run:complete": [answered], "results": [enriched]},
        event_format="json",
    )
    async def agent(ctx: AgentContext, n: int) -> dict[str, int]:
        return {"double": n * 2}

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, n=21, timeout=60)  # the client reads JSON events
    assert events[-1].data["result"] == {"double": 42}

    [(_, value, headers)] = read_topic(kafka_bootstrap_servers, answered)
    assert headers["content-type"] == "application/json"
    assert value is not None and json.loads(value)["type"] == "run:complete"
    assert json.loads(value)["data"]["result"] == {"double": 42}
    for topic in (agent.topics.results, enriched):
        [(key, raw, headers)] = read_topic(kafka_bootstrap_servers, topic)
        assert headers["content-type"] == "application/json"
        assert raw is not None
        body = json.loads(raw)  # what a consumer without Avro reads
        assert body["result"] == {"double": 42} and body["status"] == "completed"
        assert key == events[0].turn_id.encode()
        assert decode_turn_result(raw, headers).result == {"double": 42}


def test_bind_time_refusals() -> None:
    async def body(ctx: AgentContext) -> str:
        return ""

    with pytest.raises(AgentRegistrationError, match="not routable"):
        kafka_agent(name="x", llm=FakeLLM(), output_topics={"run:done": ["t"]})(body)
    with pytest.raises(AgentRegistrationError, match="event_format"):
        kafka_agent(name="x", llm=FakeLLM(), event_format="xml")(body)  # type: ignore[arg-type]
    with pytest.raises(AgentRegistrationError, match="output_type"):
        kafka_agent(name="x", llm=FakeLLM(), output_type=object())(body)


def test_the_schema_command_prints_the_result_schema(capsys: pytest.CaptureFixture[str]) -> None:
    from pyrula_stream.cli import main

    assert main(["schema", "tests.agents.typed:typed"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "Triage"
    assert set(schema["required"]) == {"order_id", "priority", "reply"}
    assert main(["schema", "examples.support_triage.agent:support"]) == 2
    assert "has no output_type" in capsys.readouterr().err
