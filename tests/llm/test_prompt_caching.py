"""Prompt caching the runtime manages, through the official SDKs against local servers that
keep each provider's prompt cache: Anthropic breakpoints (where, how many, minimums, off,
TTL), OpenAI's ``prompt_cache_key``, and what the cached tokens cost."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest

from pyrula_stream import (
    AgentContext,
    AgentLimits,
    KafkaAgentClient,
    ToolContext,
    kafka_agent,
    tool,
)
from pyrula_stream.context.compaction import SUMMARY_REQUEST, summary_messages
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.llm import AnthropicLLM, ModelRequest, OpenAILLM, ToolDefinition, Usage
from pyrula_stream.llm.anthropic import min_cacheable_tokens
from pyrula_stream.llm.pricing import DEFAULT_PRICES, cost_usd, input_cost_usd
from pyrula_stream.testing import read_topic, running_worker, unique_name
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


async def test_breakpoints_on_tools_system_and_messages_then_reads(
    server: AnthropicWireServer,
) -> None:
    usages = await _steps(_anthropic(server), server, 4)
    bodies = [r.body for r in server.requests]
    mark = {"type": "ephemeral"}
    tools_and_system = [("tools", 1, mark), ("system", 0, mark)]
    assert _marks(bodies[0]) == [*tools_and_system, ("message", 0, mark)]
    # Then the latest stable message (before the newest tool-result turn) and the last.
    assert _marks(bodies[1]) == [*tools_and_system, ("message", 1, mark), ("message", 2, mark)]
    assert _marks(bodies[3])[2:] == [("message", 5, mark), ("message", 6, mark)]
    assert all(len(_marks(b)) <= 4 for b in bodies)
    assert usages[0].cache_read_input_tokens == 0 and usages[0].cache_creation_input_tokens > 0
    for before, after in itertools.pairwise(usages):
        # Everything the last step sent up to its last breakpoint is read from the cache.
        read = before.cache_read_input_tokens + before.cache_creation_input_tokens
        assert after.cache_read_input_tokens == read
        assert after.input_tokens == 0  # all of it up to the last message, marked
    price = DEFAULT_PRICES[MODEL]
    uncached = [Usage(input_tokens=u.prompt_tokens) for u in usages]
    cached_cost = sum(input_cost_usd(u, price) for u in usages)
    assert cached_cost < 0.6 * sum(input_cost_usd(u, price) for u in uncached)


async def test_the_previous_stable_message_takes_a_slot_left_free(
    server: AnthropicWireServer,
) -> None:
    """With the tools below the minimum, the fourth breakpoint goes to the message before
    the previous tool-result turn, where an earlier step wrote."""
    await _steps(_anthropic(server), server, 3, tools=[REFUND])
    marks = [(part, index) for part, index, _ in _marks(server.requests[-1].body)]
    assert marks == [("system", 0), ("message", 1), ("message", 3), ("message", 4)]


async def test_no_breakpoints_below_the_models_minimum(server: AnthropicWireServer) -> None:
    short = ToolDefinition("lookup", "Find an order.", {"type": "object"})
    usages = await _steps(_anthropic(server), server, 3, system="Be brief.", tools=[short])
    assert [_marks(r.body) for r in server.requests] == [[], [], []]
    assert all(u.cache_read_input_tokens == u.cache_creation_input_tokens == 0 for u in usages)
    # ~1,400 tokens: past Sonnet 4.5's minimum (1,024), short of Sonnet 4.6's (2,048).
    await _steps(_anthropic(server), server, 1, tools=[REFUND])
    assert [m[0] for m in _marks(server.requests[-1].body)] == ["system", "message"]
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


@pytest.mark.parametrize(
    ("model", "tokens"),
    [
        ("claude-opus-4-6", 4096),
        ("claude-opus-4-5-20251101", 4096),
        ("claude-haiku-4-5", 4096),
        ("claude-sonnet-4-6", 2048),
        ("claude-3-5-haiku-20241022", 2048),
        ("claude-sonnet-4-5-20250929", 1024),
        ("claude-opus-4-1", 1024),
        ("claude-opus-4-20250514", 1024),
        ("claude-3-7-sonnet-latest", 1024),
        ("some-proxy-model", 1024),
    ],
)
def test_minimum_cacheable_length_by_model_family(model: str, tokens: int) -> None:
    assert min_cacheable_tokens(model) == tokens


def test_a_ttl_other_than_five_minutes_or_an_hour_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="cache_ttl must be one of"):
        AnthropicLLM(MODEL, cache_ttl="2h")


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


@tool(read_only=True)
async def shipment(ctx: ToolContext, order_id: str) -> str:
    """The parcel's scans."""
    return f"order {order_id} scanned at a hub. " * 500  # ~4,000 tokens


async def test_compaction_reads_the_cached_conversation_and_keeps_the_summary_prefix(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, server: AnthropicWireServer
) -> None:
    """A turn past the threshold compacts with a summary call that reads the conversation
    from the cache and is billed to the turn; the next compaction keeps the first summary
    as it was, so the prefix up to it is still read from the cache."""
    llm = _anthropic(server)
    limits = AgentLimits(context_window=12_000, compaction_fraction=0.3)  # 3,600 tokens

    @kafka_agent(
        name=unique_name("cache-compact"),
        llm=llm,
        tools=[shipment],
        partitions=1,
        limits=limits,
        tenant=lambda request: request.metadata.get("tenant"),
        unknown_tenants="own",
    )
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}], system=SYSTEM)

    server.reply_stream([ToolUse("toolu_1", "shipment", {"order_id": "7"})], stop_reason="tool_use")
    server.reply_text("Order 7 is on its way.")
    server.reply_text("They asked where order 7 is: on its way.")  # the first summary
    server.reply_stream([ToolUse("toolu_2", "shipment", {"order_id": "8"})], stop_reason="tool_use")
    server.reply_text("Order 8 is on its way too.")
    server.reply_text("Then order 8: on its way too.")  # the second summary
    server.reply_text("Both arrive on Thursday.")
    turns: list[str] = []
    usages: list[dict[str, Any]] = []
    try:
        async with running_worker(agent, kafka_bootstrap_servers):
            for question in ("Where is order 7?", "And order 8?", "When do they arrive?"):
                events = await client.run(
                    agent.name,
                    question=question,
                    thread_id="t",
                    metadata={"tenant": "acme"},
                    timeout=60,
                )
                assert events[-1].type == "run:complete", events[-1].data
                turns.append(events[-1].turn_id)
                usages.append(events[-1].data["usage"])
    finally:
        await llm.aclose()
    assert usages[1]["llm_calls"] == 3  # the summary call is billed to the turn too
    compacting = turns[1]
    bodies, bills = [r.body for r in server.requests], server.bills
    assert len(bodies) == 7
    # The summary call counts on the tenant's quotas too.
    usage = {
        key.decode().rsplit("/", 1)[-1]: json.loads(value)
        for key, value, _ in read_topic(kafka_bootstrap_servers, agent.topics.tenant_usage)
        if key is not None and value is not None and f"/{compacting}/" in key.decode()
    }
    assert usage["llm-compact"]["tokens"] > 0 and usage["llm-compact"]["cost_usd"] > 0
    summary = bodies[2]
    assert _text(summary["messages"][-1]["content"]) == SUMMARY_REQUEST
    assert summary["system"] == bodies[1]["system"] and summary["tools"] == bodies[1]["tools"]
    # Everything the turn's last step had written is read by the summary call.
    assert bills[2].cache_read_input_tokens == (
        bills[1].cache_read_input_tokens + bills[1].cache_creation_input_tokens
    )
    # After the compaction the system prompt's prefix is still read from the cache.
    assert bills[3].cache_read_input_tokens > 0
    # The second compaction keeps the first summary verbatim and reads past it.
    first, second = summary_messages("They asked where order 7 is: on its way."), bodies[6]
    plain = [{"role": m["role"], "content": _text(m["content"])} for m in second["messages"]]
    assert plain[:4] == [*first, *summary_messages("Then order 8: on its way too.")]
    assert bills[6].cache_read_input_tokens > bills[3].cache_read_input_tokens


async def test_a_summary_call_answered_with_a_tool_call_is_asked_again_without_tools(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, server: AnthropicWireServer
) -> None:
    llm = _anthropic(server)
    limits = AgentLimits(context_window=12_000, compaction_fraction=0.3)

    @kafka_agent(
        name=unique_name("cache-retry"), llm=llm, tools=[shipment], partitions=1, limits=limits
    )
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}], system=SYSTEM)

    server.reply_stream([ToolUse("toolu_1", "shipment", {"order_id": "7"})], stop_reason="tool_use")
    server.reply_text("Order 7 is on its way.")
    server.reply_stream([ToolUse("toolu_2", "shipment", {"order_id": "7"})], stop_reason="tool_use")
    server.reply_text("They asked where order 7 is.")  # the summary, asked again
    server.reply_text("It arrives on Thursday.")
    try:
        async with running_worker(agent, kafka_bootstrap_servers):
            await client.run(agent.name, question="Where is order 7?", thread_id="t", timeout=60)
            events = await client.run(agent.name, question="When?", thread_id="t", timeout=60)
    finally:
        await llm.aclose()
    assert events[-1].data["result"] == "It arrives on Thursday."
    assert events[-1].data["usage"]["llm_calls"] == 2  # both summary calls bill as one
    again, answered = server.requests[3].body, server.requests[4].body
    assert "tools" not in again
    assert _text(answered["messages"][0]["content"]).endswith("They asked where order 7 is.")


def _text(content: Any) -> Any:
    """A message's content without its cache marker (a marked string became a block)."""
    if isinstance(content, list) and len(content) == 1 and content[0].get("type") == "text":
        return content[0]["text"]
    return content


async def test_metrics_give_the_cached_fraction_per_agent_and_tenant(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, server: AnthropicWireServer
) -> None:
    llm = _anthropic(server)

    @kafka_agent(
        name=unique_name("cache-metrics"),
        llm=llm,
        tools=[shipment],
        partitions=1,
        tenant=lambda request: request.metadata.get("tenant"),
        unknown_tenants="own",
    )
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}], system=SYSTEM)

    server.reply_stream([ToolUse("toolu_1", "shipment", {"order_id": "7"})], stop_reason="tool_use")
    server.reply_text("Order 7 is on its way.")
    try:
        async with running_worker(agent, kafka_bootstrap_servers) as worker:
            events = await client.run(
                agent.name, question="Where is order 7?", metadata={"tenant": "acme"}, timeout=60
            )
            sample = worker.metrics.registry.get_sample_value
            labels = {"agent": agent.name}
            tenant = {**labels, "tenant": "acme"}
            figures = (
                sample("pyrula_prompt_cached_fraction", labels),
                sample("pyrula_tenant_prompt_cached_fraction", tenant),
                sample("pyrula_tenant_prompt_tokens_total", {**tenant, "kind": "cache_read"}),
            )
    finally:
        await llm.aclose()
    usage = events[-1].data["usage"]
    read = usage["cache_read_input_tokens"]
    prompt = read + usage["input_tokens"] + usage["cache_creation_input_tokens"]
    assert read > 0
    assert figures == (pytest.approx(read / prompt), pytest.approx(read / prompt), read)


async def test_a_threads_turns_share_one_prompt_cache_key_on_openai(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    with OpenAIWireServer(prompt_cache=True) as server:
        llm = OpenAILLM("gpt-5.4-mini", api_key=OPENAI_SECRET_KEY, base_url=server.base_url)

        @kafka_agent(name=unique_name("cache-key"), llm=llm, partitions=1)
        async def agent(ctx: AgentContext, question: str) -> str:
            return await ctx.llm.run([{"role": "user", "content": question}], system=SYSTEM)

        try:
            async with running_worker(agent, kafka_bootstrap_servers):
                for thread in ("t", "t", "u", None):
                    server.reply_text("On its way.")
                    events = await client.run(
                        agent.name, question="Where is order 7?", thread_id=thread, timeout=60
                    )
                    assert events[-1].type == "run:complete"
        finally:
            await llm.aclose()
    keys = [r.body["prompt_cache_key"] for r in server.requests]
    assert keys[0] == keys[1] and len(set(keys)) == 3
    assert all(k.startswith("pyrula-") and agent.name not in k for k in keys)
