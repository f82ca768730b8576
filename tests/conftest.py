"""Shared fixtures. The broker fixture ``kafka_bootstrap_servers`` comes from
``pyrula_stream.testing`` (a pytest plugin): a real Apache Kafka, never a mock."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pyrula_stream import KafkaAgentClient


@pytest.fixture
async def client(kafka_bootstrap_servers: str) -> AsyncIterator[KafkaAgentClient]:
    async with KafkaAgentClient(kafka_bootstrap_servers) as c:
        yield c
