"""Where a turn stands, from the records on its key's partition.

A turn's request, journal records and result share that partition (see
``pyrula_stream.kafka.turn_lookup``), so its status is read in the order that answers
soonest: the journal partition (running, or ended while its terminal record is kept), the
results partition (ended, once the journal let go of it), then the turns partition from
the workers' committed offset (queued: a request no worker has started).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.kafka.group import record_turn_id
from pyrula_stream.kafka.offsets import ConsumedRecord
from pyrula_stream.kafka.turn_lookup import TurnLookup
from pyrula_stream.wire import serde
from pyrula_stream.wire.journal_keys import PARK, PROGRESS, TERMINAL, parse_journal_key
from pyrula_stream.wire.serde import decode_journal_entry

TurnState = Literal["queued", "running", "deferred", "completed", "failed", "unknown"]


@dataclass(frozen=True)
class TurnStatus:
    """Where a turn stands.

    ``queued``: its request is on the turns topic past the workers' committed offset and
    no worker started it yet. ``running``: its ``attempt`` and ``last_step`` (e.g.
    ``llm``, ``tool:lookup_order``). ``completed`` / ``failed`` (with ``code``): ended;
    ``events`` is how many it published (0 once only its results record is left).
    ``deferred``: its tenant was over a quota before it started; it is parked until
    ``resume_at`` (epoch ms). ``unknown``: nothing of the turn is on its key's partition.
    ``tenant``: whose turn it is (agents with ``tenant=``), where the records say.
    """

    turn_id: str
    state: TurnState
    attempt: int = 0
    last_step: str | None = None
    code: str | None = None
    events: int = 0
    tenant: str | None = None
    resume_at: int | None = None


def read_turn_status(
    lookup: TurnLookup,
    agent: str,
    topics: AgentTopics,
    turn_id: str,
    key: str,
    *,
    workers_group: str,
    codec: serde.ValueCodec | None = None,
) -> TurnStatus | None:
    """The turn's status (blocking); ``None`` when the agent has no turns topic.

    ``key`` is the key its request was produced with; ``codec`` reads registry-framed
    results and requests."""
    partition = lookup.partition_of(topics.turns, key)
    if partition is None:
        return None
    journal = lookup.read(
        topics.journal, partition, lambda r: parse_journal_key(r.key)[0] == turn_id
    )
    found = journal_status(turn_id, journal)
    if found is not None:
        return found
    results_partition = lookup.partition_of(topics.results, key)
    if results_partition is not None:
        results = lookup.read(
            topics.results, results_partition, lambda r: r.key == key and bool(r.value)
        )
        found = result_status(turn_id, results, codec)
        if found is not None:
            return found
    committed = lookup.committed(workers_group, topics.turns, partition)

    def requested(record: ConsumedRecord) -> bool:
        return request_turn_id(agent, topics.turns, record, codec) == turn_id

    queued = lookup.read(topics.turns, partition, requested, start=committed)
    return TurnStatus(turn_id, "queued" if queued else "unknown")


def journal_status(turn_id: str, records: list[ConsumedRecord]) -> TurnStatus | None:
    """Ended or running, from the turn's journal records (``None``: it has none live)."""
    latest: dict[str, bytes | None] = {}
    ended: bytes | None = None  # a terminal record stays a fact once it is tombstoned
    for record in records:
        suffix = parse_journal_key(record.key)[1]
        latest[suffix] = record.value
        if suffix == TERMINAL and record.value is not None:
            ended = record.value
    if ended is not None:
        terminal = decode_journal_entry(ended, {})
        failed = terminal.data.get("status") == "failed"
        return TurnStatus(
            turn_id,
            "failed" if failed else "completed",
            attempt=terminal.attempt,
            code=terminal.data.get("code"),
            events=int(terminal.data.get("events") or 0),
        )
    live = {k: decode_journal_entry(v, {}) for k, v in latest.items() if v is not None}
    steps = sorted(((int(k), e) for k, e in live.items() if k.isdigit()), key=lambda s: s[0])
    progress = live.get(PROGRESS)
    park = live.get(PARK)
    if not steps and park is not None:  # parked before its start: deferred by a quota
        request = park.data.get("request") or {}
        wake = park.data.get("wake_at_ms")
        return TurnStatus(
            turn_id,
            "deferred",
            attempt=park.attempt,
            events=int(progress.data.get("next_seq") or 0) if progress else 0,
            tenant=request.get("tenant"),
            resume_at=int(wake) if wake else None,
        )
    if not steps and progress is None:
        return None
    last = steps[-1][1] if steps else None
    attempts = [e.attempt for _, e in steps] + ([progress.attempt] if progress else [])
    start = steps[0][1] if steps and steps[0][1].kind == "start" else None
    return TurnStatus(
        turn_id,
        "running",
        attempt=max(attempts),
        last_step=None if last is None else _step_name(last.kind, last.name),
        events=int(progress.data.get("next_seq") or 0) if progress else 0,
        tenant=start.data.get("tenant") if start is not None else None,
    )


def result_status(
    turn_id: str, records: list[ConsumedRecord], codec: serde.ValueCodec | None = None
) -> TurnStatus | None:
    """The turn's outcome from its record on the results topic, if there is one."""
    for record in reversed(records):
        if record.value is None:
            continue
        try:
            body = serde.decode_record("turn_result", record.value, record.headers, codec)
        except MalformedRecordError:
            continue
        if body.get("turn_id") == turn_id:
            failed = body.get("status") == "failed"
            return TurnStatus(
                turn_id,
                "failed" if failed else "completed",
                attempt=int(body.get("attempt") or 0),
                code=body.get("error_code"),
                tenant=body.get("tenant"),
            )
    return None


def request_turn_id(
    agent: str, topic: str, record: ConsumedRecord, codec: serde.ValueCodec | None = None
) -> str | None:
    """The turn id a record of the turns topic asks for, as the worker reads it."""
    try:
        request = serde.decode_turn_request(
            record.value,
            record.headers,
            codec,
            default_turn_id=record_turn_id(topic, record.partition, record.offset),
            default_agent=agent,
        )
    except MalformedRecordError:
        return None
    return request.turn_id


def _step_name(kind: str, name: str) -> str:
    return kind if not name or name == kind else f"{kind}:{name}"
