"""Faust: submit turns from a Faust agent through Faust's own producer, read results.

Needs the ``faust`` extra (``faust-streaming``). ``TurnRequestCodec`` and
``TurnResultCodec`` are Faust codecs for the turns and results topics; ``submit_turn``
sends a turn request on a Faust topic, so in ``processing_guarantee="exactly_once"`` the
request commits in the same Faust transaction as the input offset that caused it. Its
turn id is derived from that input record (topic, partition, offset), so a Faust rerun of
the record is the same turn and our worker runs it once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import faust
from faust.serializers.codecs import Codec

from pyrula_stream.client.kafka_client import turn_id_for
from pyrula_stream.objects.urls import resolved_result
from pyrula_stream.wire import serde
from pyrula_stream.wire.serde import TurnRequest, TurnResult


class TurnResultCodec(Codec):
    """Faust codec for ``pyrula.<agent>.results`` values: bytes -> ``TurnResult``."""

    def _dumps(self, obj: Any) -> bytes:
        if not isinstance(obj, TurnResult):
            raise TypeError(f"TurnResultCodec encodes TurnResult, not {type(obj).__name__}")
        return serde.encode("turn_result", obj)

    def _loads(self, s: bytes) -> TurnResult:
        """The result, its values stored by reference read back (``PYRULA_OBJECT_STORE``)."""
        result = serde.decode_turn_result_value(s)
        value = resolved_result(result.result)
        return result if value is result.result else dataclasses.replace(result, result=value)


class TurnRequestCodec(Codec):
    """Faust codec for ``pyrula.<agent>.turns`` values (Avro, the worker's default)."""

    def _dumps(self, obj: Any) -> bytes:
        if not isinstance(obj, TurnRequest):
            raise TypeError(f"TurnRequestCodec encodes TurnRequest, not {type(obj).__name__}")
        return serde.encode("turn_request", obj)

    def _loads(self, s: bytes) -> TurnRequest:
        return serde.decode_turn_request(s, {})


def turns_topic(app: faust.App, agent: str, *, prefix: str = "pyrula") -> faust.TopicT:
    """The agent's turns topic as a Faust topic (string keys, turn request values)."""
    return app.topic(
        f"{prefix}.{agent}.turns",
        key_serializer="raw",
        value_serializer=TurnRequestCodec(),
        internal=False,
    )


def results_topic(app: faust.App, agent: str, *, prefix: str = "pyrula") -> faust.TopicT:
    """The agent's results topic as a Faust topic (``TurnResult`` values)."""
    return app.topic(
        f"{prefix}.{agent}.results",
        key_serializer="raw",
        value_serializer=TurnResultCodec(),
        internal=False,
    )


async def submit_turn(
    topic: faust.TopicT,
    agent: str,
    params: Mapping[str, Any],
    *,
    key: str,
    correlation_id: str | None = None,
    reply_headers: Mapping[str, str] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> str:
    """Send a turn request for the event being processed; returns its turn id.

    Call it inside a Faust agent: the turn id comes from the current event's topic,
    partition and offset. ``key`` partitions the request (and its result), e.g. the order
    id; ``correlation_id`` and ``reply_headers`` come back on the result record.
    """
    event = faust.current_event()
    if event is None:
        raise RuntimeError("submit_turn must be called while a Faust agent handles an event")
    msg = event.message
    source = f"{msg.topic}/{msg.partition}/{msg.offset}"
    request = TurnRequest(
        turn_id=turn_id_for(source),
        agent=agent,
        params=dict(params),
        metadata=dict(metadata or {}),
        idempotency_key=source,
        submitted_ms=int(time.time() * 1000),
    )
    headers: dict[str, bytes] = {
        serde.CONTENT_TYPE_HEADER: serde.content_type("turn_request").encode(),
    }
    if correlation_id is not None:
        headers[serde.CORRELATION_HEADER] = correlation_id.encode()
    for name, value in (reply_headers or {}).items():
        headers[serde.REPLY_HEADER_PREFIX + name] = value.encode()
    await topic.send(key=key.encode(), value=request, headers=headers)
    return request.turn_id
