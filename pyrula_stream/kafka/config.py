"""Client configuration shared by every producer, consumer and admin client we create."""

from __future__ import annotations

import logging
from typing import Any

from pyrula_stream.kafka.partitioner import PARTITIONER

librdkafka_logger = logging.getLogger("pyrula_stream.librdkafka")


def _dotted(overrides: dict[str, Any]) -> dict[str, Any]:
    return {k.replace("_", "."): v for k, v in overrides.items()}


def base_config(bootstrap_servers: str, **overrides: Any) -> dict[str, Any]:
    """Bootstrap, low-latency socket and retry settings, librdkafka's logs into Python's."""
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "logger": librdkafka_logger,
        "log_level": 3,
        # Small requests (transaction control, offsets) must not wait on Nagle's algorithm,
        # and a transaction that follows another is retried at once while the previous
        # one's markers land (CONCURRENT_TRANSACTIONS); together ~114 ms -> ~14 ms a commit.
        "socket.nagle.disable": True,
        "retry.backoff.ms": 1,
        "retry.backoff.max.ms": 50,
    }
    conf.update(_dotted(overrides))
    return conf


def producer_config(
    bootstrap_servers: str,
    *,
    transactional_id: str | None = None,
    transaction_timeout_ms: int = 10_000,
    extra: dict[str, Any] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Every producer we create: idempotent, ``acks=all``, 1 ms linger, our partitioner.

    The partitioner must be the same everywhere (clients, worker, tables), or a key's
    records would land on different partitions depending on who wrote them.
    ``transactional_id`` makes it a transactional (EOS v2) producer. ``extra`` is the
    user's own settings (``WorkerOptions.producer_config``), applied last as given.
    """
    conf = base_config(
        bootstrap_servers,
        **{
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 1,
            "partitioner": PARTITIONER,
        },
    )
    conf.update(_dotted(overrides))
    if transactional_id is not None:
        conf["transactional.id"] = transactional_id
        conf["transaction.timeout.ms"] = transaction_timeout_ms
    conf.update(extra or {})
    return conf


def reader_config(bootstrap_servers: str, *, client_id: str) -> dict[str, Any]:
    """A group-less reader: assigned partitions, committed records only, never commits."""
    return base_config(
        bootstrap_servers,
        **{
            "group.id": f"{client_id}-reader",
            "client.id": client_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10,
        },
    )
