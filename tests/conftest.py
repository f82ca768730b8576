"""Shared fixtures. The broker fixture ``kafka_bootstrap_servers`` comes from
``pyrula_stream.testing`` (a pytest plugin): a real Apache Kafka, never a mock."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager

import pytest

from pyrula_stream import KafkaAgent, KafkaAgentClient, KafkaWorker, WorkerOptions
from pyrula_stream.objects.s3_server import LocalS3, local_s3
from pyrula_stream.testing import BOOTSTRAP_ENV, local_kafka, running_worker
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
        "secured_broker",
    }
)
"""Fixtures that start (or need) a real broker: a test that uses one, directly or through
another fixture, is marked ``broker``, so ``pytest -m "not broker"`` runs the rest alone.
A test that starts a broker of its own says so with ``@pytest.mark.broker``."""


_SHARED_BROKER = contextlib.ExitStack()


def pytest_configure(config: pytest.Config) -> None:
    """Under ``pytest -n N`` (pytest-xdist, as ``make test`` runs), the controller starts
    the session's one broker before the workers start, and they inherit its address
    (``KAFKA_BOOTSTRAP_SERVERS``): one broker for the whole run, not one per worker."""
    is_worker = hasattr(config, "workerinput")
    distributed = bool(getattr(config.option, "numprocesses", None))
    if is_worker or not distributed or os.environ.get(BOOTSTRAP_ENV):
        return
    os.environ[BOOTSTRAP_ENV] = _SHARED_BROKER.enter_context(local_kafka())
    config.add_cleanup(_stop_shared_broker)


def _stop_shared_broker() -> None:
    os.environ.pop(BOOTSTRAP_ENV, None)
    _SHARED_BROKER.close()


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


S3_TEST_BUCKET = "pyrula-test"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[LocalS3]:
    """A real S3 server (versitygw over a temporary folder) for the session, with the
    bucket ``S3_TEST_BUCKET``; its credentials are put in the environment as ``AWS_*``,
    where boto3 (and so ``S3ObjectStore``, and any worker process started meanwhile)
    reads them. Started only for the tests that ask for it."""
    with local_s3(S3_TEST_BUCKET) as server:
        yield server
