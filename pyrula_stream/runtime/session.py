"""The Kafka clients of one group membership of a worker, made and closed together.

A fenced producer or consumer cannot be reused, so after fencing the worker drops its
turns and opens a new session: a transactional writer, the group consumer of the turns
topic, group-less readers (restore, control, replies) and the committer that batches the
turns' records into transactions.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.kafka.consumers import (
    ControlReader,
    RepliesReader,
    reader_consumer,
    reader_group_id,
)
from pyrula_stream.kafka.group import TurnConsumer
from pyrula_stream.kafka.transactions import BatchWriter
from pyrula_stream.observability.telemetry import WorkerTelemetry
from pyrula_stream.runtime.committer import GroupCommitter
from pyrula_stream.runtime.options import WorkerOptions
from pyrula_stream.wire import serde


class SessionLost(Exception):
    """The worker's clients must be recreated: it drops its turns and rejoins the group."""


@dataclass
class GroupSession:
    """The Kafka clients of one group membership; recreated after fencing."""

    writer: BatchWriter
    consumer: TurnConsumer
    restorer: Any
    control: ControlReader
    replies: RepliesReader
    committer: GroupCommitter
    loop: asyncio.AbstractEventLoop

    def close(self) -> None:
        self.consumer.close()
        self.restorer.close()
        self.control.close()
        self.replies.close()
        self.writer.close()


async def open_session(
    agent: KafkaAgent,
    bootstrap_servers: str,
    options: WorkerOptions,
    *,
    worker_id: str,
    group_id: str,
    telemetry: WorkerTelemetry,
    codec: serde.ValueCodec | None,
    committer: GroupCommitter,
) -> GroupSession:
    """Start the writer (it fences an older session of this worker) and make the readers
    and the group consumer, which is not subscribed yet."""
    exactly_once = options.processing_guarantee == "exactly_once_v2"
    settings = options.kafka_config
    writer = BatchWriter(
        bootstrap_servers,
        transactional_id=f"{agent.prefix}.{agent.name}.{worker_id}",
        exactly_once=exactly_once,
        extra=options.producer_config,
        kafka_config=settings,
    )
    await asyncio.to_thread(writer.start)
    consumer = TurnConsumer(
        bootstrap_servers,
        topic=agent.topics.turns,
        agent=agent.name,
        group_id=group_id,
        client_id=worker_id,
        exactly_once=exactly_once,
        group_instance_id=worker_id if options.static_membership else None,
        group_protocol=options.group_protocol,
        extra=options.consumer_config,
        on_lag=telemetry.on_lag,
        kafka_config=settings,
        codec=codec,
        limits=options.decode_limits,
    )
    # Readers never join their group, but a secured cluster wants DESCRIBE on it.
    readers = reader_group_id(agent.prefix, agent.name)
    return GroupSession(
        writer=writer,
        consumer=consumer,
        restorer=reader_consumer(
            bootstrap_servers,
            client_id=f"{worker_id}-restore",
            kafka_config=settings,
            group_id=readers,
        ),
        control=ControlReader(
            bootstrap_servers,
            agent.topics.control,
            client_id=f"{worker_id}-control",
            kafka_config=settings,
            group_id=readers,
        ),
        replies=RepliesReader(
            bootstrap_servers,
            (agent.topics.replies, agent.topics.signals, agent.topics.answers),
            client_id=f"{worker_id}-replies",
            kafka_config=settings,
            group_id=readers,
        ),
        committer=committer,
        loop=asyncio.get_running_loop(),
    )
