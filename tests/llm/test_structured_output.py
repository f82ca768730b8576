"""The output_type's JSON Schema given natively to the model (OpenAI ``response_format``,
Anthropic ``output_config.format``) through the official SDKs against the local wire
servers, inside real Kafka turns; validation, retries and replay stay as they are."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from pyrula_stream import AgentContext, KafkaAgentClient, ToolContext, kafka_agent, tool
from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.agent.output import OutputSpec
from pyrula_stream.llm import LLMClient, OpenAILLM
from pyrula_stream.runtime.replay import replay_turn
from pyrula_stream.state.history import load_recording
from pyrula_stream.testing import running_worker, unique_name
from pyrula_stream.testing_servers.anthropic_server import AnthropicWireServer, Text, ToolUse
from pyrula_stream.testing_servers.openai_server import MODEL, OpenAIWireServer
from tests.llm.servers import fixtures


class Triage(BaseModel):
    order_id: str
    priority: int


class TriageV2(BaseModel):
    order_id: str
    priority: int
    team: str


@tool(read_only=True)
async def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, str]:
    """Look up an order."""
    return {"order_id": order_id, "status": "late"}


def triage_agent(llm: LLMClient, output_type: Any = Triage, name: str | None = None) -> KafkaAgent:
    @kafka_agent(
        name=name or unique_name("triage"),
        llm=llm,
        tools=[lookup_order],
        output_type=output_type,
        keep_history=True,
        partitions=1,
    )
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}], system="Triage.")

    return agent


def system_text(body: dict[str, Any]) -> str:
    system = body.get("system", "")
    return system if isinstance(system, str) else "".join(b["text"] for b in system)


class Line(BaseModel):
    sku: str


class Order(BaseModel):
    lines: list[Line]
    notes: dict[str, str]


def test_closed_object_schemas_go_natively_and_the_rest_stay_in_the_prompt() -> None:
    nested = OutputSpec(TriageV2).native_format()
    assert nested is not None and nested.name == "TriageV2"
    with_defs = OutputSpec(list[Line] | Line).native_format()
    assert with_defs is None  # the root is not an object
    for prompted in (str, int, list[Line], dict[str, int], Order):
        assert OutputSpec(prompted).native_format() is None, prompted

    class Box(BaseModel):
        line: Line

    boxed = OutputSpec(Box).native_format()
    assert boxed is not None
    assert boxed.schema["$defs"]["Line"]["additionalProperties"] is False


async def test_openai_gets_the_schema_as_strict_response_format(
    kafka_bootstrap_servers: str,
    client: KafkaAgentClient,
    openai_server: OpenAIWireServer,
    openai_llm: LLMClient,
) -> None:
    openai_server.reply_stream('{"order_id": "9"}')  # invalid: sent back once
    openai_server.reply_stream('{"order_id": "9", "priority": 2}')
    agent = triage_agent(openai_llm)
    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, question="Order 9 is late", timeout=60)
    assert events[-1].type == "run:complete", events[-1].data
    assert events[-1].data["result"] == {"order_id": "9", "priority": 2}

    first, retry = (r.body for r in openai_server.requests)
    expected = {
        "type": "json_schema",
        "json_schema": {
            "name": "Triage",
            "strict": True,
            "schema": {
                "title": "Triage",
                "type": "object",
                "properties": {
                    "order_id": {"title": "Order Id", "type": "string"},
                    "priority": {"title": "Priority", "type": "integer"},
                },
                "required": ["order_id", "priority"],
                "additionalProperties": False,
            },
        },
    }
    assert first["response_format"] == expected
    assert retry["response_format"] == expected
    # Given natively, the schema is not repeated in the system prompt.
    assert first["messages"][0] == {"role": "system", "content": "Triage."}
    assert "does not match the required output schema" in retry["messages"][-1]["content"]
    assert "tools" in first  # the agent's tools stay callable beside the output format


async def test_anthropic_gets_the_schema_as_output_config_after_a_tool_call(
    kafka_bootstrap_servers: str,
    client: KafkaAgentClient,
    anthropic_server: AnthropicWireServer,
    anthropic_llm: LLMClient,
) -> None:
    anthropic_server.reply_stream(
        [ToolUse("toolu_1", "lookup_order", {"order_id": "9"})], stop_reason="tool_use"
    )
    anthropic_server.reply_stream([Text('{"order_id": "9", "priority": 1}')])
    agent = triage_agent(anthropic_llm)
    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, question="Order 9 is late", timeout=60)
    assert events[-1].type == "run:complete", events[-1].data
    assert events[-1].data["result"] == {"order_id": "9", "priority": 1}

    bodies = [r.body for r in anthropic_server.requests]
    assert len(bodies) == 2
    for body in bodies:  # on every call: the model may use tools, its answer is constrained
        assert body["output_config"] == {
            "format": {
                "type": "json_schema",
                "schema": {
                    "title": "Triage",
                    "type": "object",
                    "properties": {
                        "order_id": {"title": "Order Id", "type": "string"},
                        "priority": {"title": "Priority", "type": "integer"},
                    },
                    "required": ["order_id", "priority"],
                    "additionalProperties": False,
                },
            }
        }
        assert [t["name"] for t in body["tools"]] == ["lookup_order"]
        assert "tool_choice" not in body
        assert system_text(body) == "Triage."
    assert bodies[1]["messages"][-1]["content"][0]["type"] == "tool_result"


async def test_a_schema_providers_cannot_take_stays_in_the_prompt(
    kafka_bootstrap_servers: str,
    client: KafkaAgentClient,
    anthropic_server: AnthropicWireServer,
    anthropic_llm: LLMClient,
) -> None:
    anthropic_server.reply_stream([Text('{"late": 3}')])
    agent = triage_agent(anthropic_llm, output_type=dict[str, int])
    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, question="Count late orders", timeout=60)
    assert events[-1].data["result"] == {"late": 3}
    [body] = [r.body for r in anthropic_server.requests]
    assert "output_config" not in body
    assert '"additionalProperties":{"type":"integer"}' in system_text(body)


async def test_structured_output_off_keeps_the_schema_in_the_prompt(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, openai_server: OpenAIWireServer
) -> None:
    llm = OpenAILLM(
        MODEL,
        api_key=fixtures.OPENAI_SECRET_KEY,
        base_url=openai_server.base_url,
        structured_output=False,  # a model or compatible server without json_schema
    )
    openai_server.reply_stream('{"order_id": "9", "priority": 3}')
    agent = triage_agent(llm)
    try:
        async with running_worker(agent, kafka_bootstrap_servers):
            events = await client.run(agent.name, question="Order 9 is late", timeout=60)
    finally:
        await llm.aclose()
    assert events[-1].data["result"] == {"order_id": "9", "priority": 3}
    [body] = [r.body for r in openai_server.requests]
    assert "response_format" not in body
    system = body["messages"][0]["content"]
    assert system.startswith("Triage.\n\n") and '"priority"' in system


async def test_a_changed_output_type_fails_replay_with_replay_input_changed(
    kafka_bootstrap_servers: str,
    client: KafkaAgentClient,
    openai_server: OpenAIWireServer,
    openai_llm: LLMClient,
) -> None:
    openai_server.reply_stream('{"order_id": "9", "priority": 2}')
    agent = triage_agent(openai_llm)
    async with running_worker(agent, kafka_bootstrap_servers):
        handle = await client.submit(agent.name, question="Order 9 is late")
        events = [e async for e in client.stream(agent.name, handle.turn_id)]
    assert events[-1].type == "run:complete", events[-1].data
    recording = await asyncio.to_thread(
        load_recording, kafka_bootstrap_servers, agent.topics.history, handle.turn_id
    )

    same = await replay_turn(triage_agent(openai_llm, Triage, agent.name), recording)
    assert same.clean, same.message
    changed = await replay_turn(triage_agent(openai_llm, TriageV2, agent.name), recording)
    assert not changed.clean
    assert changed.step == 1
    assert "the output schema (output_type) changed" in changed.message
    assert "system prompt" not in changed.message
    assert len(openai_server.requests) == 1  # replay never called the model
    assert recording.terminal["result"] == {"order_id": "9", "priority": 2}
