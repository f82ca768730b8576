"""The batch half of the cost phase: a backlog of three-step turns, live against the batch
lane (``measure_batch``).

A backlog of ``turns`` turns is written to the turns topic at once, then drained by one
in-process worker whose model is the local OpenAI server (``testing_servers``, through
the official SDK: Chat Completions live, the Batch API's files and batches on the lane).
Each turn makes three model calls (two tool calls, then the answer). The server answers
both ways from one responder, so the two runs bill the same tokens; the runtime prices
every call with the real price table (``llm.pricing``, ``gpt-5.4-mini``), a call that
went by batch at its provider's batch price. The figures are read from the outside: the
sum of the turns' ``run:complete`` costs, and the server's log of calls (live and by
batch).

- ``batch_cost_fraction``: dollars per 1,000 turns on the lane over live (target <= 0.55);
- ``batch_drain_s`` / ``live_drain_s``: from the first request written to the last turn's
  end, with batches that end ``BATCH_DELAY_S`` after their submit (the real providers
  take minutes to hours: this is the lane's own overhead, not a provider's window);
- ``batch_calls_by_batch`` / ``batch_calls_live``: where the lane run's calls went (all by
  batch, none live, or the lane did not carry the backlog), and
  ``batch_calls_submitted_twice`` (0: the provider's log never saw a call twice).

The phase's ``cost.py`` calls ``measure_batch`` with ``QUICK_TURNS`` or ``FULL_TURNS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from pyrula_stream.agent.batch import BatchLane
from pyrula_stream.agent.definition import KafkaAgent, kafka_agent
from pyrula_stream.agent.limits import AgentLimits
from pyrula_stream.bench.harness import PREFIX, agent_topics, drop_topics, in_process_worker
from pyrula_stream.bench.harness import unique as unique_name
from pyrula_stream.bench.load import CompletionReader, Submitter, read_records, turn_requests
from pyrula_stream.context.agent_context import AgentContext
from pyrula_stream.llm.openai import OpenAILLM
from pyrula_stream.llm.openai_batch import OpenAIBatchClient
from pyrula_stream.runtime.options import WorkerOptions
from pyrula_stream.testing import wait_for
from pyrula_stream.testing_servers.answers import Answer, Prompt, ToolCall
from pyrula_stream.testing_servers.openai_batch import MODEL, OpenAIBatchServer
from pyrula_stream.tools.contract import ToolContext, tool
from pyrula_stream.wire.batches import call_id
from pyrula_stream.wire.events import EventType, decode_event

FULL_TURNS = 2000
QUICK_TURNS = 60
STEPS = 3
"""Model calls per turn: two asking for a tool, then the answer."""
PARTITIONS = 4
BATCH_DELAY_S = 1.0
MAX_AGE_S = 1.0
POLL_S = 0.5
DRAIN_TIMEOUT_S = 1800.0
SYSTEM = "You enrich one order record: look it up, check its customer, then summarize."


def three_steps(prompt: Prompt) -> Answer:
    """The model of a backlog turn: ``lookup``, ``customer``, then a one-line summary."""
    step = prompt.assistant_messages
    if step < STEPS - 1:
        name = ("lookup", "customer")[step]
        return Answer(tool_calls=(ToolCall(f"call_{step}", name, {"order": 42 + step}),))
    return Answer(text="Order 42: shipped to a returning customer in Lyon; no action needed.")


@tool(read_only=True)
async def lookup(ctx: ToolContext, order: int) -> dict[str, Any]:
    """Look an order up."""
    return {"order": order, "status": "shipped", "lines": [{"sku": f"S{order}", "qty": 1}]}


@tool(read_only=True)
async def customer(ctx: ToolContext, order: int) -> dict[str, Any]:
    """The customer of an order."""
    return {"order": order, "customer": "C-1001", "city": "Lyon", "orders": 7}


def backlog_agent(name: str, llm: OpenAILLM, *, lane: bool) -> KafkaAgent:
    batch = None
    if lane:
        client = OpenAIBatchClient(llm)
        batch = BatchLane(client, max_age_s=MAX_AGE_S, poll_interval_s=POLL_S)

    @kafka_agent(
        name=name,
        prefix=PREFIX,
        llm=llm,
        tools=[lookup, customer],
        partitions=PARTITIONS,
        limits=AgentLimits(max_llm_calls=STEPS + 1, max_tool_calls=STEPS),
        batch=batch,
    )
    async def enrich(ctx: AgentContext, n: int) -> str:
        ask = [{"role": "user", "content": f"Enrich order #{n}."}]
        return await ctx.llm.run(ask, system=SYSTEM)

    return enrich


async def _drain(bootstrap: str, turns: int, *, lane: bool, keep_topics: bool) -> dict[str, Any]:
    """Write ``turns`` requests at once and time their drain; what they cost and where
    their calls went."""
    log = Path(tempfile.mkdtemp(prefix="pyrula-bench-cost-")) / "calls.jsonl"
    with OpenAIBatchServer(three_steps, delay_s=BATCH_DELAY_S, log=log) as server:
        llm = OpenAILLM(MODEL, base_url=server.base_url, api_key="bench", llm_call_timeout=120)
        agent = backlog_agent(unique_name("backlog"), llm, lane=lane)
        topics = agent.topics
        options = WorkerOptions(max_concurrent_turns=500)
        try:
            async with in_process_worker(agent, bootstrap, options):
                reader = CompletionReader(bootstrap, topics.events, PARTITIONS)
                submitter = Submitter(bootstrap)
                try:
                    requests = turn_requests(agent.name, turns, {"n": 1})
                    started = await asyncio.to_thread(submitter.send_all, topics.turns, requests)
                    try:
                        await wait_for(lambda: reader.reached(turns), DRAIN_TIMEOUT_S, "drain")
                    except RuntimeError as exc:
                        raise RuntimeError(f"{exc}: {await _errors(bootstrap, agent)}") from None
                    drain_s = reader.last_done - started
                finally:
                    submitter.close()
                    reader.close()
            records = await asyncio.to_thread(read_records, bootstrap, topics.events, PARTITIONS)
        finally:
            with contextlib.suppress(Exception):
                await llm.aclose()
            if not keep_topics:
                drop_topics(bootstrap, agent_topics(agent))
    cost = 0.0
    for _, _, value, headers in records:
        if value is None:
            continue
        event = decode_event(value, headers)
        if event.type == EventType.RUN_COMPLETE:
            cost += float((event.data.get("usage") or {}).get("cost_usd", 0.0))
    calls = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return {
        "usd_per_1000_turns": cost * 1000 / turns,
        "drain_s": round(drain_s, 2),
        "calls_by_batch": sum(1 for c in calls if c.get("via") == "batch"),
        "calls_by_batch_once": len(
            {call_id(str(c["custom_id"])) for c in calls if c.get("via") == "batch"}
        ),
        "calls_live": sum(1 for c in calls if c.get("via") == "live"),
        "batches": len({c.get("batch_id") for c in calls if c.get("via") == "batch"}),
    }


async def _errors(bootstrap: str, agent: KafkaAgent) -> list[str]:
    """The first few ``run:error`` events of the agent (why the bench stopped)."""
    records = await asyncio.to_thread(read_records, bootstrap, agent.topics.events, PARTITIONS)
    found: list[str] = []
    for _, _, value, headers in records:
        if value is not None and len(found) < 3:
            event = decode_event(value, headers)
            if event.type == EventType.RUN_ERROR:
                found.append(f"{event.data.get('code')}: {event.data.get('message')}")
    return found


async def measure_batch(bootstrap: str, *, turns: int, keep_topics: bool = False) -> dict[str, Any]:
    """``batch_cost_fraction`` and the drain times (see the module docstring)."""
    live = await _drain(bootstrap, turns, lane=False, keep_topics=keep_topics)
    batched = await _drain(bootstrap, turns, lane=True, keep_topics=keep_topics)
    whole = live["usd_per_1000_turns"]
    return {
        "batch_cost_fraction": round(batched["usd_per_1000_turns"] / whole, 4) if whole else None,
        "batch_turns": turns,
        "batch_steps": STEPS,
        "batch_model": MODEL,
        "batch_usd_per_1000_turns": round(batched["usd_per_1000_turns"], 6),
        "live_usd_per_1000_turns": round(whole, 6),
        "batch_drain_s": batched["drain_s"],
        "live_drain_s": live["drain_s"],
        "batch_provider_delay_s": BATCH_DELAY_S,
        "batch_batches": batched["batches"],
        "batch_calls_by_batch": batched["calls_by_batch"],
        "batch_calls_live": batched["calls_live"],
        "batch_calls_submitted_twice": batched["calls_by_batch"] - batched["calls_by_batch_once"],
        "batch_measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
