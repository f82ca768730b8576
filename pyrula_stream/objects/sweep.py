"""The sweeper: deletes objects no live record references, once they are past a grace.

What is referenced is read from the records themselves, not kept anywhere else: every
topic under the agents' prefix is read to its end (``read_committed``), and each record
that holds a ``$pyrula_ref`` gives up every content hash in it. A compacted topic (the
journal, threads, memory, ...) counts only the latest value of each key: a step a
finished turn tombstoned no longer references anything, even before the log cleaner runs.
A delete-policy topic (events, results, requests, the DLQ) counts every retained record:
once retention drops the last record that names an object, the object goes too. Every
agent's topics are read, not only the swept agent's, so a value copied into another
agent's records (a sub-agent's result in its parent's journal) keeps its object.

An object younger than ``grace_s`` is never deleted: its commit may still be in flight
(a crash between the object write and the commit leaves exactly such an object, which a
later sweep removes). The store is listed BEFORE the topics are read, so an object old
enough to delete was written more than ``grace_s`` before the read began; with a grace
past the producer's ``transaction.timeout.ms`` its transaction has committed or aborted
by then, and the read sees its records if it committed. Each candidate's age is read
again just before it is deleted, so a rerun that wrote the same bytes again meanwhile
(content addressing: same key) keeps it. Running the sweep twice is harmless: a second
run finds nothing more to delete.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pyrula_stream.kafka.config import new_consumer, reader_config
from pyrula_stream.kafka.offsets import ConsumedRecord, read_to_end
from pyrula_stream.objects.store import ObjectInfo, ObjectStore
from pyrula_stream.wire.payload_refs import REF_MARK

DEFAULT_GRACE_S = 3600.0
"""An hour: far past any transaction's timeout (librdkafka's default is a minute)."""

COMPACTED_SUFFIXES = (
    ".journal",
    ".threads",
    ".dlq-redrives",
    ".tenants",
    ".tenant-usage",
    ".cache",
    ".memory",
)
"""Topics (``topics/*.yaml``) where only a key's latest value is live."""

_DIGEST = re.compile(rb"[0-9a-f]{64}")


def object_prefix(prefix: str, agent: str) -> str:
    """Where an agent's objects live in a store: one agent's sweep lists only these."""
    return f"{prefix}.{agent}/"


def digest_of(key: str) -> str:
    """The content hash a content-addressed key ends with."""
    return key.rsplit("/", 1)[-1]


def referenced_digests(records: Iterable[ConsumedRecord], *, compacted: bool) -> set[str]:
    """Every content hash named by a reference in ``records`` (of one topic). A hash
    anywhere in a record that holds a reference counts, whatever the record's framing
    (Avro, JSON, escaped inside a string): keeping too much is safe, too little is not."""
    latest: dict[tuple[int, str], bytes | None] = {}
    found: set[str] = set()
    for record in records:
        if compacted:
            latest[(record.partition, record.key)] = record.value
        elif record.value and REF_MARK in record.value:
            found.update(m.decode() for m in _DIGEST.findall(record.value))
    for value in latest.values():
        if value and REF_MARK in value:
            found.update(m.decode() for m in _DIGEST.findall(value))
    return found


@dataclass
class SweepReport:
    """What one sweep saw and did."""

    listed: int = 0
    """Objects under the agent's prefix when the sweep began."""
    referenced: int = 0
    young: int = 0
    """Unreferenced, but younger than the grace: left for a later sweep."""
    deleted: list[str] = field(default_factory=list)
    topics: int = 0
    records: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "listed": self.listed,
            "referenced": self.referenced,
            "young": self.young,
            "deleted": len(self.deleted),
            "topics": self.topics,
            "records": self.records,
        }


def live_digests(
    bootstrap_servers: str,
    prefix: str,
    *,
    kafka_config: Any = None,
    topics: Iterable[str] | None = None,
    timeout_s: float = 120.0,
) -> tuple[set[str], int, int]:
    """The content hashes live records reference, read from ``topics`` (default: every
    topic named ``<prefix>.*``; one that does not exist is skipped); with the topic and
    record counts read."""
    conf = reader_config(bootstrap_servers, kafka_config, client_id="pyrula-objects-sweep")
    consumer = new_consumer(conf)
    try:
        names = consumer.list_topics(timeout=30).topics
        if topics is None:
            topics = sorted(t for t in names if t.startswith(f"{prefix}."))
        else:  # an agent's topic it never needed (tenants of an agent without) is absent
            topics = [t for t in topics if t in names]
        digests: set[str] = set()
        count = records = 0
        for topic in topics:
            read = list(read_to_end(consumer, topic, timeout_s=timeout_s))
            compacted = topic.endswith(COMPACTED_SUFFIXES)
            digests |= referenced_digests(read, compacted=compacted)
            count += 1
            records += len(read)
        return digests, count, records
    finally:
        consumer.close()


def sweep(
    store: ObjectStore,
    key_prefix: str,
    live: Callable[[], set[str]],
    *,
    grace_s: float = DEFAULT_GRACE_S,
    dry_run: bool = False,
    now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    on_deleted: Callable[[int], None] | None = None,
) -> SweepReport:
    """Delete the objects under ``key_prefix`` that ``live()`` (read after the listing)
    does not name and that are older than ``grace_s``; ``on_deleted`` hears how many
    (``WorkerMetrics.swept_objects``: ``pyrula_objects_swept_total``)."""
    report = SweepReport()
    listed: list[ObjectInfo] = list(store.list(key_prefix))
    report.listed = len(listed)
    old_before = now_ms() - int(grace_s * 1000)
    referenced = live()
    for info in listed:
        if digest_of(info.key) in referenced:
            report.referenced += 1
        elif info.modified_ms > old_before or _rewritten(store, info, old_before):
            report.young += 1
        else:
            if not dry_run:
                store.delete(info.key)
            report.deleted.append(info.key)
    if on_deleted is not None and report.deleted and not dry_run:
        on_deleted(len(report.deleted))
    return report


def _rewritten(store: ObjectStore, info: ObjectInfo, old_before: int) -> bool:
    """Whether the object was written again since it was listed (a rerun's same bytes)."""
    for now in store.list(info.key):
        if now.key == info.key:
            return now.modified_ms > old_before
    return False
