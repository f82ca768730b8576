"""The cost phase: what the runtime's prompt caching takes off the model bill.

Each measurement is one function returning its figures; ``run_cost`` merges them into the
phase's dict (another measurement, such as the batch lane's, is one more function).

Caching (``measure_caching``): a 20-step turn (19 tool calls, then the answer) with a
2,000-token system prompt and three tools, by a real worker on the broker, its model the
local Anthropic server (``testing_servers``, through the official SDK) keeping
Anthropic's prompt cache by the published rules. The server bills each request; the
phase prices those bills with the real price table (``llm.pricing``, input side only:
uncached input, cache writes at 1.25x, reads at 0.1x). The same turn runs with the
runtime's caching (``AnthropicLLM``'s default) and with ``prompt_caching=False``:
``cache_cost_fraction`` is the first's billed input cost over the second's (target
<= 0.35). ``cache_cost_fraction_after_compaction`` is the same for a turn on a thread
whose history is past the agent's compaction threshold, so the turn compacts it (a model
call that summarizes) before its 20 steps; the earlier 20-step turn that filled the
thread runs first and is not counted (target <= 0.45).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pyrula_stream import AgentContext, KafkaAgentClient, ToolContext, kafka_agent, tool
from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.agent.limits import AgentLimits
from pyrula_stream.bench.cost_batch import FULL_TURNS, QUICK_TURNS, measure_batch
from pyrula_stream.bench.harness import PREFIX, agent_topics, drop_topics, in_process_worker
from pyrula_stream.bench.harness import unique as unique_name
from pyrula_stream.llm.anthropic import AnthropicLLM
from pyrula_stream.llm.base import Usage
from pyrula_stream.llm.pricing import DEFAULT_PRICES, input_cost_usd
from pyrula_stream.llm.tokens import text_tokens
from pyrula_stream.testing_servers.anthropic_server import MODEL, AnthropicWireServer, Text
from pyrula_stream.testing_servers.anthropic_server import ToolUse as ToolUseReply
from pyrula_stream.testing_servers.prompt_cache import CacheUsage

STEPS = 20
"""Model calls of the measured turn: 19 asking for a tool, then the answer."""
SYSTEM_TOKENS = 2000
CONTEXT_WINDOW = 10_000
COMPACTION_FRACTION = 0.4
"""Compaction past 4,000 estimated tokens: a thread holding one 20-step turn is past it
(~5,500 with the system prompt and tools), a fresh turn never is."""


def system_prompt(tokens: int = SYSTEM_TOKENS) -> str:
    """A support agent's policy, numbered rules, about ``tokens`` tokens long."""
    rules: list[str] = ["You are the support agent of an online shop. Follow these rules."]
    n = 0
    while text_tokens("\n".join(rules)) < tokens:
        n += 1
        rules.append(
            f"Rule {n}: when a customer asks about an order, look it up first, check the "
            f"carrier's status and the refund policy for the customer's region, and answer "
            f"with facts only; never promise a date the carrier has not given (case {n})."
        )
    return "\n".join(rules)


SYSTEM = system_prompt()


@tool(read_only=True)
async def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    """Look up an order by id: its lines, status, carrier and tracking id."""
    lines = [{"sku": f"SKU-{order_id}-{i}", "qty": 1 + i % 3, "price": 9.5 + i} for i in range(12)]
    return {"order_id": order_id, "status": "shipped", "carrier": "DHL", "lines": lines}


@tool(read_only=True)
async def carrier_status(ctx: ToolContext, tracking_id: str) -> dict[str, Any]:
    """The carrier's scans of a parcel, newest last."""
    scans = [{"at": f"2026-12-0{1 + i % 7}T0{i % 10}:00Z", "where": f"hub {i}"} for i in range(10)]
    return {"tracking_id": tracking_id, "scans": scans}


@tool(read_only=True)
async def refund_policy(ctx: ToolContext, region: str) -> str:
    """The refund policy that applies in a region."""
    return f"In {region}, refunds are due within 14 days of delivery. " * 8


TOOLS = [lookup_order, carrier_status, refund_policy]


def _script(steps: int) -> list[ToolUseReply | Text]:
    """The model's replies of one turn: ``steps - 1`` tool calls, then the answer."""
    calls: list[ToolUseReply | Text] = []
    for i in range(steps - 1):
        name, args = [
            ("lookup_order", {"order_id": str(1000 + i)}),
            ("carrier_status", {"tracking_id": f"JD{i:08d}"}),
            ("refund_policy", {"region": f"region-{i}"}),
        ][i % 3]
        calls.append(ToolUseReply(f"toolu_{i:02d}", name, args))
    return [*calls, Text("Order 1000 shipped with DHL and arrives on Thursday.")]


def _queue(server: AnthropicWireServer, steps: int) -> None:
    for reply in _script(steps):
        stop = "tool_use" if isinstance(reply, ToolUseReply) else "end_turn"
        server.reply_stream([reply], stop_reason=stop, model=MODEL, output_tokens=40)


def cost_agent(name: str, llm: AnthropicLLM) -> KafkaAgent:
    limits = AgentLimits(
        max_llm_calls=STEPS + 1,
        max_tool_calls=STEPS,
        context_window=CONTEXT_WINDOW,
        compaction_fraction=COMPACTION_FRACTION,
    )

    @kafka_agent(name=name, prefix=PREFIX, llm=llm, tools=TOOLS, partitions=1, limits=limits)
    async def cost_turn(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}], system=SYSTEM)

    return cost_turn


@dataclass
class _Bills:
    """The input cost of the requests a server billed, from one index on."""

    server: AnthropicWireServer

    def since(self, start: int) -> tuple[float, list[CacheUsage]]:
        bills = self.server.bills[start:]
        price = DEFAULT_PRICES[MODEL]
        cost = sum(
            input_cost_usd(
                Usage(
                    input_tokens=b.input_tokens,
                    cache_creation_input_tokens=b.cache_creation_input_tokens,
                    cache_creation_1h_input_tokens=b.cache_creation_1h_input_tokens,
                    cache_read_input_tokens=b.cache_read_input_tokens,
                ),
                price,
            )
            for b in bills
        )
        return cost, bills


@contextlib.asynccontextmanager
async def _caching_run(
    bootstrap: str, *, caching: bool, keep_topics: bool
) -> AsyncIterator[tuple[KafkaAgentClient, KafkaAgent, AnthropicWireServer]]:
    """A worker whose model is a fresh local Anthropic server, caching on or off."""
    with AnthropicWireServer(prompt_cache=True) as server:
        llm = AnthropicLLM(MODEL, api_key="bench", base_url=server.base_url, prompt_caching=caching)
        agent = cost_agent(unique_name("cost"), llm)
        try:
            async with (
                in_process_worker(agent, bootstrap),
                KafkaAgentClient(bootstrap, prefix=PREFIX) as client,
            ):
                yield client, agent, server
        finally:
            await llm.aclose()
            if not keep_topics:
                drop_topics(bootstrap, agent_topics(agent))


async def _turn(
    client: KafkaAgentClient, agent: KafkaAgent, question: str, thread_id: str | None = None
) -> None:
    events = await client.run(agent.name, question=question, thread_id=thread_id, timeout=300)
    if events[-1].type != "run:complete":
        raise RuntimeError(f"cost turn ended with {events[-1].type}: {events[-1].data}")


async def _costs(bootstrap: str, *, caching: bool, keep_topics: bool) -> dict[str, Any]:
    """A plain 20-step turn, then two on a thread (the second compacts first): the billed
    input cost of the plain one and of the compacting one, and their bills."""
    async with _caching_run(bootstrap, caching=caching, keep_topics=keep_topics) as run:
        client, agent, server = run
        bills = _Bills(server)
        _queue(server, STEPS)
        await _turn(client, agent, "Where is order 1000?")
        plain, plain_bills = bills.since(0)
        thread = unique_name("thread")
        _queue(server, STEPS)
        await _turn(client, agent, "Where is order 1000?", thread)
        start = len(server.bills)
        server.reply_stream([Text("The customer asked about order 1000; it shipped.")])
        _queue(server, STEPS)
        await _turn(client, agent, "And when does it arrive?", thread)
        compacted, compacted_bills = bills.since(start)
        if len(compacted_bills) != STEPS + 1:
            raise RuntimeError(
                f"the thread's second turn made {len(compacted_bills)} model calls, not a "
                f"compaction and {STEPS} steps"
            )
        return {
            "input_cost_usd": plain,
            "calls": len(plain_bills),
            "cache_read_tokens": sum(b.cache_read_input_tokens for b in plain_bills),
            "cache_write_tokens": sum(b.cache_creation_input_tokens for b in plain_bills),
            "input_tokens": sum(b.input_tokens for b in plain_bills),
            "input_cost_usd_after_compaction": compacted,
            "calls_after_compaction": len(compacted_bills),
        }


def _fraction(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole else None


async def measure_caching(bootstrap: str, *, keep_topics: bool = False) -> dict[str, Any]:
    """``cache_cost_fraction`` and ``cache_cost_fraction_after_compaction``, with the
    figures they come from (see the module docstring)."""
    cached = await _costs(bootstrap, caching=True, keep_topics=keep_topics)
    uncached = await _costs(bootstrap, caching=False, keep_topics=keep_topics)
    return {
        "cache_cost_fraction": _fraction(cached["input_cost_usd"], uncached["input_cost_usd"]),
        "cache_cost_fraction_after_compaction": _fraction(
            cached["input_cost_usd_after_compaction"],
            uncached["input_cost_usd_after_compaction"],
        ),
        "cache_steps": STEPS,
        "cache_system_tokens": text_tokens(SYSTEM),
        "cache_model": MODEL,
        "cache_cached": _rounded(cached),
        "cache_uncached": _rounded(uncached),
    }


def _rounded(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in figures.items()}


async def run_cost(
    bootstrap: str, *, quick: bool = False, keep_topics: bool = False
) -> dict[str, Any]:
    """Every measurement of the cost phase, merged into one dict. ``quick`` is for the
    measurements that shrink in a quick run (caching's 20-step turn does not)."""
    results: dict[str, Any] = {}
    results.update(await measure_caching(bootstrap, keep_topics=keep_topics))
    turns = QUICK_TURNS if quick else FULL_TURNS
    results.update(await measure_batch(bootstrap, turns=turns, keep_topics=keep_topics))
    return results
