"""Avro encoding of the wire records in ``schemas/`` (the contract with other consumers).

Without a Schema Registry a value is the schemaless Avro body of its schema, and a header
``content-type: application/vnd.pyrula.<record>.v<N>+avro`` says which schema decodes it,
so any consumer can read our topics with fastavro and the ``.avsc`` file. Turn requests
may also be sent as JSON (``content-type: application/json``) by producers without Avro.
With a Schema Registry (``ValueCodec`` from ``pyrula_stream.kafka.schema_registry``) the
value is in the Confluent wire format and the header ends in ``;framing=confluent``;
readers given a codec accept both, so a topic can migrate.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field, fields
from enum import StrEnum
from functools import cache
from importlib import resources
from typing import Any, Protocol

import fastavro

from pyrula_stream.errors import MalformedRecordError

SCHEMA_VERSION = 1
CONTENT_TYPE_HEADER = "content-type"


class EventType(StrEnum):
    RUN_START = "run:start"
    LLM_DELTA = "llm:delta"
    LLM_COMPLETE = "llm:complete"
    TOOL_START = "tool:start"
    TOOL_RESULT = "tool:result"
    STATUS = "status"
    RUN_COMPLETE = "run:complete"
    RUN_ERROR = "run:error"

    @property
    def is_terminal(self) -> bool:
        return self in (EventType.RUN_COMPLETE, EventType.RUN_ERROR)


@dataclass(frozen=True, slots=True)
class TurnRequest:
    turn_id: str
    agent: str
    params: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    thread_id: str | None = None
    idempotency_key: str | None = None
    submitted_ms: int = 0

    @property
    def key(self) -> str:
        """Records of one thread share a key, so the thread's turns stay in order."""
        return self.thread_id or self.turn_id


@dataclass(frozen=True, slots=True)
class Event:
    type: str
    turn_id: str
    agent: str
    seq: int
    ts_ms: int
    attempt: int = 1
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def is_terminal(self) -> bool:
        return self.type in (EventType.RUN_COMPLETE, EventType.RUN_ERROR)


@dataclass(frozen=True, slots=True)
class JournalEntry:
    turn_id: str
    step: int
    kind: str
    name: str = ""
    input_hash: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1
    ts_ms: int = 0

    @property
    def key(self) -> str:
        return journal_key(self.turn_id, self.step, self.kind)


def journal_key(turn_id: str, step: int, kind: str = "") -> str:
    """``turn_id/<step>`` for steps, ``turn_id/progress`` and ``turn_id/terminal`` otherwise."""
    if step >= 0:
        return f"{turn_id}/{step}"
    return f"{turn_id}/{kind}"


REGISTRY_FRAMING = ";framing=confluent"


def content_type(record: str) -> str:
    return f"application/vnd.pyrula.{record}.v{SCHEMA_VERSION}+avro"


def registry_content_type(record: str) -> str:
    """The header of a value in the Confluent wire format (magic 0, schema id, Avro body)."""
    return content_type(record) + REGISTRY_FRAMING


class ValueCodec(Protocol):
    """How values are framed: schemaless Avro (``SCHEMALESS``) or through a registry."""

    def encode(self, record: str, value: Any, topic: str) -> tuple[bytes, str]:
        """``(value bytes, content-type)`` of one record for ``topic``."""
        ...

    def decode(self, record: str, payload: bytes) -> dict[str, Any]:
        """The Avro body of a registry-framed value, resolved to our schema."""
        ...

    def close(self) -> None:
        """Release connections (a registry client's)."""
        ...


class SchemalessAvro:
    """Schemaless Avro bodies; the content-type header names the schema."""

    def encode(self, record: str, value: Any, topic: str) -> tuple[bytes, str]:
        return encode(record, value), content_type(record)

    def decode(self, record: str, payload: bytes) -> dict[str, Any]:
        raise MalformedRecordError(
            f"this {record} is in the Schema Registry wire format; reading it needs a "
            "registry: set schema.registry.url in kafka_config"
        )

    def close(self) -> None:
        pass


SCHEMALESS = SchemalessAvro()


@cache
def parsed_schema(record: str) -> Any:
    """The parsed ``schemas/<record>.avsc``."""
    text = resources.files("pyrula_stream").joinpath(f"schemas/{record}.avsc").read_text()
    return fastavro.parse_schema(json.loads(text))


_JSON_FIELDS = {
    "turn_request": ("params", "metadata"),
    "event": ("data",),
    "journal_entry": ("data",),
}


_FIELD_NAMES = {
    "turn_request": [f.name for f in fields(TurnRequest)],
    "event": [f.name for f in fields(Event)],
    "journal_entry": [f.name for f in fields(JournalEntry)],
}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def avro_body(record: str, value: TurnRequest | Event | JournalEntry) -> dict[str, Any]:
    """The record as its Avro schema's fields (JSON-valued fields as JSON text)."""
    # A shallow field dict: dataclasses.asdict deep-copies every nested dict first,
    # which the profiler showed as half the worker's time.
    body = {name: getattr(value, name) for name in _FIELD_NAMES[record]}
    for name in _JSON_FIELDS[record]:
        body[name] = _dumps(body[name])
    return body


def encode(record: str, value: TurnRequest | Event | JournalEntry) -> bytes:
    body = avro_body(record, value)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed_schema(record), body)
    return buf.getvalue()


def _decode_body(
    record: str, payload: bytes, headers: dict[str, str], codec: ValueCodec | None
) -> dict[str, Any]:
    ctype = headers.get(CONTENT_TYPE_HEADER, content_type(record))
    if ctype == registry_content_type(record):
        return (codec or SCHEMALESS).decode(record, payload)
    if ctype == "application/json":
        try:
            body = json.loads(payload)
        except ValueError as exc:
            raise MalformedRecordError(f"value is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise MalformedRecordError("a JSON value must be an object")
        for name in _JSON_FIELDS[record]:
            if isinstance(body.get(name), dict):
                body[name] = _dumps(body[name])
        return body
    if ctype != content_type(record):
        raise MalformedRecordError(
            f"unsupported content-type {ctype!r}; expected {content_type(record)!r}, "
            f"{registry_content_type(record)!r} or 'application/json'"
        )
    try:
        decoded = fastavro.schemaless_reader(io.BytesIO(payload), parsed_schema(record), None)
    except Exception as exc:  # fastavro raises many types on corrupt input
        raise MalformedRecordError(
            f"value does not decode as {record}.avsc: {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(decoded, dict):
        raise MalformedRecordError(f"value of {record} is not a record")
    return decoded


def _load_json_fields(record: str, body: dict[str, Any]) -> dict[str, Any]:
    for name in _JSON_FIELDS[record]:
        raw = body.get(name, "{}")
        try:
            body[name] = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError as exc:
            raise MalformedRecordError(f"field {name!r} is not valid JSON: {exc}") from None
        if not isinstance(body[name], dict):
            raise MalformedRecordError(f"field {name!r} must be a JSON object")
    return body


def decode_turn_request(
    payload: bytes | None, headers: dict[str, str], codec: ValueCodec | None = None
) -> TurnRequest:
    if not payload:
        raise MalformedRecordError("turn request has an empty value")
    body = _load_json_fields("turn_request", _decode_body("turn_request", payload, headers, codec))
    try:
        return TurnRequest(
            turn_id=str(body["turn_id"]),
            agent=str(body["agent"]),
            params=body["params"],
            metadata=body.get("metadata") or {},
            thread_id=body.get("thread_id"),
            idempotency_key=body.get("idempotency_key"),
            submitted_ms=int(body.get("submitted_ms") or 0),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedRecordError(f"turn request is missing or has a bad field: {exc}") from None


def decode_event(payload: bytes, headers: dict[str, str], codec: ValueCodec | None = None) -> Event:
    body = _load_json_fields("event", _decode_body("event", payload, headers, codec))
    return Event(**body)


def decode_journal_entry(payload: bytes, headers: dict[str, str]) -> JournalEntry:
    body = _load_json_fields("journal_entry", _decode_body("journal_entry", payload, headers, None))
    return JournalEntry(**body)


RawHeaders = list[tuple[str, str | bytes | None]] | dict[str, str | bytes | None] | None
"""Headers as the Kafka client returns them."""


def headers_dict(raw: RawHeaders) -> dict[str, str]:
    """Kafka headers as a dict of text (last value of a repeated header wins)."""
    items = raw.items() if isinstance(raw, dict) else (raw or [])
    return {
        k: v.decode("utf-8", "replace") if isinstance(v, bytes) else (v or "") for k, v in items
    }
