"""OpenTelemetry spans and W3C trace context across Kafka hops.

Only the OpenTelemetry API is a dependency: without an SDK configured every span here is
a no-op. The trace context travels as a ``traceparent`` (and ``tracestate``) header:
``submit`` injects it into the turn request, the worker continues it, the turn's
``start`` step journals it (so a turn resumed on another worker continues the same
trace) and every event record carries it. The confluent-kafka contrib instrumentation
is not used: it does not wrap transactional producers.

Span names follow the OpenTelemetry messaging and GenAI conventions: ``send <topic>``
(client), ``process <turns topic>`` (consumer), ``invoke_agent <agent>``,
``chat <model>``, ``execute_tool <tool>``; plus ``commit_transaction`` for each
transaction the worker commits.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:  # the SDK is an extra (``otel``): only its type is needed here
    from opentelemetry.sdk.trace.sampling import Sampler

TRACE_HEADERS = ("traceparent", "tracestate")
TraceCarrier = dict[str, str]
"""The W3C trace context of a turn: ``{"traceparent": ..., "tracestate": ...}``."""

_PROPAGATOR = TraceContextTextMapPropagator()

SAMPLER_ENV = "OTEL_TRACES_SAMPLER"
DEFAULT_TRACE_RATIO = 0.1
"""The share of turns a worker traces when it builds the tracer provider itself and
``OTEL_TRACES_SAMPLER`` is not set: a turn whose request carries a sampled trace context
is always traced (parent-based), one that carries none is traced one time in ten."""


def tracer() -> trace.Tracer:
    """The library's tracer from the global provider (a no-op until an SDK is set)."""
    from pyrula_stream._version import __version__

    return trace.get_tracer("pyrula_stream", __version__)


_NO_PROVIDER = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_provider_installed = False


def tracing_on(spans: trace.Tracer) -> bool:
    """Whether ``spans`` can record anything: an SDK (or other) provider is installed.

    Without one, even a no-op span costs a context attach and detach; the worker asks
    this once per turn attempt and skips its spans when it says no. OpenTelemetry takes a
    global provider once, for good, so a yes is kept; the no is a type lookup (an
    ``isinstance`` against the providers' ABCs took a few microseconds of every turn).
    """
    global _provider_installed
    if isinstance(spans, trace.NoOpTracer):
        return False
    if _provider_installed:
        return True
    if type(trace.get_tracer_provider()) in _NO_PROVIDER:
        return False
    _provider_installed = True
    return True


def current_carrier() -> TraceCarrier:
    """The current span's context as W3C headers (empty when there is no valid span)."""
    carrier: TraceCarrier = {}
    _PROPAGATOR.inject(carrier)
    return carrier


def span_carrier(span: Span) -> TraceCarrier:
    """``span``'s context as W3C headers (what the propagator's ``inject`` writes, built
    directly: once per turn attempt, without a context to set and read back)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return {}
    carrier = {"traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"}
    if ctx.trace_state:
        carrier["tracestate"] = ctx.trace_state.to_header()
    return carrier


def carrier_from_headers(headers: Mapping[str, str]) -> TraceCarrier | None:
    """The trace context a record's headers carry, if any."""
    carrier = {k: headers[k] for k in TRACE_HEADERS if headers.get(k)}
    return carrier or None


def carrier_headers(carrier: Mapping[str, str] | None) -> list[tuple[str, bytes]]:
    """Kafka headers for a trace context."""
    return [(k, v.encode()) for k, v in (carrier or {}).items() if k in TRACE_HEADERS]


def context_of(carrier: Mapping[str, str] | None) -> Context | None:
    """The parent context a carrier describes (``None``: start a new trace)."""
    return _PROPAGATOR.extract(dict(carrier)) if carrier else None


@contextmanager
def send_span(topic: str, turn_id: str) -> Iterator[TraceCarrier]:
    """The client's ``send <topic>`` span; yields the context to put in the headers."""
    with tracer().start_as_current_span(
        f"send {topic}",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "kafka",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": topic,
            "pyrula.turn_id": turn_id,
        },
    ):
        yield current_carrier()


def start_commit_span(spans: trace.Tracer, links: Iterable[Span | None], records: int) -> Span:
    """A span for one transaction, linked to the turns whose records it commits."""
    return spans.start_span(
        "commit_transaction",
        context=Context(),  # a commit serves many turns: its own trace, linked to each
        kind=SpanKind.PRODUCER,
        links=[Link(s.get_span_context()) for s in links if s is not None],
        attributes={"messaging.system": "kafka", "messaging.batch.message_count": records},
    )


def mark_error(span: Span, error_type: str, message: str | None = None) -> None:
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, message))


def default_sampler() -> Sampler | None:
    """The sampler of the provider the worker builds: ``OTEL_TRACES_SAMPLER`` when set
    (``None``: the SDK reads it), else ``parentbased_traceidratio`` at
    ``DEFAULT_TRACE_RATIO``.

    Why not the SDK's ``parentbased_always_on``: the spans of a traced turn cost more
    CPU than the rest of its telemetry together (``make bench`` prices both ways); one
    turn in ten still traces every turn a traced client sends, and
    ``OTEL_TRACES_SAMPLER=parentbased_always_on`` traces them all.
    """
    if os.environ.get(SAMPLER_ENV, "").strip():
        return None
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    return ParentBased(TraceIdRatioBased(DEFAULT_TRACE_RATIO))


def otlp_from_environment(service_name: str) -> bool:
    """Export spans over OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the traces
    variant) is set and the ``otel`` extra is installed; returns whether it did.

    Called by ``pyrula-stream worker``; an application that configures its own
    ``TracerProvider`` does not need it (its sampler is then the application's choice;
    ``default_sampler`` is the worker's).
    """
    if not (
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        from pyrula_stream.errors import ConfigurationError

        raise ConfigurationError(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed: "
            "pip install 'pyrula-stream[otel]'"
        ) from exc
    attrs: dict[str, Any] = {"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)}
    provider = TracerProvider(resource=Resource.create(attrs), sampler=default_sampler())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True
