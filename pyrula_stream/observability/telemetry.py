"""What one turn reports: its spans, its metrics and its log fields, in one object.

The worker gives each ``TurnRuntime`` a ``TurnTelemetry``; the spine calls it where it
already has the facts: ``track`` wraps the turn's task (``process`` and ``invoke_agent``
spans, in-flight gauge, log fields), ``model_call`` and ``tool_call`` wrap the one durable
step of each (call metrics, and a ``chat`` / ``execute_tool`` event on the turn's
``invoke_agent`` span), ``ended`` is the terminal event once committed. A replayed step
is marked ``pyrula.replayed=true`` and is not counted or timed again.

Why events and not a span per step: every SDK span costs its sampler, its attribute
checks, a context switch and a trip through the batch processor (about 25 us each on
the bench machine); five spans per one-tool turn cost a quarter of the worker's
throughput. A step event costs a fifth of that and keeps the step's attributes, its
start and its duration. ``PYRULA_TRACE_STEP_SPANS=1`` brings back a ``chat`` and
``execute_tool`` span per step (for backends that build views from GenAI spans).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry.trace import (
    INVALID_SPAN,
    NoOpTracer,
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    set_span_in_context,
    use_span,
)

from pyrula_stream.llm.base import LLMClient, ModelResponse
from pyrula_stream.observability import logs
from pyrula_stream.observability.metrics import TenantMetric, WorkerMetrics
from pyrula_stream.observability.tracing import (
    TraceCarrier,
    context_of,
    mark_error,
    span_carrier,
    start_commit_span,
    tracer,
    tracing_on,
)
from pyrula_stream.records import OutRecord
from pyrula_stream.serde import JournalEntry, TurnRequest

log = logging.getLogger(__name__)


class TopicNames(Protocol):
    """The topic names telemetry labels its figures with (``AgentTopics`` has them)."""

    @property
    def turns(self) -> str: ...

    @property
    def journal(self) -> str: ...

    @property
    def dlq(self) -> str: ...


REPLAYED = "pyrula.replayed"
DURATION_MS = "pyrula.duration_ms"
"""A step event's duration (the event's timestamp is when the step started)."""
STEP_SPANS_ENV = "PYRULA_TRACE_STEP_SPANS"
"""``1``: a span per model and tool call step, as before step events (costs throughput)."""


def step_spans_from_environment() -> bool:
    return os.environ.get(STEP_SPANS_ENV, "").strip().lower() in ("1", "true", "yes")


def journaled_trace(steps: Mapping[int, JournalEntry]) -> TraceCarrier | None:
    """The trace context a turn's ``start`` step journaled (a resumed turn continues it)."""
    start = steps.get(0)
    if start is None or start.kind != "start":
        return None
    trace = start.data.get("trace")
    return {str(k): str(v) for k, v in trace.items()} if isinstance(trace, dict) else None


@dataclass(slots=True)
class TurnTelemetry:
    """Spans, metrics and log fields of one turn on this worker (see the module doc)."""

    turn_id: str = ""
    agent: str = ""
    turns_topic: str = ""
    partition: int = -1
    offset: int = -1
    """The turn request's offset in its partition of the turns topic (-1: none)."""
    group_id: str = ""
    worker_id: str = ""
    thread_id: str | None = None
    trace: TraceCarrier | None = None
    """The request's trace context: what ``submit`` injected, or what the journal kept."""
    metrics: WorkerMetrics | None = None
    tracer: Tracer = field(default_factory=NoOpTracer)
    step_spans: bool = False
    """A span per step (``PYRULA_TRACE_STEP_SPANS``) instead of an event on the turn's."""
    tenant: str | None = None
    """The turn's tenant (agents with ``tenant=``): its metrics carry a ``tenant`` label."""
    span: Span | None = field(default=None, init=False)
    _totals: list[int] | None = field(default=None, init=False)
    """This attempt's model calls, tool calls, input and output tokens (for its span)."""
    _model: tuple[str, str] | None = field(default=None, init=False)
    _outcome: str | None = field(default=None, init=False)
    """The provider and model of this attempt's last model call (for its span)."""
    _event_trace: TraceCarrier | None = field(default=None, init=False)
    _attempt_started: float = field(default_factory=time.time, init=False)
    _traced: bool | None = field(default=None, init=False)
    _attempt: int = field(default=0, init=False)
    _spans: AbstractContextManager[Span] | None = field(default=None, init=False)
    """The attempt's ``_turn_spans`` while it runs (traced attempts only)."""

    def event_trace(self) -> TraceCarrier | None:
        """The context an event record carries: the running ``invoke_agent`` span's,
        else the request's."""
        return self._event_trace or self.trace

    def attempt(self, attempt: int) -> TurnTelemetry:
        """One attempt of the turn, as a context around the body of its task: its spans
        (none without a tracer provider: events then carry the request's own trace
        context), its metrics and its log fields. The telemetry is its own context, so
        a turn in flight holds no extra coroutine or context object for it."""
        self._attempt = attempt
        return self

    def __enter__(self) -> Span:
        attempt = self._attempt
        logs.bind(turn_id=self.turn_id, attempt=attempt, partition=self.partition)
        self._attempt_started = time.time()
        self._traced = tracing_on(self.tracer)
        span: Span = INVALID_SPAN
        if self._traced:
            self._spans = self._turn_spans(attempt)
            span = self.span = self._spans.__enter__()
            self._event_trace = span_carrier(span) if span.get_span_context().is_valid else None
        log.info("turn attempt started")
        if self.metrics is not None:
            self.metrics.turn_started(attempt)
        return span

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> bool:
        spans, self._spans = self._spans, None
        span = self.span if spans is not None and self.span is not None else INVALID_SPAN
        try:
            if kind is not None and issubclass(kind, asyncio.CancelledError):
                span.set_attribute("pyrula.stopped", True)  # revoked, aborted or stopping
            elif exc is not None and isinstance(exc, Exception):
                span.record_exception(exc)
                mark_error(span, type(exc).__name__, str(exc))
        finally:
            if self.span is not None:
                self._close(self.span)
            if self.metrics is not None:
                self.metrics.turn_left()
        return bool(spans.__exit__(kind, exc, tb)) if spans is not None else False

    def _close(self, span: Span) -> None:
        """The attempt's outcome, step counts, token sums and model, in one call on its
        ``invoke_agent`` span (its step events carry what differs per call)."""
        attributes: dict[str, Any] = {}
        if self._outcome is not None:
            attributes["pyrula.outcome"] = self._outcome
        if self._totals is not None:
            calls, tools, tokens_in, tokens_out = self._totals
            attributes["pyrula.model_calls"] = calls
            attributes["pyrula.tool_calls"] = tools
            if calls:
                attributes["gen_ai.usage.input_tokens"] = tokens_in
                attributes["gen_ai.usage.output_tokens"] = tokens_out
        if self._model is not None:
            attributes["gen_ai.provider.name"], attributes["gen_ai.request.model"] = self._model
        if attributes:
            span.set_attributes(attributes)

    def _step_totals(self) -> list[int]:
        if self._totals is None:
            self._totals = [0, 0, 0, 0]
        return self._totals

    @contextmanager
    def _turn_spans(self, attempt: int) -> Iterator[Span]:
        """``process <turns topic>`` with ``invoke_agent <agent>`` inside; yields the latter."""
        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": self.turns_topic,
            "messaging.destination.partition.id": str(self.partition),
            "messaging.consumer.group.name": self.group_id,
            "pyrula.turn_id": self.turn_id,
            "pyrula.attempt": attempt,
            "pyrula.worker_id": self.worker_id,
        }
        if self.offset >= 0:  # a parked turn that resumes on a reply has no input record
            attributes["messaging.kafka.offset"] = self.offset
        spans = self.tracer
        # Only invoke_agent becomes the current span (what steps and user code see): the
        # process span is its parent by context, saving a context attach per turn.
        process = spans.start_span(
            f"process {self.turns_topic}",
            context=context_of(self.trace),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )
        if not process.is_recording():  # not sampled: its context stands for both spans
            with use_span(process, end_on_exit=False) as span:
                yield span
            return
        try:
            with spans.start_as_current_span(
                f"invoke_agent {self.agent}",
                context=set_span_in_context(process),
                attributes=_agent_attributes(self.agent, self.thread_id),
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                yield span
        finally:
            process.end()

    @property
    def traced(self) -> bool:
        """Whether this attempt records spans (decided when ``track`` starts it)."""
        if self._traced is None:
            self._traced = tracing_on(self.tracer)
        return self._traced

    def ended(self, code: str | None, started_ms: int | None) -> None:
        """The terminal event is committed: count the turn once, by its outcome."""
        log.info("turn ended: %s", code or "completed")
        if self.span is not None:
            self._outcome = "failed" if code else "completed"  # set as the span closes
            if code:
                mark_error(self.span, code)
        if self.metrics is not None:
            started = started_ms / 1000 if started_ms else self._attempt_started
            self.metrics.turn_ended(code, time.time() - started)
        self._tenant_count("turns", "failed" if code else "completed")

    def tenant_used(self, tokens: int) -> None:
        """A live model call's tokens, counted against the tenant's quota."""
        self._tenant_count("tokens", amount=tokens)

    def deferred(self, reason: str) -> None:
        """The turn was deferred: its tenant reached ``reason`` (a limit's name)."""
        log.info("turn deferred: tenant %s reached %s", self.tenant, reason)
        self._tenant_count("deferred", reason)

    def _tenant_count(self, kind: TenantMetric, *labels: str, amount: int = 1) -> None:
        """The turn's tenant's series of ``kind`` (agents with ``tenant=`` only)."""
        if self.metrics is not None and self.tenant is not None:
            self.metrics.tenant_count(kind, self.tenant, *labels, amount=amount)

    def model_call(self, llm: LLMClient) -> AbstractContextManager[ModelCallObserver]:
        """One model call step: a ``chat <model>`` event on the turn span (or its own span).
        Untraced, the observer is its own context: no generator held per call in flight."""
        provider = llm.provider or type(llm).__name__
        if not self.traced:
            return ModelCallObserver(INVALID_SPAN, self.metrics, provider, llm.model)
        return self._model_call_span(llm, provider)

    @contextmanager
    def _model_call_span(self, llm: LLMClient, provider: str) -> Iterator[ModelCallObserver]:
        self._model = (provider, llm.model)
        if not self.step_spans and self.span is not None:
            yield ModelCallObserver(
                self.span, self.metrics, provider, llm.model, self._step_totals(), as_event=True
            )
            return
        with self.tracer.start_as_current_span(
            f"chat {llm.model}",
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": provider,
                "gen_ai.request.model": llm.model,
                "gen_ai.agent.name": self.agent,
            },
        ) as span:
            yield ModelCallObserver(span, self.metrics, provider, llm.model, self._step_totals())

    @contextmanager
    def tool_call(
        self, tool: str, call_key: str, tool_use_id: str | None
    ) -> Iterator[ToolCallObserver]:
        """One tool call step: an ``execute_tool <tool>`` event (or span) on the turn span."""
        if not self.traced:
            yield ToolCallObserver(INVALID_SPAN, self.metrics, tool)
            return
        if not self.step_spans and self.span is not None:
            observer = ToolCallObserver(self.span, self.metrics, tool, self._step_totals(), True)
            observer.event = {"pyrula.call_key": call_key}
            if tool_use_id:
                observer.event["gen_ai.tool.call.id"] = tool_use_id
            yield observer
            return
        with self.tracer.start_as_current_span(
            f"execute_tool {tool}", attributes=_tool_attributes(tool, call_key, tool_use_id)
        ) as span:
            yield ToolCallObserver(span, self.metrics, tool, self._step_totals())


def _tool_attributes(tool: str, call_key: str, tool_use_id: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "pyrula.call_key": call_key,
    }
    if tool_use_id:
        attributes["gen_ai.tool.call.id"] = tool_use_id
    return attributes


@dataclass(slots=True)
class ModelCallObserver:
    """One model call step. With ``as_event`` ``span`` is the turn's ``invoke_agent``
    span and the step becomes a ``chat <model>`` event on it; without, ``span`` is the
    step's own ``chat`` span. ``totals`` are the turn's (see ``TurnTelemetry``)."""

    span: Span
    metrics: WorkerMetrics | None
    provider: str
    model: str
    totals: list[int] | None = None
    as_event: bool = False
    started: float = field(default_factory=time.monotonic)
    started_ns: int = field(default_factory=time.time_ns)

    def __enter__(self) -> ModelCallObserver:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def recorded(
        self,
        data: Mapping[str, Any],
        replayed: bool,
        cost_usd: float,
        response: ModelResponse | None,
    ) -> None:
        """The step's journaled data and its parsed response (``None`` for a failed
        call); a live call is counted, a replayed one only marked."""
        span = self.span
        now = time.monotonic()
        if span.is_recording():
            attributes = self._attributes(data, replayed, response)
            if self.as_event:
                attributes[DURATION_MS] = round(1000 * (now - self.started), 3)
                span.add_event(f"chat {self.model}", attributes, self.started_ns)
            else:
                span.set_attributes(attributes)
                if "error" in data:
                    span.set_status(Status(StatusCode.ERROR))
            totals = self.totals
            if totals is not None:
                totals[0] += 1
                if response is not None:
                    totals[2] += attributes["gen_ai.usage.input_tokens"]
                    totals[3] += attributes["gen_ai.usage.output_tokens"]
        if not replayed and self.metrics is not None:
            provider, model = self.provider, self.model
            if response is not None and response.provider is not None:  # a fallback answered
                provider, model = response.provider, response.model or model
            self.metrics.model_call(provider, model, now - self.started, response, cost_usd)

    def _attributes(
        self, data: Mapping[str, Any], replayed: bool, response: ModelResponse | None
    ) -> dict[str, Any]:
        """The step's facts: a span gets the conventions' full set; an event only what
        differs per call (the provider and request model are on the turn span, zero
        cache counts and a response model equal to the request's are left out)."""
        span = not self.as_event
        attributes: dict[str, Any] = {REPLAYED: replayed}
        if "error" in data:
            attributes["error.type"] = str(data["error"].get("type", "error"))
        if response is not None:
            usage = response.usage
            cache_read, cache_creation = (
                usage.cache_read_input_tokens,
                usage.cache_creation_input_tokens,
            )
            if span or (response.model and response.model != self.model):
                attributes["gen_ai.response.model"] = response.model or self.model
            attributes["gen_ai.response.finish_reasons"] = [response.stop_reason]
            # The conventions count cached input inside input_tokens; our Usage (like
            # Anthropic's) keeps the kinds apart, as the token metric does.
            attributes["gen_ai.usage.input_tokens"] = (
                usage.input_tokens + cache_read + cache_creation
            )
            attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
            if span or cache_read:
                attributes["gen_ai.usage.cache_read.input_tokens"] = cache_read
            if span or cache_creation:
                attributes["gen_ai.usage.cache_creation.input_tokens"] = cache_creation
        return attributes


@dataclass(slots=True)
class ToolCallObserver:
    """One tool call step: its own ``execute_tool`` span, or (``as_event``) an
    ``execute_tool <tool>`` event with ``event``'s attributes on the turn's span."""

    span: Span
    metrics: WorkerMetrics | None
    tool: str
    totals: list[int] | None = None
    as_event: bool = False
    event: dict[str, Any] | None = None
    started: float = field(default_factory=time.monotonic)
    step_started: float = 0.0
    started_ns: int = field(default_factory=time.time_ns)

    def __post_init__(self) -> None:
        self.step_started = self.started

    def running(self) -> None:
        """The tool itself starts now (its step was waiting for the durability barrier):
        the duration metric is the tool's own time; the span covers the whole step."""
        self.started = time.monotonic()

    def recorded(self, data: Mapping[str, Any], replayed: bool) -> None:
        status = str(data.get("status", "error"))
        now = time.monotonic()
        span = self.span
        if span.is_recording():
            error = None if status == "ok" else str(data.get("error_code") or "tool_error")
            if self.as_event:
                attributes = self.event or {}
                attributes[REPLAYED] = replayed
                attributes["pyrula.tool.status"] = status
                attributes[DURATION_MS] = round(1000 * (now - self.step_started), 3)
                if error is not None:
                    attributes["error.type"] = error
                span.add_event(f"execute_tool {self.tool}", attributes, self.started_ns)
            else:
                span.set_attribute(REPLAYED, replayed)
                span.set_attribute("pyrula.tool.status", status)
                if error is not None:
                    mark_error(span, error)
            if self.totals is not None:
                self.totals[1] += 1
        if not replayed and self.metrics is not None:
            self.metrics.tool_call(self.tool, status, now - self.started)


def _agent_attributes(agent: str, thread_id: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent,
    }
    if thread_id:
        attributes["gen_ai.conversation.id"] = thread_id
    return attributes


class CommitObserver:
    """One transaction: its ``commit_transaction`` span (linked to the turns it carries)
    and, once committed, its duration, batch size, journal records and dead letters."""

    def __init__(
        self,
        tracer: Tracer,
        metrics: WorkerMetrics | None,
        turns: Iterable[TurnTelemetry],
        records: list[OutRecord],
    ) -> None:
        self.metrics = metrics
        self.records = records
        self.span = (
            start_commit_span(tracer, [t.span for t in turns], len(records))
            if tracing_on(tracer)
            else INVALID_SPAN
        )
        self.started = time.monotonic()
        self.ok = True

    def aborted(self) -> None:
        self.ok = False
        mark_error(self.span, "transaction_aborted")
        if self.metrics is not None:
            self.metrics.aborted()

    def failed(self, exc: BaseException) -> None:
        self.ok = False
        mark_error(self.span, type(exc).__name__, str(exc))

    def end(self) -> None:
        if self.ok and self.metrics is not None:
            self.metrics.committed(self.records, time.monotonic() - self.started)
        self.span.end()


class WorkerTelemetry:
    """A worker's metrics registry and tracer, and the factory of its turns' telemetry.

    ``enabled=False`` (``WorkerOptions.telemetry``) records nothing per turn or commit
    and starts no span; ``/metrics`` still answers. The bench measures the difference.
    ``step_spans`` (default: ``PYRULA_TRACE_STEP_SPANS``) gives each step its own span.
    """

    def __init__(
        self,
        agent: str,
        *,
        topics: TopicNames,
        worker_id: str,
        group_id: str = "",
        enabled: bool = True,
        step_spans: bool | None = None,
    ) -> None:
        self.agent = agent
        self.turns_topic = topics.turns
        self.worker_id = worker_id
        self.group_id = group_id
        self.metrics = WorkerMetrics(agent, journal_topic=topics.journal, dlq_topic=topics.dlq)
        self.enabled = enabled
        self.tracer: Tracer = tracer() if enabled else NoOpTracer()
        self._hot = self.metrics if enabled else None
        self.step_spans = step_spans_from_environment() if step_spans is None else step_spans

    @property
    def on_lag(self) -> Callable[[str, dict[int, int]], None] | None:
        """What the group consumer reports lag to (``None``: no statistics at all)."""
        return self.metrics.set_lag if self.enabled else None

    def for_turn(
        self,
        request: TurnRequest,
        partition: int,
        offset: int,
        steps: Mapping[int, JournalEntry],
        trace: TraceCarrier | None,
    ) -> TurnTelemetry:
        """A turn's telemetry; the journaled trace context wins over the record's."""
        return TurnTelemetry(
            request.turn_id,
            self.agent,
            self.turns_topic,
            partition,
            offset,
            self.group_id,
            self.worker_id,
            request.thread_id,
            journaled_trace(steps) or trace,
            self._hot,
            self.tracer,
            self.step_spans,
        )

    def commit(self, turns: Iterable[TurnTelemetry], records: list[OutRecord]) -> CommitObserver:
        return CommitObserver(self.tracer, self._hot, turns, records)
