"""LiteLLM through the real ``litellm`` package (its OpenAI-compatible provider) against the
local Chat Completions server: streaming, tool calls, usage and cost, error mapping, and
one turn on the real broker."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import pytest

from pyrula_stream import (
    AgentContext,
    AgentLimits,
    KafkaAgentClient,
    ToolContext,
    kafka_agent,
    tool,
)
from pyrula_stream.errors import (
    ConfigurationError,
    ContextWindowExceeded,
    ErrorCode,
    LLMError,
    LLMProviderUnavailable,
    LLMRateLimited,
    ProviderStreamTruncated,
)
from pyrula_stream.llm import LiteLLM, TextDelta, ToolDefinition, Usage
from pyrula_stream.llm.pricing import DEFAULT_PRICES, cost_usd
from pyrula_stream.testing import read_topic, running_worker, unique_name
from pyrula_stream.testing_servers.openai_server import MODEL, Call, OpenAIWireServer
from tests.llm.servers.fixtures import OPENAI_SECRET_KEY as SECRET
from tests.llm.servers.fixtures import assert_secret_free, collect

LOOKUP = ToolDefinition(
    name="lookup",
    description="Find an order by id.",
    input_schema={"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
)
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture
async def llm(openai_server: OpenAIWireServer) -> AsyncIterator[LiteLLM]:
    adapter = LiteLLM(
        f"openai/{MODEL}",
        api_base=openai_server.base_url,
        api_key=SECRET,
        max_tokens=512,
        backoff_base_s=0.001,
    )
    yield adapter
    await adapter.aclose()


# -- streaming and conversion -------------------------------------------------------------


async def test_text_streams_deltas_to_the_routed_server(
    llm: LiteLLM, openai_server: OpenAIWireServer
) -> None:
    openai_server.reply_stream("Hello world", text_chunk=4)
    deltas, response = await collect(llm, HELLO, tools=[LOOKUP], system="Be brief.")
    assert deltas == ["Hell", "o wo", "rld"]
    assert response.text == "Hello world" and response.stop_reason == "end_turn"
    assert response.model == MODEL
    request = openai_server.last_request
    assert request.path == "/chat/completions"
    assert request.headers["authorization"] == f"Bearer {SECRET}"
    # litellm strips the route: the server is asked for the bare model.
    assert request.body["model"] == MODEL
    assert request.body["stream"] is True
    assert request.body["stream_options"] == {"include_usage": True}
    assert request.body["max_completion_tokens"] == 512
    assert request.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
    ]
    assert request.body["tools"][0]["function"]["name"] == "lookup"
    # Only litellm's first request: its own retries are off.
    assert request.headers["x-stainless-retry-count"] == "0"


async def test_tool_call_round_trip(llm: LiteLLM, openai_server: OpenAIWireServer) -> None:
    openai_server.reply_stream(
        "Checking.",
        [Call("call_a", "lookup", {"id": "A-17"}), Call("call_b", "lookup", {"id": "B-2"})],
    )
    openai_server.reply_text("Both shipped.")
    _, first = await collect(llm, HELLO, tools=[LOOKUP], tool_choice={"type": "any"})
    assert first.stop_reason == "tool_use" and first.text == "Checking."
    assert [(c.id, c.name, c.input) for c in first.tool_calls] == [
        ("call_a", "lookup", {"id": "A-17"}),
        ("call_b", "lookup", {"id": "B-2"}),
    ]
    assert openai_server.requests[0].body["tool_choice"] == "required"
    conversation = [
        *HELLO,
        first.as_message(),
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": "shipped"},
                {
                    "type": "tool_result",
                    "tool_use_id": "call_b",
                    "content": "gone",
                    "is_error": True,
                },
            ],
        },
    ]
    _, second = await collect(llm, conversation, tools=[LOOKUP])
    assert second.text == "Both shipped."
    sent = openai_server.last_request.body["messages"]
    assert sent[1]["role"] == "assistant"
    assert [c["id"] for c in sent[1]["tool_calls"]] == ["call_a", "call_b"]
    assert sent[2:] == [
        {"role": "tool", "tool_call_id": "call_a", "content": "shipped"},
        {"role": "tool", "tool_call_id": "call_b", "content": "Error: gone"},
    ]


async def test_usage_excludes_cached_tokens_and_a_routed_model_is_priced(
    openai_server: OpenAIWireServer,
) -> None:
    llm = LiteLLM(
        "openai/gpt-4o-mini", api_base=openai_server.base_url, api_key=SECRET, max_tokens=64
    )
    openai_server.reply_stream(
        "ok", model="gpt-4o-mini", prompt_tokens=1_000, completion_tokens=200, cached_tokens=400
    )
    _, response = await collect(llm, HELLO)
    assert response.usage == Usage(input_tokens=600, output_tokens=200, cache_read_input_tokens=400)
    price = DEFAULT_PRICES["gpt-4o-mini"]
    assert cost_usd(response.usage, price) == pytest.approx(
        (600 * price.input + 200 * price.output + 400 * price.cache_read) / 1e6
    )


async def test_extra_is_forwarded_and_cannot_take_the_adapters_own_keywords(
    openai_server: OpenAIWireServer,
) -> None:
    llm = LiteLLM(
        MODEL,
        api_base=openai_server.base_url,
        api_key=SECRET,
        temperature=0.25,
        extra={"custom_llm_provider": "openai", "seed": 7, "user": "tenant-a"},
    )
    openai_server.reply_text("ok")
    await collect(llm, HELLO)
    body = openai_server.last_request.body
    assert body["model"] == MODEL
    assert (body["seed"], body["user"], body["temperature"]) == (7, "tenant-a", 0.25)
    with pytest.raises(ConfigurationError, match="num_retries"):
        LiteLLM(MODEL, extra={"num_retries": 3})
    with pytest.raises(ConfigurationError, match="api_base or base_url"):
        LiteLLM(MODEL, api_base="http://a.invalid", base_url="http://b.invalid")


# -- errors ----------------------------------------------------------------------------------


async def test_503_is_retried_then_ends_as_provider_unavailable(
    llm: LiteLLM, openai_server: OpenAIWireServer
) -> None:
    openai_server.reply_server_error(503)
    openai_server.reply_text("recovered")
    assert (await collect(llm, HELLO))[1].text == "recovered"
    for _ in range(llm.max_retries + 1):
        openai_server.reply_server_error(503)
    with pytest.raises(LLMProviderUnavailable) as info:
        await collect(llm, HELLO)
    assert info.value.code is ErrorCode.LLM_PROVIDER_UNAVAILABLE
    assert info.value.detail["status"] == 503
    assert info.value.detail["attempts"] == llm.max_retries + 1
    assert len(openai_server.requests) == 2 + llm.max_retries + 1


async def test_429_is_retried_then_ends_as_rate_limited(
    llm: LiteLLM, openai_server: OpenAIWireServer
) -> None:
    for _ in range(llm.max_retries + 1):
        openai_server.reply_rate_limited(retry_after="0.01")
    with pytest.raises(LLMRateLimited) as info:
        await collect(llm, HELLO)
    assert info.value.code is ErrorCode.LLM_RATE_LIMITED
    detail = info.value.detail
    assert (detail["status"], detail["retry_after_s"]) == (429, 0.01)
    assert detail["request_id"] == "req_wire_openai"
    assert len(openai_server.requests) == llm.max_retries + 1


async def test_refusals_fail_at_once_and_keep_the_key_out(
    llm: LiteLLM, openai_server: OpenAIWireServer
) -> None:
    openai_server.reply_error(400, f"Invalid 'messages' near {SECRET}", "invalid_request_error")
    with pytest.raises(LLMError, match="Invalid 'messages'") as refused:
        await collect(llm, HELLO)
    assert type(refused.value) is LLMError
    assert_secret_free(refused.value, SECRET)
    openai_server.reply_error(
        400, "maximum context length is 128000 tokens", "invalid_request_error"
    )
    with pytest.raises(ContextWindowExceeded):
        await collect(llm, HELLO)
    assert len(openai_server.requests) == 2
    assert SECRET not in repr(llm) and SECRET not in llm.describe()


async def test_a_stream_cut_after_text_is_truncated_and_not_retried(
    llm: LiteLLM, openai_server: OpenAIWireServer
) -> None:
    openai_server.reply_truncated("partial answer")
    seen: list[str] = []
    with pytest.raises(ProviderStreamTruncated):
        async for item in llm.stream(HELLO):
            assert isinstance(item, TextDelta)
            seen.append(item.text)
    assert "".join(seen) == "partial answer" and len(openai_server.requests) == 1


async def test_a_tool_call_stream_cut_before_any_text_is_retried_then_truncated(
    llm: LiteLLM, openai_server: OpenAIWireServer
) -> None:
    for _ in range(llm.max_retries + 1):
        openai_server.reply_truncated("", [Call("call_t", "lookup", {"id": "1"})])
    with pytest.raises(ProviderStreamTruncated):
        await collect(llm, HELLO, tools=[LOOKUP])
    assert len(openai_server.requests) == llm.max_retries + 1


async def test_a_connection_broken_mid_stream_is_provider_unavailable(
    llm: LiteLLM, openai_server: OpenAIWireServer
) -> None:
    openai_server.reply_aborted("some text here", keep=3)
    with pytest.raises(LLMProviderUnavailable) as info:
        await collect(llm, HELLO)
    assert type(info.value) is LLMProviderUnavailable
    assert len(openai_server.requests) == 1  # text was shown: not sent again


async def test_a_missing_key_or_an_unroutable_model_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, openai_server: OpenAIWireServer
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    llm = LiteLLM(f"openai/{MODEL}", api_base=openai_server.base_url, backoff_base_s=0.001)
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        await collect(llm, HELLO)
    assert openai_server.requests == []
    with pytest.raises(ConfigurationError, match="cannot route model 'no-such-route/m'"):
        LiteLLM("no-such-route/m")


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "litellm", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'pyrula-stream\[litellm\]'"):
        LiteLLM(f"openai/{MODEL}")


# -- a turn on the real broker ------------------------------------------------------------


@tool(read_only=True)
async def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, str]:
    """Look up an order."""
    return {"order_id": order_id, "status": "shipped"}


async def test_a_turn_on_litellm_is_priced_by_its_bare_model(
    kafka_bootstrap_servers: str,
    client: KafkaAgentClient,
    openai_server: OpenAIWireServer,
) -> None:
    llm = LiteLLM(
        "openai/gpt-4o-mini",
        api_base=openai_server.base_url,
        api_key=SECRET,
        backoff_base_s=0.001,
    )

    @kafka_agent(
        name=unique_name("litellm"),
        llm=llm,
        tools=[lookup_order],
        limits=AgentLimits(max_cost_usd=1.0),
        partitions=1,
    )
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}], system="Be brief.")

    openai_server.reply_stream(
        "", [Call("call_1", "lookup_order", {"order_id": "9"})], model="gpt-4o-mini"
    )
    openai_server.reply_stream(
        "Order 9 shipped.", model="gpt-4o-mini", prompt_tokens=40, completion_tokens=6
    )
    try:
        async with running_worker(agent, kafka_bootstrap_servers):
            events = await client.run(agent.name, question="Where is order 9?", timeout=60)
    finally:
        await llm.aclose()
    assert events[-1].type == "run:complete", events[-1].data
    assert events[-1].data["result"] == "Order 9 shipped."
    assert [e.data["tool"] for e in events if e.type == "tool:result"] == ["lookup_order"]
    assert any(e.type == "llm:delta" for e in events)
    price = DEFAULT_PRICES["gpt-4o-mini"]
    expected = ((13 + 40) * price.input + (5 + 6) * price.output) / 1e6
    assert events[-1].data["usage"]["cost_usd"] == pytest.approx(expected, abs=1e-6)
    tool_message = openai_server.requests[1].body["messages"][-1]
    assert tool_message == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": '{"order_id":"9","status":"shipped"}',
    }
    for topic in (agent.topics.events, agent.topics.journal):
        for _, value, _ in read_topic(kafka_bootstrap_servers, topic):
            assert SECRET.encode() not in (value or b"")


def test_importing_the_package_does_not_import_litellm() -> None:
    import subprocess

    code = (
        "import sys, pyrula_stream.llm as llm; "
        "assert llm.LiteLLM.provider == 'litellm' and 'litellm' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
