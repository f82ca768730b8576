"""A model or tool call step's trace facts and metrics (``TurnTelemetry`` makes these).

Where a step's trace facts go is the turn's step mode (``PYRULA_TRACE_STEPS``, see
``telemetry``): summed into ``StepTotals`` for the turn's span, an event on that span, or
a span of the step's own. A failed step is an event even when the steps are summed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from contextvars import Token
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context

from pyrula_stream.llm.base import ModelResponse
from pyrula_stream.observability.metrics import WorkerMetrics
from pyrula_stream.observability.tracing import mark_error

REPLAYED = "pyrula.replayed"
DURATION_MS = "pyrula.duration_ms"
"""A step event's duration (the event's timestamp is when the step started)."""


class StepTotals:
    """One attempt's steps, summed for its ``invoke_agent`` span (set once as it ends)."""

    __slots__ = (
        "cache_creation",
        "cache_read",
        "finish_reason",
        "input_tokens",
        "model_calls",
        "model_ms",
        "output_tokens",
        "replayed",
        "response_model",
        "tool_calls",
        "tool_ms",
        "tools",
    )

    def __init__(self) -> None:
        self.model_calls = self.tool_calls = self.replayed = 0
        self.input_tokens = self.output_tokens = self.cache_read = self.cache_creation = 0
        self.model_ms = self.tool_ms = 0.0
        self.finish_reason: str | None = None
        self.response_model: str | None = None
        self.tools: dict[str, None] = {}
        """The tools called, in first-call order (a dict keeps order and drops repeats)."""

    def model(self, response: ModelResponse | None, replayed: bool, seconds: float) -> None:
        self.model_calls += 1
        self.replayed += replayed
        self.model_ms += seconds
        if response is not None:
            usage = response.usage
            self.input_tokens += usage.input_tokens
            self.output_tokens += usage.output_tokens
            self.cache_read += usage.cache_read_input_tokens
            self.cache_creation += usage.cache_creation_input_tokens
            self.finish_reason = response.stop_reason
            self.response_model = response.model

    def tool(self, name: str, replayed: bool, seconds: float) -> None:
        self.tool_calls += 1
        self.replayed += replayed
        self.tool_ms += seconds
        self.tools[name] = None

    def attributes(self, request_model: str | None, detail: bool) -> dict[str, Any]:
        """The span's step attributes; ``detail``: the sums that step events or spans do
        not already carry (durations, tools, finish reason, replayed steps)."""
        out: dict[str, Any] = {
            "pyrula.model_calls": self.model_calls,
            "pyrula.tool_calls": self.tool_calls,
        }
        if self.model_calls:
            # The conventions count cached input inside input_tokens; our Usage (like
            # Anthropic's) keeps the kinds apart, as the token metric does.
            cached = self.cache_read + self.cache_creation
            out["gen_ai.usage.input_tokens"] = self.input_tokens + cached
            out["gen_ai.usage.output_tokens"] = self.output_tokens
        if not detail:
            return out
        if self.cache_read:
            out["gen_ai.usage.cache_read.input_tokens"] = self.cache_read
        if self.cache_creation:
            out["gen_ai.usage.cache_creation.input_tokens"] = self.cache_creation
        if self.model_calls:
            out["pyrula.model_duration_ms"] = round(1000 * self.model_ms, 3)
        if self.finish_reason is not None:
            out["gen_ai.response.finish_reasons"] = (self.finish_reason,)
        if self.response_model and self.response_model != request_model:
            out["gen_ai.response.model"] = self.response_model
        if self.tool_calls:
            out["pyrula.tool_duration_ms"] = round(1000 * self.tool_ms, 3)
            out["pyrula.tools"] = tuple(self.tools)
        if self.replayed:
            out["pyrula.replayed_steps"] = self.replayed
        return out


class _StepObserver:
    """What both step observers share: the span the step reports on, entered as a
    context manager (a step with its own span makes it current while it runs)."""

    __slots__ = (
        "_attached",
        "as_event",
        "metrics",
        "own",
        "span",
        "started",
        "started_ns",
        "totals",
    )

    def __init__(
        self, span: Span | None, metrics: WorkerMetrics | None, totals: StepTotals | None
    ) -> None:
        self.span = span
        """The turn's ``invoke_agent`` span, or the step's own; ``None``: not traced."""
        self.metrics = metrics
        self.totals = totals
        self.as_event = False
        """A ``chat`` / ``execute_tool`` event per step on the turn's span."""
        self.own = False
        self._attached: Token[Context] | None = None
        self.started = time.monotonic()
        self.started_ns = time.time_ns()

    def _start_own(self, tracer: Tracer, name: str, kind: SpanKind, attrs: dict[str, Any]) -> None:
        self.span = tracer.start_span(name, kind=kind, attributes=attrs)
        self.own = True

    def __enter__(self) -> _StepObserver:
        if self.own and self.span is not None:
            self._attached = otel_context.attach(set_span_in_context(self.span))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.own or self.span is None:
            return
        if self._attached is not None:
            otel_context.detach(self._attached)
        if exc is not None and not isinstance(exc, asyncio.CancelledError):
            self.span.record_exception(exc)
            self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        self.span.end()


class ModelCallObserver(_StepObserver):
    """One model call step: counted in the metrics when live, and reported on the turn's
    span (summed, or as an event) or on a ``chat <model>`` span of its own."""

    __slots__ = ("model", "provider")

    def __init__(
        self,
        span: Span | None,
        metrics: WorkerMetrics | None,
        provider: str,
        model: str,
        totals: StepTotals | None,
    ) -> None:
        super().__init__(span, metrics, totals)
        self.provider = provider
        self.model = model

    def own_span(self, tracer: Tracer, agent: str) -> None:
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self.provider,
            "gen_ai.request.model": self.model,
            "gen_ai.agent.name": agent,
        }
        self._start_own(tracer, f"chat {self.model}", SpanKind.CLIENT, attributes)

    def __enter__(self) -> ModelCallObserver:
        super().__enter__()
        return self

    def recorded(
        self,
        data: Mapping[str, Any],
        replayed: bool,
        cost_usd: float,
        response: ModelResponse | None,
    ) -> None:
        """The step's journaled data and its parsed response (``None`` for a failed
        call); a live call is counted, a replayed one only marked."""
        now = time.monotonic()
        span = self.span
        if span is not None:
            if self.totals is not None:
                self.totals.model(response, replayed, now - self.started)
            failed = "error" in data
            if self.own:
                span.set_attributes(self._attributes(data, replayed, response))
                if failed:
                    span.set_status(Status(StatusCode.ERROR))
            elif self.as_event or failed:
                attributes = self._attributes(data, replayed, response)
                attributes[DURATION_MS] = round(1000 * (now - self.started), 3)
                span.add_event(f"chat {self.model}", attributes, self.started_ns)
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
        full = self.own
        attributes: dict[str, Any] = {REPLAYED: replayed}
        if "error" in data:
            attributes["error.type"] = str(data["error"].get("type", "error"))
        if response is not None:
            usage = response.usage
            cache_read, cache_creation = (
                usage.cache_read_input_tokens,
                usage.cache_creation_input_tokens,
            )
            if full or (response.model and response.model != self.model):
                attributes["gen_ai.response.model"] = response.model or self.model
            attributes["gen_ai.response.finish_reasons"] = [response.stop_reason]
            attributes["gen_ai.usage.input_tokens"] = (
                usage.input_tokens + cache_read + cache_creation
            )
            attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
            if full or cache_read:
                attributes["gen_ai.usage.cache_read.input_tokens"] = cache_read
            if full or cache_creation:
                attributes["gen_ai.usage.cache_creation.input_tokens"] = cache_creation
        return attributes


class ToolCallObserver(_StepObserver):
    """One tool call step: counted in the metrics when live, and reported on the turn's
    span (summed, or as an event) or on an ``execute_tool <tool>`` span of its own."""

    __slots__ = ("call", "step_started", "tool")

    def __init__(
        self,
        span: Span | None,
        metrics: WorkerMetrics | None,
        tool: str,
        totals: StepTotals | None,
    ) -> None:
        super().__init__(span, metrics, totals)
        self.tool = tool
        self.call: tuple[str, str | None] = ("", None)
        """The call's key and the model's tool-use id (for an event or a span)."""
        self.step_started = self.started

    def own_span(self, tracer: Tracer) -> None:
        call_key, tool_use_id = self.call
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": self.tool,
            "pyrula.call_key": call_key,
        }
        if tool_use_id:
            attributes["gen_ai.tool.call.id"] = tool_use_id
        self._start_own(tracer, f"execute_tool {self.tool}", SpanKind.INTERNAL, attributes)

    def __enter__(self) -> ToolCallObserver:
        super().__enter__()
        return self

    def running(self) -> None:
        """The tool itself starts now (its step was waiting for the durability barrier):
        the duration metric is the tool's own time; the trace covers the whole step."""
        self.started = time.monotonic()

    def recorded(self, data: Mapping[str, Any], replayed: bool) -> None:
        status = str(data.get("status", "error"))
        now = time.monotonic()
        span = self.span
        if span is not None:
            if self.totals is not None:
                self.totals.tool(self.tool, replayed, now - self.step_started)
            error = None if status == "ok" else str(data.get("error_code") or "tool_error")
            if self.own:
                span.set_attribute(REPLAYED, replayed)
                span.set_attribute("pyrula.tool.status", status)
                if error is not None:
                    mark_error(span, error)
            elif self.as_event or error is not None:
                call_key, tool_use_id = self.call
                attributes: dict[str, Any] = {
                    "pyrula.call_key": call_key,
                    REPLAYED: replayed,
                    "pyrula.tool.status": status,
                    DURATION_MS: round(1000 * (now - self.step_started), 3),
                }
                if tool_use_id:
                    attributes["gen_ai.tool.call.id"] = tool_use_id
                if error is not None:
                    attributes["error.type"] = error
                span.add_event(f"execute_tool {self.tool}", attributes, self.started_ns)
        if not replayed and self.metrics is not None:
            self.metrics.tool_call(self.tool, status, now - self.started)
