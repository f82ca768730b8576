"""Fixtures of the telemetry tests: the OpenTelemetry SDK and the spans one test ends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the SDK is the `otel` extra: absent from the lowest-versions venv
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_WATCHED = {"spans": False}
"""Spans are kept only while a test holds the ``spans`` fixture: once installed, the SDK
stays for the session, and the tests after a tracing test must not find spans that nobody
reads hanging off their workers. (Still recorded and propagated as sampled: a worker in a
subprocess samples by its parent.)"""


@pytest.fixture(scope="session")
def _sdk_spans() -> InMemorySpanExporter:
    """The OpenTelemetry SDK installed once for the session (a global tracer provider can
    be set only once per process), its spans kept in memory."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    class WhileWatched(SimpleSpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            if _WATCHED["spans"]:
                super().on_end(span)

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(WhileWatched(exporter))
    return exporter


@pytest.fixture
def spans(_sdk_spans: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    """The spans this process ends during one test (clients' and in-process workers')."""
    _sdk_spans.clear()
    _WATCHED["spans"] = True
    try:
        yield _sdk_spans
    finally:
        _WATCHED["spans"] = False
        _sdk_spans.clear()
