"""Outgoing Kafka records and the one builder for each kind we write outside events.

``OutRecord`` is what turns and the worker hand the group committer. The builders here
are the only places that write the ``content-type`` header, dead-letter headers,
tombstones and control records, so every topic gets them in one shape.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import NoReturn

from pyrula_stream.errors import ErrorCode, PayloadTooLarge
from pyrula_stream.redaction import REDACTED, is_credential_header
from pyrula_stream.wire import caps, guard, serde
from pyrula_stream.wire.fitting import ORIGINAL_PREFIX, fit_letter
from pyrula_stream.wire.payload_refs import Offload, StoredValue


@dataclass(slots=True)
class OutRecord:
    topic: str
    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]]
    partition: int | None = None
    compacted: bool = False
    """Only the latest value of its key matters (a journal entry): a later record of the
    same key in the same commit replaces it, and it is not sent."""
    unsent_key: bool = False
    """A tombstone of a key no earlier commit carried: with that key's write in the same
    commit, neither is sent (as Kafka Streams' record cache does)."""
    deferred: Callable[[], bytes] | None = None
    """Builds ``value`` when the record is sent (``materialize``): most journal entries
    are replaced or cancelled within their commit, and then never encoded."""
    objects: tuple[StoredValue, ...] = ()
    """Values this record carries by reference: the committer puts them in their object
    store before the transaction that sends the record commits (only if it is sent)."""

    @property
    def is_tombstone(self) -> bool:
        return self.value is None and self.deferred is None

    def materialize(self) -> None:
        """Encode a deferred value now (the committer, for the records it sends)."""
        if self.deferred is not None:
            self.value = self.deferred()
            self.deferred = None

    @property
    def size(self) -> int:
        size = len(self.key) + len(self.value or b"")
        for k, v in self.headers:
            size += len(k) + len(v)
        return size


class SharedHeaders(list[tuple[str, bytes]]):
    """One header list that many records hold (``wire_record``'s, per content type): a
    list per record was the most common object alive between two commits. Changing it
    would change every record that holds it, so it refuses; build a new list instead
    (``record.headers = record.headers + more``)."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("shared record headers: assign a new list instead of changing it")

    append = extend = insert = remove = pop = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse


@cache
def _shared_headers(ctype: tuple[str, bytes]) -> SharedHeaders:
    return SharedHeaders([ctype])


def shared_headers(name: str, value: str) -> SharedHeaders:
    """The one header list holding just ``name: value`` (a content type), as
    ``wire_record`` gives it: for a writer that builds its ``OutRecord`` itself."""
    return _shared_headers((name, value.encode()))


@cache
def content_type_header(record: str, fmt: serde.WireFormat = "avro") -> tuple[str, bytes]:
    """The header naming the schema (``record``) that decodes a value, or JSON (built once
    per kind: every record carries one)."""
    return (serde.CONTENT_TYPE_HEADER, serde.content_type(record, fmt).encode())


JSON_CONTENT_TYPE = (serde.CONTENT_TYPE_HEADER, b"application/json")

DLQ_REASON_HEADER = "pyrula.dlq.reason"
DLQ_CODE_HEADER = "pyrula.dlq.code"
DLQ_WORKER_HEADER = "pyrula.dlq.worker"
DLQ_SOURCE_HEADER = "pyrula.dlq.source"
"""A dead letter's headers: why, its ``ErrorCode``, who wrote it, ``topic[partition]@offset``."""


def request_headers(request: serde.TurnRequest) -> list[tuple[str, bytes]]:
    """The headers a turn request's record carries beside its Avro body: its content type,
    its lineage (a sub-agent call), correlation id and reply headers. A copy of the request
    with these (a quarantined turn's dead letter) runs as the same call when redriven."""
    headers = [content_type_header("turn_request")]
    if request.lineage is not None:
        headers += request.lineage.headers()
    if request.correlation_id is not None:
        headers.append((serde.CORRELATION_HEADER, request.correlation_id.encode()))
    headers += [
        (f"{serde.REPLY_HEADER_PREFIX}{name}", value.encode())
        for name, value in request.reply_headers
    ]
    return headers


def wire_record(
    topic: str,
    key: bytes,
    value: bytes | None,
    record: str,
    *,
    partition: int | None = None,
    max_bytes: int | None = None,
    fmt: serde.WireFormat = "avro",
    headers: Sequence[tuple[str, bytes]] = (),
    content_type: str | None = None,
) -> OutRecord:
    """A record of one of our schemas; ``PayloadTooLarge`` past ``max_bytes``, before any
    retry can loop on a size the broker will always refuse. ``content_type`` overrides the
    header ``fmt`` implies (a registry codec's framing)."""
    ctype = (
        content_type_header(record, fmt)
        if content_type is None
        else (serde.CONTENT_TYPE_HEADER, content_type.encode())
    )
    rec = OutRecord(
        topic, key, value, [ctype, *headers] if headers else _shared_headers(ctype), partition
    )
    if max_bytes is not None and _size(key, value, ctype, headers) > max_bytes:
        raise PayloadTooLarge(
            f"a record for {topic} would be {rec.size} bytes, over the {max_bytes}-byte "
            "limit (max_record_bytes / the broker's message.max.bytes); give the worker "
            "an object store (PYRULA_OBJECT_STORE, --object-store or "
            "WorkerOptions(object_store=...)) so large values travel by reference "
            "(docs/large-payloads.md), or shrink the value"
        )
    return rec


def _size(
    key: bytes, value: bytes | None, ctype: tuple[str, bytes], headers: Sequence[tuple[str, bytes]]
) -> int:
    """``OutRecord.size`` before the record is built: every record's check, on every step."""
    size = len(key) + (len(value) if value is not None else 0) + len(ctype[0]) + len(ctype[1])
    for k, v in headers:
        size += len(k) + len(v)
    return size


def tombstone(
    topic: str,
    key: str,
    partition: int | None = None,
    *,
    record: str = "journal_entry",
    unsent_key: bool = False,
) -> OutRecord:
    """Deletes ``key`` from a compacted topic holding ``record`` values."""
    rec = wire_record(topic, key.encode(), None, record, partition=partition)
    rec.compacted = True
    rec.unsent_key = unsent_key
    return rec


def latest_only(records: list[OutRecord]) -> list[int]:
    """The indices of ``records`` worth sending in one commit: of the compacted records of
    one key, only the last; and none when that last is a tombstone of a key only this
    commit writes. Other records are all kept, in order."""
    keep: list[int] = []
    last: dict[tuple[str, int | None, bytes], int] = {}
    written: set[tuple[str, int | None, bytes]] = set()
    for i in range(len(records) - 1, -1, -1):
        rec = records[i]
        if not rec.compacted:
            keep.append(i)
            continue
        k = (rec.topic, rec.partition, rec.key)
        if k in last:
            written.add(k)
            continue
        last[k] = i
        keep.append(i)
    keep.reverse()
    return [
        i
        for i in keep
        if not (
            records[i].unsent_key
            and records[i].is_tombstone
            and (records[i].topic, records[i].partition, records[i].key) in written
        )
    ]


def result_records(
    topics: Sequence[str],
    request: serde.TurnRequest,
    result: serde.TurnResult,
    *,
    fmt: serde.WireFormat = "avro",
    max_bytes: int | None = None,
    offload: Offload | None = None,
    version: str | None = None,
) -> list[OutRecord]:
    """A turn's result for each topic: keyed as its request was, the request's
    correlation id and reply headers echoed as headers, and the agent's ``version`` that
    ran it (``pyrula.agent-version``: an evaluator scores that version, the variant); a
    result past ``offload``'s threshold is stored by reference."""
    headers = [(name, value.encode()) for name, value in request.reply_headers]
    if request.correlation_id is not None:
        headers.append((serde.CORRELATION_HEADER, request.correlation_id.encode()))
    if version is not None:
        headers.append((serde.AGENT_VERSION_HEADER, version.encode()))
    stored: list[StoredValue] = []
    if offload is not None and result.result is not None:
        smaller, stored = offload.apply(result.result, f"the result of turn {result.turn_id}")
        if stored:
            result = replace(result, result=smaller)
    value = serde.encode("turn_result", result, fmt)
    key = request.result_key.encode()
    records = [
        wire_record(t, key, value, "turn_result", max_bytes=max_bytes, fmt=fmt, headers=headers)
        for t in topics
    ]
    if stored and records:
        records[0].objects = tuple(stored)
    return records


_REDACTED = REDACTED.encode()


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """Where a consumed record came from and what it held: what a dead letter copies."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]

    @property
    def source(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


def dead_letter(
    dlq_topic: str,
    reason: str,
    code: ErrorCode,
    *,
    worker: str,
    key: bytes,
    value: bytes | None,
    headers: list[tuple[str, bytes]],
    max_bytes: int,
    source: str | None = None,
) -> OutRecord:
    """A record we could not process: its bytes, with the reason in ``pyrula.dlq.*`` headers
    and its own headers kept as ``pyrula.original.*`` (a credential's value redacted), cut
    to ``max_bytes`` (the producer's room for one record, ``fitting.record_room``) with what
    was cut said in ``pyrula.dlq.trimmed``: a letter the producer refuses would leave its
    input unread."""
    out = [
        (DLQ_REASON_HEADER, reason.encode()),
        (DLQ_CODE_HEADER, str(code).encode()),
        (DLQ_WORKER_HEADER, worker.encode()),
    ]
    if source is not None:
        out.append((DLQ_SOURCE_HEADER, source.encode()))
    original = [
        (f"{ORIGINAL_PREFIX}{k}", _REDACTED if is_credential_header(k) else v or b"")
        for k, v in headers
    ]
    key, value, fitted = fit_letter(key, value, out, original, max_bytes)
    return OutRecord(dlq_topic, key, value, fitted)


def dead_letter_source(
    dlq_topic: str,
    record: SourceRecord,
    reason: str,
    code: ErrorCode,
    *,
    worker: str,
    max_bytes: int,
) -> OutRecord:
    """A consumed record that could not be read, dead-lettered as received."""
    return dead_letter(
        dlq_topic,
        reason,
        code,
        worker=worker,
        key=record.key or b"",
        value=record.value,
        headers=record.headers,
        max_bytes=max_bytes,
        source=record.source,
    )


def undeliverable_letter(
    dlq_topic: str, record: OutRecord, reason: str, *, worker: str, max_bytes: int
) -> OutRecord | None:
    """The dead letter of a record the broker keeps refusing: its key and headers, not its
    value (often why it was refused); ``None`` for a record that is a dead letter itself."""
    if record.topic == dlq_topic:
        return None
    return dead_letter(
        dlq_topic,
        reason,
        ErrorCode.RECORD_UNDELIVERABLE,
        worker=worker,
        key=record.key,
        value=None,
        headers=record.headers,
        max_bytes=max_bytes,
        source=f"{record.topic}/{record.partition}",
    )


CONTROL_ACTIONS = ("cancel", "terminate")


@dataclass(frozen=True, slots=True)
class ControlRequest:
    """A cancel or terminate request on ``<agent>.control`` (JSON, keyed by turn id)."""

    turn_id: str
    action: str
    reason: str | None = None
    ts_ms: int = 0

    def record(self, control_topic: str) -> OutRecord:
        body = {
            "turn_id": self.turn_id,
            "action": self.action,
            "reason": self.reason,
            "ts_ms": self.ts_ms or int(time.time() * 1000),
        }
        return OutRecord(
            control_topic, self.turn_id.encode(), json.dumps(body).encode(), [JSON_CONTENT_TYPE]
        )

    @classmethod
    def parse(cls, value: bytes | None) -> ControlRequest | None:
        """The request a control record holds, or ``None`` when it is unreadable (or its
        turn id is past ``MAX_TURN_ID_CHARS``): whatever the bytes, nothing raises."""
        try:
            body = guard.loads_object(value, "control record")
            turn_id, action = body.get("turn_id"), body.get("action")
            if not isinstance(turn_id, str) or not turn_id or action not in CONTROL_ACTIONS:
                return None
            caps.check_text(turn_id, caps.MAX_TURN_ID_CHARS, "turn_id", "MAX_TURN_ID_CHARS")
            reason = body.get("reason")
            reason = (reason if isinstance(reason, str) and reason else action)[:500]
            ts_ms = guard.int_field(body, "ts_ms", "control record")
        except Exception:  # any flaw of outside bytes: the reader skips and counts it
            return None
        return cls(turn_id, action, reason, ts_ms)
