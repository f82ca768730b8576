"""Clients of running agents (floor 8): what a producer or a service uses.

- ``kafka_client``: ``KafkaAgentClient`` (submit, stream, wait) and ``TurnHandle``.
- ``signals``: sending signals and answers to parked turns.
- ``event_reader``: one shared reader of an agent's events for many streams.
- ``turn_status``: where a turn stands, read from its topics.

This module is the public face: ``from pyrula_stream.client import KafkaAgentClient``
keeps working.
"""

from pyrula_stream.client.kafka_client import (
    KafkaAgentClient,
    TurnHandle,
    missing_agent_topic,
    new_request,
    turn_id_for,
)

__all__ = [
    "KafkaAgentClient",
    "TurnHandle",
    "missing_agent_topic",
    "new_request",
    "turn_id_for",
]
