"""A consumer closed while another thread polls it must not take the process down.

librdkafka frees the consumer's queues on close; a poll running at that moment in another
thread used to read freed memory (SIGABRT/SIGSEGV in the suite on confluent-kafka 2.12,
through a cancelled ``asyncio.to_thread(poll)``). Every consumer we build now waits.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from pyrula_stream.kafka.admin import TopicSpec, apply_topics
from pyrula_stream.kafka.config import new_consumer, reader_config
from pyrula_stream.kafka.guarded import GuardedConsumer


def test_close_waits_for_a_poll_in_another_thread(kafka_bootstrap_servers: str) -> None:
    from confluent_kafka import TopicPartition

    topic = f"guarded-{uuid.uuid4().hex[:8]}"
    apply_topics(kafka_bootstrap_servers, [TopicSpec(topic, 1)])
    consumer = new_consumer(
        reader_config(kafka_bootstrap_servers, client_id=f"guarded-{uuid.uuid4().hex[:6]}")
    )
    assert isinstance(consumer, GuardedConsumer)
    consumer.assign([TopicPartition(topic, 0, 0)])
    order: list[str] = []
    refused: list[BaseException] = []

    def poller() -> None:
        try:
            while True:
                consumer.poll(1.0)  # an empty topic: each call waits its whole second
                order.append("poll returned")
        except RuntimeError as exc:
            refused.append(exc)

    thread = threading.Thread(target=poller, daemon=True)
    thread.start()
    while consumer.calls_in_flight() == 0:
        threading.Event().wait(0.01)
    consumer.close()
    order.append("closed")
    thread.join(timeout=10)

    assert not thread.is_alive()
    assert order[-2:] == ["poll returned", "closed"], order
    assert refused and "closed" in str(refused[0])
    with pytest.raises(RuntimeError, match="closed"):
        consumer.poll(0)
    consumer.close()  # a second close is a no-op
