"""FallbackLLM with LiteLLM on either side, through the real ``litellm`` package (its
OpenAI-compatible provider) against the local Chat Completions server: a provider that is
down hands the call to LiteLLM, a LiteLLM that rate-limits hands it on, and on the real
broker a turn's model calls, cost and metrics are LiteLLM's model's."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pyrula_stream import AgentContext, KafkaAgentClient, ToolContext, kafka_agent, tool
from pyrula_stream.llm import AnthropicLLM, FallbackLLM, LiteLLM, ToolDefinition
from pyrula_stream.llm.pricing import DEFAULT_PRICES
from pyrula_stream.testing import running_worker, unique_name
from pyrula_stream.testing_servers.anthropic_server import AnthropicWireServer
from pyrula_stream.testing_servers.openai_server import Call, OpenAIWireServer
from tests.llm.servers.fixtures import OPENAI_SECRET_KEY, collect

HELLO = [{"role": "user", "content": "hello"}]
LOOKUP = ToolDefinition(
    name="lookup",
    description="Find an order by id.",
    input_schema={"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
)
PRICED = "gpt-4o-mini"


@pytest.fixture
async def litellm_llm(openai_server: OpenAIWireServer) -> AsyncIterator[LiteLLM]:
    adapter = LiteLLM(
        f"openai/{PRICED}",
        api_base=openai_server.base_url,
        api_key=OPENAI_SECRET_KEY,
        max_tokens=256,
        backoff_base_s=0.001,
    )
    yield adapter
    await adapter.aclose()


def anthropic_down(server: AnthropicWireServer, llm: AnthropicLLM) -> None:
    """Every try of the Anthropic model (its retries too) answers 503."""
    for _ in range(llm.max_retries + 1):
        server.reply_server_error(503)


async def test_litellm_answers_with_a_tool_call_when_the_primary_is_down(
    openai_server: OpenAIWireServer,
    litellm_llm: LiteLLM,
    anthropic_server: AnthropicWireServer,
    anthropic_llm: AnthropicLLM,
) -> None:
    anthropic_down(anthropic_server, anthropic_llm)
    openai_server.reply_stream(
        "Looking.", [Call("call_1", "lookup", {"id": "A-1"})], model=PRICED, prompt_tokens=30
    )
    deltas, response = await collect(
        FallbackLLM([anthropic_llm, litellm_llm]), HELLO, tools=[LOOKUP]
    )
    assert response.provider == "litellm" and response.model == PRICED
    assert "".join(deltas) == "Looking."
    assert [(c.id, c.name, c.input) for c in response.tool_calls] == [
        ("call_1", "lookup", {"id": "A-1"})
    ]
    assert response.usage.input_tokens == 30
    assert len(anthropic_server.requests) == anthropic_llm.max_retries + 1
    assert len(openai_server.requests) == 1
    assert openai_server.last_request.body["model"] == PRICED  # litellm strips the route


async def test_a_litellm_primary_that_rate_limits_hands_the_call_to_the_next(
    openai_server: OpenAIWireServer,
    litellm_llm: LiteLLM,
    anthropic_server: AnthropicWireServer,
    anthropic_llm: AnthropicLLM,
) -> None:
    for _ in range(litellm_llm.max_retries + 1):
        openai_server.reply_rate_limited(retry_after="0")
    anthropic_server.reply_text("not limited here")
    _, response = await collect(FallbackLLM([litellm_llm, anthropic_llm]), HELLO)
    assert response.text == "not limited here" and response.provider == "anthropic"
    assert len(openai_server.requests) == litellm_llm.max_retries + 1


async def test_a_turn_on_litellm_after_a_fallback_is_priced_and_counted_as_litellms(
    kafka_bootstrap_servers: str,
    client: KafkaAgentClient,
    openai_server: OpenAIWireServer,
    litellm_llm: LiteLLM,
    anthropic_server: AnthropicWireServer,
    anthropic_llm: AnthropicLLM,
) -> None:
    @tool
    async def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, str]:
        """Find an order's status."""
        return {"order_id": order_id, "status": "shipped"}

    @kafka_agent(
        name=unique_name("fallbacklite"),
        llm=FallbackLLM([anthropic_llm, litellm_llm]),
        tools=[lookup_order],
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "Where is order 9?"}])

    for _ in range(2):  # both model calls find the primary down
        anthropic_down(anthropic_server, anthropic_llm)
    openai_server.reply_stream(
        "",
        [Call("call_1", "lookup_order", {"order_id": "9"})],
        model=PRICED,
        prompt_tokens=20,
        completion_tokens=5,
    )
    openai_server.reply_stream(
        "Order 9 shipped.", model=PRICED, prompt_tokens=40, completion_tokens=6
    )
    async with running_worker(agent, kafka_bootstrap_servers) as worker:
        events = await client.run(agent.name, timeout=60)
        counted = worker.metrics.registry.get_sample_value(
            "pyrula_model_calls_total",
            {"agent": agent.name, "provider": "litellm", "model": PRICED, "outcome": "ok"},
        )
    assert events[-1].type == "run:complete", events[-1].data
    assert events[-1].data["result"] == "Order 9 shipped."
    assert {e.data["model"] for e in events if e.type == "llm:complete"} == {PRICED}
    assert counted == 2
    price = DEFAULT_PRICES[PRICED]
    expected = ((20 + 40) * price.input + (5 + 6) * price.output) / 1e6
    # Priced as gpt-4o-mini (the reported cost is rounded to 1e-6), not as the primary:
    primary = DEFAULT_PRICES[anthropic_llm.model]
    assert (60 * primary.input + 11 * primary.output) / 1e6 > expected + 1e-4
    assert events[-1].data["usage"]["cost_usd"] == pytest.approx(expected, abs=1e-6)
