"""A turn on a real provider adapter (the Anthropic SDK against the local wire server),
scraped and traced: model calls, tokens by kind and cost by provider and model, tools by
status (an unknown tool under one bounded label), and the ``chat`` span's ``gen_ai.*``
attributes as the OpenTelemetry GenAI conventions define them, in each
``PYRULA_TRACE_STEPS`` mode: summed on the turn's ``invoke_agent`` span (the default, a
failed step an event), an event per step on it, and a span per step."""

from __future__ import annotations

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pyrula_stream import (
    AgentContext,
    KafkaAgentClient,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.chaos.processes import free_port
from pyrula_stream.llm import LLMClient
from pyrula_stream.observability.telemetry import STEPS_ENV, StepMode
from pyrula_stream.testing import running_worker, unique_name
from pyrula_stream.testing_servers.anthropic_server import MODEL, AnthropicWireServer, Text, ToolUse
from tests.llm.servers import fixtures
from tests.observability.test_metrics import scrape_until, value

anthropic_server = fixtures.anthropic_server
anthropic_llm = fixtures.anthropic_llm


@tool(read_only=True)
async def lookup(ctx: ToolContext, key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool(read_only=True)
async def broken(ctx: ToolContext) -> str:
    """Always fails."""
    raise RuntimeError("backend down")


@pytest.mark.parametrize("mode", ["attributes", "events", "spans"])
async def test_model_and_tool_metrics_and_genai_span_of_a_priced_provider(
    kafka_bootstrap_servers: str,
    client: KafkaAgentClient,
    anthropic_server: AnthropicWireServer,
    anthropic_llm: LLMClient,
    spans: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
    mode: StepMode,
) -> None:
    monkeypatch.setenv(STEPS_ENV, mode)
    anthropic_server.reply_stream(
        [
            ToolUse("toolu_1", "lookup", {"key": "k"}),
            ToolUse("toolu_2", "broken", {}),
            ToolUse("toolu_3", "no_such_tool_4711", {}),
        ],
        stop_reason="tool_use",
        input_tokens=11,
        cache_read_input_tokens=100,
        cache_creation_input_tokens=40,
    )
    anthropic_server.reply_stream([Text("Done.")], input_tokens=13)

    @kafka_agent(name=unique_name("genai"), llm=anthropic_llm, tools=[lookup, broken], partitions=1)
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    port = free_port()
    async with (
        running_worker(agent, kafka_bootstrap_servers, WorkerOptions(health_port=port)),
        httpx.AsyncClient() as http,
    ):
        events = await client.run(agent.name, timeout=60)
        assert events[-1].type == "run:complete", events[-1].data
        scraped = await scrape_until(
            http, port, lambda m: value(m, "pyrula_turns_total") == 1, "the turn counted"
        )

    calls = [e.data["usage"] for e in events if e.type == "llm:complete"]
    assert len(calls) == 2
    cost = events[-1].data["usage"]["cost_usd"]
    assert cost > 0
    model = {"provider": "anthropic", "model": MODEL}
    assert value(scraped, "pyrula_model_calls_total", outcome="ok", **model) == 2
    assert value(scraped, "pyrula_model_call_duration_seconds_count", **model) == 2
    for kind, field in (
        ("input", "input_tokens"),
        ("output", "output_tokens"),
        ("cache_read", "cache_read_input_tokens"),
        ("cache_creation", "cache_creation_input_tokens"),
    ):
        expected = sum(c[field] for c in calls)
        assert value(scraped, "pyrula_model_tokens_total", kind=kind, **model) == expected > 0
    assert value(scraped, "pyrula_model_cost_usd_total", **model) == pytest.approx(cost)

    assert value(scraped, "pyrula_tool_calls_total", tool="lookup", status="ok") == 1
    assert value(scraped, "pyrula_tool_calls_total", tool="broken", status="error") == 1
    assert value(scraped, "pyrula_tool_calls_total", tool="unknown", status="error") == 1
    assert not [ls for _, ls in scraped if ("tool", "no_such_tool_4711") in ls]

    [invoke] = [
        s
        for s in spans.get_finished_spans()
        if s.name == f"invoke_agent {agent.name}" and s.parent is not None
    ]
    turn = dict(invoke.attributes or {})
    assert turn["gen_ai.usage.input_tokens"] == 11 + 100 + 40 + 13
    assert (turn["pyrula.model_calls"], turn["pyrula.tool_calls"]) == (2, 3)
    if mode == "attributes":
        _check_summed_steps(turn, invoke)
        return
    chats, tools = _step_spans(spans, invoke) if mode == "spans" else _step_events(invoke)
    assert len(chats) == 2
    first = chats[0]
    if mode == "spans":
        assert first["gen_ai.provider.name"] == "anthropic"
        assert first["gen_ai.request.model"] == first["gen_ai.response.model"] == MODEL
    else:  # the turn span names the provider and model once; equal ones are left out
        assert turn["gen_ai.provider.name"] == "anthropic"
        assert turn["gen_ai.request.model"] == MODEL
        assert "gen_ai.response.model" not in first
    assert tuple(first["gen_ai.response.finish_reasons"]) == ("tool_use",)
    # The conventions count cached input inside gen_ai.usage.input_tokens.
    assert first["gen_ai.usage.input_tokens"] == 11 + 100 + 40
    assert first["gen_ai.usage.cache_read.input_tokens"] == 100
    assert first["gen_ai.usage.cache_creation.input_tokens"] == 40
    assert first["gen_ai.usage.output_tokens"] == calls[0]["output_tokens"]
    assert chats[1]["gen_ai.usage.input_tokens"] == 13
    assert set(tools) == {"lookup", "broken", "unknown"}
    assert tools["broken"]["error.type"] == "tool_error"
    assert "error.type" not in tools["lookup"]
    assert all(t["gen_ai.tool.call.id"].startswith("toolu_") for t in tools.values())


def _check_summed_steps(turn: dict[str, object], invoke: ReadableSpan) -> None:
    """The default mode: the steps summed on the turn span, only the failed ones as events."""
    assert turn["gen_ai.provider.name"] == "anthropic"
    assert turn["gen_ai.request.model"] == MODEL
    assert "gen_ai.response.model" not in turn  # equal to the request's: left out
    assert turn["gen_ai.usage.cache_read.input_tokens"] == 100
    assert turn["gen_ai.usage.cache_creation.input_tokens"] == 40
    assert tuple(turn["gen_ai.response.finish_reasons"]) == ("end_turn",)  # type: ignore[arg-type]
    assert turn["pyrula.tools"] == ("lookup", "broken", "unknown")
    assert isinstance(turn["pyrula.model_duration_ms"], float)
    assert isinstance(turn["pyrula.tool_duration_ms"], float)
    assert "pyrula.replayed_steps" not in turn  # nothing replayed
    failed = {e.name: dict(e.attributes or {}) for e in invoke.events}
    assert set(failed) == {"execute_tool broken", "execute_tool unknown"}
    assert failed["execute_tool broken"]["error.type"] == "tool_error"
    assert failed["execute_tool broken"]["pyrula.tool.status"] == "error"
    assert str(failed["execute_tool unknown"]["gen_ai.tool.call.id"]).startswith("toolu_")


Step = dict[str, object]


def _step_events(invoke: ReadableSpan) -> tuple[list[Step], dict[str, Step]]:
    """The model and tool steps as events on the turn's ``invoke_agent`` span."""
    chats = [dict(e.attributes or {}) for e in invoke.events if e.name == f"chat {MODEL}"]
    tools = {
        e.name.removeprefix("execute_tool "): dict(e.attributes or {})
        for e in invoke.events
        if e.name.startswith("execute_tool ")
    }
    assert all(isinstance(c["pyrula.duration_ms"], float) for c in chats)
    assert not [e for e in invoke.events if not e.name.startswith(("chat ", "execute_tool "))]
    return chats, tools


def _step_spans(
    spans: InMemorySpanExporter, invoke: ReadableSpan
) -> tuple[list[Step], dict[str, Step]]:
    """The model and tool steps as spans of their own under ``invoke_agent``."""
    assert not invoke.events
    children = [
        s
        for s in spans.get_finished_spans()
        if s.parent is not None and s.parent.span_id == invoke.context.span_id
    ]
    chats = sorted(
        (s for s in children if s.name == f"chat {MODEL}"), key=lambda s: s.start_time or 0
    )
    tools = {
        str((s.attributes or {})["gen_ai.tool.name"]): s
        for s in children
        if s.name.startswith("execute_tool ")
    }
    assert tools["broken"].status.status_code.name == "ERROR"
    return [dict(s.attributes or {}) for s in chats], {
        name: dict(s.attributes or {}) for name, s in tools.items()
    }
