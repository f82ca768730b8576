"""Shared fixtures. The broker fixture ``kafka_bootstrap_servers`` comes from
``pyrula_stream.testing`` (a pytest plugin): a real Apache Kafka, never a mock."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

import pytest

from pyrula_stream import KafkaAgent, KafkaAgentClient, KafkaWorker, WorkerOptions
from pyrula_stream.testing import running_worker
from tests.approvals_kit import HITL_OPTIONS, Refunds, Serve

# litellm fetches its cost map from the internet when imported unless told to use the copy
# it ships; the suite must not depend on the network (and LiteLLM's costs come from
# pyrula_stream.llm.pricing anyway). Set before any test module imports litellm.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

BROKER_FIXTURES = frozenset(
    {
        "kafka_bootstrap_servers",
        "kafka_config",
        "schema_registry_url",
        "kafka_cluster",
        "secured_kafka",
    }
)
"""Fixtures that start (or need) a real broker: a test that uses one, directly or through
another fixture, is marked ``broker``, so ``pytest -m "not broker"`` runs the rest alone.
A test that starts a broker of its own says so with ``@pytest.mark.broker``."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if BROKER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.broker)


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
