"""Prompt caching the runtime manages, through the official SDKs against local servers that
keep each provider's prompt cache: Anthropic breakpoints (where, how many, minimums, off,
TTL), OpenAI's ``prompt_cache_key``, and what the cached tokens cost."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from pyrula_stream.llm import AnthropicLLM, ModelRequest, OpenAILLM, ToolDefinition, Usage
from pyrula_stream.llm.pricing import DEFAULT_PRICES, cost_usd, input_cost_usd
from pyrula_stream.testing_servers.anthropic_server import AnthropicWireServer, ToolUse
from pyrula_stream.testing_servers.openai_server import OpenAIWireServer
from tests.llm.servers.fixtures import OPENAI_SECRET_KEY, SECRET_KEY

MODEL = "claude-sonnet-4-5"  # cacheable from 1,024 tokens
SYSTEM = "You answer questions about orders, politely and precisely. " * 90  # ~1,350 tokens
LOOKUP = ToolDefinition(
    name="lookup",
    description="Find an order by id. " + "It returns the order's lines and state. " * 130,
    input_schema={"type": "object", "properties": {"id": {"type": "string"}}},
)
REFUND = ToolDefinition(
    name="refund",
    description="Refund an order.",
    input_schema={"type": "object", "properties": {"id": {"type": "string"}}},
)
TOOLS = [REFUND, LOOKUP]  # the long one last: the tools alone pass the minimum


@pytest.fixture
def server() -> Iterator[AnthropicWireServer]:
    with AnthropicWireServer(prompt_cache=True) as started:
        yield started


def _anthropic(server: AnthropicWireServer, **options: Any) -> AnthropicLLM:
    return AnthropicLLM(
        MODEL, api_key=SECRET_KEY, base_url=server.base_url, backoff_base_s=0.001, **options
    )


def _marks(body: dict[str, Any]) -> list[tuple[str, int, Any]]:
    """Where the request carries ``cache_control``: (part, index, marker)."""
    found = [
        ("tools", i, t["cache_control"])
        for i, t in enumerate(body.get("tools") or [])
        if "cache_control" in t
    ]
    system = body.get("system")
    if isinstance(system, list):
        found += [
            ("system", i, b["cache_control"]) for i, b in enumerate(system) if "cache_control" in b
        ]
    for i, message in enumerate(body["messages"]):
        if isinstance(message["content"], list):
            found += [
                ("message", i, b["cache_control"])
                for b in message["content"]
                if "cache_control" in b
            ]
    return found


async def _steps(
    llm: AnthropicLLM,
    server: AnthropicWireServer,
    steps: int,
    *,
    system: str | None = SYSTEM,
    tools: list[ToolDefinition] | None = None,
) -> list[Usage]:
    """A tool loop of ``steps`` model calls (each answered with a tool call), its usage."""
    tools = TOOLS if tools is None else tools
    conversation: list[dict[str, Any]] = [{"role": "user", "content": "Where is order 7?"}]
    usages = []
    try:
        for step in range(steps):
            server.reply_stream([ToolUse(f"toolu_{step}", tools[-1].name, {"id": "7"})])
            response = await llm.complete_request(ModelRequest(list(conversation), tools, system))
            usages.append(response.usage)
            conversation.append(response.as_message())
            result = {"type": "tool_result", "tool_use_id": f"toolu_{step}"}
            result["content"] = f"order 7, line {step}: " + "shipped. " * 60
            conversation.append({"role": "user", "content": [result]})
    finally:
        await llm.aclose()
    return usages


async def test_breakpoints_on_tools_system_and_stable_messages_then_reads(
    server: AnthropicWireServer,
) -> None:
    usages = await _steps(_anthropic(server), server, 4)
    bodies = [r.body for r in server.requests]
    ephemeral = {"type": "ephemeral"}
    assert _marks(bodies[0]) == [("tools", 1, ephemeral), ("system", 0, ephemeral)]
    # Step 2: the assistant message before the newest tool-result turn.
    assert _marks(bodies[1])[2:] == [("message", 1, ephemeral)]
    # Steps 3 and 4: the last two stable messages, four breakpoints in all.
    assert _marks(bodies[2])[2:] == [("message", 1, ephemeral), ("message", 3, ephemeral)]
    assert _marks(bodies[3])[2:] == [("message", 3, ephemeral), ("message", 5, ephemeral)]
    assert all(len(_marks(b)) <= 4 for b in bodies)
    assert usages[0].cache_read_input_tokens == 0 and usages[0].cache_creation_input_tokens > 0
    for before, after in itertools.pairwise(usages):
        # Everything the last step sent up to its last breakpoint is read from the cache.
        read = before.cache_read_input_tokens + before.cache_creation_input_tokens
        assert after.cache_read_input_tokens == read
        assert after.input_tokens < after.cache_read_input_tokens / 5
    price = DEFAULT_PRICES[MODEL]
    uncached = [Usage(input_tokens=u.prompt_tokens) for u in usages]
    cached_cost = sum(input_cost_usd(u, price) for u in usages)
    assert cached_cost < 0.6 * sum(input_cost_usd(u, price) for u in uncached)


async def test_no_breakpoints_below_the_models_minimum(server: AnthropicWireServer) -> None:
    short = ToolDefinition("lookup", "Find an order.", {"type": "object"})
    usages = await _steps(_anthropic(server), server, 3, system="Be brief.", tools=[short])
    assert [_marks(r.body) for r in server.requests] == [[], [], []]
    assert all(u.cache_read_input_tokens == u.cache_creation_input_tokens == 0 for u in usages)
    # ~1,400 tokens: past Sonnet 4.5's minimum (1,024), short of Sonnet 4.6's (2,048).
    await _steps(_anthropic(server), server, 1, tools=[REFUND])
    assert [m[0] for m in _marks(server.requests[-1].body)] == ["system"]
    sonnet_4_6 = AnthropicLLM("claude-sonnet-4-6", api_key=SECRET_KEY, base_url=server.base_url)
    await _steps(sonnet_4_6, server, 1, tools=[REFUND])
    assert _marks(server.requests[-1].body) == []


async def test_caching_off_sends_no_breakpoints_and_reads_nothing(
    server: AnthropicWireServer,
) -> None:
    usages = await _steps(_anthropic(server, prompt_caching=False), server, 3)
    assert [_marks(r.body) for r in server.requests] == [[], [], []]
    assert server.requests[0].body["system"] == SYSTEM
    assert all(u.cache_read_input_tokens == u.cache_creation_input_tokens == 0 for u in usages)


async def test_one_hour_ttl_is_marked_priced_at_twice_input_and_outlives_five_minutes(
    server: AnthropicWireServer,
) -> None:
    hour = await _steps(_anthropic(server, cache_ttl="1h"), server, 1)
    assert {m[2]["ttl"] for m in _marks(server.requests[-1].body)} == {"1h"}
    written = hour[0].cache_creation_input_tokens
    assert written > 0 and hour[0].cache_creation_1h_input_tokens == written
    price = DEFAULT_PRICES[MODEL]
    assert input_cost_usd(hour[0], price) == pytest.approx(
        (hour[0].input_tokens * price.input + written * price.input * 2) / 1e6
    )
    server.cache.advance(600)  # ten minutes: the hour's entries are still there
    again = await _steps(_anthropic(server, cache_ttl="1h"), server, 1)
    assert again[0].cache_read_input_tokens == written
    server.cache.advance(3601)
    five = await _steps(_anthropic(server), server, 1)
    server.cache.advance(301)
    expired = await _steps(_anthropic(server), server, 1)
    assert five[0].cache_read_input_tokens == 0  # the hour has run out
    assert expired[0].cache_read_input_tokens == 0
    assert expired[0].cache_creation_input_tokens == five[0].cache_creation_input_tokens


def test_cache_reads_and_writes_are_priced_by_kind() -> None:
    usage = Usage(
        input_tokens=1_000_000,
        output_tokens=0,
        cache_creation_input_tokens=2_000_000,
        cache_creation_1h_input_tokens=1_000_000,
        cache_read_input_tokens=10_000_000,
    )
    sonnet = DEFAULT_PRICES["claude-sonnet-4-6"]  # $3 input
    assert cost_usd(usage, sonnet) == pytest.approx(3 + 3 * 1.25 + 3 * 2 + 10 * 0.3)
    mini = DEFAULT_PRICES["gpt-5.4-mini"]  # $0.75 input, $0.075 cached
    cached = Usage(input_tokens=1_000_000, cache_read_input_tokens=10_000_000)
    assert cost_usd(cached, mini) == pytest.approx(0.75 + 0.75)


async def test_openai_gets_the_conversations_prompt_cache_key() -> None:
    with OpenAIWireServer(prompt_cache=True) as server:
        llm = OpenAILLM(
            "gpt-5.4-mini", api_key=OPENAI_SECRET_KEY, base_url=server.base_url, max_tokens=64
        )
        off = OpenAILLM(
            "gpt-5.4-mini",
            api_key=OPENAI_SECRET_KEY,
            base_url=server.base_url,
            prompt_caching=False,
        )
        messages = [{"role": "user", "content": "Where is order 7?"}]
        usages = []
        try:
            for key, client in (("conv-a", llm), ("conv-a", llm), ("conv-b", llm), ("conv-a", off)):
                server.reply_text("In transit.")
                request = ModelRequest(messages, [LOOKUP], SYSTEM, cache_key=key)
                usages.append((await client.complete_request(request)).usage)
        finally:
            await llm.aclose()
            await off.aclose()
    keys = [r.body.get("prompt_cache_key") for r in server.requests]
    assert keys == ["conv-a", "conv-a", "conv-b", None]
    first, second, other, unkeyed = usages
    assert first.cache_read_input_tokens == 0
    # The second call reads its prefix in 1,024 + 128k token steps, priced as cached.
    assert second.cache_read_input_tokens >= 1024
    assert (second.cache_read_input_tokens - 1024) % 128 == 0
    assert second.prompt_tokens == first.prompt_tokens
    assert other.cache_read_input_tokens == unkeyed.cache_read_input_tokens == 0
    price = DEFAULT_PRICES["gpt-5.4-mini"]
    assert input_cost_usd(second, price) < 0.3 * input_cost_usd(first, price)
