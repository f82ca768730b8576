"""A turn request copied with ``request_headers`` (a quarantined turn's dead letter) reads
back as the same call: a sub-agent's lineage, correlation id and reply headers kept."""

from __future__ import annotations

from pyrula_stream.wire import serde
from pyrula_stream.wire.lineage import Lineage
from pyrula_stream.wire.records import request_headers


def test_a_copied_request_keeps_its_lineage_correlation_and_reply_headers() -> None:
    lineage = Lineage(
        root_turn_id="root-1",
        parent_turn_id="parent-1",
        parent_agent="billing",
        parent_prefix="pyrula",
        parent_partition=2,
        call_key="c0",
        depth=1,
        tenant="acme",
    )
    request = serde.TurnRequest(
        turn_id="child-1",
        agent="refunds",
        params={"order": "7"},
        lineage=lineage,
        correlation_id="corr-9",
        reply_headers=(("route", "eu"),),
    )
    headers = request_headers(request)
    copy = serde.decode_turn_request(
        serde.encode("turn_request", request),
        {name: value.decode() for name, value in headers},
    )
    assert copy.lineage == lineage
    assert copy.correlation_id == "corr-9"
    assert copy.reply_headers == (("route", "eu"),)
    assert (copy.turn_id, copy.agent, copy.params) == ("child-1", "refunds", {"order": "7"})
