"""The hand-written Avro encodings write the bytes fastavro writes for the same record."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyrula_stream.errors import PayloadTooLarge
from pyrula_stream.wire import serde
from pyrula_stream.wire.avro_writer import (
    EVENT_FIELDS,
    avro_long,
    avro_string,
    event_value,
    record_writer,
)
from pyrula_stream.wire.events import (
    Event,
    EventRouting,
    EventType,
    LlmComplete,
    LlmDelta,
    Payload,
    RunComplete,
    RunDeferred,
    RunError,
    RunInterrupted,
    RunStart,
    Status,
    SubagentResult,
    SubagentStart,
    ToolResult,
    ToolStart,
    TurnEvents,
    decode_event,
)
from pyrula_stream.wire.serde import JournalEntry

SCHEMAS = Path(serde.__file__).resolve().parents[1] / "schemas"
SCHEMA = SCHEMAS / "event.avsc"

LONGS = st.integers(min_value=-(2**63), max_value=2**63 - 1)
TEXT = st.text()  # any code point but lone surrogates, which no JSON text carries


def test_event_fields_are_the_schema_fields_in_order() -> None:
    fields = [f["name"] for f in json.loads(SCHEMA.read_text())["fields"]]
    assert tuple(fields) == EVENT_FIELDS


@settings(max_examples=300)
@given(
    type_=st.sampled_from(list(EventType)),
    turn_id=TEXT,
    agent=TEXT,
    seq=LONGS,
    ts_ms=LONGS,
    attempt=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    data=st.dictionaries(TEXT, st.one_of(TEXT, LONGS, st.booleans(), st.none()), max_size=4),
)
def test_event_value_is_fastavros_bytes(
    type_: EventType, turn_id: str, agent: str, seq: int, ts_ms: int, attempt: int, data: dict
) -> None:
    event = Event(type_, turn_id, agent, seq, ts_ms, attempt, data)
    head = avro_string(type_) + avro_string(turn_id) + avro_string(agent)
    fast = event_value(head, seq, ts_ms, attempt, serde.json_bytes(data))
    assert fast == serde.encode("event", event)


@given(LONGS)
def test_longs_are_fastavros_bytes(n: int) -> None:
    event = Event("status", "t", "a", n, 0, 1, {})
    head = avro_string("status") + avro_string("t") + avro_string("a")
    value = event_value(head, n, 0, 1, b"{}")
    assert value == serde.encode("event", event)
    assert avro_long(n) == value[len(head) : len(head) + len(avro_long(n))]


def test_turn_events_decode_to_what_was_emitted() -> None:
    events = TurnEvents("turn-é", "agent", EventRouting("a.events"), attempt=2, next_seq=7)
    [first] = events.records(LlmDelta(0, "héllo"))
    [second] = events.records(LlmDelta(1, "again"))
    decoded = [decode_event(r.value or b"", serde.headers_dict(r.headers)) for r in (first, second)]
    assert [(e.type, e.turn_id, e.agent, e.seq, e.attempt, e.data) for e in decoded] == [
        ("llm:delta", "turn-é", "agent", 7, 2, {"call": 0, "text": "héllo"}),
        ("llm:delta", "turn-é", "agent", 8, 2, {"call": 1, "text": "again"}),
    ]


FIELD_VALUES: dict[Any, st.SearchStrategy[Any]] = {
    "string": TEXT,
    "int": st.integers(min_value=-(2**31), max_value=2**31 - 1),
    "long": LONGS,
    "double": st.floats(allow_nan=False) | st.integers(-(2**53), 2**53),
    ("null", "string"): st.none() | TEXT,
}


def _records(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            f["name"]: FIELD_VALUES[tuple(f["type"]) if isinstance(f["type"], list) else f["type"]]
            for f in schema["fields"]
        }
    )


@pytest.mark.parametrize("name", sorted(p.stem for p in SCHEMAS.glob("*.avsc")))
def test_every_schema_is_written_as_fastavro_writes_it(name: str) -> None:
    schema = json.loads((SCHEMAS / f"{name}.avsc").read_text())
    parsed = fastavro.parse_schema(schema)
    write = record_writer(schema)

    @settings(max_examples=200)
    @given(_records(schema))
    def same_bytes(body: dict[str, Any]) -> None:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, body)
        assert write(body) == buf.getvalue()

    same_bytes()


def test_a_schema_without_a_hand_encoder_is_refused() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "m", "type": "boolean"}]}
    with pytest.raises(ValueError, match="'m' of type 'boolean'"):
        record_writer(schema)


PAYLOADS: list[Payload] = [
    RunStart({"q": "é"}, {"m": 1}, "thread-1", "worker-1", 5, {"agent": "p", "turn_id": "t"}),
    LlmDelta(0, "héllo"),
    LlmComplete(0, "m", "hi", [{"id": "t1"}], "tool_use", {"input_tokens": 1}, {}),
    ToolStart("k", "tool", {"a": [1, 2]}, "t1", {"mcp_server": "s"}),
    ToolResult("k", "tool", "t1", "ok", "out", 2, error_code="x", cached=True),
    Status("busy", tool="tool", dropped_events=3),
    RunInterrupted("approval", "key", "ok?", "tool", "t1", {"a": 1}, 9),
    RunDeferred("quota", "tenant", 99),
    SubagentStart("k", "child", "child-1", 1, {"x": 1}),
    SubagentResult("child", "child-1", "completed", {"r": 1}, None, {"input_tokens": 1}),
]


def test_every_event_type_is_written_as_the_generic_encoder_writes_it() -> None:
    """Each payload class's record (type bytes looked up by class, small longs from a
    table: seqs from 1020 cross its end) is ``serde.encode`` of the event it decodes to."""
    events = TurnEvents("turn-é", "agent", EventRouting("a.events"), attempt=3, next_seq=1020)
    records = [r for p in PAYLOADS for r in events.records(p)]
    records += events.closing_records(RunComplete({"answer": 42}, {"input_tokens": 2}))
    failed = TurnEvents("turn-2", "agent", EventRouting("a.events"), attempt=1)
    records += failed.closing_records(RunError("internal", "boom", "ValueError", {"d": 1}))
    decoded = [decode_event(r.value or b"", serde.headers_dict(r.headers)) for r in records]
    assert {e.type for e in decoded} == set(EventType)
    assert [e.seq for e in decoded[:-1]] == list(range(1020, 1020 + len(decoded) - 1))
    for record, event in zip(records, decoded, strict=True):
        assert record.value == serde.encode("event", event)


def test_an_event_over_max_record_bytes_is_refused() -> None:
    events = TurnEvents("t", "agent", EventRouting("a.events"), attempt=1, max_record_bytes=200)
    assert events.records(LlmDelta(0, "x" * 100))
    with pytest.raises(PayloadTooLarge):
        events.records(LlmDelta(1, "x" * 200))


@settings(max_examples=300)
@given(
    turn_id=TEXT,
    step=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    kind=TEXT,
    name=TEXT,
    input_hash=TEXT,
    data=st.dictionaries(TEXT, st.one_of(TEXT, LONGS, st.booleans(), st.none()), max_size=4),
    attempt=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    ts_ms=LONGS,
)
def test_a_journal_entry_is_written_as_the_generic_encoder_writes_it(
    turn_id: str,
    step: int,
    kind: str,
    name: str,
    input_hash: str,
    data: dict,
    attempt: int,
    ts_ms: int,
) -> None:
    entry = JournalEntry(turn_id, step, kind, name, input_hash, data, attempt, ts_ms)
    fast = serde.encode_journal_entry(entry, serde.json_bytes(data))
    assert fast == serde.encode("journal_entry", entry)
