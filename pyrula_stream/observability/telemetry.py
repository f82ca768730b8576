"""What one turn reports: its spans, its metrics and its log fields, in one object.

The worker gives each ``TurnRuntime`` a ``TurnTelemetry``; the spine calls it where it
already has the facts: ``track`` wraps the turn's task (``process`` and ``invoke_agent``
spans, in-flight gauge, log fields), ``model_call`` and ``tool_call`` wrap the one durable
step of each (call metrics and the step's trace facts), ``ended`` is the terminal event
once committed. A replayed step is marked and is not counted or timed again.

Where a step's trace facts go is ``PYRULA_TRACE_STEPS``:

- ``attributes`` (the default): summed into attributes of the turn's ``invoke_agent``
  span, set once as it ends (calls, tokens, durations, tools, finish reason); a failed
  step still becomes an event with its error, so failures keep their detail.
- ``events``: a ``chat <model>`` / ``execute_tool <tool>`` event per step on that span.
- ``spans``: a span per step (for backends that build views from GenAI step spans;
  ``PYRULA_TRACE_STEP_SPANS=1`` is the older spelling).

Why attributes by default: every SDK span, event and attribute goes through the SDK's
sampler, attribute checks and batch processor. Measured in-process on the bench machine,
the tracing work of a one-tool turn was about 95 us with the steps as attributes, 120 us
as events and 175 us as spans (the whole turn costs the worker about 500 us).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from contextvars import Token
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Protocol

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import (
    INVALID_SPAN,
    NoOpTracer,
    Span,
    SpanKind,
    Tracer,
    set_span_in_context,
)

from pyrula_stream.errors import ConfigurationError
from pyrula_stream.llm.base import LLMClient, Usage
from pyrula_stream.observability import logs
from pyrula_stream.observability.metrics import TenantMetric, WorkerMetrics
from pyrula_stream.observability.steps import ModelCallObserver, StepTotals, ToolCallObserver
from pyrula_stream.observability.tracing import (
    TraceCarrier,
    context_of,
    mark_error,
    span_carrier,
    start_commit_span,
    tracer,
    tracing_on,
)
from pyrula_stream.wire.records import OutRecord
from pyrula_stream.wire.serde import JournalEntry, TurnRequest

log = logging.getLogger(__name__)


class TopicNames(Protocol):
    """The topic names telemetry labels its figures with (``AgentTopics`` has them)."""

    @property
    def turns(self) -> str: ...

    @property
    def journal(self) -> str: ...

    @property
    def dlq(self) -> str: ...


STEPS_ENV = "PYRULA_TRACE_STEPS"
"""Where a step's trace facts go: ``attributes`` (default), ``events`` or ``spans``."""
STEP_SPANS_ENV = "PYRULA_TRACE_STEP_SPANS"
"""``1``: the older spelling of ``PYRULA_TRACE_STEPS=spans``."""
StepMode = Literal["attributes", "events", "spans"]
STEP_MODES: tuple[StepMode, ...] = ("attributes", "events", "spans")


def step_mode_from_environment() -> StepMode:
    """``PYRULA_TRACE_STEPS`` (or the older ``PYRULA_TRACE_STEP_SPANS=1``); a value that
    is not a mode stops the worker at startup rather than tracing something else."""
    raw = os.environ.get(STEPS_ENV, "").strip().lower()
    if not raw:
        legacy = os.environ.get(STEP_SPANS_ENV, "").strip().lower()
        return "spans" if legacy in ("1", "true", "yes") else "attributes"
    for mode in STEP_MODES:
        if raw == mode:
            return mode
    raise ConfigurationError(
        f"{STEPS_ENV}={raw!r} is not a step trace mode: choose one of {', '.join(STEP_MODES)}"
    )


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
    step_mode: StepMode = "attributes"
    """Where each step's trace facts go (``PYRULA_TRACE_STEPS``, see the module doc)."""
    tenant: str | None = None
    """The turn's tenant (agents with ``tenant=``): its metrics carry a ``tenant`` label."""
    span: Span | None = field(default=None, init=False)
    """This attempt's ``invoke_agent`` span while it records (``None``: not traced)."""
    _totals: StepTotals | None = field(default=None, init=False)
    _model: tuple[str, str] | None = field(default=None, init=False)
    """The provider and model of this attempt's last model call (for its span)."""
    _outcome: str | None = field(default=None, init=False)
    _event_trace: TraceCarrier | None = field(default=None, init=False)
    _attempt_started: float = field(default_factory=time.time, init=False)
    _traced: bool | None = field(default=None, init=False)
    _attempt: int = field(default=0, init=False)
    _process: Span | None = field(default=None, init=False)
    """The attempt's ``process`` span while it records (it ends after ``invoke_agent``)."""
    _attached: Token[Context] | None = field(default=None, init=False)
    """The attached context that makes ``invoke_agent`` current while the attempt runs."""

    def event_trace(self) -> TraceCarrier | None:
        """The context an event record carries: the running ``invoke_agent`` span's,
        else the request's."""
        return self._event_trace or self.trace

    def attempt(self, attempt: int) -> TurnTelemetry:
        """One attempt of the turn, as a context around the body of its task: its spans
        (none without a tracer provider: events then carry the request's own trace
        context), its metrics and its log fields. The telemetry is its own context, so a
        turn in flight holds no extra coroutine or context object for it."""
        self._attempt = attempt
        return self

    def log_fields(self) -> dict[str, Any]:
        """The fields of this turn's log lines (``logs.TurnLogFields``)."""
        return {"turn_id": self.turn_id, "attempt": self._attempt, "partition": self.partition}

    def __enter__(self) -> TurnTelemetry:
        attempt = self._attempt
        logs.bind_turn(self)
        self._attempt_started = time.time()
        self._traced = tracing_on(self.tracer)
        if self._traced:
            process, span = self._start_spans(attempt)
            # Only invoke_agent becomes the current span (what steps and user code see):
            # the process span is its parent by context, saving a context attach per turn.
            self._attached = otel_context.attach(set_span_in_context(span))
            # An unsampled turn's events still carry its (unsampled) context.
            self._event_trace = span_carrier(span) or None
            if span.is_recording():
                self.span, self._process = span, process
        log.info("turn attempt started")
        if self.metrics is not None:
            self.metrics.turn_started(attempt)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        span = self.span
        try:
            if span is not None and exc is not None:
                if isinstance(exc, asyncio.CancelledError):
                    span.set_attribute("pyrula.stopped", True)  # revoked, aborted or stopping
                elif isinstance(exc, Exception):
                    span.record_exception(exc)
                    mark_error(span, type(exc).__name__, str(exc))
        finally:
            if self._attached is not None:
                otel_context.detach(self._attached)
                self._attached = None
            if span is not None:
                self._close(span)
                span.end()
            if self._process is not None:
                self._process.end()
                self._process = None
            if self.metrics is not None:
                self.metrics.turn_left()

    def _close(self, span: Span) -> None:
        """The attempt's outcome, step sums and model, in one call on its ``invoke_agent``
        span (the step events or spans, when there are any, carry each call's own)."""
        attributes: dict[str, Any] = {}
        if self._outcome is not None:
            attributes["pyrula.outcome"] = self._outcome
        model = self._model
        if self._totals is not None:
            detail = self.step_mode == "attributes"
            attributes.update(self._totals.attributes(model and model[1], detail))
        if model is not None:
            attributes["gen_ai.provider.name"], attributes["gen_ai.request.model"] = model
        if attributes:
            span.set_attributes(attributes)

    def _start_spans(self, attempt: int) -> tuple[Span, Span]:
        """``process <turns topic>`` and ``invoke_agent <agent>`` inside it; an unsampled
        process span stands for both (its context is what the steps see)."""
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
        process = self.tracer.start_span(
            f"process {self.turns_topic}",
            context=context_of(self.trace),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )
        if not process.is_recording():
            return process, process
        invoke = self.tracer.start_span(
            f"invoke_agent {self.agent}",
            context=set_span_in_context(process),
            attributes=_agent_attributes(self.agent, self.thread_id),
            record_exception=False,
            set_status_on_exception=False,
        )
        return process, invoke

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

    def tenant_prompt(self, usage: Usage) -> None:
        """A live model call's prompt tokens by kind, for the tenant's cached fraction."""
        if self.metrics is not None and self.tenant is not None:
            self.metrics.tenant_prompt(self.tenant, usage)

    def deferred(self, reason: str) -> None:
        """The turn was deferred: its tenant reached ``reason`` (a limit's name)."""
        log.info("turn deferred: tenant %s reached %s", self.tenant, reason)
        self._tenant_count("deferred", reason)

    def batch_queued(self) -> None:
        """A model call was queued on the batch lane (its turn parks)."""
        if self.metrics is not None:
            self.metrics.batch.call("queued")

    def batch_failed(self) -> None:
        """A batch call came back without a response (or its deadline passed)."""
        log.info("batch call failed")
        if self.metrics is not None:
            self.metrics.batch.call("failed")

    def _tenant_count(self, kind: TenantMetric, *labels: str, amount: int = 1) -> None:
        """The turn's tenant's series of ``kind`` (agents with ``tenant=``) only."""
        if self.metrics is not None and self.tenant is not None:
            self.metrics.tenant_count(kind, self.tenant, *labels, amount=amount)

    def _step_totals(self) -> StepTotals:
        if self._totals is None:
            self._totals = StepTotals()
        return self._totals

    def model_call(self, llm: LLMClient) -> ModelCallObserver:
        """One model call step, as a context manager (see the module doc for its trace)."""
        provider = llm.provider or type(llm).__name__
        span = self.span
        if span is None:
            return ModelCallObserver(None, self.metrics, provider, llm.model, None)
        self._model = (provider, llm.model)
        observer = ModelCallObserver(span, self.metrics, provider, llm.model, self._step_totals())
        if self.step_mode == "spans":
            observer.own_span(self.tracer, self.agent)
        else:
            observer.as_event = self.step_mode == "events"
        return observer

    def tool_call(self, tool: str, call_key: str, tool_use_id: str | None) -> ToolCallObserver:
        """One tool call step, as a context manager (see the module doc for its trace)."""
        span = self.span
        if span is None:
            return ToolCallObserver(None, self.metrics, tool, None)
        observer = ToolCallObserver(span, self.metrics, tool, self._step_totals())
        observer.call = (call_key, tool_use_id)
        if self.step_mode == "spans":
            observer.own_span(self.tracer)
        else:
            observer.as_event = self.step_mode == "events"
        return observer


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
    ``step_mode`` (default: ``PYRULA_TRACE_STEPS``) is where each step's trace facts go.
    """

    def __init__(
        self,
        agent: str,
        *,
        topics: TopicNames,
        worker_id: str,
        group_id: str = "",
        enabled: bool = True,
        step_mode: StepMode | None = None,
    ) -> None:
        self.agent = agent
        self.turns_topic = topics.turns
        self.worker_id = worker_id
        self.group_id = group_id
        self.metrics = WorkerMetrics(agent, journal_topic=topics.journal, dlq_topic=topics.dlq)
        self.enabled = enabled
        self.tracer: Tracer = tracer() if enabled else NoOpTracer()
        self._hot = self.metrics if enabled else None
        self.step_mode = step_mode_from_environment() if step_mode is None else step_mode

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
            self.step_mode,
        )

    def commit(self, turns: Iterable[TurnTelemetry], records: list[OutRecord]) -> CommitObserver:
        return CommitObserver(self.tracer, self._hot, turns, records)
