"""How many turn requests of an agent wait for a worker: ``AppOptions.max_queue_depth``.

The depth is the consumer lag of ``<prefix>.<agent>.workers`` on the agent's turns
topic: the stable end of each partition less the offset the workers committed. It is
read at most once per ``CACHE_S`` per agent, so a burst of submits costs one read.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import TopicPartition

from pyrula_stream.kafka.config import new_consumer, reader_config

CACHE_S = 1.0


def turns_waiting(
    bootstrap_servers: str,
    prefix: str,
    agent: str,
    *,
    kafka_config: Mapping[str, Any] | None,
    timeout_s: float,
) -> int:
    """The workers' lag on ``<prefix>.<agent>.turns`` (blocking; 0 without the topic).
    Asked as the workers' group without joining it or committing (an OffsetFetch)."""
    topic = f"{prefix}.{agent}.turns"
    conf = reader_config(
        bootstrap_servers,
        kafka_config=kafka_config,
        client_id=f"pyrula-gateway-depth-{uuid.uuid4().hex[:8]}",
        group_id=f"{prefix}.{agent}.workers",
    )
    consumer = new_consumer(conf)
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return 0
        wanted = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
        total = 0
        for tp in consumer.committed(wanted, timeout=timeout_s):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, tp.partition), timeout=timeout_s, cached=False
            )
            total += max(0, high - (tp.offset if tp.offset >= 0 else low))
        return total
    finally:
        consumer.close()


class QueueDepths:
    """``turns_waiting`` per agent, read at most once a ``CACHE_S``."""

    def __init__(
        self, bootstrap_servers: str, *, kafka_config: Mapping[str, Any] | None, timeout_s: float
    ) -> None:
        self._bootstrap = bootstrap_servers
        self._kafka_config = kafka_config
        self._timeout_s = timeout_s
        self._read: dict[tuple[str, str], tuple[float, int]] = {}

    async def depth(self, prefix: str, agent: str) -> int:
        at, found = self._read.get((prefix, agent), (0.0, 0))
        if time.monotonic() - at < CACHE_S:
            return found
        found = await asyncio.to_thread(
            turns_waiting,
            self._bootstrap,
            prefix,
            agent,
            kafka_config=self._kafka_config,
            timeout_s=self._timeout_s,
        )
        self._read[(prefix, agent)] = (time.monotonic(), found)
        return found
