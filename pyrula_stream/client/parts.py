"""What ``KafkaAgentClient`` gives the mixins its methods are split into (``signals``,
``control``): its connection settings and producer, declared once for the type checker."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyrula_stream.errors import UnknownTopicError
from pyrula_stream.kafka.config import KafkaSettings
from pyrula_stream.kafka.io import RecordProducer


class ClientParts:
    """The settings and helpers ``KafkaAgentClient`` supplies to its mixins."""

    bootstrap_servers: str
    prefix: str
    timeout: float
    kafka_config: KafkaSettings
    _submitted: Any

    if TYPE_CHECKING:  # supplied by KafkaAgentClient

        def _get_producer(self) -> RecordProducer: ...

        def _no_topic(self, agent: str, exc: UnknownTopicError) -> UnknownTopicError: ...
