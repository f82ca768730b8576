"""The wire contract: every .avsc parses, records round-trip, old records still decode."""

from __future__ import annotations

import io
import json
from pathlib import Path

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyrula_stream import serde
from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.events import Event, decode_event
from pyrula_stream.serde import JournalEntry, TurnRequest

SCHEMAS = Path(__file__).parent.parent / "schemas"
SAMPLES = Path(__file__).parent / "data" / "v1"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@pytest.mark.parametrize("path", sorted(SCHEMAS.glob("*.avsc")), ids=lambda p: p.stem)
def test_every_schema_parses(path: Path) -> None:
    schema = fastavro.parse_schema(json.loads(path.read_text()))
    assert schema["type"] == "record"


@given(params=st.dictionaries(st.text(max_size=10), json_values, max_size=5))
def test_turn_request_round_trip(params: dict[str, object]) -> None:
    request = TurnRequest("t1", "support", params, {"m": 1}, "thread", "idem", 123)
    body = serde.encode("turn_request", request)
    assert serde.decode_turn_request(body, {}) == request


@given(data=st.dictionaries(st.text(max_size=10), json_values, max_size=5))
def test_event_and_journal_round_trip(data: dict[str, object]) -> None:
    event = Event("tool:result", "t1", "support", 3, 1700000000000, 2, data)
    assert decode_event(serde.encode("event", event), {}) == event
    entry = JournalEntry("t1", 4, "tool", "lookup", "abc", data, 2, 1700000000000)
    assert serde.decode_journal_entry(serde.encode("journal_entry", entry), {}) == entry


def test_any_consumer_decodes_with_the_avsc_file_alone() -> None:
    event = Event("run:complete", "t1", "support", 5, 1, 1, {"result": "ok"})
    body = serde.encode("event", event)
    schema = fastavro.parse_schema(json.loads((SCHEMAS / "event.avsc").read_text()))
    raw = fastavro.schemaless_reader(io.BytesIO(body), schema, None)
    assert raw["type"] == "run:complete"
    assert json.loads(raw["data"]) == {"result": "ok"}
    assert serde.content_type("event") == "application/vnd.pyrula.event.v1+avro"


@pytest.mark.parametrize("record", ["turn_request", "event", "journal_entry"])
def test_samples_written_by_v1_still_decode(record: str) -> None:
    """Bytes written by the first release (tests/data/v1) must decode forever."""
    body = (SAMPLES / f"{record}.avro").read_bytes()
    expected = json.loads((SAMPLES / f"{record}.json").read_text())
    decoder = {
        "turn_request": serde.decode_turn_request,
        "event": decode_event,
        "journal_entry": serde.decode_journal_entry,
    }[record]
    decoded = decoder(body, {})
    assert {k: getattr(decoded, k) for k in expected} == expected


def test_json_turn_requests_are_accepted() -> None:
    body = json.dumps({"turn_id": "t", "agent": "a", "params": {"q": 1}}).encode()
    request = serde.decode_turn_request(body, {"content-type": "application/json"})
    assert request.params == {"q": 1}
    assert request.key == "t"


@pytest.mark.parametrize(
    ("payload", "headers", "message"),
    [
        (b"", {}, "empty value"),
        (b"\xff\xff\xff", {}, "does not decode as turn_request.avsc"),
        (b"{}", {"content-type": "text/plain"}, "unsupported content-type"),
        (b"[1]", {"content-type": "application/json"}, "must be an object"),
        (b'{"agent": "a", "params": {}}', {"content-type": "application/json"}, "turn_id"),
    ],
)
def test_malformed_turn_requests_say_what_is_wrong(
    payload: bytes, headers: dict[str, str], message: str
) -> None:
    with pytest.raises(MalformedRecordError, match=message):
        serde.decode_turn_request(payload, headers)
