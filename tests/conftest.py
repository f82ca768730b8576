"""Shared fixtures. The broker fixture ``kafka_bootstrap_servers`` comes from
``pyrula_stream.testing`` (a pytest plugin): a real Apache Kafka, never a mock."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import pytest

from pyrula_stream import KafkaAgent, KafkaAgentClient, KafkaWorker, WorkerOptions
from pyrula_stream.testing import running_worker
from tests.approvals_kit import HITL_OPTIONS, Refunds, Serve

# litellm fetches its cost map from the internet when imported unless told to use the copy
# it ships; the suite must not depend on the network (and LiteLLM's costs come from
# pyrula_stream.llm.pricing anyway). Set before any test module imports litellm.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

if TYPE_CHECKING:  # the SDK is the `otel` extra: absent from the lowest-versions venv
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from playwright.async_api import Browser, Page, Route

    from pyrula_stream.kafka.local.cluster import LocalCluster


@pytest.fixture
async def client(kafka_bootstrap_servers: str) -> AsyncIterator[KafkaAgentClient]:
    async with KafkaAgentClient(kafka_bootstrap_servers) as c:
        yield c


@pytest.fixture
def refunds() -> Refunds:
    """A fresh approval-gated ``refund`` tool (``refunds.tool()``) and the runs it made."""
    return Refunds()


@pytest.fixture
def serve(kafka_bootstrap_servers: str) -> Serve:
    """``async with serve(agent) as worker``: an in-process worker of ``agent`` on the
    session's broker (``HITL_OPTIONS`` unless given), stopped gracefully on exit."""

    def start(
        agent: KafkaAgent, options: WorkerOptions = HITL_OPTIONS
    ) -> AbstractAsyncContextManager[KafkaWorker]:
        return running_worker(agent, kafka_bootstrap_servers, options)

    return start


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


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[LocalCluster]:
    """A local cluster of three brokers and a controller, started once per session and
    only when a test (marked ``cluster``) asks for it."""
    from pyrula_stream.kafka.local.cluster import start_local_cluster

    cluster = start_local_cluster(3)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    """One headless Chromium for the session (the UI's and the web chat's tests), started
    only when a browser test asks for it."""
    from playwright.async_api import async_playwright

    from tests.browsers import system_chromium

    executable = system_chromium()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=executable, headless=True)
        yield launched
        await launched.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    """A page that may load only from this machine: the pages must work offline, so a
    request anywhere else (a CDN, a font service) is refused and fails the test."""
    from urllib.parse import urlsplit

    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    elsewhere: list[str] = []

    async def only_local(route: Route) -> None:
        host = urlsplit(route.request.url).hostname
        if host in ("127.0.0.1", "localhost", "::1"):
            await route.continue_()
        else:
            elsewhere.append(route.request.url)
            await route.abort()

    await context.route("**/*", only_local)
    yield await context.new_page()
    await context.close()
    assert not elsewhere, f"the page loaded from outside this machine: {elsewhere}"
