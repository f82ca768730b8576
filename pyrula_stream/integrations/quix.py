"""Quix Streams: serializers for an agent's turns and results topics.

Needs the ``quix`` extra (``quixstreams``). ``TurnRequestSerializer`` turns a dict
(``params``, optional ``correlation_id`` and ``metadata``) into a turn request whose turn
id is derived from the input record being processed (topic, partition, offset), so a
Quix rerun of that record is the same turn and our worker runs it once.
``TurnResultDeserializer`` gives each result as a dict (the fields of
``schemas/turn_result.avsc``, Avro or JSON). The model runs in our workers, never inside
a Quix ``apply``: a model call there would block the partition.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from quixstreams import message_context
from quixstreams.models.serializers import Deserializer, SerializationContext, Serializer

from pyrula_stream.client.kafka_client import turn_id_for
from pyrula_stream.objects.urls import resolved_result
from pyrula_stream.wire import serde
from pyrula_stream.wire.serde import TurnRequest


class TurnRequestSerializer(Serializer):
    """Serializes ``{"params": {...}, "correlation_id": ..., "metadata": {...}}`` as an
    Avro turn request for ``agent`` (the value of ``sdf.to_topic(turns)``)."""

    def __init__(self, agent: str) -> None:
        self.agent = agent

    @property
    def extra_headers(self) -> dict[str, str]:
        return {serde.CONTENT_TYPE_HEADER: serde.content_type("turn_request")}

    def __call__(self, value: Mapping[str, Any], ctx: SerializationContext) -> bytes:
        source = message_context()
        where = f"{source.topic}/{source.partition}/{source.offset}"
        metadata = dict(value.get("metadata") or {})
        if value.get("correlation_id") is not None:  # echoed on the result record
            metadata["correlation_id"] = str(value["correlation_id"])
        request = TurnRequest(
            turn_id=turn_id_for(where),
            agent=self.agent,
            params=dict(value["params"]),
            metadata=metadata,
            idempotency_key=where,
            submitted_ms=int(time.time() * 1000),
        )
        return serde.encode("turn_request", request)


class TurnResultDeserializer(Deserializer):
    """Deserializes a results record into a dict of its fields."""

    def __call__(self, value: bytes, ctx: SerializationContext) -> dict[str, Any]:
        fields = dataclasses.asdict(serde.decode_turn_result_value(value))
        fields["result"] = resolved_result(fields["result"])  # by reference: read back
        return fields
