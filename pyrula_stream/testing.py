"""Test helpers for users and for our own suite: a real broker, a worker in-process.

``kafka_bootstrap_servers`` (pytest fixture, session scope) and ``local_kafka()`` give a
bootstrap address:

- ``KAFKA_BOOTSTRAP_SERVERS`` set: that cluster is used as is;
- ``PYRULA_KAFKA=testcontainers``: a Kafka container via testcontainers (needs Docker);
- otherwise a real single-node Apache Kafka broker (KRaft) is started from Maven jars
  with the machine's Java 17+, and stopped when the session ends.

``schema_registry_url`` (session scope, started only for tests that ask for it) gives a
real Schema Registry's Confluent-compatible URL: ``SCHEMA_REGISTRY_URL`` when set, else a
local Apicurio Registry (fetched once with Maven, run with Java 21+).

Client settings for a secured cluster come from the properties file named by
``PYRULA_KAFKA_CONFIG`` (every client the package creates reads it when no explicit
``kafka_config`` is given); the ``kafka_config`` fixture returns them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.kafka.config import KafkaSettings, settings_from_env
from pyrula_stream.kafka.local.broker import start_local_broker
from pyrula_stream.runtime.worker import KafkaWorker, WorkerOptions

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"


@contextlib.contextmanager
def local_kafka() -> Iterator[str]:
    """Yield a bootstrap address, starting (and later stopping) a broker when needed."""
    existing = os.environ.get(BOOTSTRAP_ENV)
    if existing:
        yield existing
        return
    if os.environ.get("PYRULA_KAFKA") == "testcontainers":
        try:
            from testcontainers.kafka import KafkaContainer
        except ImportError as exc:
            raise ConfigurationError(
                "PYRULA_KAFKA=testcontainers needs `pip install 'pyrula-stream[dev]'` and Docker"
            ) from exc
        with KafkaContainer().with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    broker = start_local_broker()
    try:
        yield broker.bootstrap_servers
    finally:
        broker.stop()


def _kafka_bootstrap_servers() -> Iterator[str]:
    """A real Kafka for the whole test session (see the module docstring)."""
    with local_kafka() as bootstrap:
        yield bootstrap


try:  # a pytest plugin when pytest is installed; plain helpers otherwise
    import pytest
except ImportError:  # pragma: no cover - exercised only without the dev extra
    pass
else:
    kafka_bootstrap_servers = pytest.fixture(scope="session", name="kafka_bootstrap_servers")(
        _kafka_bootstrap_servers
    )

    @pytest.fixture(scope="session", name="schema_registry_url")
    def schema_registry_url() -> Iterator[str]:
        """A real Schema Registry for the session (see ``local_schema_registry``)."""
        with local_schema_registry() as url:
            yield url

    @pytest.fixture(scope="session", name="kafka_config")
    def kafka_config() -> KafkaSettings:
        """The client settings of ``PYRULA_KAFKA_CONFIG`` (empty when it is not set)."""
        return settings_from_env()


@contextlib.contextmanager
def local_schema_registry() -> Iterator[str]:
    """Yield a Schema Registry URL: ``SCHEMA_REGISTRY_URL``, else a local Apicurio Registry."""
    existing = os.environ.get("SCHEMA_REGISTRY_URL")
    if existing:
        yield existing
        return
    from pyrula_stream.kafka.local.registry import start_local_registry

    registry = start_local_registry()
    try:
        yield registry.url
    finally:
        registry.stop()


def unique_name(base: str = "t") -> str:
    """A fresh agent name or prefix, so tests sharing a broker never share topics."""
    return f"{base}{uuid.uuid4().hex[:10]}"


@contextlib.asynccontextmanager
async def running_worker(
    agent: KafkaAgent,
    bootstrap_servers: str,
    options: WorkerOptions | None = None,
    *,
    wait_assigned: bool = True,
    all_partitions: bool = False,
    timeout_s: float = 60.0,
) -> AsyncIterator[KafkaWorker]:
    """Run a worker in this event loop until it owns a partition (or ``all_partitions``);
    stop it gracefully on exit, re-raising whatever made it fail."""
    async with KafkaWorker(agent, bootstrap_servers=bootstrap_servers, options=options) as worker:
        if wait_assigned:
            wanted = agent.partitions if all_partitions else 1
            await wait_for(
                lambda: worker.done or worker.assigned_partitions >= wanted,
                timeout_s,
                f"worker of {agent.name} got no partitions",
            )
        yield worker


async def agent_topics_ready(
    bootstrap_servers: str,
    agent: str,
    *,
    prefix: str = "pyrula",
    timeout_s: float = 120.0,
    kafka_config: Mapping[str, Any] | None = None,
) -> None:
    """Wait until a worker started elsewhere (a subprocess) has created the agent's turns
    topic: a submit before that is refused with ``UnknownTopicError``."""
    from pyrula_stream.kafka.admin import missing_topics

    turns = f"{prefix}.{agent}.turns"
    await wait_for(
        lambda: not missing_topics(bootstrap_servers, [turns], kafka_config=kafka_config),
        timeout_s,
        f"{turns} created",
    )


async def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    """Poll ``predicate`` until true; raise ``TimeoutError`` naming ``what``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.05)


def read_topic(
    bootstrap_servers: str,
    topic: str,
    *,
    timeout_s: float = 30.0,
    kafka_config: Mapping[str, Any] | None = None,
    group_id: str | None = None,
) -> list[tuple[bytes | None, bytes | None, dict[str, str]]]:
    """Every committed record of ``topic`` now, as ``(key, value, headers)`` (for asserts;
    ``group_id``: the reader's group, which a secured cluster wants DESCRIBE on)."""
    from pyrula_stream.kafka.consumers import read_topic as read_all

    records = read_all(
        bootstrap_servers,
        topic,
        timeout_s=timeout_s,
        client_id=unique_name("read"),
        kafka_config=kafka_config,
        group_id=group_id,
    )
    return [(r.key.encode() if r.key else None, r.value, r.headers) for r in records]


def assert_replays(agent: KafkaAgent, pattern: str | Path) -> None:
    """Fail unless every recorded turn matching ``pattern`` replays cleanly on ``agent``'s
    current code (offline: no Kafka, no model). Keep golden turns from
    ``pyrula-stream turn export`` in your repo and CI catches a change that would fail
    in-flight turns with ``replay_input_changed`` before it is deployed."""
    from pyrula_stream.runtime.replay import replay_files

    def run() -> list[Any]:
        return asyncio.run(replay_files(agent, pattern))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        reports = run()
    else:  # called from an async test: replay on a loop of its own
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            reports = pool.submit(run).result()
    broken = [str(r) for r in reports if not r.clean]
    if broken:
        raise AssertionError(
            f"{len(broken)} of {len(reports)} recorded turns no longer replay:\n  "
            + "\n  ".join(broken)
        )
