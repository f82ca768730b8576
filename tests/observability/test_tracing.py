"""One trace from ``submit`` through two worker processes, with a SIGKILL between the model
call and the tool: the second worker continues the same trace, replays the model call
(marked replayed, not re-run) and runs the tool; every event carries the trace context.
The steps are summed into attributes of the turn's ``invoke_agent`` span (events or spans
of their own with ``PYRULA_TRACE_STEPS``, ``tests/observability/test_models.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pyrula_stream import AgentContext, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.chaos.processes import Managed, child_env, free_port
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.kafka.consumers import read_topic
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.llm import FakeLLM
from pyrula_stream.observability.telemetry import (
    STEP_SPANS_ENV,
    STEPS_ENV,
    step_mode_from_environment,
)
from pyrula_stream.observability.tracing import SAMPLER_ENV, carrier_headers, default_sampler
from pyrula_stream.testing import agent_topics_ready, running_worker, unique_name, wait_for
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import decode_event
from pyrula_stream.wire.records import content_type_header
from pyrula_stream.wire.serde import TurnRequest, decode_journal_entry
from tests.observability.test_metrics import scrape_until, value

Span = dict[str, Any]


class TracedWorker(Managed):
    """``tests.agents.traced`` in its own process group, spans to ``spans_file``."""

    def __init__(self, tag: str, tmp: Path, bootstrap: str, env: dict[str, str]) -> None:
        self.spans_file = tmp / f"spans-{tag}.jsonl"
        self.port = free_port()
        argv = [
            *(sys.executable, "-m", "tests.agents.traced", str(self.spans_file), "--"),
            *("worker", "tests.agents.traced:traced", "--bootstrap-servers", bootstrap),
            *("--worker-id", f"traced-{tag}", "--health-port", str(self.port)),
            *("--shutdown-grace", "2"),
        ]
        super().__init__(tag, argv, env, tmp / f"worker-{tag}.log")

    async def wait_ready(self) -> None:
        async with httpx.AsyncClient() as http:
            for _ in range(600):
                assert self.alive(), self.log_path.read_text()
                try:
                    if (await http.get(f"http://127.0.0.1:{self.port}/readyz")).is_success:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
        raise TimeoutError(f"worker {self.name} never ready; see {self.log_path}")

    def spans(self) -> list[Span]:
        lines = self.spans_file.read_text().splitlines() if self.spans_file.exists() else []
        return [json.loads(line) for line in lines]


def one(spans: list[Span], name: str, **attributes: Any) -> Span:
    found = [
        s
        for s in spans
        if s["name"] == name and all(s["attributes"].get(k) == v for k, v in attributes.items())
    ]
    assert len(found) == 1, f"{len(found)} spans {name} {attributes}: {spans}"
    return found[0]


async def test_one_trace_from_submit_through_two_workers_across_a_sigkill(
    kafka_bootstrap_servers: str,
    client: KafkaAgentClient,
    spans: InMemorySpanExporter,
    tmp_path: Path,
) -> None:
    name = unique_name("traced")
    topics = AgentTopics.for_agent(name)
    marker = tmp_path / "tool-started"
    base = {"TRACED_AGENT": name, "TRACED_MARKER": str(marker)}
    first = TracedWorker(
        "a", tmp_path, kafka_bootstrap_servers, child_env(base | {"TRACED_BLOCK": "1"})
    )
    second = TracedWorker("b", tmp_path, kafka_bootstrap_servers, child_env(base))
    try:
        first.start()
        await first.wait_ready()
        handle = await client.submit(name, q="go")
        await wait_for(marker.exists, 90, "the first worker started the tool")
        first.kill()  # SIGKILL: the model call is journaled, the tool never finished
        journal = await asyncio.to_thread(read_topic, kafka_bootstrap_servers, topics.journal)
        start = [
            decode_journal_entry(r.value, r.headers)
            for r in journal
            if r.key == f"{handle.turn_id}/0" and r.value is not None
        ]
        second.start()
        events = await asyncio.wait_for(_collect(client, name, handle.turn_id), 120)
        assert events[-1].type == "run:complete"
        async with httpx.AsyncClient() as http:
            b_metrics = await scrape_until(
                http, second.port, lambda m: value(m, "pyrula_turns_total") == 1, "turn counted"
            )
        assert second.stop(30) == 0
    finally:
        first.kill()
        second.kill()

    send = one(
        [
            {
                "name": s.name,
                "trace_id": format(s.context.trace_id, "032x"),
                "span_id": format(s.context.span_id, "016x"),
                "kind": s.kind.name,
                "attributes": dict(s.attributes or {}),
            }
            for s in spans.get_finished_spans()
        ],
        f"send {topics.turns}",
        **{"pyrula.turn_id": handle.turn_id},
    )
    assert send["kind"] == "PRODUCER"
    trace_id = send["trace_id"]
    a_spans, b_spans = first.spans(), second.spans()
    # The start step journaled the request's trace context (what a resumed turn continues).
    assert [e.kind for e in start] == ["start"]
    assert start[0].data["trace"]["traceparent"].split("-")[1:3] == [trace_id, send["span_id"]]

    # Worker A, killed inside the tool: its turn spans never ended, so only its commits
    # were exported; they link to its invoke_agent span (the parent of its events).
    assert not [s for s in a_spans if s["name"].startswith(("process", "invoke_agent"))]
    a_invokes = {link for s in a_spans if s["name"] == "commit_transaction" for link in s["links"]}
    assert a_invokes

    # Worker B continues the same trace under the client's send span.
    process = one(b_spans, f"process {topics.turns}")
    assert (process["trace_id"], process["parent_id"]) == (trace_id, send["span_id"])
    assert process["kind"] == "CONSUMER"
    assert process["attributes"]["messaging.system"] == "kafka"
    assert process["attributes"]["pyrula.attempt"] == 2
    assert process["attributes"]["messaging.consumer.group.name"] == f"pyrula.{name}.workers"
    assert process["attributes"]["messaging.destination.partition.id"] == str(handle.partition)
    assert process["attributes"]["messaging.kafka.offset"] == handle.offset
    invoke = one(b_spans, f"invoke_agent {name}")
    assert (invoke["trace_id"], invoke["parent_id"]) == (trace_id, process["span_id"])
    attrs = invoke["attributes"]
    assert attrs["gen_ai.agent.name"] == name
    assert attrs["pyrula.outcome"] == "completed"
    assert (attrs["gen_ai.provider.name"], attrs["gen_ai.request.model"]) == ("fake", "fake")
    assert not [s for s in b_spans if s["name"].startswith(("chat", "execute_tool"))]

    # The steps, summed on B's invoke_agent span (no step events: none failed): the
    # replayed model call, the tool, the live model call.
    assert invoke["events"] == []
    assert (attrs["pyrula.model_calls"], attrs["pyrula.tool_calls"]) == (2, 1)
    assert attrs["pyrula.replayed_steps"] == 1  # the model call A journaled
    assert attrs["pyrula.tools"] == ["effect"]
    assert attrs["gen_ai.response.finish_reasons"] == ["end_turn"]  # the last call's
    assert attrs["pyrula.model_duration_ms"] >= 0
    assert attrs["pyrula.tool_duration_ms"] >= 0
    assert "gen_ai.usage.cache_read.input_tokens" not in attrs  # zero: left out
    # The replay reports what A journaled: its usage counts once, with the live call's.
    [llm_step] = [
        decode_journal_entry(r.value, r.headers)
        for r in journal
        if r.key == f"{handle.turn_id}/1" and r.value is not None
    ]
    usage = llm_step.data["response"]["usage"]
    assert usage["input_tokens"] > 0
    assert attrs["gen_ai.usage.input_tokens"] > usage["input_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] > usage["output_tokens"]
    commits = [s for s in b_spans if s["name"] == "commit_transaction"]
    assert any(invoke["span_id"] in s["links"] for s in commits)
    # Worker B's metrics count its live work only: the replayed model call is not counted.
    assert value(b_metrics, "pyrula_turns_total", outcome="completed") == 1
    assert value(b_metrics, "pyrula_turns_started_total", resumed="true") == 1
    assert value(b_metrics, "pyrula_turns_started_total", resumed="false") == 0
    assert value(b_metrics, "pyrula_model_calls_total") == 1
    assert value(b_metrics, "pyrula_model_call_duration_seconds_count") == 1
    assert value(b_metrics, "pyrula_tool_calls_total", tool="effect", status="ok") == 1

    # Every event of the turn, from either worker, carries the trace in its headers.
    records = await asyncio.to_thread(read_topic, kafka_bootstrap_servers, topics.events)
    parents = {}
    for record in records:
        event = decode_event(record.value or b"", record.headers)
        _, tid, parent, _ = record.headers["traceparent"].split("-")
        assert tid == trace_id
        parents[event.seq] = (event.attempt, parent)
    assert {p for attempt, p in parents.values() if attempt == 1} <= a_invokes
    assert {attempt for attempt, _ in parents.values()} == {1, 2}
    assert {p for attempt, p in parents.values() if attempt == 2} == {invoke["span_id"]}


async def _collect(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Any]:
    return [e async for e in client.stream(agent, turn_id)]


async def test_a_sub_agent_turn_continues_its_parents_trace(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, spans: InMemorySpanExporter
) -> None:
    """The child's request carries the parent's ``traceparent`` and ``tracestate``: the
    child worker's spans and events join the trace under the parent's ``invoke_agent``."""

    @kafka_agent(name=unique_name("tchild"), llm=FakeLLM(["ok"]), partitions=1)
    async def child(ctx: AgentContext, n: int) -> int:
        return n + 1

    @kafka_agent(name=unique_name("tparent"), llm=FakeLLM(["ok"]), partitions=1)
    async def parent(ctx: AgentContext, n: int) -> int:
        result: int = await ctx.call_agent(child, n=n)
        return result

    upstream = TraceContextTextMapPropagator().extract(
        {
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "tracestate": "vendor=abc",
        }
    )
    quick = WorkerOptions(shutdown_grace=0.2)
    async with (
        running_worker(child, kafka_bootstrap_servers, quick),
        running_worker(parent, kafka_bootstrap_servers, quick),
    ):
        with trace.get_tracer("test").start_as_current_span("upstream", context=upstream):
            handle = await client.submit(parent.name, n=1)
        events = await asyncio.wait_for(_collect(client, parent.name, handle.turn_id), 60)
        assert events[-1].data["result"] == 2
        child_turn = next(e for e in events if e.type == "subagent:start").data["child_turn_id"]
        child_events = await asyncio.wait_for(_collect(client, child.name, child_turn), 60)
        assert child_events[-1].type == "run:complete"

    def of_turn(name: str, turn_id: str) -> list[ReadableSpan]:
        return [
            s
            for s in spans.get_finished_spans()
            if s.name == name and (s.attributes or {}).get("pyrula.turn_id") == turn_id
        ]

    trace_id = 0x0AF7651916CD43DD8448EB211C80319C
    parent_process = of_turn(f"process {parent.topics.turns}", handle.turn_id)
    assert parent_process and {s.context.trace_id for s in parent_process} == {trace_id}
    parent_invokes = {
        s.context.span_id
        for s in spans.get_finished_spans()
        if s.name == f"invoke_agent {parent.name}"
        and s.parent is not None
        and s.parent.span_id in {p.context.span_id for p in parent_process}
    }
    [child_process] = of_turn(f"process {child.topics.turns}", child_turn)
    assert child_process.context.trace_id == trace_id
    assert child_process.parent is not None and child_process.parent.span_id in parent_invokes
    assert child_process.context.trace_state.get("vendor") == "abc"

    requests = await asyncio.to_thread(read_topic, kafka_bootstrap_servers, child.topics.turns)
    [request] = [r for r in requests if r.value is not None]
    assert request.headers["tracestate"] == "vendor=abc"
    records = await asyncio.to_thread(read_topic, kafka_bootstrap_servers, child.topics.events)
    for record in records:
        assert record.headers["traceparent"].split("-")[1] == format(trace_id, "032x")
        assert record.headers["tracestate"] == "vendor=abc"


async def test_a_turn_of_an_unsampled_trace_records_no_span_and_passes_the_context_on(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, spans: InMemorySpanExporter
) -> None:
    """A request whose trace was not sampled (``traceparent`` flags ``00``): the worker
    records no span for the turn (what a sampler saves) yet every event carries the
    trace, still unsampled, so the caller's trace and its consumers stay joined."""

    @kafka_agent(name=unique_name("unsampled"), llm=FakeLLM(["ok"]), partitions=1)
    async def quiet(ctx: AgentContext, n: int) -> int:
        return n + 1

    upstream = TraceContextTextMapPropagator().extract(
        {"traceparent": "00-5bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}
    )
    async with running_worker(quiet, kafka_bootstrap_servers, WorkerOptions(shutdown_grace=0.2)):
        with trace.get_tracer("test").start_as_current_span("upstream", context=upstream):
            handle = await client.submit(quiet.name, n=1)
        events = await asyncio.wait_for(_collect(client, quiet.name, handle.turn_id), 60)
    assert events[-1].data["result"] == 2
    assert not [
        s
        for s in spans.get_finished_spans()
        if (s.attributes or {}).get("pyrula.turn_id") == handle.turn_id
        or s.name == f"invoke_agent {quiet.name}"
    ]
    records = await asyncio.to_thread(read_topic, kafka_bootstrap_servers, quiet.topics.events)
    assert len(records) == len(events)
    for record in records:
        _, trace_id, _, flags = record.headers["traceparent"].split("-")
        assert (trace_id, flags) == ("5bf92f3577b34da6a3ce929d0e0e4736", "00")


async def test_without_an_sdk_the_worker_passes_the_requests_trace_context_on(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    """A worker with no tracer provider starts no span, yet journals the request's trace
    context and puts it on every event, so a traced producer and consumer still join."""
    name = unique_name("nosdk")
    env = {
        k: v for k, v in child_env({"ECHO_AGENT_NAME": name}).items() if not k.startswith("OTEL_")
    }
    port = free_port()
    argv = [
        *(sys.executable, "-m", "pyrula_stream.cli", "worker", "tests.agents.echo:noting"),
        *("--bootstrap-servers", kafka_bootstrap_servers, "--health-port", str(port)),
    ]
    topics = AgentTopics.for_agent(name)
    carrier = {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "tracestate": "vendor=xyz",
    }
    request = TurnRequest(unique_name("turn"), name, {"text": "hi"})
    worker = Managed("nosdk", argv, env, tmp_path / "nosdk-worker.log")
    producer = RecordProducer(kafka_bootstrap_servers)
    try:
        worker.start()
        async with httpx.AsyncClient() as http:
            for _ in range(600):
                assert worker.alive(), worker.log_path.read_text()
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get(f"http://127.0.0.1:{port}/readyz")).is_success:
                        break
                await asyncio.sleep(0.1)
        await agent_topics_ready(kafka_bootstrap_servers, name)
        await producer.send(
            topics.turns,
            request.key.encode(),
            serde.encode("turn_request", request),
            [content_type_header("turn_request"), *carrier_headers(carrier)],
        )
        events = await asyncio.wait_for(_collect(client, name, request.turn_id), 120)
        assert events[-1].type == "run:complete"
        assert worker.stop(30) == 0
    finally:
        worker.kill()
        await asyncio.to_thread(producer.close)

    journal = await asyncio.to_thread(read_topic, kafka_bootstrap_servers, topics.journal)
    [start] = [
        decode_journal_entry(r.value, r.headers)
        for r in journal
        if r.key == f"{request.turn_id}/0" and r.value is not None
    ]
    assert start.data["trace"] == carrier
    records = await asyncio.to_thread(read_topic, kafka_bootstrap_servers, topics.events)
    assert len(records) == len(events)
    for record in records:
        assert {k: record.headers.get(k) for k in carrier} == carrier


class _Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that keeps what it is sent."""

    received: ClassVar[list[tuple[str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def test_worker_exports_to_the_otlp_endpoint_in_its_environment(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    collector = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    name = unique_name("otlp")
    env = child_env(
        {
            "ECHO_AGENT_NAME": name,
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_port}",
            "OTEL_SERVICE_NAME": "otlp-test-workers",
            "OTEL_TRACES_SAMPLER": "parentbased_always_on",  # the default traces 1 in 10
        }
    )
    port = free_port()
    argv = [
        *(sys.executable, "-m", "pyrula_stream.cli", "worker", "tests.agents.echo:echo"),
        *("--bootstrap-servers", kafka_bootstrap_servers, "--health-port", str(port)),
    ]
    worker = Managed("otlp", argv, env, tmp_path / "otlp-worker.log")
    try:
        worker.start()
        async with httpx.AsyncClient() as http:
            for _ in range(600):
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get(f"http://127.0.0.1:{port}/readyz")).is_success:
                        break
                await asyncio.sleep(0.1)
        events = await client.run(name, text="hi", timeout=120)
        assert events[-1].type == "run:complete"
        assert worker.stop(30) == 0  # a graceful stop flushes the batch of spans
    finally:
        worker.kill()
        collector.shutdown()
        collector.server_close()
    sent = b"".join(body for path, body in _Collector.received if path == "/v1/traces")
    for expected in (b"otlp-test-workers", f"invoke_agent {name}".encode(), b"pyrula.tools"):
        assert expected in sent, worker.log_path.read_text()


def test_step_trace_mode_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STEPS_ENV, raising=False)
    monkeypatch.delenv(STEP_SPANS_ENV, raising=False)
    assert step_mode_from_environment() == "attributes"
    monkeypatch.setenv(STEP_SPANS_ENV, "1")  # the older spelling
    assert step_mode_from_environment() == "spans"
    monkeypatch.setenv(STEPS_ENV, " Events ")
    assert step_mode_from_environment() == "events"
    monkeypatch.setenv(STEPS_ENV, "span")
    with pytest.raises(ConfigurationError, match=r"PYRULA_TRACE_STEPS='span'.*attributes"):
        step_mode_from_environment()


def test_the_worker_samples_one_turn_in_ten_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace.sampling import Decision

    monkeypatch.delenv(SAMPLER_ENV, raising=False)
    sampler = default_sampler()
    assert sampler is not None
    assert sampler.get_description().startswith("ParentBased{root:TraceIdRatioBased{0.1}")
    sampled = sum(
        sampler.should_sample(None, trace_id, "process").decision is Decision.RECORD_AND_SAMPLE
        for trace_id in range(1, 2**64, 2**64 // 1000)
    )
    assert 50 < sampled < 150  # about one in ten roots
    monkeypatch.setenv(SAMPLER_ENV, "parentbased_always_on")
    assert default_sampler() is None  # the SDK reads OTEL_TRACES_SAMPLER itself
