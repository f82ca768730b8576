"""``--large``: a share of the turns carry values far past a Kafka record, stored by
reference in an object store (a local directory, or with ``--large-store s3`` a real S3
server on loopback), and workers are SIGKILLed between the object write and
the commit (the committer's kill point, ``PYRULA_CHAOS_KILL_AFTER_OBJECTS``).

Every third turn's request carries a 300 KB parameter of its own (stored by the
submitting client) and returns it in its result; the tool's result is 300 KB for about
half the turns (by turn id), whole in its ``tool:result`` event (no
``max_tool_result_bytes``). After the run the harness sweeps the store once with no grace
(every worker is stopped: no commit is in flight) and checks, from the records themselves:

- ``dangling_refs``: references in the turns, events, results and journal topics whose
  object is missing or whose bytes differ (after the sweep: it deleted nothing live);
- ``orphans_left``: objects no live record references, after that sweep;
- ``large_turns``: turns whose records carried at least one reference (at least 50);
- ``kills_after_objects``: workers that killed themselves at the kill point (at least 1).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.chaos.verify import Findings, Record
from pyrula_stream.errors import MalformedRecordError, PyrulaError
from pyrula_stream.objects.resolver import PayloadStores
from pyrula_stream.objects.sweep import live_digests, object_prefix, sweep
from pyrula_stream.objects.urls import open_store
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import decode_event
from pyrula_stream.wire.payload_refs import REF_MARK, PayloadRef, refs_in

LARGE_ENV = "PYRULA_CHAOS_LARGE"
"""``1``: the chaos agent's tool returns a large value for about half the turns."""
KILL_SHARE = 0.03
"""The share of the workers' object-storing commits after which a worker kills itself."""
VALUE_BYTES = 300_000
"""Each large value: past the 256 KiB offload threshold, so it travels by reference."""
LARGE_KEYS = ("dangling_refs", "orphans_left")
"""Gated: each must be 0 (and ``large_turns`` at least ``MIN_LARGE_TURNS``)."""
MIN_LARGE_TURNS = 50


def large_params(i: int) -> dict[str, Any]:
    """The extra parameters of submitted turn ``i`` (every third one carries a blob of its
    own: content addressing would store equal blobs once)."""
    return {"blob": f"{i}:" + "P" * VALUE_BYTES} if i % 3 == 0 else {}


def large_tool_result(turn: str) -> str | None:
    """The tool's large value for ``turn`` (about half the turns), else ``None``."""
    return "E" * VALUE_BYTES if hashlib.sha256(turn.encode()).digest()[0] % 2 == 0 else None


def _refs(topic_kind: str, record: Record) -> list[PayloadRef]:
    value = record.value
    if not value or REF_MARK not in value:
        return []
    try:
        if topic_kind == "events":
            return list(refs_in(decode_event(value, record.headers).data))
        if topic_kind == "results":
            return list(refs_in(serde.decode_turn_result(value, record.headers).result))
        if topic_kind == "journal":
            return list(refs_in(serde.decode_journal_entry(value, record.headers).data))
        return list(refs_in(serde.decode_turn_request(value, record.headers).params))
    except MalformedRecordError:
        return []


def check_large(
    topics: AgentTopics,
    read: Any,
    bootstrap: str,
    store_setting: str | Path,
    self_kills: int,
    f: Findings,
    *,
    kafka_config: Any = None,
) -> None:
    """Sweep once, then count dangling references, orphans and large turns."""
    store = open_store(str(store_setting))
    prefix, agent = topics.turns.split(".")[0], topics.turns.split(".")[1]
    names = [t for t in vars(topics).values() if isinstance(t, str)]
    report = sweep(
        store,
        object_prefix(prefix, agent),
        lambda: live_digests(bootstrap, prefix, kafka_config=kafka_config, topics=names)[0],
        grace_s=0,
    )
    f.counts["orphans_swept"] = len(report.deleted)
    payloads = PayloadStores([store])
    large: set[str] = set()
    live: set[str] = set()
    for kind, topic in (
        ("turns", topics.turns),
        ("events", topics.events),
        ("results", topics.results),
        ("journal", topics.journal),
    ):
        records: Iterable[Record] = read(topic)
        if kind == "journal":  # compacted: only each key's latest value is live
            records = {(r.partition, r.key): r for r in records}.values()
        for record in records:
            for ref in _refs(kind, record):
                live.add(ref.key)
                turn = record.key if kind != "journal" else record.key.split("/")[0]
                large.add(turn)
                try:
                    payloads.fetch(ref)
                except PyrulaError as exc:
                    f.add("dangling_refs", example=f"{topic} {record.key}: {exc}")
    f.zero("dangling_refs")
    left = [i.key for i in store.list() if i.key not in live]
    f.add("orphans_left", len(left), example=", ".join(left[:3]) or None)
    f.counts["large_turns"] = len(large)
    f.counts["stored_objects"] = sum(1 for _ in store.list())
    f.counts["kills_after_objects"] = self_kills
