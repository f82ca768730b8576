"""FallbackLLM through the real SDKs against the local wire servers: a provider that is
down or rate-limits hands the call to the next model; one that answered part of a reply,
or refused the request itself, does not. On the real broker: the turn completes on the
second model, metrics and ``llm:complete`` name it, and a resumed turn replays the
recorded answer without asking either provider again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula_stream import (
    AgentContext,
    KafkaAgentClient,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.errors import ConfigurationError, LLMError, LLMProviderUnavailable
from pyrula_stream.llm import AnthropicLLM, FallbackLLM, OpenAILLM
from pyrula_stream.testing import running_worker, unique_name, wait_for
from pyrula_stream.testing_servers.anthropic_server import MODEL as ANTHROPIC_MODEL
from pyrula_stream.testing_servers.anthropic_server import AnthropicWireServer, ToolUse
from pyrula_stream.testing_servers.openai_server import OpenAIWireServer
from tests.llm.servers.fixtures import collect

HELLO = [{"role": "user", "content": "hello"}]


def down(server: OpenAIWireServer, llm: OpenAILLM) -> None:
    """Every try of the primary (its retries too) answers 503."""
    for _ in range(llm.max_retries + 1):
        server.reply_server_error(503)


async def test_a_provider_that_is_down_hands_the_call_to_the_next(
    openai_server: OpenAIWireServer,
    openai_llm: OpenAILLM,
    anthropic_server: AnthropicWireServer,
    anthropic_llm: AnthropicLLM,
) -> None:
    down(openai_server, openai_llm)
    anthropic_server.reply_text("from the second model")
    llm = FallbackLLM([openai_llm, anthropic_llm])
    _, response = await collect(llm, HELLO)
    assert response.text == "from the second model"
    assert response.provider == "anthropic" and response.model == ANTHROPIC_MODEL
    assert len(openai_server.requests) == openai_llm.max_retries + 1
    assert len(anthropic_server.requests) == 1


async def test_a_provider_that_rate_limits_hands_the_call_to_the_next(
    openai_server: OpenAIWireServer,
    openai_llm: OpenAILLM,
    anthropic_server: AnthropicWireServer,
    anthropic_llm: AnthropicLLM,
) -> None:
    for _ in range(openai_llm.max_retries + 1):
        openai_server.reply_rate_limited(retry_after="0")
    anthropic_server.reply_text("not limited here")
    _, response = await collect(FallbackLLM([openai_llm, anthropic_llm]), HELLO)
    assert response.text == "not limited here"


async def test_a_refused_request_or_a_half_shown_answer_is_not_handed_on(
    openai_server: OpenAIWireServer,
    openai_llm: OpenAILLM,
    anthropic_server: AnthropicWireServer,
    anthropic_llm: AnthropicLLM,
) -> None:
    llm = FallbackLLM([openai_llm, anthropic_llm])
    openai_server.reply_error(400, "Invalid 'messages'", "invalid_request_error")
    with pytest.raises(LLMError):
        await collect(llm, HELLO)
    # The connection breaks after text was streamed: the first model's failure stands.
    openai_server.reply_aborted("half a sentence that was already shown", keep=3)
    with pytest.raises(LLMProviderUnavailable):
        await collect(llm, HELLO)
    assert anthropic_server.requests == []


def test_fallback_refuses_no_models_and_unknown_codes() -> None:
    with pytest.raises(ConfigurationError, match="at least one"):
        FallbackLLM([])
    with pytest.raises(ConfigurationError, match="unknown error codes"):
        FallbackLLM([OpenAILLM("m", api_key="k")], on=("llm_down",))


async def test_a_turn_completes_on_the_second_model_and_replays_without_asking_again(
    kafka_bootstrap_servers: str,
    client: KafkaAgentClient,
    openai_server: OpenAIWireServer,
    openai_llm: OpenAILLM,
    anthropic_server: AnthropicWireServer,
    anthropic_llm: AnthropicLLM,
) -> None:
    gate, runs = asyncio.Event(), []

    @tool
    async def charge(ctx: ToolContext, cents: int) -> str:
        """Charges a card (an effect: the model's answer is durable before it runs)."""
        runs.append(cents)
        await gate.wait()
        return "charged"

    @kafka_agent(
        name=unique_name("fallback"),
        llm=FallbackLLM([openai_llm, anthropic_llm]),
        tools=[charge],
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "charge 5"}])

    down(openai_server, openai_llm)
    anthropic_server.reply_stream(
        [ToolUse("toolu_1", "charge", {"cents": 5})], stop_reason="tool_use"
    )
    options = WorkerOptions(shutdown_grace=0.1, worker_id="fallback-1")
    async with running_worker(agent, kafka_bootstrap_servers, options) as first:
        handle = await client.submit(agent.name)
        await wait_for(lambda: len(runs) == 1, 60, "the tool started after the fallback")
        counted = first.metrics.registry.get_sample_value(
            "pyrula_model_calls_total",
            {
                "agent": agent.name,
                "provider": "anthropic",
                "model": ANTHROPIC_MODEL,
                "outcome": "ok",
            },
        )
        assert counted == 1
    asked = (len(openai_server.requests), len(anthropic_server.requests))
    # The first worker stopped mid-tool: the next one reruns the turn from its journal.
    gate.set()
    down(openai_server, openai_llm)  # still down for the turn's second model call
    anthropic_server.reply_text("charged 5 cents")
    async with running_worker(agent, kafka_bootstrap_servers, options):
        events: list[Any] = [e async for e in client.stream(agent.name, handle.turn_id)]
    assert events[-1].type == "run:complete", events[-1].data
    completes = [e.data for e in events if e.type == "llm:complete"]
    assert {c["model"] for c in completes} == {ANTHROPIC_MODEL}
    # The first model call was replayed from the journal: only the second one was asked.
    assert len(openai_server.requests) == asked[0] + openai_llm.max_retries + 1
    assert len(anthropic_server.requests) == asked[1] + 1
