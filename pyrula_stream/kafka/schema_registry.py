"""Values in the Confluent wire format through a Schema Registry (opt-in).

``serialization="schema_registry"`` frames turn requests and events as magic byte 0, the
4-byte schema id and the Avro body, with confluent-kafka's ``AvroSerializer`` and
``AvroDeserializer``. Subjects follow the topic name strategy (``<topic>-value``), set
explicitly. Schemas are registered by ``pyrula-stream topics apply`` (``register_schemas``),
never at first produce: a serializer only looks its schema up, so an unregistered subject
fails with a clear error instead of creating a schema nobody reviewed.

The journal stays schemaless Avro: it is the worker's own changelog, read back raw.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from importlib import resources
from typing import Any

from confluent_kafka.schema_registry import Schema, topic_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

from pyrula_stream.errors import (
    ConfigurationError,
    MalformedRecordError,
    SchemaRegistryUnavailableError,
)
from pyrula_stream.kafka.config import check_serialization, new_registry, registry_config
from pyrula_stream.redaction import redact_url, scrub
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import Event


@cache
def schema_text(record: str) -> str:
    """``schemas/<record>.avsc`` as registered. A string default of ``"{}"`` is written
    as the equivalent JSON escape ``"\\u007b\\u007d"``: Apicurio Registry 3.3 cannot tell
    the type of a schema containing ``"{}"`` (HTTP 422); the parsed schema is the same."""
    text = resources.files("pyrula_stream").joinpath(f"schemas/{record}.avsc").read_text()
    return text.replace('"{}"', '"\\u007b\\u007d"')


def subject_for(topic: str) -> str:
    """The topic name strategy: the value schema of ``topic`` lives under ``<topic>-value``."""
    return str(topic_subject_name_strategy(SerializationContext(topic, MessageField.VALUE), ""))


class RegistryCodec:
    """Encodes and decodes values through one registry (see the module docstring)."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self._conf = dict(conf)
        self.url = redact_url(str(conf.get("url")))  # its userinfo may hold a password
        self.client = new_registry(self._conf)
        self._serializers: dict[str, AvroSerializer] = {}
        self._deserializers: dict[str, AvroDeserializer] = {}

    def __repr__(self) -> str:
        return f"<RegistryCodec {self.url}>"

    def close(self) -> None:
        """Close the registry client's HTTP connections."""
        self.client.close()

    @contextmanager
    def _reaching(self, doing: str) -> Iterator[None]:
        """Registry requests that fail on the network raise one clear error naming the
        registry; the client raises httpx's (or httpx2's) transport errors as they are."""
        try:
            yield
        except Exception as exc:
            if not _is_transport_error(exc):
                raise
            reason = scrub(str(exc) or type(exc).__name__, self._conf)
            raise SchemaRegistryUnavailableError(
                f"cannot reach the Schema Registry at {self.url} to {doing} ({reason}); "
                "check schema.registry.url in kafka_config and that the registry is up"
            ) from None

    def _described(self, exc: Exception) -> str:
        return scrub(str(exc), self._conf)

    def _serializer(self, record: str) -> AvroSerializer:
        if record not in self._serializers:
            self._serializers[record] = AvroSerializer(
                self.client,
                schema_text(record),
                conf={
                    "auto.register.schemas": False,
                    "use.latest.version": False,
                    "subject.name.strategy": topic_subject_name_strategy,
                },
            )
        return self._serializers[record]

    def encode(self, record: str, value: Any, topic: str) -> tuple[bytes, str]:
        ctx = SerializationContext(topic, MessageField.VALUE)
        try:
            with self._reaching(f"frame the {record} value for {topic}"):
                data = self._serializer(record)(serde.avro_body(record, value), ctx)
        except (SchemaRegistryError, SerializationError) as exc:
            raise ConfigurationError(
                f"cannot frame a {record} for {topic} with the Schema Registry at {self.url}: "
                f"{self._described(exc)}. Register its schema under subject "
                f"{subject_for(topic)!r} with `pyrula-stream topics apply` (schemas are never "
                "registered at first produce)"
            ) from None
        assert data is not None
        return bytes(data), serde.registry_content_type(record)

    def decode(self, record: str, payload: bytes) -> dict[str, Any]:
        if record not in self._deserializers:
            # The topic strategy, as for writing: the default in confluent-kafka 2.16 asks the
            # registry for topic associations on every new deserializer, an endpoint
            # Apicurio does not serve (and a request that once never came back in CI).
            self._deserializers[record] = AvroDeserializer(
                self.client,
                schema_text(record),
                conf={"subject.name.strategy": topic_subject_name_strategy},
            )
        try:
            ctx = SerializationContext("", MessageField.VALUE)
            with self._reaching(f"decode a {record} value"):
                body = self._deserializers[record](payload, ctx)
        except (SchemaRegistryError, SerializationError) as exc:
            raise MalformedRecordError(
                f"value does not decode as {record} through the registry at {self.url}: "
                f"{self._described(exc)}"
            ) from None
        if not isinstance(body, dict):
            raise MalformedRecordError(f"value of {record} is not a record")
        return body

    def prepare(self, record: str, topics: Sequence[str]) -> None:
        """Look up the schema id of each topic now (blocking), so a missing registration
        fails at start and no HTTP call happens while turns run."""
        for topic in topics:
            self.encode(record, _SAMPLES[record], topic)

    def register(self, record: str, topic: str) -> int:
        """Register ``record``'s schema under ``topic``'s subject (a no-op when it exists)."""
        schema = Schema(schema_str=schema_text(record), schema_type="AVRO")
        subject = subject_for(topic)
        try:
            with self._reaching(f"register subject {subject!r}"):
                return int(self.client.register_schema(subject, schema))
        except SchemaRegistryError as exc:
            raise ConfigurationError(
                f"the Schema Registry at {self.url} refused {record}'s schema for subject "
                f"{subject!r}: {self._described(exc)}"
            ) from None


def _is_transport_error(exc: BaseException) -> bool:
    """httpx's ``TransportError`` (connect, read, TLS, timeout), from httpx or httpx2."""
    return any(
        cls.__name__ == "TransportError" and cls.__module__.startswith("httpx")
        for cls in type(exc).__mro__
    )


_SAMPLES: dict[str, Any] = {
    "event": Event("status", "", "", 0, 0),
    "turn_request": serde.TurnRequest("", "", {}),
}


def reader_codec(kafka_config: Mapping[str, Any] | None) -> RegistryCodec | None:
    """A codec for reading registry-framed values when a registry is configured."""
    conf = registry_config(kafka_config)
    return RegistryCodec(conf) if conf else None


def writer_codec(
    serialization: str, kafka_config: Mapping[str, Any] | None, reader: RegistryCodec | None
) -> serde.ValueCodec:
    """How values are written: schemaless Avro, or through the configured registry."""
    check_serialization(serialization, kafka_config)
    if serialization == "schema_registry" and reader is not None:
        return reader
    return serde.SCHEMALESS


def event_codecs(
    kafka_config: Mapping[str, Any] | None, serialization: str, event_topics: Sequence[str]
) -> tuple[RegistryCodec | None, serde.ValueCodec]:
    """A worker's ``(reader, writer)``: it reads either framing whenever a registry is
    configured; with ``serialization="schema_registry"`` it writes events framed, and their
    schema ids are looked up now, so a missing registration fails at start."""
    reader = reader_codec(kafka_config)
    writer = writer_codec(serialization, kafka_config, reader)
    if reader is not None and writer is reader:
        try:
            reader.prepare("event", event_topics)
        except BaseException:
            reader.close()
            raise
    return reader, writer


def register_schemas(
    kafka_config: Mapping[str, Any] | None, topics: Mapping[str, Sequence[str]]
) -> list[str]:
    """Register each record's schema for its topics (``{"event": [...], ...}``); returns
    ``"<subject> id <n>"`` lines. Does nothing without a configured registry."""
    codec = reader_codec(kafka_config)
    if codec is None:
        return []
    try:
        return [
            f"{subject_for(topic)} id {codec.register(record, topic)}"
            for record, names in topics.items()
            for topic in names
        ]
    finally:
        codec.close()
