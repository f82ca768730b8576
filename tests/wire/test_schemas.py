"""The wire contract: every .avsc parses, records round-trip, old records still decode."""

from __future__ import annotations

import io
import json
from pathlib import Path

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import Event, decode_event
from pyrula_stream.wire.serde import JournalEntry, TurnRequest, TurnResult

SCHEMAS = Path(__file__).parents[2] / "schemas"
SAMPLES = Path(__file__).parents[1] / "data" / "v1"

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


@pytest.mark.parametrize("record", ["turn_request", "event", "journal_entry", "turn_result"])
def test_samples_written_by_v1_still_decode(record: str) -> None:
    """Bytes written by the first release (tests/data/v1) must decode forever."""
    body = (SAMPLES / f"{record}.avro").read_bytes()
    expected = json.loads((SAMPLES / f"{record}.json").read_text())
    decoder = {
        "turn_request": serde.decode_turn_request,
        "event": decode_event,
        "journal_entry": serde.decode_journal_entry,
        "turn_result": serde.decode_turn_result,
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


@given(result=json_values)
def test_turn_result_round_trip_in_avro_and_json(result: object) -> None:
    value = TurnResult("t1", "support", "completed", result, usage={"llm_calls": 1}, cost_usd=0.5)
    for fmt in ("avro", "json"):
        body = serde.encode("turn_result", value, fmt)  # type: ignore[arg-type]
        ctype = serde.content_type("turn_result", fmt)  # type: ignore[arg-type]
        assert serde.decode_turn_result(body, {"content-type": ctype}) == value


def test_a_failed_result_decodes_with_the_avsc_file_alone() -> None:
    value = TurnResult("t1", "a", "failed", error_code="output_validation", error_message="m")
    schema = fastavro.parse_schema(json.loads((SCHEMAS / "turn_result.avsc").read_text()))
    raw = fastavro.schemaless_reader(io.BytesIO(serde.encode("turn_result", value)), schema, None)
    assert raw["result"] is None and raw["error_code"] == "output_validation"


def test_a_request_without_turn_id_or_agent_takes_the_defaults() -> None:
    body = json.dumps({"params": {"q": 1}}).encode()
    with pytest.raises(MalformedRecordError, match="turn_id"):
        serde.decode_turn_request(body, {"content-type": "application/json"})
    request = serde.decode_turn_request(
        body, {"content-type": "application/json"}, default_turn_id="t9", default_agent="a"
    )
    assert (request.turn_id, request.agent, request.params) == ("t9", "a", {"q": 1})


def test_a_bare_params_object_is_a_request() -> None:
    headers = {
        "content-type": "application/vnd.pyrula.params+json",
        "pyrula.correlation-id": "order-7",
        "pyrula.reply.source": "orders-db",
    }
    request = serde.decode_turn_request(
        b'{"question": "where?"}', headers, default_turn_id="t", default_agent="a"
    )
    assert request.params == {"question": "where?"}
    assert request.correlation_id == "order-7"
    assert request.reply_headers == (("source", "orders-db"),)
    with pytest.raises(MalformedRecordError, match="must be a JSON object"):
        serde.decode_turn_request(b"[1]", headers, default_turn_id="t", default_agent="a")
