"""The client refuses ids past the caps of ``wire/caps.py`` before it produces: the sender
learns at once, not from a dead letter its role cannot read. The client here points at
a port where no broker listens, so any attempt to produce or read would fail otherwise
(``BrokerUnavailableError`` after the timeout), never with ``OverCapError``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from pyrula_stream import KafkaAgentClient
from pyrula_stream.client.kafka_client import new_request
from pyrula_stream.client.outgoing_caps import check_request
from pyrula_stream.errors import MalformedRecordError, OverCapError, UserError
from pyrula_stream.kafka.local.broker import free_port
from pyrula_stream.wire import caps, serde

LONG = "x" * 70_000

Call = Callable[[KafkaAgentClient], Awaitable[Any]]


@pytest.fixture
async def client() -> AsyncIterator[KafkaAgentClient]:
    async with KafkaAgentClient(f"127.0.0.1:{free_port()}", timeout=3) as client:
        yield client


CALLS: dict[str, tuple[Call, str]] = {
    "submit thread_id": (lambda c: c.submit("a", thread_id=LONG), "MAX_THREAD_ID_CHARS"),
    "submit idempotency_key": (
        lambda c: c.submit("a", idempotency_key=LONG),
        "MAX_IDEMPOTENCY_KEY_CHARS",
    ),
    "submit_request turn_id": (
        lambda c: c.submit_request(serde.TurnRequest(turn_id=LONG, agent="a", params={})),
        "MAX_TURN_ID_CHARS",
    ),
    "submit inherited tenant": (
        lambda c: c.submit_request(
            new_request("a", None, None, None, {}), headers=[("pyrula-tenant", LONG.encode())]
        ),
        "MAX_TENANT_CHARS",
    ),
    "submit headers": (
        lambda c: c.submit_request(
            new_request("a", None, None, None, {}),
            headers=[(f"h{i}", b"") for i in range(caps.MAX_HEADERS)],
        ),
        "MAX_HEADERS",
    ),
    "signal turn_id": (lambda c: c.signal("a", LONG, "go"), "MAX_TURN_ID_CHARS"),
    "signal key": (lambda c: c.signal("a", "t1", "go", key=LONG), "MAX_THREAD_ID_CHARS"),
    "approve turn_id": (lambda c: c.approve("a", LONG, "tool_approval:x#0.0"), "MAX_TURN_ID"),
    "approve turn_key": (
        lambda c: c.approve("a", "t1", "tool_approval:x#0.0", turn_key=LONG),
        "MAX_THREAD_ID_CHARS",
    ),
    "cancel turn_id": (lambda c: c.cancel("a", LONG), "MAX_TURN_ID_CHARS"),
}


@pytest.mark.parametrize("call", list(CALLS))
async def test_an_id_past_its_cap_is_refused_before_anything_is_sent(
    client: KafkaAgentClient, call: str
) -> None:
    send, cap = CALLS[call]
    with pytest.raises(OverCapError, match=rf"over the cap of \d+ \({cap}.*nothing was sent"):
        await send(client)
    assert issubclass(OverCapError, UserError), "a usage mistake: a retry cannot help"


@pytest.mark.parametrize(
    ("field", "cap", "name"),
    [
        ("turn_id", caps.MAX_TURN_ID_CHARS, "MAX_TURN_ID_CHARS"),
        ("thread_id", caps.MAX_THREAD_ID_CHARS, "MAX_THREAD_ID_CHARS"),
        ("idempotency_key", caps.MAX_IDEMPOTENCY_KEY_CHARS, "MAX_IDEMPOTENCY_KEY_CHARS"),
    ],
)
def test_the_client_refuses_what_the_worker_refuses_and_no_more(
    field: str, cap: int, name: str
) -> None:
    """At the cap both the client and the worker's decoder take the request; one past it,
    both refuse it, naming the same cap."""
    for length, taken in ((cap, True), (cap + 1, False)):
        ids: dict[str, Any] = {"turn_id": "t", field: "i" * length}
        request = serde.TurnRequest(agent="a", params={}, **ids)
        value = serde.encode("turn_request", request, "json")
        headers = {serde.CONTENT_TYPE_HEADER: serde.content_type("turn_request", "json")}
        if taken:
            check_request(request, [])
            assert getattr(serde.decode_turn_request(value, headers), field) == "i" * length
            continue
        with pytest.raises(OverCapError, match=name):
            check_request(request, [])
        with pytest.raises(MalformedRecordError, match=name):
            serde.decode_turn_request(value, headers)


def test_headers_at_the_cap_pass() -> None:
    request = new_request("a", None, None, None, {})
    check_request(request, [(f"h{i}", b"") for i in range(caps.MAX_HEADERS)])
    check_request(request, [("pyrula-tenant", b"t" * caps.MAX_TENANT_CHARS)])
