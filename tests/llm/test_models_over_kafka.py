"""Real provider adapters (official SDKs against local wire servers) inside Kafka turns,
and the run's budget."""

from __future__ import annotations

from typing import Any

from pyrula_stream import (
    AgentContext,
    AgentLimits,
    KafkaAgentClient,
    ToolContext,
    kafka_agent,
    tool,
)
from pyrula_stream.llm import FakeLLM, LLMClient, reply_tool_call
from pyrula_stream.testing import read_topic, running_worker, unique_name
from pyrula_stream.testing_servers.anthropic_server import AnthropicWireServer, Text, ToolUse
from pyrula_stream.testing_servers.openai_server import Call, OpenAIWireServer
from pyrula_stream.wire.serde import decode_journal_entry
from tests.llm.servers import fixtures


@tool(read_only=True)
async def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, str]:
    """Look up an order."""
    return {"order_id": order_id, "status": "shipped"}


def support_agent(llm: LLMClient, limits: AgentLimits | None = None) -> Any:
    @kafka_agent(
        name=unique_name("model"), llm=llm, tools=[lookup_order], limits=limits, partitions=1
    )
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}], system="Be brief.")

    return agent


def assert_no_secret(bootstrap: str, agent: Any, secret: str) -> None:
    for topic in (agent.topics.events, agent.topics.journal):
        for _, value, _ in read_topic(bootstrap, topic):
            assert secret.encode() not in (value or b"")


async def test_a_turn_on_anthropic(
    kafka_bootstrap_servers: str,
    client: KafkaAgentClient,
    anthropic_server: AnthropicWireServer,
    anthropic_llm: LLMClient,
) -> None:
    anthropic_server.reply_stream(
        [ToolUse("toolu_1", "lookup_order", {"order_id": "9"})],
        stop_reason="tool_use",
        cache_read_input_tokens=100,
    )
    anthropic_server.reply_stream([Text("Order 9 has shipped and is on its way to you.")])
    agent = support_agent(anthropic_llm)
    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, question="Where is order 9?", timeout=60)
    assert events[-1].type == "run:complete"
    assert events[-1].data["result"] == "Order 9 has shipped and is on its way to you."
    assert any(e.type == "llm:delta" for e in events)
    first = next(e for e in events if e.type == "llm:complete")
    assert first.data["usage"]["cache_read_input_tokens"] == 100
    assert events[-1].data["usage"]["cost_usd"] > 0
    second_request = anthropic_server.requests[1].body
    assert second_request["messages"][-1]["content"][0]["type"] == "tool_result"
    assert second_request["tools"][0]["name"] == "lookup_order"
    assert_no_secret(kafka_bootstrap_servers, agent, fixtures.SECRET_KEY)


async def test_a_turn_on_openai(
    kafka_bootstrap_servers: str,
    client: KafkaAgentClient,
    openai_server: OpenAIWireServer,
    openai_llm: LLMClient,
) -> None:
    openai_server.reply_stream(
        "", [Call("call_1", "lookup_order", {"order_id": "9"})], finish_reason="tool_calls"
    )
    openai_server.reply_stream("Order 9 shipped.")
    agent = support_agent(openai_llm)
    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, question="Where is order 9?", timeout=60)
    assert events[-1].data.get("result") == "Order 9 shipped.", events[-1].data
    second = openai_server.requests[1].body
    assert second["messages"][-1]["role"] == "tool"
    assert second["messages"][-1]["content"] == '{"order_id":"9","status":"shipped"}'
    assert_no_secret(kafka_bootstrap_servers, agent, fixtures.OPENAI_SECRET_KEY)


async def test_a_truncated_stream_fails_the_turn_and_its_end_is_journaled(
    kafka_bootstrap_servers: str,
    client: KafkaAgentClient,
    openai_server: OpenAIWireServer,
    openai_llm: LLMClient,
) -> None:
    for _ in range(openai_llm.max_retries + 1):
        openai_server.reply_truncated("Order 9 sh")
    agent = support_agent(openai_llm)
    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, question="Where?", timeout=60)
    assert events[-1].data["code"] == "llm_provider_unavailable"
    assert events[-1].data["error_type"] == "ProviderStreamTruncated"
    # The failed call and the turn's end met in one commit: its terminal record went to
    # the journal (the call's entry and its tombstone were not written at all).
    ends = [
        decode_journal_entry(value, headers).data
        for key, value, headers in read_topic(kafka_bootstrap_servers, agent.topics.journal)
        if value is not None and key is not None and key.endswith(b"/terminal")
    ]
    assert [(e["status"], e["code"]) for e in ends] == [("failed", "llm_provider_unavailable")]


async def test_budgets_end_the_turn_and_name_the_limit(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    loop_forever = FakeLLM([reply_tool_call("lookup_order", order_id="1")])
    cases = [
        (AgentLimits(max_llm_calls=2), loop_forever, "max_llm_calls=2"),
        (AgentLimits(max_total_tokens=150), loop_forever, "max_total_tokens=150"),
        (AgentLimits(max_cost_usd=1.0), FakeLLM(["x"], model="mystery-9"), "no price"),
        (AgentLimits(context_window=20), FakeLLM(["x"]), "context window"),
        (AgentLimits(max_turn_wall_seconds=0.0), FakeLLM(["x"]), "max_turn_wall_seconds"),
    ]
    for limits, llm, message in cases:
        agent = support_agent(llm, limits)
        async with running_worker(agent, kafka_bootstrap_servers):
            events = await client.run(agent.name, question="go " * 30, timeout=60)
        error = events[-1].data
        assert error["code"] in ("budget_exceeded", "context_window_exceeded"), error
        assert message in error["message"], error
    assert error["detail"]["limit"] == "max_turn_wall_seconds"
