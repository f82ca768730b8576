"""What a worker checks and opens before it joins its group.

Kafka may come up after the worker (a restart, a deploy), so the worker waits for it with
backoff instead of failing. Topics are created when missing and compared with the spec;
drift, or an output topic that does not exist, stops the worker with one clear line. The
stores shared by every worker of the agent (the tool cache, ``ctx.memory``) are opened
once per start and closed when the worker stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.errors import ConfigurationError, TopicDriftError
from pyrula_stream.kafka.admin import apply_topics, broker_answers, missing_topics
from pyrula_stream.kafka.stores.cache import KafkaCacheStore
from pyrula_stream.kafka.stores.memory import KafkaMemory
from pyrula_stream.kafka.transactions import writer_record_room
from pyrula_stream.runtime.options import WorkerOptions
from pyrula_stream.runtime.quotas import TenantQuotas
from pyrula_stream.tools.cache import CacheStore, InProcessCacheStore

log = logging.getLogger(__name__)

BROKER_WAIT_MAX_S = 10.0
"""Longest pause between two looks for a Kafka that does not answer yet."""


async def wait_for_broker(
    bootstrap_servers: str,
    kafka_config: Mapping[str, Any] | None,
    stopping: Callable[[], bool],
) -> None:
    """Return once Kafka answers (or a stop was asked for), retrying with backoff."""
    delay, waited, started = 0.5, False, time.monotonic()
    while not stopping():
        answers = partial(broker_answers, bootstrap_servers, 2.0, kafka_config=kafka_config)
        if await asyncio.to_thread(answers):
            if waited:
                log.warning(
                    "Kafka at %s answers after %.0fs; starting",
                    bootstrap_servers,
                    time.monotonic() - started,
                )
            return
        if not waited:
            log.warning(
                "Kafka at %s does not answer; waiting for it (retrying with backoff up "
                "to %.0fs; /readyz says not ready until the worker has started)",
                bootstrap_servers,
                BROKER_WAIT_MAX_S,
            )
            waited = True
        await asyncio.sleep(delay)
        delay = min(delay * 2, BROKER_WAIT_MAX_S)


async def check_topics(
    agent: KafkaAgent,
    bootstrap_servers: str,
    kafka_config: Mapping[str, Any] | None,
    *,
    apply: bool,
) -> None:
    """Create what is missing (``apply``); refuse drift and output topics that do not exist."""
    if apply:
        report = await asyncio.to_thread(
            partial(apply_topics, bootstrap_servers, agent.topic_specs(), kafka_config=kafka_config)
        )
        if not report.ok:
            raise TopicDriftError(
                f"agent '{agent.name}' refuses to start: its topics differ from the "
                "spec:\n  " + "\n  ".join(report.drift)
            )
    routed = sorted(agent.event_routing.all_topics() - {agent.topics.events})
    absent = await asyncio.to_thread(
        partial(missing_topics, bootstrap_servers, routed, kafka_config=kafka_config)
    )
    if absent:
        raise ConfigurationError(
            f"agent '{agent.name}' routes events to output topics that do not exist: "
            f"{', '.join(absent)}; create them (they are yours, so they are never created "
            "for you) or remove them from output_topics"
        )


class TopicProbe:
    """Whether a topic exists (a sub-agent's turns topic); a found topic is remembered."""

    def __init__(self, bootstrap_servers: str, kafka_config: Mapping[str, Any] | None) -> None:
        self._bootstrap = bootstrap_servers
        self._kafka_config = kafka_config
        self._known: set[str] = set()

    async def exists(self, topic: str) -> bool:
        if topic in self._known:
            return True
        absent = await asyncio.to_thread(
            partial(missing_topics, self._bootstrap, [topic], kafka_config=self._kafka_config)
        )
        if not absent:
            self._known.add(topic)
        return not absent


def tenant_quotas(
    agent: KafkaAgent, bootstrap_servers: str, options: WorkerOptions, worker_id: str
) -> TenantQuotas | None:
    """The tenants' shared usage and limits, for an agent with ``tenant=``."""
    if not agent.tenancy.enabled:
        return None
    return TenantQuotas(
        agent,
        bootstrap_servers,
        worker_id=worker_id,
        kafka_config=options.kafka_config,
        record_room=writer_record_room(options.kafka_config, options.producer_config),
    )


@contextlib.asynccontextmanager
async def shared_stores(
    agent: KafkaAgent,
    bootstrap_servers: str,
    options: WorkerOptions,
    *,
    worker_id: str,
    state_dir: Path,
    quotas: TenantQuotas | None = None,
) -> AsyncIterator[tuple[CacheStore, KafkaMemory | None]]:
    """The tool cache (in process unless ``shared_tool_cache``) and the Kafka memory
    store (unless another ``memory_backend`` is given), each read to its end first; the
    tenants' usage and limits (``quotas``) read to their end too."""
    cache: CacheStore = InProcessCacheStore()
    memory: KafkaMemory | None = None
    try:
        if quotas is not None:
            await asyncio.to_thread(quotas.start)
        if options.shared_tool_cache:
            shared = KafkaCacheStore(
                bootstrap_servers,
                prefix=agent.shared_prefix,
                client_id=f"{worker_id}-cache",
                kafka_config=options.kafka_config,
            )
            await asyncio.to_thread(shared.start)
            cache = shared
        if options.memory_backend is None:
            memory = KafkaMemory(
                bootstrap_servers,
                state_dir=state_dir,
                client_id=f"{worker_id}-memory",
                prefix=agent.shared_prefix,
                kafka_config=options.kafka_config,
            )
            await asyncio.to_thread(memory.start)
        yield cache, memory
    finally:
        if isinstance(cache, KafkaCacheStore):
            await asyncio.to_thread(cache.close)
        if memory is not None:
            await asyncio.to_thread(memory.close)
        if quotas is not None:
            await asyncio.to_thread(quotas.close)
