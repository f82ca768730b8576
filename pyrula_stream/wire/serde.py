"""Avro encoding of the wire records in ``schemas/`` (the contract with other consumers).

Without a Schema Registry a value is the schemaless Avro body of its schema, and a header
``content-type: application/vnd.pyrula.<record>.v<N>+avro`` says which schema decodes it,
so any consumer can read our topics with fastavro and the ``.avsc`` file. Turn requests
may also be sent as JSON (``content-type: application/json``) by producers without Avro,
or as a bare params object (``application/vnd.pyrula.params+json``); events and results
are written as JSON instead of Avro for an agent bound with ``event_format="json"``.
With a Schema Registry (``ValueCodec`` from ``pyrula_stream.kafka.schema_registry``) an
Avro value is in the Confluent wire format and the header ends in ``;framing=confluent``;
readers given a codec accept both, so a topic can migrate.

The input ``fingerprint`` is wire too: every journal written so far depends on its
bytes. The journal's keys are in ``journal_keys``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from importlib import resources
from typing import Any, Literal, Protocol

import fastavro
import orjson

from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.wire import caps, journal_keys
from pyrula_stream.wire import guard as wire_guard
from pyrula_stream.wire.avro_writer import avro_long, avro_string, record_writer
from pyrula_stream.wire.guard import DEFAULT_LIMITS, DecodeLimits
from pyrula_stream.wire.lineage import Lineage

SCHEMA_VERSION = 1
CONTENT_TYPE_HEADER = "content-type"
JSON_CONTENT_TYPE = "application/json"
PARAMS_CONTENT_TYPE = "application/vnd.pyrula.params+json"
"""A turn request whose whole value is the params object: agent and turn id come from
the record's topic, partition and offset."""
CORRELATION_HEADER = "pyrula.correlation-id"
REPLY_HEADER_PREFIX = "pyrula.reply."
"""Request headers echoed on the turn's result record (without this prefix)."""
AGENT_VERSION_HEADER = "pyrula.agent-version"
"""On a result record: the agent's version that ran the turn (absent without one)."""

WireFormat = Literal["avro", "json"]


@dataclass(frozen=True, slots=True)
class TurnRequest:
    turn_id: str
    agent: str
    params: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    thread_id: str | None = None
    idempotency_key: str | None = None
    submitted_ms: int = 0
    # From the request record's headers and key, not its Avro body (see ``TurnResult``):
    lineage: Lineage | None = None
    """A sub-agent's place in its call tree."""
    correlation_id: str | None = None
    reply_headers: tuple[tuple[str, str], ...] = ()
    record_key: str | None = None
    tenant: str | None = None
    """Who the turn belongs to (``@kafka_agent(tenant=...)``), set when it is read."""

    @property
    def key(self) -> str:
        """Records of one thread share a key, so the thread's turns stay in order."""
        return self.thread_id or self.turn_id

    @property
    def result_key(self) -> str:
        """The result is keyed as the request was, so a join stays co-partitioned."""
        return self.record_key or self.key


@dataclass(frozen=True, slots=True)
class TurnResult:
    """A turn's outcome on ``<agent>.results`` (``schemas/turn_result.avsc``)."""

    turn_id: str
    agent: str
    status: str
    result: Any = None
    error_code: str | None = None
    error_message: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    cost_usd: float = 0.0
    attempt: int = 1
    started_ms: int = 0
    finished_ms: int = 0
    duration_ms: int = 0
    thread_id: str | None = None
    correlation_id: str | None = None
    tenant: str | None = None


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
        return journal_keys.journal_key(self.turn_id, self.step, self.kind)


REGISTRY_FRAMING = ";framing=confluent"


@cache
def content_type(record: str, fmt: WireFormat = "avro") -> str:
    if fmt == "json":
        return JSON_CONTENT_TYPE
    return f"application/vnd.pyrula.{record}.v{SCHEMA_VERSION}+avro"


@cache
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


ADDED_FIELDS: dict[str, tuple[str, ...]] = {"turn_result": ("tenant",)}
"""Fields appended to a schema after its first release, oldest first. Schemaless Avro
carries no writer schema, so a record written before a field existed is read with the
schema as it was then (the reader's defaults fill the rest)."""


@cache
def older_writer_schemas(record: str) -> tuple[Any, ...]:
    """The record's earlier writer schemas, newest first (one per appended field)."""
    schema = json.loads(
        resources.files("pyrula_stream").joinpath(f"schemas/{record}.avsc").read_text()
    )
    out = []
    for name in reversed(ADDED_FIELDS.get(record, ())):
        schema = {**schema, "fields": [f for f in schema["fields"] if f["name"] != name]}
        out.append(fastavro.parse_schema(schema))
    return tuple(out)


_JSON_FIELDS = {
    "turn_request": ("params", "metadata"),
    "event": ("data",),
    "journal_entry": ("data",),
    "turn_history": ("data",),
    "turn_result": ("usage",),
}
_JSON_VALUE_FIELDS = {"turn_result": ("result",)}
"""Fields holding any JSON value (not only an object); ``null`` stays an Avro null."""


_FIELD_NAMES = {
    "turn_request": [
        "turn_id",
        "agent",
        "params",
        "metadata",
        "thread_id",
        "idempotency_key",
        "submitted_ms",
    ],
    "event": ["type", "turn_id", "agent", "seq", "ts_ms", "attempt", "data"],
    "journal_entry": [f.name for f in fields(JournalEntry)],
    "turn_result": [f.name for f in fields(TurnResult)],
    "turn_history": ["turn_id", "agent", "version", "ts_ms", "data"],
}


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str)
"""The fallback for what orjson refuses (integers past 64 bits)."""

_ORJSON_OPTIONS = (
    orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
)
"""Keys and values as ``json.dumps(default=str)`` writes them: non-string keys as strings,
dataclasses and datetimes through ``str``."""


def _dumps(value: Any) -> str:
    """Compact JSON of a value on the wire (never hashed: ``fingerprint`` has its own
    encoder, whose bytes must not change). orjson: several times faster than ``json``,
    and every event and journal entry is one of these."""
    try:
        return orjson.dumps(value, default=str, option=_ORJSON_OPTIONS).decode()
    except orjson.JSONEncodeError:
        return _ENCODER.encode(value)


def json_bytes(value: Any) -> bytes:
    """``json_text`` as UTF-8, without a round trip through ``str`` (an event's data)."""
    try:
        return orjson.dumps(value, default=str, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:
        return _ENCODER.encode(value).encode()


def json_text(value: Any) -> str:
    """A JSON-valued field's text as ``encode`` writes it (see ``encode_prepared``)."""
    return _dumps(value)


def avro_body(
    record: str, value: object, prepared: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The record as its Avro schema's fields (JSON-valued fields as JSON text, or as
    ``prepared`` gives it)."""
    # A shallow field dict: dataclasses.asdict deep-copies every nested dict first,
    # which the profiler showed as half the worker's time.
    body = {name: getattr(value, name) for name in _FIELD_NAMES[record]}
    for name in _JSON_FIELDS[record]:
        body[name] = prepared[name] if prepared and name in prepared else _dumps(body[name])
    for name in _JSON_VALUE_FIELDS.get(record, ()):
        body[name] = None if body[name] is None else _dumps(body[name])
    return body


def encode(record: str, value: object, fmt: WireFormat = "avro") -> bytes:
    """The schemaless Avro body of ``value`` (a dataclass with the schema's fields), or
    with ``fmt="json"`` one JSON object with the same fields (JSON fields nested)."""
    if fmt == "json":
        # A shallow field dict: dataclasses.asdict deep-copies every nested dict first.
        return _dumps({name: getattr(value, name) for name in _FIELD_NAMES[record]}).encode()
    return _write_avro(record, avro_body(record, value))


def encode_prepared(record: str, value: object, prepared: Mapping[str, str]) -> bytes:
    """``encode`` (Avro) with some JSON-valued fields already as text: taken when the
    value was built, so a dict changed after that cannot change the bytes."""
    return _write_avro(record, avro_body(record, value, prepared))


def encode_journal_entry(entry: JournalEntry, data: bytes) -> bytes:
    """``encode_prepared("journal_entry", entry, {"data": ...})`` with the data's JSON
    already as UTF-8 (``json_bytes``, taken when the entry was written): written field by
    field in ``schemas/journal_entry.avsc``'s order, no field dict and no second encode
    of the data, for every journal record a commit sends."""
    return b"".join(
        (
            avro_string(entry.turn_id),
            avro_long(entry.step),
            avro_string(entry.kind),
            avro_string(entry.name),
            avro_string(entry.input_hash),
            avro_long(len(data)),
            data,
            avro_long(entry.attempt),
            avro_long(entry.ts_ms),
        )
    )


@cache
def _hand_writer(record: str) -> Callable[[Mapping[str, Any]], bytes] | None:
    """The record's hand-built Avro writer (``None``: a schema it cannot write)."""
    try:
        return record_writer(parsed_schema(record))
    except ValueError:
        return None


def _write_avro(record: str, body: Mapping[str, Any]) -> bytes:
    """Schemaless Avro of ``body``: by hand (the bytes fastavro writes, in a third of the
    time, see ``avro_writer``), else with fastavro."""
    writer = _hand_writer(record)
    if writer is not None:
        return writer(body)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed_schema(record), body)
    return buf.getvalue()


def _decode_body(
    record: str,
    payload: bytes,
    headers: Mapping[str, str],
    codec: ValueCodec | None = None,
    limits: DecodeLimits = DEFAULT_LIMITS,
) -> dict[str, Any]:
    if not isinstance(payload, bytes | bytearray):
        raise MalformedRecordError(f"{record} value is {type(payload).__name__}, not bytes")
    wire_guard.check_size(payload, f"{record} value", limits)
    ctype = headers.get(CONTENT_TYPE_HEADER, content_type(record))
    if ctype == registry_content_type(record):
        with wire_guard.guarded(f"{record} value (registry framed)"):
            return (codec or SCHEMALESS).decode(record, payload)
    if ctype == JSON_CONTENT_TYPE:
        body = wire_guard.loads(payload, f"{record} value", limits)
        if not isinstance(body, dict):
            raise MalformedRecordError("a JSON value must be an object")
        for name in _JSON_FIELDS[record]:
            if isinstance(body.get(name), dict):
                body[name] = _dumps(body[name])
        for name in _JSON_VALUE_FIELDS.get(record, ()):
            if body.get(name) is not None:
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
        decoded = _decode_older(record, payload)
        if decoded is None:
            raise MalformedRecordError(
                f"value does not decode as {record}.avsc: {type(exc).__name__}: {exc}"[:500]
            ) from None
    if not isinstance(decoded, dict):
        raise MalformedRecordError(f"value of {record} is not a record")
    return decoded


def _decode_older(record: str, payload: bytes) -> Any:
    """The value read as written before a field was appended (``ADDED_FIELDS``), or
    ``None`` when no earlier schema reads it either."""
    for writer in older_writer_schemas(record):
        try:
            return fastavro.schemaless_reader(io.BytesIO(payload), writer, parsed_schema(record))
        except Exception:
            continue
    return None


def _load_json_fields(
    record: str, body: dict[str, Any], limits: DecodeLimits = DEFAULT_LIMITS
) -> dict[str, Any]:
    for name in _JSON_FIELDS[record]:
        raw = body.get(name, "{}")
        if raw == "{}":  # most requests' metadata: no parse
            body[name] = {}
        elif isinstance(raw, str):
            body[name] = wire_guard.loads(raw, f"field {name!r}", limits)
        if not isinstance(body[name], dict):
            raise MalformedRecordError(f"field {name!r} must be a JSON object")
    return body


def decode_turn_request(
    payload: bytes | None,
    headers: Mapping[str, str],
    codec: ValueCodec | None = None,
    *,
    default_turn_id: str | None = None,
    default_agent: str | None = None,
    limits: DecodeLimits = DEFAULT_LIMITS,
) -> TurnRequest:
    """A turn request; ``turn_id`` and ``agent`` may be left out when defaults are given
    (the consumer derives them from the record's topic, partition and offset). ``codec``
    reads registry-framed values (``None``: only schemaless Avro and JSON). Whatever the
    bytes hold, the only error is ``MalformedRecordError``."""
    with wire_guard.guarded("turn request"):
        return _turn_request(payload, headers, codec, default_turn_id, default_agent, limits)


def _turn_request(
    payload: bytes | None,
    headers: Mapping[str, str],
    codec: ValueCodec | None,
    default_turn_id: str | None,
    default_agent: str | None,
    limits: DecodeLimits,
) -> TurnRequest:
    if not payload:
        raise MalformedRecordError("turn request has an empty value")
    if headers.get(CONTENT_TYPE_HEADER) == PARAMS_CONTENT_TYPE:
        wire_guard.check_size(payload, "a bare params value", limits)
        body: dict[str, Any] = {"params": _json_object(payload, "a bare params value", limits)}
    else:
        body = _load_json_fields(
            "turn_request", _decode_body("turn_request", payload, headers, codec, limits), limits
        )
    reply = tuple(
        (k[len(REPLY_HEADER_PREFIX) :], v)
        for k, v in headers.items()
        if k.startswith(REPLY_HEADER_PREFIX) and len(k) > len(REPLY_HEADER_PREFIX)
    )
    what = "turn request"
    metadata = wire_guard.dict_field(body, "metadata", what)
    _check_caps(body)
    try:
        return TurnRequest(
            turn_id=_id_field(body, "turn_id", default_turn_id),
            agent=_id_field(body, "agent", default_agent),
            params=body["params"],
            metadata=metadata,
            thread_id=wire_guard.text_field(body, "thread_id", what) or None,
            idempotency_key=wire_guard.text_field(body, "idempotency_key", what) or None,
            submitted_ms=_ms_field(body.get("submitted_ms")),
            lineage=Lineage.from_headers(headers),
            correlation_id=headers.get(CORRELATION_HEADER)
            or _text_or_none(metadata.get("correlation_id")),
            reply_headers=reply,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedRecordError(f"turn request is missing or has a bad field: {exc}") from None


_CAPPED_FIELDS = (
    ("turn_id", caps.MAX_TURN_ID_CHARS, "MAX_TURN_ID_CHARS"),
    ("thread_id", caps.MAX_THREAD_ID_CHARS, "MAX_THREAD_ID_CHARS"),
    ("idempotency_key", caps.MAX_IDEMPOTENCY_KEY_CHARS, "MAX_IDEMPOTENCY_KEY_CHARS"),
)


def _check_caps(body: dict[str, Any]) -> None:
    """Refuse an id past its cap (``wire/caps.py``): each is a key of the partition's
    journal and of the worker's memory."""
    for name, cap, cap_name in _CAPPED_FIELDS:
        value = body.get(name)
        if isinstance(value, str):
            caps.check_text(value, cap, f"turn request: field {name!r}", cap_name)


def _id_field(body: dict[str, Any], name: str, default: str | None) -> str:
    """Text (or an integer); absent, null or "" take ``default``. ``[]``, ``{}`` or
    ``false`` are wrong types, not absent values."""
    value = body.get(name)
    if value is None or value == "":
        return _required(default, name)
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise MalformedRecordError(f"turn request: field {name!r} must be text")
    return str(value)


def _ms_field(value: Any) -> int:
    """Milliseconds: an integer, or its digits as text (older producers sent text)."""
    if value is None or value == "":
        return 0
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise MalformedRecordError("turn request: field 'submitted_ms' must be an integer")
    return int(value)


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _required(default: str | None, name: str) -> str:
    if default is None:
        raise KeyError(name)
    return default


def _json_object(
    payload: bytes, what: str, limits: DecodeLimits = DEFAULT_LIMITS
) -> dict[str, Any]:
    return wire_guard.loads_object(payload, what, limits)


def decode_turn_result_value(payload: bytes) -> TurnResult:
    """A results record without its headers (a stream processor's deserializer): JSON
    when it is a JSON object, else Avro. An Avro result starts with the length of
    ``turn_id`` as a zigzag varint, never the byte ``{`` (a negative length)."""
    if not isinstance(payload, bytes | bytearray):
        raise MalformedRecordError(f"result value is {type(payload).__name__}, not bytes")
    ctype = JSON_CONTENT_TYPE if payload[:1] == b"{" else content_type("turn_result")
    return decode_turn_result(payload, {CONTENT_TYPE_HEADER: ctype})


_RESULT_TEXT = ("turn_id", "agent", "status")
_RESULT_OPTIONAL_TEXT = ("error_code", "error_message", "thread_id", "correlation_id")
_RESULT_INTS = ("attempt", "started_ms", "finished_ms", "duration_ms")


def decode_turn_result(payload: bytes, headers: Mapping[str, str]) -> TurnResult:
    """A results record, Avro or JSON (its ``content-type`` header says which)."""
    with wire_guard.guarded("result record"):
        body = _load_json_fields("turn_result", _decode_body("turn_result", payload, headers))
        raw = body.get("result")
        body["result"] = None if raw is None else wire_guard.loads(raw, "field 'result'")
        what = "result record"
        for name in _RESULT_TEXT:
            if not isinstance(body.get(name), str):
                raise MalformedRecordError(f"{what}: field {name!r} must be text")
        for name in _RESULT_OPTIONAL_TEXT:
            wire_guard.text_field(body, name, what)
        for name in _RESULT_INTS:
            wire_guard.int_field(body, name, what)
        cost = body.get("cost_usd", 0.0)
        if isinstance(cost, bool) or not isinstance(cost, int | float):
            raise MalformedRecordError(f"{what}: field 'cost_usd' must be a number")
        try:
            return TurnResult(**body)
        except (TypeError, ValueError) as exc:
            raise MalformedRecordError(f"result record has a bad field: {exc}") from None


def decode_record(
    record: str,
    payload: bytes,
    headers: Mapping[str, str],
    codec: ValueCodec | None = None,
    limits: DecodeLimits = DEFAULT_LIMITS,
) -> dict[str, Any]:
    """The fields of one record of ``schemas/<record>.avsc``, JSON fields parsed;
    ``codec`` reads registry-framed values."""
    with wire_guard.guarded(record):
        return _load_json_fields(
            record, _decode_body(record, payload, headers, codec, limits), limits
        )


JOURNAL_LIMITS = DecodeLimits(max_depth=512)
"""Journal entries nest what a turn's params, model messages and tool results hold one
or two levels deeper, and a worker wrote them: a deeper cap (still far below the
parser's stack), so no step of ours reads back as unreadable and runs again."""


def decode_journal_entry(payload: bytes, headers: Mapping[str, str]) -> JournalEntry:
    """A journal record; any flaw is ``MalformedRecordError``."""
    body = decode_record("journal_entry", payload, headers, limits=JOURNAL_LIMITS)
    what = "journal entry"
    for name in ("turn_id", "kind"):
        if not isinstance(body.get(name), str):
            raise MalformedRecordError(f"{what}: field {name!r} must be text")
    for name in ("name", "input_hash"):
        wire_guard.text_field(body, name, what)
    if not isinstance(body.get("step"), int) or isinstance(body.get("step"), bool):
        raise MalformedRecordError(f"{what}: field 'step' must be an integer")
    for name in ("attempt", "ts_ms"):
        wire_guard.int_field(body, name, what)
    with wire_guard.guarded(what):
        return JournalEntry(**body)


RawHeaders = list[tuple[str, str | bytes | None]] | dict[str, str | bytes | None] | None
"""Headers as the Kafka client returns them."""


def headers_dict(raw: RawHeaders) -> dict[str, str]:
    """Kafka headers as a dict of text (last value of a repeated header wins)."""
    items = raw.items() if isinstance(raw, dict) else (raw or [])
    return {
        k: v.decode("utf-8", "replace") if isinstance(v, bytes) else (v or "") for k, v in items
    }
