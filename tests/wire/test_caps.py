"""Caps on ids and counts from outside (``wire/caps.py``): past one, a decoder refuses
the record with ``MalformedRecordError`` naming the cap; the pending-signal cap refuses a
signal with ``too_many``. Pure decoders and journal logic, no broker."""

from __future__ import annotations

import json

import pytest

from pyrula_stream.agent.limits import DEFAULT_MAX_TOOL_CALLS, AgentLimits
from pyrula_stream.durable.journal import TurnJournal
from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.runtime.taking import pending_over_cap
from pyrula_stream.wire import caps, serde
from pyrula_stream.wire.lineage import Lineage
from pyrula_stream.wire.records import ControlRequest
from pyrula_stream.wire.signals import Signal, parse_signal, refusal_reason
from pyrula_stream.wire.subagents import parse_reply

JSON_HEADERS = {"content-type": "application/json"}


def turn_request(**fields: object) -> bytes:
    return json.dumps({"turn_id": "t", "agent": "a", "params": {}, **fields}).encode()


@pytest.mark.parametrize(
    ("field", "cap", "name"),
    [
        ("turn_id", caps.MAX_TURN_ID_CHARS, "MAX_TURN_ID_CHARS"),
        ("thread_id", caps.MAX_THREAD_ID_CHARS, "MAX_THREAD_ID_CHARS"),
        ("idempotency_key", caps.MAX_IDEMPOTENCY_KEY_CHARS, "MAX_IDEMPOTENCY_KEY_CHARS"),
    ],
)
def test_turn_request_ids_are_capped(field: str, cap: int, name: str) -> None:
    at_cap = serde.decode_turn_request(turn_request(**{field: "x" * cap}), JSON_HEADERS)
    assert getattr(at_cap, field) == "x" * cap
    with pytest.raises(MalformedRecordError, match=rf"over the cap of {cap} \({name}\)"):
        serde.decode_turn_request(turn_request(**{field: "x" * (cap + 1)}), JSON_HEADERS)


def signal_value(**fields: object) -> bytes:
    body = {"turn_id": "t", "signal_id": "s", "name": "go", **fields}
    return json.dumps(body).encode()


def test_signal_and_reply_ids_are_capped() -> None:
    assert parse_signal(signal_value(signal_id="s" * 200), 0).signal_id == "s" * 200
    with pytest.raises(MalformedRecordError, match="MAX_SIGNAL_ID_CHARS"):
        parse_signal(signal_value(signal_id="s" * 70_000), 0)
    with pytest.raises(MalformedRecordError, match="MAX_TURN_ID_CHARS"):
        parse_signal(signal_value(turn_id="t" * 600), 0)
    reply = {"parent_turn_id": "p", "child_turn_id": "c", "agent": "a", "status": "completed"}
    assert parse_reply(json.dumps(reply).encode()).child_turn_id == "c"
    for field, name in (
        ("parent_turn_id", "MAX_TURN_ID_CHARS"),
        ("child_turn_id", "MAX_TURN_ID_CHARS"),
        ("agent", "MAX_AGENT_NAME_CHARS"),
    ):
        with pytest.raises(MalformedRecordError, match=name):
            parse_reply(json.dumps({**reply, field: "x" * 600}).encode())


def test_an_inherited_tenant_and_lineage_ids_are_capped() -> None:
    headers = {
        "pyrula-root-turn-id": "r",
        "pyrula-parent-turn-id": "p",
        "pyrula-parent-agent": "caller",
        "pyrula-parent-prefix": "pyrula",
        "pyrula-parent-partition": "0",
        "pyrula-call-key": "0.0",
        "pyrula-depth": "1",
        "pyrula-tenant": "t" * caps.MAX_TENANT_CHARS,
    }
    lineage = Lineage.from_headers(headers)
    assert lineage is not None and lineage.tenant == "t" * caps.MAX_TENANT_CHARS
    with pytest.raises(MalformedRecordError, match="MAX_TENANT_CHARS"):
        Lineage.from_headers({**headers, "pyrula-tenant": "t" * 5_000})
    with pytest.raises(MalformedRecordError, match="MAX_TURN_ID_CHARS"):
        Lineage.from_headers({**headers, "pyrula-root-turn-id": "r" * 600})


def test_header_count_and_control_turn_id_are_capped() -> None:
    caps.check_headers([("h", b"")] * caps.MAX_HEADERS, "record")
    with pytest.raises(MalformedRecordError, match=r"65 headers, over the cap of 64"):
        caps.check_headers([("h", b"")] * 65, "record")
    body = {"turn_id": "t" * 600, "action": "cancel"}
    assert ControlRequest.parse(json.dumps(body).encode()) is None
    body["turn_id"] = "t" * caps.MAX_TURN_ID_CHARS
    assert ControlRequest.parse(json.dumps(body).encode()) is not None


def test_pending_signals_are_capped_by_count_and_bytes() -> None:
    journal = TurnJournal("t")

    def signal(n: int, payload: object = None) -> Signal:
        return Signal("note", payload, 1, "alice", f"s{n}", "t", False, n)

    for n in range(caps.MAX_PENDING_SIGNALS - 1):
        journal.signals[f"s{n}"] = signal(n).data()
    assert pending_over_cap(journal, signal(-1)) is None
    journal.signals["last"] = signal(caps.MAX_PENDING_SIGNALS).data()
    why = pending_over_cap(journal, signal(-1))
    assert why is not None and "MAX_PENDING_SIGNALS" in why
    assert refusal_reason(f"signal refused: {why}") == "too_many"
    # An answer, or the signal a parked turn waits for, still gets through.
    assert pending_over_cap(journal, Signal("approval#0", "approve", answer=True)) is None
    journal.park = {"signals": ["go"]}
    assert pending_over_cap(journal, Signal("go", turn_id="t")) is None

    journal = TurnJournal("t")
    journal.signals["big"] = signal(0, "x" * (caps.MAX_PENDING_SIGNAL_BYTES - 1000)).data()
    assert pending_over_cap(journal, signal(1, "y" * 100)) is None
    why = pending_over_cap(journal, signal(1, "y" * 2000))
    assert why is not None and "MAX_PENDING_SIGNAL_BYTES" in why


def test_max_tool_calls_has_a_default() -> None:
    assert AgentLimits().max_tool_calls == DEFAULT_MAX_TOOL_CALLS == 128


def test_signals_taken_but_not_committed_count_toward_the_cap() -> None:
    journal = TurnJournal("t")
    taking = {f"s{n}": 10 for n in range(caps.MAX_PENDING_SIGNALS)}
    why = pending_over_cap(journal, Signal("note", None, 1, None, "x", "t"), taking)
    assert why is not None and "too_many" in why
