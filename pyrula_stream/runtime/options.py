"""Worker settings: ``WorkerOptions`` and ``PoisonOptions``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pyrula_stream.access.tenant_signature import check_tenant_key
from pyrula_stream.kafka.config import KafkaSettings, check_serialization, resolve
from pyrula_stream.wire.guard import DecodeLimits
from pyrula_stream.wire.payload_refs import DEFAULT_THRESHOLD

SHUTDOWN_GRACE_S = 25.0
"""Default seconds a stopping worker gives its running turns. Kubernetes kills a pod 30 s
(its default ``terminationGracePeriodSeconds``) after SIGTERM: a 30 s drain would be
killed mid-handover, so the default leaves 5 s to commit, leave the group and close.
A longer ``shutdown_grace`` needs a grace period above it (docs/containers.md)."""


@dataclass(frozen=True)
class PoisonOptions:
    """A turn whose attempts make no progress ``max_retries`` times is quarantined, and so
    is a record that was being read when ``max_retries`` worker processes died (counted
    across processes in the partition's journal; a count older than ``retry_ttl_s``
    starts again). Quarantined: dead-lettered with code ``poison_quarantine`` and ended
    with a ``run:error``. A worker whose sessions keep ending on the same input waits
    before it rejoins, ``restart_backoff_s`` doubled per repeat up to
    ``restart_backoff_max_s``, and counts those endings like deaths. See
    docs/hostile-input.md."""

    max_retries: int = 3
    retry_ttl_s: float = 3600.0
    restart_backoff_s: float = 0.5
    restart_backoff_max_s: float = 30.0


@dataclass(frozen=True)
class WorkerOptions:
    """Tuning for a worker process.

    ``shared_tool_cache`` keeps ``cache_ttl`` results and ``ctx.cache`` in the compacted
    ``<prefix>.cache`` topic that every worker materializes; off, each worker process
    keeps its own in-memory cache.
    ``processing_guarantee="exactly_once_v2"`` commits journal, events and input offsets
    in one transaction; ``"at_least_once"`` (brokers without transactions) writes with an
    idempotent producer and commits offsets afterwards, so events may repeat (dedupe on
    ``turn_id`` + ``seq``). ``commit_interval_s`` caps how often a commit starts (0: as
    soon as the previous one ends). ``commit_linger_s``: records no one waits for yet
    (events while a turn runs, a step before a read-only tool) wait up to this long to
    join a commit someone does wait for (a turn's end, the step before a tool with
    effects), so they do not queue it behind a commit of their own (0: commit at once).
    ``worker_id`` makes the transactional id stable across restarts, so a restarted
    worker aborts its predecessor's open transaction at once.
    ``static_membership`` also makes ``worker_id`` the consumer's ``group.instance.id``
    (KIP-345): a worker restarted with its id gets its partitions back at once, without a
    rebalance and without waiting out the session timeout. The price: librdkafka never
    sends a static member's LeaveGroup, so a worker stopped for good leaves its partitions
    idle until the session timeout (10 s) ends. ``group_protocol="consumer"`` selects the
    KIP-848 rebalance protocol (the broker assigns; Kafka 4.0+).
    ``state_dir`` holds the worker's local tables (idempotency keys within
    ``idempotency_ttl_s``, one SQLite file per partition, rebuilt from the journal on each
    assignment); unset, each worker uses a temporary directory it removes when it stops.
    The worker makes it a 0700 directory and its files 0600 (they hold what turns carry).
    Every ``idempotency_expiry_interval_s`` the worker forgets the keys past their TTL
    and tombstones them, off its event loop, at most ``idempotency_expiry_batch`` keys
    per commit.
    ``telemetry=False`` records no per-turn metrics and starts no spans (``/metrics``
    still answers); the bench uses it as the baseline that prices telemetry.
    ``durable_timer_after_s``: a ``ctx.sleep``/``sleep_until`` longer than this parks the
    turn (no task, no slot; the partition's owner wakes it); a shorter one holds its slot.
    ``memory_backend`` replaces ``<prefix>.memory`` behind ``ctx.memory`` with another
    ``MemoryBackend``; its writes run once as journaled steps, outside the transaction.
    ``kafka_config`` (librdkafka settings: ``security.protocol``, ``sasl.*``, ``ssl.*``,
    ``client.id``, ...) reaches every client the worker creates; without it the file in
    ``PYRULA_KAFKA_CONFIG`` is used. ``consumer_config``/``producer_config`` apply last, to
    the group consumer and the transactional producer only.
    ``serialization="schema_registry"`` writes events in the Confluent wire format through
    the registry at ``schema.registry.url`` in ``kafka_config``; turn requests in either
    framing are read whenever a registry is configured.
    ``decode_limits`` caps what a turn request may hold before it is parsed (size 16 MiB,
    JSON nesting 128 levels); a request past them is dead-lettered with the reason.
    ``max_delivery_attempts``: a record the broker keeps refusing aborts each transaction
    it rides; after this many commits in a row its turn ends with ``record_undeliverable``
    (a record of no turn goes to the DLQ instead), so the partition moves on.
    ``max_queued_turns``: how far the worker reads ahead, in turns waiting for a slot,
    before it stops fetching. Fair admission picks among the turns it has read, so a
    tenant's flood delays another tenant's turn that comes after it in a partition only
    until the queue drops below this (docs/tenants.md gives the bound).
    ``max_pending_records`` bounds the records waiting for the next commit: past it, a
    model call that took longer than two commits waits for a commit to take the buffer
    before it writes its deltas and its response (0: unbounded). Many slow calls that
    return together then cost one buffer, not a burst of records at once; quicker calls
    are paced by the commits they await and never wait (docs/operating.md).
    ``shutdown_grace``: seconds a stop (SIGTERM) waits for running turns to finish
    before it stops them at a step boundary (``SHUTDOWN_GRACE_S``); ``health_host`` is
    where ``health_port`` listens (``0.0.0.0`` in a pod, so probes and scrapes reach it).
    ``tenant_key`` (at least 32 bytes) makes the worker trust a turn's tenant only when
    the request carries its signature under that key (``access/tenant_signature.py``);
    any other tenant runs as the shared ``"unknown"`` one (docs/tenants.md).
    ``object_store`` (an ``ObjectStore``, or its setting: ``file:///dir``, a directory,
    ``s3://bucket/prefix``; without it ``PYRULA_OBJECT_STORE``, as the command line's
    ``--object-store``) turns on payloads by
    reference: a value whose JSON is past ``offload_threshold_bytes`` (256 KiB; an
    agent's ``AgentLimits.offload_threshold_bytes`` wins) is put there before the commit
    that references it, and references in requests and the journal are read back from
    it. Without one, a record past ``max_record_bytes`` fails with ``PayloadTooLarge``
    (docs/large-payloads.md).
    """

    max_concurrent_turns: int = 50
    max_queued_turns: int = 1000
    shutdown_grace: float = SHUTDOWN_GRACE_S
    cancel_timeout: float = 5.0
    poison: PoisonOptions = field(default_factory=PoisonOptions)
    health_port: int | None = None
    health_host: str = "127.0.0.1"
    processing_guarantee: Literal["exactly_once_v2", "at_least_once"] = "exactly_once_v2"
    commit_interval_s: float = 0.0
    commit_linger_s: float = 0.01
    idempotency_ttl_s: float = 86400.0
    idempotency_expiry_interval_s: float = 60.0
    idempotency_expiry_batch: int = 500
    state_dir: str | Path | None = None
    worker_id: str | None = None
    group_id: str | None = None
    max_record_bytes: int = 1_000_000
    apply_topics: bool = True
    shared_tool_cache: bool = True
    static_membership: bool = False
    group_protocol: Literal["classic", "consumer"] = "classic"
    consumer_config: Mapping[str, Any] = field(default_factory=dict)
    producer_config: Mapping[str, Any] = field(default_factory=dict)
    telemetry: bool = True
    durable_timer_after_s: float = 5.0
    memory_backend: Any = field(default=None, repr=False)  # may hold a store's credentials
    kafka_config: Mapping[str, Any] | None = None
    serialization: Literal["avro", "schema_registry"] = "avro"
    decode_limits: DecodeLimits = field(default_factory=DecodeLimits)
    max_delivery_attempts: int = 5
    max_pending_records: int = 1000
    tenant_key: bytes | None = field(default=None, repr=False)
    object_store: Any = field(default=None, repr=False)  # may hold a store's credentials
    offload_threshold_bytes: int = DEFAULT_THRESHOLD

    def __post_init__(self) -> None:
        if self.tenant_key is not None:
            check_tenant_key(self.tenant_key)
        # Resolved once, so every client sees the same settings, and a repr hides secrets.
        object.__setattr__(self, "kafka_config", resolve(self.kafka_config))
        check_serialization(self.serialization, self.kafka_config)
        for name in ("consumer_config", "producer_config"):
            object.__setattr__(self, name, KafkaSettings(getattr(self, name)))
